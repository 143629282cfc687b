package fleet_test

import (
	"reflect"
	"testing"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/codec"
)

// fullStatusReport decodes a status report the full way: codec's JSON,
// then ReadStatusReport, as the HTTP handler does when QuickStatusReport
// declines.
func fullStatusReport(b []byte, needDevice bool) (fleet.StatusReport, error) {
	v, err := codec.Decode(codec.JSON, b)
	if err != nil {
		return fleet.StatusReport{}, err
	}
	f := fleet.NewFields(v)
	r := fleet.ReadStatusReport(f, needDevice)
	return r, f.Err()
}

// statusReportSeeds are reports of the plain shape and near misses of it:
// each of the full decode's rules broken once, and valid bodies the quick
// one leaves to it.
var statusReportSeeds = []string{
	`{"device_id":"dev-00001","action_id":12,"state":"Downloading","progress":40,"timestamp":1732870000000,"sequence":7}`,
	`{"id":"12","state":"Downloading","progress":40,"timestamp":1732870000000,"sequence":7}`,
	` { "device_id" : "d1" , "id" : 3 , "action_id" : "3" , "state" : "x" } `,
	`{"device_id":"d1","action_id":3,"state":"Completed","progress":"100"}`,
	"{\"device_id\":\"d1\",\n\t\"action_id\":3,\r\"state\":\"x\"}\n",
	`{"device_id":"d1","action_id":3,"id":4,"state":"x"}`,
	`{"device_id":"d1","action_id":0,"state":"x"}`,
	`{"device_id":"d1","action_id":-3,"state":"x"}`,
	`{"device_id":"d1","action_id":3.0,"state":"x"}`,
	`{"device_id":"d1","action_id":3e0,"state":"x"}`,
	`{"device_id":"d1","action_id":03,"state":"x"}`,
	`{"device_id":"d1","action_id":"03","state":"x"}`,
	`{"device_id":"d1","action_id":"","state":"x"}`,
	`{"device_id":"d1","action_id":9223372036854775807,"state":"x"}`,
	`{"device_id":"d1","action_id":9223372036854775808,"state":"x"}`,
	`{"device_id":"d1","action_id":"9223372036854775808","state":"x"}`,
	`{"device_id":"d1","action_id":null,"state":"x"}`,
	`{"device_id":"d1","state":"x"}`,
	`{"device_id":"d1","action_id":3}`,
	`{"device_id":"d1","action_id":3,"state":""}`,
	`{"device_id":"d1","action_id":3,"state":"0123456789012345678901234567890123456789012345678901234567890123"}`,
	`{"device_id":"d1","action_id":3,"state":"01234567890123456789012345678901234567890123456789012345678901234"}`,
	`{"device_id":"d1","action_id":3,"state":"caf\u00e9"}`,
	`{"device_id":"d1","action_id":3,"state":"café"}`,
	`{"device_id":"d1","action_id":3,"state":"a\"b"}`,
	`{"device_id":"d1","action_id":3,"state":"x","progress":101}`,
	`{"device_id":"d1","action_id":3,"state":"x","progress":"101"}`,
	`{"device_id":"d1","action_id":3,"state":"x","progress":100.0}`,
	`{"device_id":"d1","action_id":3,"state":"x","timestamp":"5"}`,
	`{"device_id":"d1","action_id":3,"state":"x","timestamp":4611686018427387904}`,
	`{"device_id":"d1","action_id":3,"state":"x","sequence":999999999999999999}`,
	`{"device_id":"d1","action_id":3,"state":"x","sequence":1000000000000000000}`,
	`{"device_id":"d1","action_id":3,"state":"x","errors":["e"]}`,
	`{"device_id":"d1","action_id":3,"state":"x","other":1}`,
	`{"device_id":"d1","action_id":3,"state":"x","state":"y"}`,
	`{"device_id":"d 1","action_id":3,"state":"x"}`,
	`{"device_id":"","action_id":3,"state":"x"}`,
	`{"device_id":7,"action_id":3,"state":"x"}`,
	`{"device_id":"d1","action_id":3,"state":"x",}`,
	`{"device_id":"d1","action_id":3,"state":"x"}x`,
	`{"device_id":"d1","action_id":3,"state":"x"`,
	`{"device_id":"d1","action_id":3 "state":"x"}`,
	`{}`,
	`[{"action_id":3,"state":"x"}]`,
	`null`,
	``,
}

func TestQuickStatusReport(t *testing.T) {
	quick := 0
	for _, s := range statusReportSeeds {
		for _, needDevice := range []bool{true, false} {
			if checkQuickStatusReport(t, []byte(s), needDevice) {
				quick++
			}
		}
	}
	if quick < 5 {
		t.Errorf("QuickStatusReport read %d of the seeds; the plain ones at least", quick)
	}
	r, ok := fleet.QuickStatusReport([]byte(statusReportSeeds[0]), true)
	if !ok || r.DeviceID != "dev-00001" || r.ActionID != 12 || r.State != "Downloading" || *r.Progress != 40 || *r.Timestamp != 1732870000000 || *r.Sequence != 7 {
		t.Errorf("QuickStatusReport(%s) = %+v, %v", statusReportSeeds[0], r, ok)
	}
}

// checkQuickStatusReport fails t when QuickStatusReport reads b into a
// report the full decode would not make of it; it says whether it read b.
func checkQuickStatusReport(t *testing.T, b []byte, needDevice bool) bool {
	t.Helper()
	got, ok := fleet.QuickStatusReport(b, needDevice)
	if !ok {
		return false
	}
	want, err := fullStatusReport(b, needDevice)
	if err != nil {
		t.Fatalf("QuickStatusReport(%q, %v) read %+v; the full decode refuses it: %v", b, needDevice, got, err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("QuickStatusReport(%q, %v) = %+v; the full decode reads %+v", b, needDevice, got, want)
	}
	return true
}

// FuzzQuickStatusReport checks that whatever QuickStatusReport reads, the
// full decode reads alike; everything else is left to the full decode.
//
//	go test -run '^$' -fuzz FuzzQuickStatusReport -fuzztime 10m .
func FuzzQuickStatusReport(f *testing.F) {
	for _, s := range statusReportSeeds {
		f.Add([]byte(s), true)
		f.Add([]byte(s), false)
	}
	f.Fuzz(func(t *testing.T, b []byte, needDevice bool) {
		checkQuickStatusReport(t, b, needDevice)
	})
}

// BenchmarkQuickStatusReport reads the plain status report of S10 (with
// its device id, as HTTP has it) and of MQTT (without, the topic names the
// device).
//
//	go test -run '^$' -bench QuickStatusReport .
func BenchmarkQuickStatusReport(b *testing.B) {
	for _, c := range []struct {
		name       string
		needDevice bool
		body       string
	}{
		{"http", true, statusReportSeeds[0]},
		{"mqtt", false, `{"action_id":12,"state":"Downloading","progress":40,"timestamp":1732870000000,"sequence":7}`},
	} {
		b.Run(c.name, func(b *testing.B) {
			body := []byte(c.body)
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, ok := fleet.QuickStatusReport(body, c.needDevice); !ok {
					b.Fatal("not read")
				}
			}
		})
	}
}
