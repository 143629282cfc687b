package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/fleetd/fleet"
)

var _ fleet.GroupService = (*DB)(nil)

// selectorConds are the conditions on the devices table, for devicesWhere,
// that choose the devices a selector does. A metadata key equal to a value
// is read through the index of metadata search (metadataIs), so a group
// of one such requirement is counted as fast as that search; the other
// requirements are checked on each device read.
func (d dialect) selectorConds(tenant string, sel fleet.Selector) []deviceCond {
	cs := make([]deviceCond, 0, len(sel))
	for _, r := range sel {
		if r.Op == fleet.OpEquals && r.ReportedPath() == nil {
			cs = append(cs, d.metadataIs(tenant, r.Key, r.Values[0]))
			continue
		}
		cond, args := d.requirementHolds(r)
		if r.Negated() {
			cond = "NOT " + cond
		}
		cs = append(cs, deviceCond{scan: cond, scanArgs: args})
	}
	return cs
}

// requirementHolds is SQL, never NULL, that is true for a device that has
// r's key with one of r's values (=, !=, in, notin) or at all (exists, !).
func (d dialect) requirementHolds(r fleet.Requirement) (string, []any) {
	values := ""
	if len(r.Values) > 0 {
		values = " IN (" + placeholders(len(r.Values)) + ")"
	}
	vargs := make([]any, len(r.Values))
	for i, v := range r.Values {
		vargs[i] = v
	}
	if path := r.ReportedPath(); path != nil {
		cond, args := d.reportedHolds(path, r.Values)
		return "EXISTS (SELECT 1 FROM device_shadows s WHERE s.tenant = devices.tenant AND s.device_id = devices.id AND " + cond + ")", args
	}
	if d == postgres {
		if values == "" {
			return "(metadata ->> ?) IS NOT NULL", []any{r.Key}
		}
		return "coalesce((metadata ->> ?)" + values + ", false)", append([]any{r.Key}, vargs...)
	}
	if values == "" {
		return "EXISTS (SELECT 1 FROM json_each(metadata) e WHERE e.key = ?)", []any{r.Key}
	}
	return "EXISTS (SELECT 1 FROM json_each(metadata) e WHERE e.key = ? AND e.value" + values + ")", append([]any{r.Key}, vargs...)
}

// reportedHolds is the condition on device_shadows s that its reported
// state has a value at path, one of values if any are given: a number by
// value, as a 64-bit float, when the value in the selector is a number
// too (reported.n=7 and reported.n=7.0 both hold for 7 and for 7.0, and
// 1.5e20 for 150000000000000000000); a string as it is; a boolean as
// true or false. An object or array has no value to compare. The two
// databases write numbers as text in their own ways (SQLite 1.5e+20,
// PostgreSQL's jsonb 150000000000000000000), so numbers are compared as
// numbers, never as text (docs/twin.md).
func (d dialect) reportedHolds(path []string, values []string) (string, []any) {
	p := `$."` + strings.Join(path, `"."`) + `"`
	// value is SQL of the value at path (SQLite's json_extract, jsonb on
	// PostgreSQL), kind its JSON type, each taking p as their argument.
	value, kind := "json_extract(s.reported, ?)", "json_type(s.reported, ?)"
	number, texts := "json_type(s.reported, ?) IN ('integer', 'real')", "(CASE json_type(s.reported, ?) WHEN 'true' THEN 'true' WHEN 'false' THEN 'false' WHEN 'text' THEN json_extract(s.reported, ?) END)"
	textArgs, asFloat, no := []any{p, p}, "CAST("+value+" AS REAL)", "0"
	if d == postgres {
		// A strict JSON path, as SQLite's: each level is an object's
		// key, never an array's index (#> takes "0" for either), and a
		// level that is not there is no value (silent: NULL, not an
		// error). Segments are [A-Za-z0-9_:-] (ParseSelector).
		p = "strict " + p
		value = "jsonb_path_query_first(s.reported, CAST(? AS jsonpath), '{}', true)"
		kind = value
		number = "jsonb_typeof(" + value + ") = 'number'"
		texts = "(CASE WHEN jsonb_typeof(" + value + ") IN ('string', 'boolean') THEN " + value + " #>> '{}' END)"
		textArgs, asFloat, no = []any{p, p}, "CAST("+value+" #>> '{}' AS double precision)", "false"
	}
	if len(values) == 0 {
		return kind + " IS NOT NULL", []any{p}
	}
	var nums []any
	strs := make([]any, len(values))
	for i, v := range values {
		strs[i] = v
		if f, err := strconv.ParseFloat(v, 64); err == nil && !math.IsInf(f, 0) {
			nums = append(nums, f)
		}
	}
	numbers := no
	numArgs := []any{}
	if len(nums) > 0 {
		numbers = asFloat + " IN (" + placeholders(len(nums)) + ")"
		numArgs = append([]any{p}, nums...)
	}
	cond := "(CASE WHEN " + number + " THEN " + numbers + " ELSE coalesce(" + texts + " IN (" + placeholders(len(strs)) + "), " + no + ") END)"
	args := append(append(append([]any{p}, numArgs...), textArgs...), strs...)
	return cond, args
}

