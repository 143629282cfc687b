package fleethttp_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	fleethttp "github.com/fleetd/fleet/http"
	"github.com/fleetd/fleet/internal/poll"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
	"github.com/prometheus/client_golang/prometheus"
)

// TestPointsReadAhead pages through a device's points over the API: the
// pages after the second are answered from reads ahead, hold what the
// store's own pages hold, and are not another tenant's; a page read
// ahead and asked for after aheadTTL is read again, with the points kept
// meanwhile.
func TestPointsReadAhead(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		ctx := context.Background()
		db := sqlstoretest.MustOpen(t, b, sqlstoretest.Options{})
		keys := map[string]string{}
		start := time.Now().Add(-time.Hour).Truncate(time.Hour)
		for tenant, seqBase := range map[string]int64{"acme": 0, "other": 1_000_000} {
			_, admin, err := db.CreateTenant(ctx, tenant)
			if err != nil {
				t.Fatal(err)
			}
			keys[tenant] = admin
			if _, err := db.CreateDevices(ctx, tenant, []fleet.NewDevice{{ID: "d1"}}); err != nil {
				t.Fatal(err)
			}
			for batch := range 3 {
				var pts []fleet.DataPoint
				for i := batch * 1000; i < min(2300, (batch+1)*1000); i++ {
					pts = append(pts, fleet.DataPoint{Stream: "env", Timestamp: start.Add(time.Duration(2*i) * time.Second),
						Sequence: seqBase + int64(i), Data: map[string]any{"temp": i}, ReceivedAt: time.Now()})
				}
				if err := db.CommitStream(ctx, tenant, "d1", "env", pts, nil); err != nil {
					t.Fatal(err)
				}
			}
		}
		var clock atomic.Int64
		clock.Store(time.Now().UnixNano())
		reg := prometheus.NewRegistry()
		h := (&fleethttp.Server{Tenants: db, Devices: db, Audit: db, History: db, Registry: reg,
			Now: func() time.Time { return time.Unix(0, clock.Load()) }, Security: fleethttp.Security{Rate: -1}}).Handler()
		type page struct {
			Points []fleet.HistoryPoint `json:"points"`
			Next   *string              `json:"next"`
		}
		get := func(tenant, cursor string) page {
			t.Helper()
			q := url.Values{"limit": {"500"}}
			if cursor != "" {
				q.Set("cursor", cursor)
			}
			r := httptest.NewRequest("GET", "/api/v1/devices/d1/streams/env/points?"+q.Encode(), nil)
			r.Header.Set("X-Service-Tenant", tenant)
			r.Header.Set("X-Service-Api-Key", keys[tenant])
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != http.StatusOK {
				t.Fatalf("%d %s", w.Code, w.Body)
			}
			var p page
			if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
				t.Fatal(err)
			}
			return p
		}
		outcomes := func() map[string]float64 {
			t.Helper()
			fams, err := reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			n := map[string]float64{}
			for _, f := range fams {
				if f.GetName() == "fleetd_history_pages_read_ahead_total" {
					for _, m := range f.GetMetric() {
						n[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
					}
				}
			}
			return n
		}
		// The store's pages, read without the API.
		var want []fleet.PointPage
		for q := (fleet.PointQuery{Limit: 500}); ; {
			p, err := db.FindPoints(ctx, "acme", "d1", "env", q)
			if err != nil {
				t.Fatal(err)
			}
			want = append(want, fleet.PointPage{Points: append([]fleet.HistoryPoint(nil), p.Points...), Next: p.Next})
			if p.Next == "" {
				break
			}
			q.Cursor = p.Next
		}
		if len(want) != 5 {
			t.Fatalf("%d pages, want 5", len(want))
		}
		cursor := ""
		for i := range want {
			if i == 4 {
				// acme's last page is read ahead: another tenant's
				// request with its cursor reads that tenant's own points
				// (the last 300 of them: no page is read ahead for it).
				if p := get("other", cursor); len(p.Points) == 0 || p.Points[0].Sequence < 1_000_000 {
					t.Fatalf("other tenant's page with acme's cursor: %d points, the first %+v", len(p.Points), p.Points[:min(1, len(p.Points))])
				}
			}
			p := get("acme", cursor)
			if len(p.Points) != len(want[i].Points) {
				t.Fatalf("page %d: %d points, want %d", i, len(p.Points), len(want[i].Points))
			}
			for j := range p.Points {
				if p.Points[j].Sequence != want[i].Points[j].Sequence || !p.Points[j].Timestamp.Equal(want[i].Points[j].Timestamp) {
					t.Fatalf("page %d point %d: %+v, want %+v", i, j, p.Points[j], want[i].Points[j])
				}
			}
			if (p.Next == nil) != (want[i].Next == "") {
				t.Fatalf("page %d: next %v, want %q", i, p.Next, want[i].Next)
			}
			if p.Next != nil {
				cursor = *p.Next
			}
		}
		// Pages 3 and 4 (counting from 1) were read ahead of acme's reader
		// (the second asked for page 3, the third page 4, the fourth page
		// 5) and page 5 is read ahead and used; the last page is not full.
		if n := outcomes(); n["used"] != 3 || n["unused"] != 0 {
			t.Fatalf("pages read ahead: %v, want 3 used", n)
		}

		// Past aheadTTL, the page read ahead is read again: it holds a
		// point kept after it was read ahead.
		p1 := get("acme", "")
		p2 := get("acme", *p1.Next) // reads page 3 ahead
		late := want[2].Points[0]
		extra := fleet.DataPoint{Stream: "env", Timestamp: late.Timestamp, Sequence: late.Sequence - 1_000_000,
			Data: map[string]any{"late": true}, ReceivedAt: time.Now()}
		if err := db.CommitStream(ctx, "acme", "d1", "env", []fleet.DataPoint{extra}, nil); err != nil {
			t.Fatal(err)
		}
		clock.Add(int64(3 * time.Second))
		p3 := get("acme", *p2.Next)
		if len(p3.Points) == 0 || p3.Points[0].Sequence != extra.Sequence {
			t.Fatalf("page 3 asked for after the read ahead expired: first point %+v, want the point kept since (sequence %d)", p3.Points[:min(1, len(p3.Points))], extra.Sequence)
		}
		// The late page is released once its read ends, by a goroutine
		// of its own.
		poll.Until(t, 10*time.Second, "the late page counted unused", func() bool { return outcomes()["unused"] == 1 })
		if n := outcomes(); n["used"] != 3 || n["unused"] != 1 {
			t.Fatalf("pages read ahead: %v, want 3 used and 1 unused", n)
		}
	})
}
