package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/fleetd/fleet"
	"github.com/google/uuid"
)

var _ fleet.DeviceService = (*DB)(nil)

// insertChunk is how many rows one INSERT statement carries: fewer
// round trips, well under every bound-parameter limit.
const insertChunk = 200

// rowsInsert is a multi-row INSERT of the rows given to each exec. The
// statement of a full chunk is prepared once for the transaction: SQLite
// parses a statement of 200 rows in about the time it takes to run it,
// and provisioning runs it hundreds of times (docs/benchmarks-notebook.md,
// "Provisioning and the search rows").
type rowsInsert struct {
	tx        *Tx
	head, row string // "INSERT INTO t (a, b) VALUES ", "(?, ?)"
	tail      string // after the rows
	cols      int
	full      *sql.Stmt
}

func (tx *Tx) rowsInsert(head, row, tail string) *rowsInsert {
	return &rowsInsert{tx: tx, head: head, row: row, tail: tail, cols: strings.Count(row, "?")}
}

// exec inserts the rows of args, cols values each, at most insertChunk.
func (r *rowsInsert) exec(ctx context.Context, args ...any) (sql.Result, error) {
	n := len(args) / r.cols
	q := r.head + r.row + strings.Repeat(", "+r.row, n-1) + r.tail
	// PostgreSQL's pgx keeps the statements it runs prepared itself.
	sqlTx, ok := r.tx.tx.(*sql.Tx)
	if n < insertChunk || r.tx.db.writeStmts == nil || !ok {
		return r.tx.exec(ctx, q, args...)
	}
	ctx = context.WithoutCancel(ctx) // as Tx.stmt does
	if r.full == nil {
		st, err := sqlTx.PrepareContext(ctx, q)
		if err != nil {
			return nil, err
		}
		r.full = st
	}
	return r.full.ExecContext(ctx, args...)
}

// close releases the prepared statement, if any.
func (r *rowsInsert) close() {
	if r.full != nil {
		r.full.Close()
	}
}

// CreateDevices provisions devices in one transaction.
func (db *DB) CreateDevices(ctx context.Context, tenant string, devs []fleet.NewDevice) ([]fleet.DeviceToken, error) {
	tokens := make([]fleet.DeviceToken, len(devs))
	hashes := make([]string, len(devs))
	metadata := make([]string, len(devs))
	seen := make(map[string]bool, len(devs))
	var dups []string
	for i, d := range devs {
		id := d.ID
		if id == "" {
			id = uuid.NewString()
		}
		if seen[id] {
			dups = append(dups, id)
		}
		seen[id] = true
		tokens[i] = fleet.DeviceToken{ID: id, Token: fleet.NewSecret(fleet.DeviceTokenPrefix)}
		hashes[i] = fleet.HashSecret(tokens[i].Token)
		metadata[i] = encodeMetadata(d.Metadata)
	}
	if len(dups) > 0 {
		return nil, fleet.Errorf(fleet.EINVALID, "device ids appear more than once: %s", listSome(dups))
	}
	err := db.update(ctx, func(ctx context.Context, tx *Tx) error {
		var created, tenantArg any = millis(tx.now), tenant
		ins := tx.rowsInsert("INSERT INTO devices (tenant, id, token_hash, metadata, components, created_at) VALUES ",
			"(?, ?, ?, ?, '{}', ?)", " ON CONFLICT DO NOTHING")
		defer ins.close()
		for start := 0; start < len(devs); start += insertChunk {
			end := min(start+insertChunk, len(devs))
			args := make([]any, 0, 5*(end-start))
			for i := start; i < end; i++ {
				args = append(args, tenantArg, tokens[i].ID, hashes[i], metadata[i], created)
			}
			res, err := ins.exec(ctx, args...)
			if err != nil {
				return err
			}
			if n, err := res.RowsAffected(); err != nil {
				return err
			} else if int(n) < end-start {
				return tx.conflictingDevices(ctx, tenant, tokens[start:end], hashes[start:end])
			}
		}
		ids, metas := make([]string, len(devs)), make([]map[string]string, len(devs))
		for i, d := range devs {
			ids[i], metas[i] = tokens[i].ID, d.Metadata
		}
		if err := tx.indexDevices(ctx, tenant, ids, metas); err != nil {
			return err
		}
		if err := tx.countDevices(ctx, tenant, int64(len(devs))); err != nil {
			return err
		}
		details := map[string]any{"count": len(devs)}
		target := "devices"
		if len(devs) == 1 {
			target = "devices/" + tokens[0].ID
			details = map[string]any{"metadata": metadataOrEmpty(devs[0].Metadata)}
		}
		return tx.audit(ctx, tenant, "device.create", target, details)
	})
	if err != nil {
		return nil, err
	}
	// Each status report's sighting writes its device by id (TouchDevices).
	db.analyzeAfterWrite(ctx, "devices", len(devs))
	return tokens, nil
}