// shadowSync is the condition of FindDevices' shadow filter: devices whose
// shadow's delta is empty (in_sync; a device without a shadow is), or not.
func shadowSync(tenant string, inSync bool) deviceCond {
	c := "EXISTS (SELECT 1 FROM device_shadows s WHERE s.tenant = devices.tenant AND s.device_id = devices.id AND NOT s.in_sync)"
	if inSync {
		return deviceCond{scan: "NOT " + c}
	}
	// The devices out of sync are found, and up to indexedMost counted,
	// through the partial index of migration 0031: the overview counts
	// them at every refresh.
	from := " FROM device_shadows WHERE tenant = ? AND NOT in_sync"
	return deviceCond{scan: c, indexed: "id IN (SELECT device_id" + from + ")", indexedArgs: []any{tenant},
		probe: "SELECT device_id" + from, probeArgs: []any{tenant}, exact: true}
}

// findDevicesWhere lists a page of the devices of tenant that all of cs
// choose, by id, and counts them.
//
// One condition that its index chooses exactly (a search, a metadata
// value, the devices out of sync) and that chooses indexedMost devices at
// most is read through its index once: the probe's ids are the count, and
// the page is read from them by primary key. Read as a condition, the
// index would be read twice, by the probe and again by the page; where a
// term is common in other tenants, each read is theirs too
// (docs/benchmarks-notebook.md, "Device search across tenants").
func (db *DB) findDevicesWhere(ctx context.Context, tenant string, cs []deviceCond, p fleet.Page) ([]*fleet.Device, int, error) {
	tx, err := db.readTx(ctx)
	if err != nil {
		return nil, 0, err
	}
	defer tx.Rollback()
	if len(cs) == 1 && cs[0].indexed != "" && cs[0].exact {
		ids, err := probeIDs(ctx, tx, cs[0])
		if err != nil {
			return nil, 0, db.classify(err)
		}
		if len(ids) <= indexedMost {
			devs, err := devicesByID(ctx, tx, db.dialect, tenant, ids, p)
			return devs, len(ids), db.classify(err)
		}
		// More than the index serves: every device is checked.
		cs = []deviceCond{{scan: cs[0].scan, scanArgs: cs[0].scanArgs}}
	}
	cond, args, n, err := devicesWhere(ctx, tx, cs)
	if err != nil {
		return nil, 0, db.classify(err)
	}
	args = append([]any{tenant}, args...)
	if n < 0 {
		if err := tx.queryRow(ctx, "SELECT count(*) FROM devices WHERE tenant = ? AND "+cond, args...).Scan(&n); err != nil {
			return nil, 0, db.classify(err)
		}
	}
	rows, err := tx.query(ctx, "SELECT "+deviceColumns+" FROM devices WHERE tenant = ? AND "+cond+" ORDER BY id"+limitClause(pageLimit(p.Limit))+" OFFSET ?",
		append(args, p.Offset())...)
	if err != nil {
		return nil, 0, db.classify(err)
	}
	devs, err := scanPage(rows, p.Limit, scanDevice)
	return devs, n, db.classify(err)
}

// probeIDs reads the ids of the devices c's probe reads, indexedMost + 1
// at most.
func probeIDs(ctx context.Context, q querier, c deviceCond) ([]string, error) {
	rows, err := q.query(ctx, c.probe+limitClause(indexedMost+1), c.probeArgs...)
	if err != nil {
		return nil, err
	}
	return scanAll(rows, func(s scanner) (string, error) {
		var id string
		return id, s.Scan(&id)
	})
}

