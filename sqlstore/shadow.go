package sqlstore

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fleetd/fleet"
)

var _ fleet.ShadowService = (*DB)(nil)

// storedShadow is a shadow as its row holds it, with the JSON text of its
// sections to tell whether a merge changed them.
type storedShadow struct {
	fleet.Shadow
	desired, reported []byte
	exists            bool
}

const shadowRead = `SELECT s.desired, s.reported, s.version, s.desired_updated_at, s.reported_updated_at
	FROM devices d LEFT JOIN device_shadows s ON s.tenant = d.tenant AND s.device_id = d.id
	WHERE d.tenant = ? AND d.id = ?`

func scanShadow(row *sql.Row, device string) (*storedShadow, error) {
	var c shadowColumns
	err := row.Scan(c.dest()...)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fleet.Errorf(fleet.ENOTFOUND, "device %q not found", device)
	} else if err != nil {
		return nil, err
	}
	return c.shadow(device)
}

// shadowColumns are shadowRead's columns.
type shadowColumns struct {
	desired, reported     sql.NullString
	version               sql.NullInt64
	desiredAt, reportedAt sql.NullInt64
}

func (c *shadowColumns) dest() []any {
	return []any{&c.desired, &c.reported, &c.version, &c.desiredAt, &c.reportedAt}
}

func (c *shadowColumns) shadow(device string) (*storedShadow, error) {
	s := &storedShadow{exists: c.desired.Valid}
	if s.exists {
		var err error
		if s.Desired, s.desired, err = parseSection(c.desired.String); err != nil {
			return nil, fmt.Errorf("device %s desired: %w", device, err)
		}
		if s.Reported, s.reported, err = parseSection(c.reported.String); err != nil {
			return nil, fmt.Errorf("device %s reported: %w", device, err)
		}
		s.Version = c.version.Int64
		s.DesiredUpdatedAt, s.ReportedUpdatedAt = optionalMillis(c.desiredAt), optionalMillis(c.reportedAt)
	} else {
		s.desired, s.reported = []byte("{}"), []byte("{}")
	}
	s.Compute()
	return s, nil
}

// parseSection reads a stored section, and writes it again as
// MarshalCanonical does: PostgreSQL's jsonb gives back text of its own
// spacing and key order, which a merge's result is compared with.
func parseSection(text string) (map[string]any, []byte, error) {
	v, err := fleet.ParseCanonical([]byte(text))
	if err != nil {
		return nil, nil, err
	}
	m, _ := v.(map[string]any)
	b, err := fleet.MarshalCanonical(m)
	return m, b, err
}

func optionalMillis(ms sql.NullInt64) *time.Time {
	if !ms.Valid {
		return nil
	}
	t := fromMillis(ms.Int64)
	return &t
}

// FindShadow returns a device's shadow.
func (db *DB) FindShadow(ctx context.Context, tenant, device string) (*fleet.Shadow, error) {
	s, err := scanShadow(db.queryRow(ctx, shadowRead, tenant, device), device)
	if err != nil {
		return nil, db.classify(err)
	}
	return &s.Shadow, nil
}

// UpdateDesired merges patch into a device's desired state, in a batch
// with the concurrent writes of other shadows (writeShadows).
func (db *DB) UpdateDesired(ctx context.Context, tenant, device string, patch map[string]any, version *int64) (*fleet.Shadow, error) {
	return db.queueShadow(ctx, &shadowCall{tenant: tenant, device: device, section: fleet.ShadowDesired, patch: patch, version: version})
}

