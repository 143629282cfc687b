package sqlstore

import (
	"context"
	"maps"
	"slices"
	"strings"
	"unicode/utf8"
)

// SQLite's search rows (migrations 0019 and 0021): each device's id and
// metadata values, one a line, in device_texts, indexed by the FTS5 trigram
// index device_search; its keys and values in device_metadata. The store
// writes them in the transaction that writes the device, from the metadata
// it holds, a chunk of devices to a statement and FTS5 in one statement per
// write: FTS5 flushes its pending terms to a new segment at every
// statement that writes to it. PostgreSQL's indexes are of the devices
// table itself, and these are no-ops there.

// indexDevices writes the search rows of devices the transaction inserted.
func (tx *Tx) indexDevices(ctx context.Context, tenant string, ids []string, metas []map[string]string) error {
	if tx.db.dialect == postgres {
		return nil
	}
	var last int64
	if err := tx.queryRow(ctx, "SELECT coalesce(max(row), 0) FROM device_texts").Scan(&last); err != nil {
		return err
	}
	texts := tx.rowsInsert("INSERT INTO device_texts (tenant, id, text) VALUES ", "(?, ?, ?)", "")
	defer texts.close()
	// A metadata row equal to one there is that row: OR IGNORE changes
	// nothing, but lets SQLite run the statement without a statement
	// journal, a copy of each page it changes (6% of provisioning's CPU).
	pairs := tx.rowsInsert("INSERT OR IGNORE INTO device_metadata (tenant, id, key, value) VALUES ", "(?, ?, ?, ?)", "")
	defer pairs.close()
	var tenantArg any = tenant
	var pairArgs []any // of the metadata rows not yet written
	for start := 0; start < len(ids); start += insertChunk {
		end := min(start+insertChunk, len(ids))
		args := make([]any, 0, 3*(end-start))
		for i := start; i < end; i++ {
			var id any = ids[i]
			text := []byte(ids[i] + "\n")
			for n, k := range slices.Sorted(maps.Keys(metas[i])) {
				v := asStored(metas[i][k])
				if n > 0 {
					text = append(text, '\n')
				}
				text = append(text, v...)
				pairArgs = append(pairArgs, tenantArg, id, asStored(k), v)
			}
			args = append(args, tenantArg, id, string(text))
		}
		if _, err := texts.exec(ctx, args...); err != nil {
			return err
		}
		for len(pairArgs) >= 4*insertChunk || (end == len(ids) && len(pairArgs) > 0) {
			n := min(len(pairArgs), 4*insertChunk)
			if _, err := pairs.exec(ctx, pairArgs[:n]...); err != nil {
				return err
			}
			pairArgs = pairArgs[n:]
		}
	}
	_, err := tx.exec(ctx, "INSERT INTO device_search (rowid, text) SELECT row, text FROM device_texts WHERE row > ?", last)
	return err
}

// unindexDevice deletes the search rows of a device whose metadata was
// meta.
func (tx *Tx) unindexDevice(ctx context.Context, tenant, id string, meta map[string]string) error {
	if tx.db.dialect == postgres {
		return nil
	}
	// An external-content FTS5 index forgets a row given the text it
	// indexed.
	if _, err := tx.exec(ctx, `INSERT INTO device_search (device_search, rowid, text)
		SELECT 'delete', row, text FROM device_texts WHERE tenant = ? AND id = ?`, tenant, id); err != nil {
		return err
	}
	if _, err := tx.exec(ctx, "DELETE FROM device_texts WHERE tenant = ? AND id = ?", tenant, id); err != nil {
		return err
	}
	for k, v := range meta {
		if _, err := tx.exec(ctx, "DELETE FROM device_metadata WHERE tenant = ? AND key = ? AND value = ? AND id = ?",
			tenant, asStored(k), asStored(v), id); err != nil {
			return err
		}
	}
	return nil
}

// asStored is s as the metadata's JSON holds it, and json_each reads it
// back: encoding/json writes each byte that is not UTF-8 as U+FFFD.
func asStored(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		b.WriteRune(r) // an invalid byte reads as utf8.RuneError, U+FFFD
	}
	return b.String()
}
