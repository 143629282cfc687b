package mqtt_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/mqtt"
)

// devActions records what the Devices handler asks of the action service.
type devActions struct {
	fleet.ActionService // nil: only ReportStatus is called

	mu          sync.Mutex
	reports     []fleet.StatusReport
	err         error
	subscribed  []string
	delivered   []int64
	seen        []string
	notFoundFor int64 // reports on this action are ENOTFOUND
}

func (a *devActions) ReportStatus(ctx context.Context, tenant string, rs []fleet.StatusReport) ([]error, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.err != nil {
		return nil, a.err
	}
	errs := make([]error, len(rs))
	for i, r := range rs {
		if r.ActionID == a.notFoundFor {
			errs[i] = fleet.Errorf(fleet.ENOTFOUND, "action %d was not sent to device %q", r.ActionID, r.DeviceID)
		}
	}
	a.reports = append(a.reports, rs...)
	return errs, nil
}

func (a *devActions) DeviceSubscribed(tenant, device string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.subscribed = append(a.subscribed, tenant+"/"+device)
}

func (a *devActions) PendingMessages(ctx context.Context, tenant, device string, after int64, limit int) ([]fleet.ActionMessage, error) {
	return []fleet.ActionMessage{{ActionID: after + 1, Payload: []byte("{}")}}, nil
}

func (a *devActions) ActionDelivered(tenant, device string, id int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.delivered = append(a.delivered, id)
}

func (a *devActions) DeviceSeen(tenant, device string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.seen = append(a.seen, tenant+"/"+device)
}

// devStreams records ingested points.
type devStreams struct {
	fleet.StreamService
	points []fleet.DataPoint
}

func (s *devStreams) IngestPoints(ctx context.Context, tenant, device, stream string, pts []fleet.DataPoint) error {
	s.points = append(s.points, pts...)
	return nil
}

// devToucher records sightings.
type devToucher struct{ seen []string }

func (d *devToucher) TouchDevice(ctx context.Context, tenant, id string, t time.Time) error {
	d.seen = append(d.seen, tenant+"/"+id)
	return nil
}

func TestDevicesHandleStatus(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name     string
		payload  string
		applied  string // the reports applied, by "id:state"
		problems []string
		code     string // of the error; "" for none
	}{
		{"UplinkArray", `[{"id":"7","state":"Received","progress":0,"errors":[],"timestamp":1700000000000,"sequence":1},
			{"id":"7","state":"Downloading","progress":40,"errors":[],"timestamp":1700000000001,"sequence":2}]`,
			"7:Received 7:Downloading", nil, ""},
		{"OneObject", `{"action_id":7,"state":"Completed"}`, "7:Completed", nil, ""},
		{"UnknownFieldsIgnored", `{"id":"7","state":"Running","stream":"action_status","phase":3}`, "7:Running", nil, ""},
		{"InvalidSkipped", `[{"id":"7","state":"Running"},{"id":"7","state":"Running","progress":101},"x",{"state":"No id"},{"id":"8","state":"Done"}]`,
			"7:Running 8:Done", []string{"[1]", "[2]", "[3]"}, fleet.EINVALID},
		{"NotSentSkipped", `[{"id":"9","state":"Running"},{"id":"7","state":"Running"}]`, "9:Running 7:Running", []string{"[0]"}, fleet.EINVALID},
		{"NotJSON", `{"id":`, "", nil, fleet.EINVALID},
		{"DuplicateKeys", `{"id":"7","id":"8","state":"x"}`, "", nil, fleet.EINVALID},
	} {
		t.Run(tc.name, func(t *testing.T) {
			acts := &devActions{notFoundFor: 9}
			h := &mqtt.Devices{Actions: acts, Delivery: acts}
			err := h.HandleStatus(ctx, "acme", "dev-1", []byte(tc.payload))
			if got := fleet.ErrorCode(err); got != tc.code {
				t.Fatalf("error %v, want code %q", err, tc.code)
			}
			var applied []string
			for _, r := range acts.reports {
				if r.DeviceID != "dev-1" {
					t.Fatalf("report for %q, want the topic's device", r.DeviceID)
				}
				applied = append(applied, fmt.Sprintf("%d:%s", r.ActionID, r.State))
			}
			if strings.Join(applied, " ") != tc.applied {
				t.Fatalf("applied %v, want %s", applied, tc.applied)
			}
			if tc.problems != nil {
				var got []string
				for k := range err.(*fleet.Error).Fields {
					got = append(got, k)
				}
				sort.Strings(got)
				if fmt.Sprint(got) != fmt.Sprint(tc.problems) {
					t.Fatalf("problems with %v (%v), want %v", got, err, tc.problems)
				}
			}
		})
	}
	t.Run("UnavailablePassesThrough", func(t *testing.T) {
		acts := &devActions{err: fleet.Errorf(fleet.EUNAVAILABLE, "database down")}
		h := &mqtt.Devices{Actions: acts, Delivery: acts}
		if err := h.HandleStatus(ctx, "acme", "dev-1", []byte(`{"id":"1","state":"x"}`)); fleet.ErrorCode(err) != fleet.EUNAVAILABLE {
			t.Fatalf("error %v, want unavailable so that the broker does not acknowledge", err)
		}
	})
}

func TestDevicesHandleStream(t *testing.T) {
	ctx := context.Background()
	t.Run("NoStreamService", func(t *testing.T) {
		h := &mqtt.Devices{}
		if err := h.HandleStream(ctx, "acme", "dev-1", "gps", mqtt.CompressionNone, []byte(`not even JSON`)); err != nil {
			t.Fatalf("error %v; without a stream service points are acknowledged and dropped", err)
		}
	})
	t.Run("Points", func(t *testing.T) {
		streams := &devStreams{}
		h := &mqtt.Devices{Streams: streams, Now: func() time.Time { return time.UnixMilli(1_800_000_000_000) }}
		err := h.HandleStream(ctx, "acme", "dev-1", "gps", mqtt.CompressionNone, []byte(`[{"timestamp":1763719200000,"sequence":1,"lat":12.9},{"sequence":2}]`))
		if fleet.ErrorCode(err) != fleet.EINVALID || !mqtt.Taken(err) || len(streams.points) != 1 || streams.points[0].Data["lat"] != 12.9 || streams.points[0].Stream != "gps" {
			t.Fatalf("error %v, points %+v; want the good point kept and the bad one named", err, streams.points)
		}
	})
}

func TestDevicesDeliveryAndSightings(t *testing.T) {
	acts := &devActions{}
	seen := &devToucher{}
	h := &mqtt.Devices{Actions: acts, Delivery: acts, LastSeen: seen}
	h.DeviceConnected("acme", "dev-1")
	h.DeviceSubscribed("acme", "dev-1")
	h.ActionDelivered("acme", "dev-1", 42)
	if fmt.Sprint(seen.seen) != "[acme/dev-1]" || fmt.Sprint(acts.subscribed) != "[acme/dev-1]" || fmt.Sprint(acts.delivered) != "[42]" {
		t.Fatalf("seen %v, subscribed %v, delivered %v", seen.seen, acts.subscribed, acts.delivered)
	}
	// A data point is a sighting too, batched by the action service.
	h.HandleStream(context.Background(), "acme", "dev-1", "gps", mqtt.CompressionNone, []byte(`[]`))
	if fmt.Sprint(acts.seen) != "[acme/dev-1]" {
		t.Fatalf("sightings after a data point: %v", acts.seen)
	}
	// Without a toucher, connecting records nothing and does not fail.
	(&mqtt.Devices{Actions: acts, Delivery: acts}).DeviceConnected("acme", "dev-2")
}