// UpdateDesiredMany merges patch into the desired state of each device
// sel chooses, in one transaction, each change audited as UpdateDesired's.
func (db *DB) UpdateDesiredMany(ctx context.Context, tenant string, sel *fleet.Dispatch, patch map[string]any) (*fleet.FleetDesired, error) {
	out := &fleet.FleetDesired{Shadows: map[string]*fleet.Shadow{}}
	err := db.update(ctx, func(ctx context.Context, tx *Tx) error {
		s, err := db.dialect.selectionOf(ctx, tx, tenant, sel)
		if err != nil {
			return err
		}
		ids := s.ids
		if ids == nil {
			cond, args, _, err := s.where(ctx, tx)
			if err != nil {
				return err
			}
			if cond != "" {
				cond = " AND " + cond
			}
			rows, err := tx.query(ctx, "SELECT id FROM devices WHERE tenant = ?"+cond+" ORDER BY id"+limitClause(fleet.MaxFleetDesired+1),
				append([]any{tenant}, args...)...)
			if err != nil {
				return err
			}
			if ids, err = scanAll(rows, scanID); err != nil {
				return err
			}
		}
		if len(ids) > fleet.MaxFleetDesired {
			return fleet.Errorf(fleet.EINVALID, "the selection chooses more than %d devices; change them in parts (by group, metadata or ids)", fleet.MaxFleetDesired)
		}
		// The shadows are read and written, and the changes audited, a
		// chunk a statement: one device's statements at a time made ten
		// thousand devices take 50,000 round trips on PostgreSQL
		// (docs/benchmarks-notebook.md, Twin and groups).
		shadows, err := tx.lockShadows(ctx, tenant, ids)
		if err != nil {
			return err
		}
		setting := tx.updateConfigSetting(tenant)
		var writes []shadowWrite
		var audits []auditEntry
		for _, id := range ids {
			s, ok := shadows[id]
			if !ok {
				return fleet.FieldErrors(map[string]string{"device_ids": fmt.Sprintf("device %q not found; nothing was changed", id)})
			}
			sh, w, a, err := tx.applyDesired(ctx, tenant, id, s, patch, setting)
			if err != nil {
				return err
			}
			if w != nil {
				writes, audits = append(writes, *w), append(audits, *a)
			}
			out.Matched++
			if sh.DesiredChanged {
				out.Changed++
				out.Shadows[id] = sh
			}
		}
		if out.Matched == 0 {
			return fleet.Errorf(fleet.EINVALID, "no device matches the selection; nothing was changed")
		}
		if err := tx.upsertShadows(ctx, tenant, writes); err != nil {
			return err
		}
		return tx.auditMany(ctx, tenant, audits)
	})
	return out, err
}

// desiredChunk is how many devices one transaction of a desired
// rollout's release changes: a phase of any size is released in chunks
// (docs/twin.md), each with the batched statements of a fleet-wide
// change. A variable for the tests.
var desiredChunk = shadowChunk

// ReleaseDesired releases the next chunk of a desired rollout's device
// actions released and not yet handed on, as releaseDesired does, if the
// rollout may hand them on at now (no maintenance window, or the one it
// opened is open). It returns the shadows the chunk changed, whose
// devices are to be told, and whether more wait. The rollout is locked,
// so that two replicas never release one device twice; a chunk that fails
// leaves its device actions Queued for the next pass.
func (db *DB) ReleaseDesired(ctx context.Context, tenant string, id int64, now time.Time) (map[string]*fleet.Shadow, bool, error) {
	var out map[string]*fleet.Shadow
	var more bool
	err := db.update(ctx, func(ctx context.Context, tx *Tx) error {
		out, more = nil, false
		r, err := tx.rollout(ctx, tenant, id, lockWait)
		if err != nil || r.Action != fleet.ActionDesired || !desiredOpen(r, now) {
			return err
		}
		out, more, err = tx.releaseDesired(ctx, tenant, id)
		return err
	})
	if fleet.ErrorCode(err) == fleet.ENOTFOUND {
		return nil, false, nil // gone with its tenant
	}
	return out, more, err
}

