package twin_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestShadowAPI: the shadow's HTTP endpoints, their answers, errors and
// roles. The merge itself is tested in the root package and the store.
func TestShadowAPI(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b)
		admin := s.Admin()
		s.MustDevice(t, admin, "sh-1", nil)
		path := "/api/v1/devices/sh-1/shadow"

		var sh fleetdtest.Shadow
		s.Do(t, admin, "GET", path, nil).Want(t, 200).Decode(t, &sh)
		if sh.Version != 0 || !sh.InSync || sh.Desired == nil || sh.Delta == nil || sh.DesiredUpdatedAt != nil {
			t.Fatalf("a new device's shadow = %+v", sh)
		}
		s.Do(t, admin, "PATCH", path, map[string]any{"desired": map[string]any{"interval": 10, "log": map[string]any{"level": "debug"}}, "version": 0}).Want(t, 200).Decode(t, &sh)
		if sh.Version != 1 || sh.InSync || sh.Delta["interval"] != float64(10) || sh.DesiredUpdatedAt == nil || len(*sh.DesiredUpdatedAt) != len("2026-11-21T10:00:00.123Z") {
			t.Fatalf("after a patch: %+v", sh)
		}
		sh = fleetdtest.Shadow{}
		s.Do(t, admin, "PATCH", path, map[string]any{"desired": map[string]any{"log": nil}}).Want(t, 200).Decode(t, &sh)
		if sh.Version != 2 || len(sh.Desired) != 1 {
			t.Fatalf("after deleting log: %+v", sh)
		}
		if code := s.Do(t, admin, "PATCH", path, map[string]any{"desired": map[string]any{"interval": 20}, "version": 1}).Want(t, 409).ErrorCode(t); code != "conflict" {
			t.Fatalf("stale version: %q", code)
		}

		operator := s.NewKey(t, admin, "sh-operator", "operator")
		viewer := s.NewKey(t, admin, "sh-viewer", "viewer")
		s.Do(t, viewer, "GET", path, nil).Want(t, 200)
		s.Do(t, viewer, "PATCH", path, map[string]any{"desired": map[string]any{"x": 1}}).Want(t, 403)
		s.Do(t, operator, "PATCH", path, map[string]any{"desired": map[string]any{"x": 1}}).Want(t, 200)

		beta := s.NewTenant(t, "beta")
		s.Do(t, beta, "GET", path, nil).Want(t, 404)
		s.Do(t, beta, "PATCH", path, map[string]any{"desired": map[string]any{"x": 2}}).Want(t, 404)

		deep := map[string]any{"v": 1}
		for range 8 {
			deep = map[string]any{"n": deep}
		}
		for _, tc := range []struct {
			name   string
			body   any
			status int
			field  string
		}{
			{"NoDesired", map[string]any{"version": 1}, 400, "desired"},
			{"DesiredNotObject", map[string]any{"desired": []any{1}}, 400, "desired"},
			{"VersionNotInteger", map[string]any{"desired": map[string]any{}, "version": "3"}, 400, "version"},
			{"VersionNegative", map[string]any{"desired": map[string]any{}, "version": -1}, 400, "version"},
			{"Unknown", map[string]any{"desired": map[string]any{}, "reported": map[string]any{}}, 400, "reported"},
			{"TooDeep", map[string]any{"desired": deep}, 400, "desired.n.n.n.n.n.n.n.n.v"},
			{"TooLarge", map[string]any{"desired": map[string]any{"blob": strings.Repeat("x", 33<<10)}}, 413, "desired"},
			// PostgreSQL's JSON holds no NUL: refused on both databases.
			{"NULInValue", map[string]any{"desired": map[string]any{"x": map[string]any{"y": "a\x00b"}}}, 400, "desired.x.y"},
			{"NULInKey", map[string]any{"desired": map[string]any{"x": map[string]any{"k\x00": 1}}}, 400, "desired.x"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				var e struct {
					Error, Message string
					Fields         map[string]string
				}
				s.Do(t, admin, "PATCH", path, tc.body).Want(t, tc.status).Decode(t, &e)
				if e.Fields[tc.field] == "" || e.Message == "" {
					t.Fatalf("error = %+v, want a problem for %s", e, tc.field)
				}
			})
		}
		s.Do(t, admin, "GET", "/api/v1/devices/nope/shadow", nil).Want(t, 404)
		s.Do(t, admin, "GET", path, nil).Want(t, 200).Decode(t, &sh)
		if sh.Version != 3 {
			t.Fatalf("refused patches moved the version to %d", sh.Version)
		}
	})
}