// devicesByID reads page p, by id, of the devices of tenant among ids,
// sorting the ids and reading only the page's devices. SQLite compares
// text as Go does (BINARY: bytes); PostgreSQL compares the array's
// elements with the database's collation, the ids' own (devices.id has no
// other), so it sorts them there. Read with ORDER BY id LIMIT, PostgreSQL
// read all of them by the primary key and then sorted them: half the
// cost of the probe at 1,009 ids (docs/benchmarks-notebook.md, "Device
// search across tenants").
func devicesByID(ctx context.Context, q querier, d dialect, tenant string, ids []string, p fleet.Page) ([]*fleet.Device, error) {
	if p.Limit == 0 || p.Offset() >= len(ids) {
		return []*fleet.Device{}, nil
	}
	var in string
	var args []any
	if d == postgres {
		in, args = "id = ANY(ARRAY(SELECT u FROM unnest(CAST(? AS TEXT[])) AS u ORDER BY u"+limitClause(pageLimit(p.Limit))+" OFFSET ?))", []any{ids, p.Offset()}
	} else {
		ids = slices.Sorted(slices.Values(ids))
		in, args = d.anyOf("id", ids[p.Offset():min(p.Offset()+p.Limit, len(ids))])
	}
	rows, err := q.query(ctx, "SELECT "+deviceColumns+" FROM devices WHERE tenant = ? AND "+in+" ORDER BY id", append([]any{tenant}, args...)...)
	if err != nil {
		return nil, err
	}
	return scanPage(rows, p.Limit, scanDevice)
}

const groupColumns = "name, selector, description, created_at, updated_at"

func scanGroup(s scanner) (*fleet.Group, error) {
	var g fleet.Group
	var created, updated int64
	if err := s.Scan(&g.Name, &g.Selector, &g.Description, &created, &updated); err != nil {
		return nil, err
	}
	g.CreatedAt, g.UpdatedAt = fromMillis(created), fromMillis(updated)
	return &g, nil
}

// canonicalSelector parses a group's selector and writes it back as
// Selector.String does.
func canonicalSelector(s string) (string, error) {
	sel, err := fleet.ParseSelector(s)
	if err != nil {
		return "", err
	}
	return sel.String(), nil
}

// CreateGroup saves a group.
func (db *DB) CreateGroup(ctx context.Context, tenant string, g *fleet.Group) (*fleet.Group, error) {
	sel, err := canonicalSelector(g.Selector)
	if err != nil {
		return nil, err
	}
	err = db.update(ctx, func(ctx context.Context, tx *Tx) error {
		_, err := tx.exec(ctx, "INSERT INTO device_groups (tenant, name, selector, description, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?)",
			tenant, g.Name, sel, g.Description, millis(tx.now), millis(tx.now))
		if isUniqueViolation(err) {
			return fleet.Errorf(fleet.ECONFLICT, "a group named %q exists already", g.Name)
		} else if err != nil {
			return err
		}
		return tx.audit(ctx, tenant, "group.create", "groups/"+g.Name, map[string]any{"selector": sel, "description": g.Description})
	})
	if err != nil {
		return nil, err
	}
	return db.FindGroup(ctx, tenant, g.Name)
}

// FindGroup reads a group, with the number of its devices now.
func (db *DB) FindGroup(ctx context.Context, tenant, name string) (*fleet.Group, error) {
	g, err := scanGroup(db.queryRow(ctx, "SELECT "+groupColumns+" FROM device_groups WHERE tenant = ? AND name = ?", tenant, name))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fleet.Errorf(fleet.ENOTFOUND, "group %q not found", name)
	} else if err != nil {
		return nil, db.classify(err)
	}
	return g, db.countGroup(ctx, tenant, g)
}

// countGroup sets g.Count.
func (db *DB) countGroup(ctx context.Context, tenant string, g *fleet.Group) error {
	sel, err := fleet.ParseSelector(g.Selector)
	if err != nil {
		return err
	}
	_, n, err := db.findDevicesWhere(ctx, tenant, db.dialect.selectorConds(tenant, sel), fleet.Page{Page: 1, Limit: 0})
	g.Count = n
	return err
}