// conflictingDevices names the devices of a chunk that existed before it:
// those whose stored token is not the one just inserted.
func (tx *Tx) conflictingDevices(ctx context.Context, tenant string, toks []fleet.DeviceToken, hashes []string) error {
	ours := make(map[string]string, len(toks))
	args := []any{tenant}
	for i, t := range toks {
		ours[t.ID] = hashes[i]
		args = append(args, t.ID)
	}
	rows, err := tx.query(ctx, "SELECT id, token_hash FROM devices WHERE tenant = ? AND id IN (?"+strings.Repeat(", ?", len(toks)-1)+")", args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	var taken []string
	for rows.Next() {
		var id, hash string
		if err := rows.Scan(&id, &hash); err != nil {
			return err
		}
		if hash != ours[id] {
			taken = append(taken, id)
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	sort.Strings(taken)
	return fleet.Errorf(fleet.ECONFLICT, "devices exist already: %s", listSome(taken))
}

// listSome joins up to ten ids for a message, saying how many more there are.
func listSome(ids []string) string {
	if len(ids) <= 10 {
		return strings.Join(ids, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(ids[:10], ", "), len(ids)-10)
}

func metadataOrEmpty(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

func encodeMetadata(m map[string]string) string {
	if len(m) == 0 {
		return "{}"
	}
	b, _ := json.Marshal(m) // a map of strings always encodes
	return string(b)
}

// deviceColumns are a device's columns as scanDevice reads them, in a
// SELECT from devices (so named, without an alias). last_seen_at is in
// device_sightings (migration 0046), read for each device selected.
const deviceColumns = "id, metadata, components, created_at, " +
	"(SELECT last_seen_at FROM device_sightings s WHERE s.tenant = devices.tenant AND s.device_id = devices.id)"

func scanDevice(s scanner) (*fleet.Device, error) {
	var d fleet.Device
	var meta, comps string
	var created int64
	var seen sql.NullInt64
	if err := s.Scan(&d.ID, &meta, &comps, &created, &seen); err != nil {
		return nil, err
	}
	if err := json.Unmarshal([]byte(meta), &d.Metadata); err != nil {
		return nil, fmt.Errorf("device %s metadata: %w", d.ID, err)
	}
	if err := json.Unmarshal([]byte(comps), &d.Components); err != nil {
		return nil, fmt.Errorf("device %s components: %w", d.ID, err)
	}
	d.CreatedAt = fromMillis(created)
	if seen.Valid {
		t := fromMillis(seen.Int64)
		d.LastSeenAt = &t
	}
	return &d, nil
}

// FindDevice returns one device of the tenant.
func (db *DB) FindDevice(ctx context.Context, tenant, id string) (*fleet.Device, error) {
	d, err := scanDevice(db.queryRow(ctx, "SELECT "+deviceColumns+" FROM devices WHERE tenant = ? AND id = ?", tenant, id))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fleet.Errorf(fleet.ENOTFOUND, "device %q not found", id)
	}
	return d, db.classify(err)
}

// FindDevices lists devices by id. The count of a tenant's devices is
// kept in device_counts; a search, metadata, shadow or group filter reads
// its devices, to count and list them, as devicesWhere chooses.
func (db *DB) FindDevices(ctx context.Context, tenant string, f fleet.DeviceFilter) ([]*fleet.Device, int, error) {
	if f.Search == "" && len(f.Metadata) == 0 && f.Shadow == "" && f.Group == "" {
		return findPage(ctx, db, "SELECT coalesce((SELECT devices FROM device_counts WHERE tenant = ?), 0)",
			"SELECT "+deviceColumns+" FROM devices WHERE tenant = ? ORDER BY id", []any{tenant}, f.Page, scanDevice)
	}
	cs, err := db.deviceFilter(tenant, f.Search, f.Metadata)
	if err != nil {
		return nil, 0, err
	}
	if f.Shadow != "" {
		cs = append(cs, shadowSync(tenant, f.Shadow == fleet.ShadowInSync))
	}
	if f.Group != "" {
		sel, err := groupSelector(ctx, db, tenant, f.Group)
		if err != nil {
			return nil, 0, db.classify(err)
		}
		cs = append(cs, db.dialect.selectorConds(tenant, sel)...)
	}
	return db.findDevicesWhere(ctx, tenant, cs, f.Page)
}

// deviceFilter chooses the devices of tenant that have search in their id
// or a metadata value and the metadata meta.
func (db *DB) deviceFilter(tenant, search string, meta map[string]string) ([]deviceCond, error) {
	var cs []deviceCond
	if search != "" {
		if err := checkText("search", search); err != nil {
			return nil, err
		}
		cs = append(cs, db.dialect.deviceSearch(tenant, "", search))
	}
	for _, k := range slices.Sorted(maps.Keys(meta)) {
		if err := checkText("metadata", k+meta[k]); err != nil {
			return nil, err
		}
		cs = append(cs, db.dialect.metadataIs(tenant, k, meta[k]))
	}
	return cs, nil
}

// countDevices adds n to the tenant's count of devices.
func (tx *Tx) countDevices(ctx context.Context, tenant string, n int64) error {
	_, err := tx.exec(ctx, `INSERT INTO device_counts (tenant, devices) VALUES (?, ?)
		ON CONFLICT (tenant) DO UPDATE SET devices = device_counts.devices + excluded.devices`, tenant, n)
	return err
}

// UpdateDeviceMetadata merges patch into a device's metadata.
func (db *DB) UpdateDeviceMetadata(ctx context.Context, tenant, id string, patch map[string]*string) (*fleet.Device, error) {
	var dev *fleet.Device
	err := db.update(ctx, func(ctx context.Context, tx *Tx) error {
		d, err := scanDevice(tx.queryRow(ctx, "SELECT "+deviceColumns+" FROM devices WHERE tenant = ? AND id = ?", tenant, id))
		if errors.Is(err, sql.ErrNoRows) {
			return fleet.Errorf(fleet.ENOTFOUND, "device %q not found", id)
		} else if err != nil {
			return err
		}
		old := maps.Clone(d.Metadata)
		if d.Metadata == nil {
			d.Metadata = map[string]string{}
		}
		for k, v := range patch {
			if v == nil {
				delete(d.Metadata, k)
			} else {
				d.Metadata[k] = *v
			}
		}
		if problem := fleet.ValidateMetadata(d.Metadata); problem != "" {
			return fleet.FieldErrors(map[string]string{"metadata": "after the merge, " + problem})
		}
		if _, err := tx.exec(ctx, "UPDATE devices SET metadata = ? WHERE tenant = ? AND id = ?", encodeMetadata(d.Metadata), tenant, id); err != nil {
			return err
		}
		if err := tx.unindexDevice(ctx, tenant, id, old); err != nil {
			return err
		}
		if err := tx.indexDevices(ctx, tenant, []string{id}, []map[string]string{d.Metadata}); err != nil {
			return err
		}
		if err := tx.changed(ctx, fleet.Change{Kind: fleet.ChangeDevice, Tenant: tenant, Key: id}); err != nil {
			return err
		}
		dev = d
		return tx.audit(ctx, tenant, "device.update", "devices/"+id, map[string]any{"metadata": patch})
	})
	return dev, err
}

// DeleteDevice removes a device and everything recorded about it.
func (db *DB) DeleteDevice(ctx context.Context, tenant, id string) error {
	// device_actions has no foreign key to devices (migrations 0014 and
	// 0017): the deletion deletes the device's device actions itself. On
	// PostgreSQL, in a transaction of its own, it waits for the tenant's
	// dispatches in progress, whose rows it then deletes, and holds off new
	// ones until it commits (lockTargets); SQLite's one writer runs the two
	// one after the other.
	return db.updateAlone(ctx, func(ctx context.Context, tx *Tx) error {
		if err := tx.lockTargets(ctx, tenant, true); err != nil {
			return err
		}
		// The device actions go first, locked in reports' order: a status
		// report that completes a firmware update locks its device action,
		// then the device (recordComponents), and two writers that lock
		// the two the other way round deadlock.
		if err := tx.lockInOrder(ctx, "tenant = ? AND device_id = ?", tenant, id); err != nil {
			return err
		}
		if _, err := tx.deleteCounted(ctx, "DELETE FROM device_actions WHERE tenant = ? AND device_id = ?", tenant, id); err != nil {
			return err
		}
		var meta string
		err := tx.queryRow(ctx, "DELETE FROM devices WHERE tenant = ? AND id = ? RETURNING metadata", tenant, id).Scan(&meta)
		if errors.Is(err, sql.ErrNoRows) {
			return fleet.Errorf(fleet.ENOTFOUND, "device %q not found", id)
		} else if err != nil {
			return err
		}
		var m map[string]string
		if err := json.Unmarshal([]byte(meta), &m); err != nil {
			return fmt.Errorf("device %s metadata: %w", id, err)
		}
		if err := tx.unindexDevice(ctx, tenant, id, m); err != nil {
			return err
		}
		if err := tx.countDevices(ctx, tenant, -1); err != nil {
			return err
		}
		if err := tx.changed(ctx, fleet.Change{Kind: fleet.ChangeDeviceDelete, Tenant: tenant, Key: id}); err != nil {
			return err
		}
		return tx.audit(ctx, tenant, "device.delete", "devices/"+id, nil)
	})
}

// RotateDeviceToken gives a device a new token; the old one stops working.
func (db *DB) RotateDeviceToken(ctx context.Context, tenant, id string) (string, error) {
	token := fleet.NewSecret(fleet.DeviceTokenPrefix)
	err := db.update(ctx, func(ctx context.Context, tx *Tx) error {
		// A rotation is what an operator does when a device's credentials
		// may have leaked, so its client certificate goes too.
		res, err := tx.exec(ctx, "UPDATE devices SET token_hash = ?, cert_serial = '' WHERE tenant = ? AND id = ?", fleet.HashSecret(token), tenant, id)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n == 0 {
			return fleet.Errorf(fleet.ENOTFOUND, "device %q not found", id)
		}
		if err := tx.changed(ctx, fleet.Change{Kind: fleet.ChangeDeviceCredentials, Tenant: tenant, Key: id}); err != nil {
			return err
		}
		return tx.audit(ctx, tenant, "device.rotate_token", "devices/"+id, nil)
	})
	if err != nil {
		return "", err
	}
	return token, nil
}

// AuthenticateDevice checks a device's token.
func (db *DB) AuthenticateDevice(ctx context.Context, tenant, id, token string) error {
	var hash string
	err := db.queryRow(ctx, "SELECT token_hash FROM devices WHERE tenant = ? AND id = ?", tenant, id).Scan(&hash)
	if errors.Is(err, sql.ErrNoRows) || (err == nil && !fleet.SecretMatches(token, hash)) {
		return fleet.Errorf(fleet.EUNAUTHENTICATED, "unknown device or wrong token")
	}
	return db.classify(err)
}

// TouchDevice records that a device was seen at t, as TouchDevices does:
// a device seen later already keeps its time.
func (db *DB) TouchDevice(ctx context.Context, tenant, id string, t time.Time) error {
	return db.TouchDevices(ctx, tenant, []string{id}, t)
}