// desiredOpen reports whether r's released device actions may be handed on
// at now: it has no maintenance window, or the occurrence open now is one
// the rollout opened already (StepOpenWindow hands on at a new one).
func desiredOpen(r *fleet.Rollout, now time.Time) bool {
	w := r.Schedule.MaintenanceWindow
	if w == nil {
		return true
	}
	open, occ := w.Open(now)
	return open && occ <= r.WindowOpened
}

// releaseDesired applies a desired rollout to a chunk (desiredChunk) of
// its device actions released and not yet handed on (Queued: a phase that
// just triggered, or every phase released while its maintenance window
// was shut, when it opens): its patch merges into each
// of their devices' desired state, and each device action, which no
// device is sent, is Initiated (as if delivered, with its deadline), or
// Completed when the device reports what the patch asks already
// (docs/twin.md). It returns the shadows it changed, whose devices are to
// be told, and whether more device actions wait (ReleaseDesired releases
// them, a chunk a transaction). Device actions are locked (released)
// before devices here, as status reports lock them.
func (tx *Tx) releaseDesired(ctx context.Context, tenant string, id int64) (map[string]*fleet.Shadow, bool, error) {
	var params string
	if err := tx.queryRow(ctx, "SELECT params FROM actions WHERE tenant = ? AND id = ?", tenant, id).Scan(&params); err != nil {
		return nil, false, err
	}
	patch, err := fleet.DesiredPatch([]byte(params))
	if err != nil {
		return nil, false, err
	}
	// In no order: the index by status finds a chunk at once, where an
	// order by device would sort every device still waiting at each chunk
	// (lockShadows locks the chunk's devices in order).
	rows, err := tx.query(ctx, "SELECT device_id FROM device_actions WHERE tenant = ? AND action_id = ? AND action_status = ?"+limitClause(desiredChunk+1),
		tenant, id, string(fleet.StatusQueued))
	if err != nil {
		return nil, false, err
	}
	ids, err := scanAll(rows, scanID)
	if err != nil || len(ids) == 0 {
		return nil, false, err
	}
	more := len(ids) > desiredChunk
	ids = ids[:min(len(ids), desiredChunk)]
	// Released, they are as delivered: Initiated, with the deadline of
	// the action's timeout (docs/twin.md).
	now := millis(tx.now)
	if _, err := tx.applyMove(ctx, moveDelivered, `UPDATE device_actions SET `+moveDelivered.set+`, initiated_at = ?, updated_at = ?,
		deadline = ? + 1000 * (SELECT timeout FROM actions a WHERE a.tenant = device_actions.tenant AND a.id = device_actions.action_id)
		WHERE tenant = ? AND action_id = ? AND {from} AND device_id IN (`+placeholders(len(ids))+`)`,
		append([]any{now, now, now, tenant, id}, anys(ids)...)...); err != nil {
		return nil, false, err
	}
	shadows, err := tx.lockShadows(ctx, tenant, ids)
	if err != nil {
		return nil, false, err
	}
	setting := tx.updateConfigSetting(tenant)
	changed := map[string]*fleet.Shadow{}
	var writes []shadowWrite
	var audits []auditEntry
	var reports []fleet.StatusReport
	for _, dev := range ids {
		s, ok := shadows[dev]
		if !ok {
			continue // deleted since: its device action went with it
		}
		sh, w, a, err := tx.applyDesired(ctx, tenant, dev, s, patch, setting)
		if err != nil {
			return nil, false, err
		}
		if w != nil {
			writes, audits = append(writes, *w), append(audits, *a)
		}
		if sh.DesiredChanged {
			changed[dev] = sh
		}
		if fleet.DesiredMet(patch, sh.Reported) {
			reports = append(reports, fleet.StatusReport{DeviceID: dev, ActionID: id, State: string(fleet.StatusCompleted)})
		}
	}
	if err := tx.upsertShadows(ctx, tenant, writes); err != nil {
		return nil, false, err
	}
	if err := tx.auditMany(ctx, tenant, audits); err != nil {
		return nil, false, err
	}
	_, err = tx.applyReports(ctx, tenant, reports, tx.db.advanceable(reports))
	return changed, more, err
}