// FindGroups lists the tenant's groups by name.
func (db *DB) FindGroups(ctx context.Context, tenant string, p fleet.Page) ([]*fleet.Group, int, error) {
	gs, n, err := findPage(ctx, db, "SELECT count(*) FROM device_groups WHERE tenant = ?",
		"SELECT "+groupColumns+" FROM device_groups WHERE tenant = ? ORDER BY name", []any{tenant}, p, scanGroup)
	if err != nil {
		return nil, 0, err
	}
	for _, g := range gs {
		if err := db.countGroup(ctx, tenant, g); err != nil {
			return nil, 0, err
		}
	}
	return gs, n, nil
}

// UpdateGroup replaces a group's selector and description.
func (db *DB) UpdateGroup(ctx context.Context, tenant, name string, g *fleet.Group) (*fleet.Group, error) {
	sel, err := canonicalSelector(g.Selector)
	if err != nil {
		return nil, err
	}
	err = db.update(ctx, func(ctx context.Context, tx *Tx) error {
		var previous string
		err := tx.queryRow(ctx, "SELECT selector FROM device_groups WHERE tenant = ? AND name = ?"+tx.db.dialect.forUpdate(), tenant, name).Scan(&previous)
		if errors.Is(err, sql.ErrNoRows) {
			return fleet.Errorf(fleet.ENOTFOUND, "group %q not found", name)
		} else if err != nil {
			return err
		}
		if _, err := tx.exec(ctx, "UPDATE device_groups SET selector = ?, description = ?, updated_at = ? WHERE tenant = ? AND name = ?",
			sel, g.Description, millis(tx.now), tenant, name); err != nil {
			return err
		}
		return tx.audit(ctx, tenant, "group.update", "groups/"+name,
			map[string]any{"selector": sel, "description": g.Description, "previous_selector": previous})
	})
	if err != nil {
		return nil, err
	}
	return db.FindGroup(ctx, tenant, name)
}

// DeleteGroup deletes a group; its devices are untouched.
func (db *DB) DeleteGroup(ctx context.Context, tenant, name string) error {
	return db.update(ctx, func(ctx context.Context, tx *Tx) error {
		res, err := tx.exec(ctx, "DELETE FROM device_groups WHERE tenant = ? AND name = ?", tenant, name)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n == 0 {
			return fleet.Errorf(fleet.ENOTFOUND, "group %q not found", name)
		}
		return tx.audit(ctx, tenant, "group.delete", "groups/"+name, nil)
	})
}

// FindGroupDevices lists the devices the group's selector chooses now.
func (db *DB) FindGroupDevices(ctx context.Context, tenant, name string, p fleet.Page) ([]*fleet.Device, int, error) {
	sel, err := groupSelector(ctx, db, tenant, name)
	if err != nil {
		return nil, 0, db.classify(err)
	}
	return db.findDevicesWhere(ctx, tenant, db.dialect.selectorConds(tenant, sel), p)
}

// InGroup reports whether the device is one of the group's now; a group
// that is not there has no devices.
func (db *DB) InGroup(ctx context.Context, tenant, group, device string) (bool, error) {
	sel, err := groupSelector(ctx, db, tenant, group)
	if fleet.ErrorCode(err) == fleet.ENOTFOUND {
		return false, nil
	} else if err != nil {
		return false, db.classify(err)
	}
	where, args := []string{"tenant = ?", "id = ?"}, []any{tenant, device}
	for _, c := range db.dialect.selectorConds(tenant, sel) {
		where, args = append(where, c.scan), append(args, c.scanArgs...)
	}
	var n int
	err = db.queryRow(ctx, "SELECT count(*) FROM devices WHERE "+strings.Join(where, " AND "), args...).Scan(&n)
	return n > 0, db.classify(err)
}

// groupSelector reads and parses a group's selector.
func groupSelector(ctx context.Context, q querier, tenant, name string) (fleet.Selector, error) {
	var s string
	err := q.queryRow(ctx, "SELECT selector FROM device_groups WHERE tenant = ? AND name = ?", tenant, name).Scan(&s)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fleet.Errorf(fleet.ENOTFOUND, "group %q not found", name)
	} else if err != nil {
		return nil, err
	}
	return fleet.ParseSelector(s)
}