// TestShadowStreamBeyondTheShadowsLimits: a point of uplink's
// device_shadow stream that the reported state cannot take (beyond its
// size or depth) is still a data point: it is kept and the ingest is
// accepted, with the reported state left as it was. The shadow is derived
// from the points; refusing the ingest after they were stored would answer
// an error for data kept, and a device that retries would store it again.
func TestShadowStreamBeyondTheShadowsLimits(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b)
		admin := s.Admin()
		s.MustDevice(t, admin, "sh-big", nil)
		ingest := "/api/v1/devices/sh-big/streams/device_shadow"
		now := time.Now().UnixMilli()
		s.Send(t, fleetdtest.Req{Method: "POST", Path: ingest, Creds: admin,
			Body: []any{map[string]any{"timestamp": now - 1000, "sequence": 1, "fw": 1}}}).Want(t, 200)
		s.Send(t, fleetdtest.Req{Method: "POST", Path: ingest, Creds: admin,
			Body: []any{map[string]any{"timestamp": now, "sequence": 2, "fw": 2, "blob": strings.Repeat("x", 33<<10)}}}).Want(t, 200)

		var sh fleetdtest.Shadow
		s.Do(t, admin, "GET", "/api/v1/devices/sh-big/shadow", nil).Want(t, 200).Decode(t, &sh)
		if len(sh.Reported) != 1 || sh.Reported["fw"] != float64(1) {
			t.Fatalf("reported = %v, want the state before the point too large for it", sh.Reported)
		}
		var page struct{ Points []map[string]any }
		s.Do(t, admin, "GET", ingest+"/points", nil).Want(t, 200).Decode(t, &page)
		if len(page.Points) != 2 {
			t.Fatalf("%d points kept, want 2", len(page.Points))
		}
	})
}

// TestShadowStreamOutOfOrder: a device_shadow batch that arrives after a
// newer one (a retry, a backlog sent late) is kept as points but does not
// change the reported state, which stays that of the newest point; a
// newer batch changes it again.
func TestShadowStreamOutOfOrder(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b)
		admin := s.Admin()
		s.MustDevice(t, admin, "sh-late", nil)
		ingest := "/api/v1/devices/sh-late/streams/device_shadow"
		now := time.Now().UnixMilli()
		post := func(ts, seq int64, state map[string]any) {
			t.Helper()
			state["timestamp"], state["sequence"] = ts, seq
			s.Send(t, fleetdtest.Req{Method: "POST", Path: ingest, Creds: admin, Body: []any{state}}).Want(t, 200)
		}
		reported := func() map[string]any {
			t.Helper()
			var sh fleetdtest.Shadow
			s.Do(t, admin, "GET", "/api/v1/devices/sh-late/shadow", nil).Want(t, 200).Decode(t, &sh)
			return sh.Reported
		}
		post(now, 5, map[string]any{"fw": 2})
		post(now-60_000, 9, map[string]any{"fw": 1, "stale": true}) // older by timestamp
		post(now, 4, map[string]any{"fw": 0})                       // same timestamp, earlier sequence
		if got := reported(); fmt.Sprint(got) != "map[fw:2]" {
			t.Fatalf("reported = %v after older batches, want the newest point's map[fw:2]", got)
		}
		post(now, 6, map[string]any{"fw": 3})
		if got := reported(); fmt.Sprint(got) != "map[fw:3]" {
			t.Fatalf("reported = %v, want the newer point's map[fw:3]", got)
		}
		var page struct{ Points []map[string]any }
		s.Do(t, admin, "GET", ingest+"/points", nil).Want(t, 200).Decode(t, &page)
		if len(page.Points) != 4 {
			t.Fatalf("%d points kept, want 4", len(page.Points))
		}
	})
}
