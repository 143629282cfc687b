package sqlstore

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
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
	var desired, reported sql.NullString
	var version sql.NullInt64
	var desiredAt, reportedAt sql.NullInt64
	err := row.Scan(&desired, &reported, &version, &desiredAt, &reportedAt)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fleet.Errorf(fleet.ENOTFOUND, "device %q not found", device)
	} else if err != nil {
		return nil, err
	}
	s := &storedShadow{exists: desired.Valid}
	if s.exists {
		if s.Desired, s.desired, err = parseSection(desired.String); err != nil {
			return nil, fmt.Errorf("device %s desired: %w", device, err)
		}
		if s.Reported, s.reported, err = parseSection(reported.String); err != nil {
			return nil, fmt.Errorf("device %s reported: %w", device, err)
		}
		s.Version = version.Int64
		s.DesiredUpdatedAt, s.ReportedUpdatedAt = optionalMillis(desiredAt), optionalMillis(reportedAt)
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

// UpdateDesired merges patch into a device's desired state.
func (db *DB) UpdateDesired(ctx context.Context, tenant, device string, patch map[string]any, version *int64) (*fleet.Shadow, error) {
	var out *fleet.Shadow
	err := db.update(ctx, func(ctx context.Context, tx *Tx) error {
		var err error
		out, err = tx.updateDesired(ctx, tenant, device, patch, version)
		return err
	})
	return out, err
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
			rows, err := tx.query(ctx, "SELECT id FROM devices WHERE tenant = ?"+cond+" ORDER BY id LIMIT ?",
				append(append([]any{tenant}, args...), fleet.MaxFleetDesired+1)...)
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
		for _, id := range ids {
			sh, err := tx.updateDesired(ctx, tenant, id, patch, nil)
			if fleet.ErrorCode(err) == fleet.ENOTFOUND {
				return fleet.FieldErrors(map[string]string{"device_ids": fmt.Sprintf("device %q not found; nothing was changed", id)})
			} else if err != nil {
				return err
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
		return nil
	})
	return out, err
}

// releaseDesired applies a desired rollout to its device actions released
// and not yet handed on (Queued: a phase that just triggered, or every
// phase released while its maintenance window was shut, when it opens):
// its patch merges into each of their devices' desired state, and each device
// action, which no device is sent, is Initiated (as if delivered, with its
// deadline), or Completed when the device reports what the patch asks
// already (docs/twin.md). It returns
// the shadows it changed, whose devices are to be told. Device actions are
// locked (released) before devices here, as status reports lock them.
func (tx *Tx) releaseDesired(ctx context.Context, tenant string, id int64) (map[string]*fleet.Shadow, error) {
	var params string
	if err := tx.queryRow(ctx, "SELECT params FROM actions WHERE tenant = ? AND id = ?", tenant, id).Scan(&params); err != nil {
		return nil, err
	}
	patch, err := fleet.DesiredPatch([]byte(params))
	if err != nil {
		return nil, err
	}
	rows, err := tx.query(ctx, "SELECT device_id FROM device_actions WHERE tenant = ? AND action_id = ? AND action_status = ? ORDER BY device_id",
		tenant, id, string(fleet.StatusQueued))
	if err != nil {
		return nil, err
	}
	ids, err := scanAll(rows, scanID)
	if err != nil {
		return nil, err
	}
	// Released, they are as delivered: Initiated, with the deadline of
	// the action's timeout (docs/twin.md).
	now := millis(tx.now)
	if _, err := tx.applyMove(ctx, moveDelivered, `UPDATE device_actions SET `+moveDelivered.set+`, initiated_at = ?, updated_at = ?,
		deadline = ? + 1000 * (SELECT timeout FROM actions a WHERE a.tenant = device_actions.tenant AND a.id = device_actions.action_id)
		WHERE tenant = ? AND action_id = ? AND {from}`, now, now, now, tenant, id); err != nil {
		return nil, err
	}
	changed := map[string]*fleet.Shadow{}
	var reports []fleet.StatusReport
	for _, dev := range ids {
		sh, err := tx.updateDesired(ctx, tenant, dev, patch, nil)
		if err != nil {
			return nil, err
		}
		if sh.DesiredChanged {
			changed[dev] = sh
		}
		if fleet.DesiredMet(patch, sh.Reported) {
			reports = append(reports, fleet.StatusReport{DeviceID: dev, ActionID: id, State: string(fleet.StatusCompleted)})
		}
	}
	_, err = tx.applyReports(ctx, tenant, reports)
	return changed, err
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

func scanID(s scanner) (string, error) {
	var id string
	return id, s.Scan(&id)
}

// updateDesired is UpdateDesired inside a transaction.
func (tx *Tx) updateDesired(ctx context.Context, tenant, device string, patch map[string]any, version *int64) (*fleet.Shadow, error) {
	var out *fleet.Shadow
	err := func() error {
		s, err := tx.lockShadow(ctx, tenant, device)
		if err != nil {
			return err
		}
		if version != nil && *version != s.Version {
			return fleet.Errorf(fleet.ECONFLICT, "the shadow of device %q is at version %d, not %d: read it again and reapply the change", device, s.Version, *version)
		}
		previous := s.Desired
		text, changed, err := mergeSection(fleet.ShadowDesired, &s.Desired, s.desired, patch)
		if err != nil || !changed {
			out = &s.Shadow
			return err
		}
		s.desired = text
		s.Version++
		now := fromMillis(millis(tx.now))
		s.DesiredUpdatedAt = &now
		if err := tx.writeShadow(ctx, tenant, device, s); err != nil {
			return err
		}
		out = &s.Shadow
		out.DesiredChanged = true
		if out.Dispatched, err = tx.updateConfig(ctx, tenant, device, out); err != nil {
			return err
		}
		return tx.audit(ctx, tenant, "device.shadow.update", "devices/"+device,
			map[string]any{"desired": patch, "previous": previous, "version": s.Version})
	}()
	return out, err
}

// updateConfig dispatches to the device, in the transaction of a change
// of its desired state, an update_config action whose params are the whole
// desired state, if the tenant asked for it and the change leaves the
// device out of sync; it returns the action, nil for none.
func (tx *Tx) updateConfig(ctx context.Context, tenant, device string, sh *fleet.Shadow) (*fleet.Action, error) {
	if sh.InSync {
		return nil, nil
	}
	var on bool
	if err := tx.queryRow(ctx, "SELECT shadow_update_config FROM tenants WHERE name = ?", tenant).Scan(&on); err != nil || !on {
		return nil, err
	}
	params, err := fleet.MarshalCanonical(sh.Desired)
	if err != nil {
		return nil, err
	}
	d := &fleet.Dispatch{Action: fleet.ActionUpdateConfig, Params: params, SearchType: fleet.SearchDefault, DeviceIDs: []string{device}}
	if a := fleet.ActorFromContext(ctx); a != nil {
		d.UserEmail, d.UserName = a.UserEmail, a.UserName
	}
	return tx.dispatch(ctx, tenant, d, selection{ids: d.DeviceIDs}, false)
}

// ShadowSettings reads a tenant's choices about shadows.
func (db *DB) ShadowSettings(ctx context.Context, tenant string) (fleet.ShadowSettings, error) {
	var s fleet.ShadowSettings
	err := db.queryRow(ctx, "SELECT shadow_update_config FROM tenants WHERE name = ?", tenant).Scan(&s.UpdateConfig)
	if errors.Is(err, sql.ErrNoRows) {
		return s, fleet.Errorf(fleet.ENOTFOUND, "tenant %q not found", tenant)
	}
	return s, db.classify(err)
}

// SetShadowSettings replaces a tenant's choices about shadows, audited
// with the previous ones.
func (db *DB) SetShadowSettings(ctx context.Context, tenant string, s fleet.ShadowSettings) error {
	return db.update(ctx, func(ctx context.Context, tx *Tx) error {
		var previous fleet.ShadowSettings
		err := tx.queryRow(ctx, "SELECT shadow_update_config FROM tenants WHERE name = ?"+tx.db.dialect.forUpdate(), tenant).Scan(&previous.UpdateConfig)
		if errors.Is(err, sql.ErrNoRows) {
			return fleet.Errorf(fleet.ENOTFOUND, "tenant %q not found", tenant)
		} else if err != nil {
			return err
		}
		if _, err := tx.exec(ctx, "UPDATE tenants SET shadow_update_config = ? WHERE name = ?", s.UpdateConfig, tenant); err != nil {
			return err
		}
		return tx.audit(ctx, tenant, "tenant.shadow_settings", "tenants/"+tenant, map[string]any{"settings": s, "previous": previous})
	})
}

// UpdateReported merges patch into a device's reported state. What the
// device reports is its data, not a change made through the API: it is
// not audited.
func (db *DB) UpdateReported(ctx context.Context, tenant, device string, patch map[string]any) (*fleet.Shadow, error) {
	return db.updateReported(ctx, tenant, device, patch, nil)
}

// ReportPoint merges the data of p, a point of the device's stream kept
// already, into its reported state, unless the stream's latest point is
// newer. The latest is read once the shadow is locked: of two batches,
// the older merges only if it does so before the newer is kept, and the
// newer then merges after it.
func (db *DB) ReportPoint(ctx context.Context, tenant, device, stream string, p *fleet.DataPoint) (*fleet.Shadow, error) {
	return db.updateReported(ctx, tenant, device, p.Data, func(ctx context.Context, tx *Tx) (bool, error) {
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
	})
}

// updateReported merges patch into a device's reported state if current,
// when given, says the patch is still current.
func (db *DB) updateReported(ctx context.Context, tenant, device string, patch map[string]any,
	current func(ctx context.Context, tx *Tx) (bool, error)) (*fleet.Shadow, error) {
	var out *fleet.Shadow
	err := db.update(ctx, func(ctx context.Context, tx *Tx) error {
		s, err := tx.lockShadow(ctx, tenant, device)
		if err != nil {
			return err
		}
		if current != nil {
			if ok, err := current(ctx, tx); err != nil || !ok {
				out = &s.Shadow
				return err
			}
		}
		text, changed, err := mergeSection(fleet.ShadowReported, &s.Reported, s.reported, patch)
		if err != nil {
			return err
		}
		s.reported = text
		now := fromMillis(millis(tx.now))
		s.ReportedUpdatedAt = &now
		if !changed && s.exists {
			// The time still moves: a device that reports the same state
			// says it is still in it.
			_, err := tx.exec(ctx, "UPDATE device_shadows SET reported_updated_at = ? WHERE tenant = ? AND device_id = ?", millis(now), tenant, device)
			out = &s.Shadow
			return err
		}
		out = &s.Shadow
		return tx.writeShadow(ctx, tenant, device, s)
	})
	return out, err
}

// lockShadow reads a device's shadow to change it; on PostgreSQL it locks
// the device's row first, so that writers of one shadow take turns (the
// shadow's own row may not exist yet).
func (tx *Tx) lockShadow(ctx context.Context, tenant, device string) (*storedShadow, error) {
	if f := tx.db.dialect.forUpdate(); f != "" {
		var one int
		err := tx.queryRow(ctx, "SELECT 1 FROM devices WHERE tenant = ? AND id = ?"+f, tenant, device).Scan(&one)
		if errors.Is(err, sql.ErrNoRows) {
			return nil, fleet.Errorf(fleet.ENOTFOUND, "device %q not found", device)
		} else if err != nil {
			return nil, err
		}
	}
	return scanShadow(tx.queryRow(ctx, shadowRead, tenant, device), device)
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

// writeShadow stores s, with its delta computed again.
func (tx *Tx) writeShadow(ctx context.Context, tenant, device string, s *storedShadow) error {
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
	_, err = tx.exec(ctx, `INSERT INTO device_shadows (tenant, device_id, desired, reported, version, in_sync, desired_updated_at, reported_updated_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (tenant, device_id) DO UPDATE SET desired = excluded.desired, reported = excluded.reported, version = excluded.version,
			in_sync = excluded.in_sync, desired_updated_at = excluded.desired_updated_at, reported_updated_at = excluded.reported_updated_at`,
		tenant, device, tx.db.dialect.sectionText(s.desired, s.Desired), tx.db.dialect.sectionText(s.reported, s.Reported),
		s.Version, s.InSync, nullMillis(s.DesiredUpdatedAt), nullMillis(s.ReportedUpdatedAt))
	return err
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

func nullMillis(t *time.Time) any {
	if t == nil {
		return nil
	}
	return millis(*t)
}