// DesiredWaiting lists the device's desired rollouts' device actions that
// wait for its reported state (Initiated or Progress), with their patches.
func (db *DB) DesiredWaiting(ctx context.Context, tenant, device string) ([]fleet.DesiredWait, error) {
	rows, err := db.query(ctx, `SELECT da.action_id, a.params FROM device_actions da JOIN actions a ON a.tenant = da.tenant AND a.id = da.action_id
		WHERE da.tenant = ? AND da.device_id = ? AND da.action_status IN (?, ?) AND da.type = ? ORDER BY da.action_id`,
		tenant, device, string(fleet.StatusInitiated), string(fleet.StatusProgress), fleet.ActionDesired)
	if err != nil {
		return nil, db.classify(err)
	}
	ws, err := scanAll(rows, func(s scanner) (fleet.DesiredWait, error) {
		var w fleet.DesiredWait
		var params string
		if err := s.Scan(&w.ActionID, &params); err != nil {
			return w, err
		}
		w.Patch, err = fleet.DesiredPatch([]byte(params))
		return w, err
	})
	return ws, db.classify(err)
}

// shadowChunk is how many devices' shadows one statement reads or
// writes: 8 parameters a row, within both databases' limits.
const shadowChunk = 500

// lockShadows reads the shadows of devices to change them, a chunk a
// statement; a device not found is not in the result. On PostgreSQL it
// locks the devices' rows first, so that writers of one shadow take turns
// (the shadow's own row may not exist yet).
func (tx *Tx) lockShadows(ctx context.Context, tenant string, devices []string) (map[string]*storedShadow, error) {
	sorted := slices.Clone(devices)
	slices.Sort(sorted) // rows locked in one order, as every writer does
	out := make(map[string]*storedShadow, len(devices))
	for start := 0; start < len(sorted); start += shadowChunk {
		chunk := sorted[start:min(start+shadowChunk, len(sorted))]
		if tx.db.dialect == sqlite {
			chunk = padRows(chunk, 1) // a repeated id matches its row once
		}
		cond, args := tx.db.dialect.anyOf("d.id", chunk)
		args = append([]any{tenant}, args...)
		// Locked first, then read: a read that waits for a lock reads
		// the joined shadow as it was before (a lost update).
		if f := tx.db.dialect.forUpdate(); f != "" {
			if _, err := queryStrings(ctx, tx, "SELECT d.id FROM devices d WHERE d.tenant = ? AND "+cond+" ORDER BY d.id"+f, args...); err != nil {
				return nil, err
			}
		}
		rows, err := tx.query(ctx, `SELECT d.id, s.desired, s.reported, s.version, s.desired_updated_at, s.reported_updated_at
			FROM devices d LEFT JOIN device_shadows s ON s.tenant = d.tenant AND s.device_id = d.id
			WHERE d.tenant = ? AND `+cond, args...)
		if err != nil {
			return nil, err
		}
		err = func() error {
			defer rows.Close()
			for rows.Next() {
				var id string
				var c shadowColumns
				if err := rows.Scan(append([]any{&id}, c.dest()...)...); err != nil {
					return err
				}
				if out[id], err = c.shadow(id); err != nil {
					return err
				}
			}
			return rows.Err()
		}()
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

func scanID(s scanner) (string, error) {
	var id string
	return id, s.Scan(&id)
}

// applyDesired merges patch into s, the device's shadow read to change
// it, and dispatches update_config if the tenant's setting asks for it;
// it returns the shadow, the row to write and the change to audit, nil
// if the patch changed nothing.
func (tx *Tx) applyDesired(ctx context.Context, tenant, device string, s *storedShadow, patch map[string]any,
	setting func(context.Context) (bool, error)) (*fleet.Shadow, *shadowWrite, *auditEntry, error) {
	previous := s.Desired
	text, changed, err := mergeSection(fleet.ShadowDesired, &s.Desired, s.desired, patch)
	if err != nil || !changed {
		return &s.Shadow, nil, nil, err
	}
	a, err := tx.desiredMerged(ctx, tenant, device, s, text, previous, patch, setting)
	if err != nil {
		return nil, nil, nil, err
	}
	w := tx.rowOf(device, s)
	return &s.Shadow, &w, a, nil
}

// desiredMerged completes a change of s's desired state, whose merge
// gave text from previous: the version moves, the delta is computed
// again, update_config is dispatched if the tenant's setting asks for it;
// it returns the change to audit.
func (tx *Tx) desiredMerged(ctx context.Context, tenant, device string, s *storedShadow, text []byte, previous, patch map[string]any,
	setting func(context.Context) (bool, error)) (*auditEntry, error) {
	s.desired = text
	s.Version++
	now := fromMillis(millis(tx.now))
	s.DesiredUpdatedAt = &now
	if err := s.recompute(); err != nil {
		return nil, err
	}
	out := &s.Shadow
	out.DesiredChanged = true
	var err error
	if out.Dispatched, err = tx.updateConfig(ctx, tenant, device, out, setting); err != nil {
		return nil, err
	}
	return &auditEntry{action: "device.shadow.update", target: "devices/" + device,
		details: map[string]any{"desired": patch, "previous": previous, "version": s.Version}}, nil
}

// updateConfigSetting returns a reader of the tenant's update_config
// setting that reads it once, when first asked.
func (tx *Tx) updateConfigSetting(tenant string) func(context.Context) (bool, error) {
	var on, read bool
	return func(ctx context.Context) (bool, error) {
		if !read {
			if err := tx.queryRow(ctx, "SELECT shadow_update_config FROM tenants WHERE name = ?", tenant).Scan(&on); err != nil {
				return false, err
			}
			read = true
		}
		return on, nil
	}
}

// updateConfig dispatches to the device, in the transaction of a change
// of its desired state, an update_config action whose params are the whole
// desired state, if the tenant asked for it and the change leaves the
// device out of sync; it returns the action, nil for none. It is an
// ordinary action (docs/twin.md), with the timeout of a dispatch that names
// none: a device's timeout starts when it receives the action.
func (tx *Tx) updateConfig(ctx context.Context, tenant, device string, sh *fleet.Shadow, setting func(context.Context) (bool, error)) (*fleet.Action, error) {
	if sh.InSync {
		return nil, nil
	}
	if on, err := setting(ctx); err != nil || !on {
		return nil, err
	}
	params, err := fleet.MarshalCanonical(sh.Desired)
	if err != nil {
		return nil, err
	}
	d := &fleet.Dispatch{Action: fleet.ActionUpdateConfig, Params: params, SearchType: fleet.SearchDefault, DeviceIDs: []string{device},
		Timeout: fleet.DefaultActionTimeout}
	if a := fleet.ActorFromContext(ctx); a != nil {
		d.UserEmail, d.UserName = a.UserEmail, a.UserName
	}
	return tx.dispatch(ctx, tenant, d, selection{ids: d.DeviceIDs}, false)
}

// shadowSettings are a tenant's choices about shadows.
var shadowSettings = tenantSettings[fleet.ShadowSettings]{
	columns:  []string{"shadow_update_config"},
	fields:   func(s *fleet.ShadowSettings) []any { return []any{&s.UpdateConfig} },
	audit:    "tenant.shadow_settings",
	resource: "shadow-settings",
}

// ShadowSettings reads a tenant's choices about shadows.
func (db *DB) ShadowSettings(ctx context.Context, tenant string) (fleet.ShadowSettings, error) {
	return shadowSettings.read(ctx, db, tenant)
}

// SetShadowSettings replaces a tenant's choices about shadows, audited
// with the previous ones.
func (db *DB) SetShadowSettings(ctx context.Context, tenant string, s fleet.ShadowSettings) error {
	return shadowSettings.write(ctx, db, tenant, s)
}

// UpdateReported merges patch into a device's reported state. What the
// device reports is its data, not a change made through the API: it is
// not audited.
func (db *DB) UpdateReported(ctx context.Context, tenant, device string, patch map[string]any) (*fleet.Shadow, error) {
	return db.queueShadow(ctx, &shadowCall{tenant: tenant, device: device, section: fleet.ShadowReported, patch: patch})
}

// ReportPoint merges the data of p, a point of the device's stream kept
// already, into its reported state, unless the stream's latest point is
// newer. The latest is read once the shadow is locked: of two batches,
// the older merges only if it does so before the newer is kept, and the
// newer then merges after it.
func (db *DB) ReportPoint(ctx context.Context, tenant, device, stream string, p *fleet.DataPoint) (*fleet.Shadow, error) {
	return db.queueShadow(ctx, &shadowCall{tenant: tenant, device: device, section: fleet.ShadowReported, patch: p.Data,
		current: func(ctx context.Context, tx *Tx) (bool, error) {
			var ts, seq int64
			err := tx.queryRow(ctx, "SELECT ts, seq FROM stream_latest WHERE tenant = ? AND device_id = ? AND stream = ?",
				tenant, device, stream).Scan(&ts, &seq)
			if errors.Is(err, sql.ErrNoRows) {
				return true, nil
			} else if err != nil {
				return false, err
			}
			at := millis(p.Timestamp)
			return ts < at || ts == at && seq <= p.Sequence, nil
		}})
}

// mergeSection applies patch to *section, checks the result and returns
// its JSON text and whether it differs from old, the text before.
func mergeSection(name string, section *map[string]any, old []byte, patch map[string]any) ([]byte, bool, error) {
	merged := fleet.MergePatch(*section, patch)
	if err := fleet.CheckShadowSection(name, merged); err != nil {
		return nil, false, err
	}
	text, err := fleet.MarshalCanonical(merged)
	if err != nil {
		return nil, false, err
	}
	*section = merged
	return text, !bytes.Equal(text, old), nil
}

// shadowWrite is a device_shadows row to store.
type shadowWrite struct {
	device, desired, reported string
	version                   int64
	inSync                    bool
	desiredAt, reportedAt     *int64
}

// recompute computes s's delta again, and whether it changed.
func (s *storedShadow) recompute() error {
	before, err := fleet.MarshalCanonical(s.Delta)
	if err != nil {
		return err
	}
	s.Compute()
	after, err := fleet.MarshalCanonical(s.Delta)
	if err != nil {
		return err
	}
	s.DeltaChanged = !bytes.Equal(before, after)
	return nil
}

// rowOf returns s's row, its delta computed already.
func (tx *Tx) rowOf(device string, s *storedShadow) shadowWrite {
	return shadowWrite{device: device, desired: tx.db.dialect.sectionText(s.desired, s.Desired), reported: tx.db.dialect.sectionText(s.reported, s.Reported),
		version: s.Version, inSync: s.InSync, desiredAt: nullMillis(s.DesiredUpdatedAt), reportedAt: nullMillis(s.ReportedUpdatedAt)}
}

// upsertShadows stores rows, a chunk a statement, each device at most
// once. On PostgreSQL the statement takes a column's values as an array
// (unnestTable), so that it has one text whatever the number of rows; on
// SQLite, whose statements are no round trips, rows of VALUES, as many as
// a size class (padRows).
func (tx *Tx) upsertShadows(ctx context.Context, tenant string, rows []shadowWrite) error {
	const upsert = `INSERT INTO device_shadows (tenant, device_id, desired, reported, version, in_sync, desired_updated_at, reported_updated_at) `
	const conflict = `
		ON CONFLICT (tenant, device_id) DO UPDATE SET desired = excluded.desired, reported = excluded.reported, version = excluded.version,
			in_sync = excluded.in_sync, desired_updated_at = excluded.desired_updated_at, reported_updated_at = excluded.reported_updated_at`
	cols := []string{"device_id", "desired", "reported", "version", "in_sync", "desired_at", "reported_at"}
	for start := 0; start < len(rows); start += shadowChunk {
		chunk := rows[start:min(start+shadowChunk, len(rows))]
		if tx.db.dialect == sqlite {
			chunk = padRows(chunk, 8) // the same row twice is written twice
		}
		args := make([]any, 0, len(cols)*len(chunk))
		for _, w := range chunk {
			args = append(args, w.device, w.desired, w.reported, w.version, w.inSync, orNull(w.desiredAt), orNull(w.reportedAt))
		}
		var err error
		if tx.db.dialect == postgres {
			table, arrays := unnestTable("u", cols, []string{"TEXT", "", "", "BIGINT", "BOOLEAN", "BIGINT", "BIGINT"}, args)
			_, err = tx.exec(ctx, upsert+`SELECT CAST(? AS TEXT), u.device_id, CAST(u.desired AS JSONB), CAST(u.reported AS JSONB),
				u.version, u.in_sync, u.desired_at, u.reported_at FROM `+table+conflict, append([]any{tenant}, arrays...)...)
		} else {
			values := make([]any, 0, len(args)+len(chunk))
			for r := range chunk {
				values = append(append(values, tenant), args[r*len(cols):(r+1)*len(cols)]...)
			}
			_, err = tx.exec(ctx, upsert+"VALUES "+strings.TrimSuffix(strings.Repeat("(?, ?, ?, ?, ?, ?, ?, ?), ", len(chunk)), ", ")+conflict, values...)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// padRows returns rows, of width parameters each, with its last repeated
// up to a size class (sizeClass, or a multiple of 64 beyond its sizes,
// within SQLite's 32,766 parameters), so that a batched statement has few
// texts, which stay prepared.
func padRows[T any](rows []T, width int) []T {
	n := len(rows)
	if n == 0 {
		return rows
	}
	c := sizeClass(n)
	if n > reportChunk {
		c = (n + 63) / 64 * 64
	}
	if c*width > 32766 {
		return rows
	}
	out := slices.Grow(rows[:n:n], c-n)
	for range c - n {
		out = append(out, rows[n-1])
	}
	return out
}

// sectionText is the text a section, of canonical text and value v, is
// stored as. PostgreSQL's jsonb keeps a number as a numeric, which writes
// a float from 2^53 on, whose canonical text has an exponent
// (3.551759552515556e+17), back in digits without a point
// (355175955251555600): an integer, read back, and a change to the text
// of an identical document. Such floats are given to PostgreSQL in digits
// with ".0", whose scale a numeric keeps, so they come back as floats.
func (d dialect) sectionText(text []byte, v map[string]any) string {
	if d != postgres || !bytes.ContainsAny(text, "eE") {
		return string(text)
	}
	b, err := fleet.MarshalCanonical(pointedFloats(v))
	if err != nil {
		return string(text) // v was marshalled as text already
	}
	return string(b)
}

// pointedFloats returns v with its floats of 2^53 or more as JSON numbers
// in digits with ".0".
func pointedFloats(v any) any {
	switch v := v.(type) {
	case float64:
		if math.Abs(v) >= 1<<53 && !math.IsInf(v, 0) {
			return json.Number(strconv.FormatFloat(v, 'f', -1, 64) + ".0")
		}
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = pointedFloats(e)
		}
		return out
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, e := range v {
			out[k] = pointedFloats(e)
		}
		return out
	}
	return v
}

// orNull is *p, or nil (NULL) for nil.
func orNull(p *int64) any {
	if p == nil {
		return nil
	}
	return *p
}

func nullMillis(t *time.Time) *int64 {
	if t == nil {
		return nil
	}
	ms := millis(*t)
	return &ms
}
