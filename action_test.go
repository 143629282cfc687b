package fleet_test

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet"
)

func TestReadDispatch(t *testing.T) {
	base := func() map[string]any {
		return map[string]any{"action": "reboot", "params": map[string]any{"b": int64(1), "a": "x"}, "search_type": "all"}
	}
	with := func(kv ...any) map[string]any {
		m := base()
		for i := 0; i < len(kv); i += 2 {
			if kv[i+1] == nil {
				delete(m, kv[i].(string))
			} else {
				m[kv[i].(string)] = kv[i+1]
			}
		}
		return m
	}
	for _, tc := range []struct {
		name string
		body map[string]any
		bad  []string // fields with problems; none: valid
	}{
		{"All", base(), nil},
		{"Default", with("search_type", "default", "device_ids", []any{"d1", "d2", "d1"}, "search_key", "string", "search_query", "string"), nil},
		{"Metadata", with("search_type", "metadata", "search_key", "site", "search_query", "Berlin"), nil},
		{"MetadataEmptyValue", with("search_type", "metadata", "search_key", "site", "search_query", ""), nil},
		{"Search", with("search_type", "search", "search_query", "pump"), nil},
		{"SearchUnderKey", with("search_type", "search", "search_key", "site", "search_query", "ber"), nil},
		{"Everything", with("metadata", map[string]any{"ticket": "T-1"}, "timeout", int64(31536000), "device_ids", []any{}), nil},
		{"TimeoutIntegral", with("timeout", 30.0), nil},
		{"UnknownField", with("priority", "high"), []string{"priority"}},
		{"MissingSearchType", with("search_type", nil), []string{"search_type"}},
		{"EmptySearchType", with("search_type", ""), []string{"search_type"}},
		{"UnknownSearchType", with("search_type", "nearby"), []string{"search_type"}},
		{"MissingAction", with("action", nil), []string{"action"}},
		{"EmptyAction", with("action", ""), []string{"action"}},
		{"LongAction", with("action", strings.Repeat("x", 129)), []string{"action"}},
		{"RemoteSessionAction", with("action", "remote_session", "params", map[string]any{"session_id": "x", "kind": "shell", "target": "id"}), []string{"action"}},
		{"MissingParams", with("params", nil), []string{"params"}},
		{"ParamsNotObject", with("params", "{}"), []string{"params"}},
		{"MetadataNotObject", with("metadata", []any{}), []string{"metadata"}},
		{"TimeoutZero", with("timeout", int64(0)), []string{"timeout"}},
		{"TimeoutTooLong", with("timeout", int64(31536001)), []string{"timeout"}},
		{"TimeoutString", with("timeout", "30"), []string{"timeout"}},
		{"TimeoutFraction", with("timeout", 30.5), []string{"timeout"}},
		{"DefaultWithoutIDs", with("search_type", "default"), []string{"device_ids"}},
		{"DefaultEmptyIDs", with("search_type", "default", "device_ids", []any{}), []string{"device_ids"}},
		{"DefaultBadID", with("search_type", "default", "device_ids", []any{"ok", "not ok"}), []string{"device_ids[1]"}},
		{"DefaultIDNotString", with("search_type", "default", "device_ids", []any{int64(1)}), []string{"device_ids[0]"}},
		{"MetadataWithoutKey", with("search_type", "metadata", "search_query", "x"), []string{"search_key"}},
		{"MetadataWithoutQuery", with("search_type", "metadata", "search_key", "x"), []string{"search_query"}},
		{"SearchWithoutQuery", with("search_type", "search"), []string{"search_query"}},
		{"SearchEmptyQuery", with("search_type", "search", "search_query", ""), []string{"search_query"}},
		{"Several", with("action", nil, "timeout", int64(-1), "x", int64(1)), []string{"action", "timeout", "x"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := fleet.NewFields(tc.body)
			d := fleet.ReadDispatch(f, false)
			err := f.Err()
			if len(tc.bad) == 0 {
				if err != nil {
					t.Fatalf("error %v", err)
				}
				if string(d.Params) != `{"a":"x","b":1}` {
					t.Fatalf("params = %s", d.Params)
				}
				return
			}
			fe, ok := err.(*fleet.Error)
			if !ok || fe.Code != fleet.EINVALID {
				t.Fatalf("error %v, want invalid", err)
			}
			var got []string
			for k := range fe.Fields {
				got = append(got, k)
			}
			if fmt.Sprint(sorted(got)) != fmt.Sprint(tc.bad) {
				t.Fatalf("problems with %v (%v), want %v", got, fe.Fields, tc.bad)
			}
		})
	}
	t.Run("Values", func(t *testing.T) {
		f := fleet.NewFields(with("search_type", "default", "device_ids", []any{"d1", "d2", "d1"}, "metadata", map[string]any{"k": "v"}))
		d := fleet.ReadDispatch(f, false)
		if f.Err() != nil || d.Action != "reboot" || fmt.Sprint(d.DeviceIDs) != "[d1 d2]" || string(d.Metadata) != `{"k":"v"}` || d.Timeout != fleet.DefaultActionTimeout {
			t.Fatalf("dispatch = %+v (%v)", d, f.Err())
		}
	})
}

func sorted(s []string) []string {
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if s[j] < s[i] {
				s[i], s[j] = s[j], s[i]
			}
		}
	}
	return s
}

func TestReadStatusReport(t *testing.T) {
	for _, tc := range []struct {
		name   string
		body   map[string]any
		device bool
		bad    []string
		want   string // fmt of the report's interesting values
	}{
		{"Uplink", map[string]any{"id": "42", "state": "Downloading", "progress": int64(40), "errors": []any{}, "timestamp": int64(1700000000000), "sequence": int64(3)}, false, nil, "42 Downloading 40 1700000000000 3"},
		{"HTTP", map[string]any{"device_id": "d1", "action_id": int64(42), "state": "Completed"}, true, nil, "42 Completed - - -"},
		{"ProgressString", map[string]any{"action_id": "7", "state": "x", "progress": "100"}, false, nil, "7 x 100 - -"},
		{"BothIDsAgree", map[string]any{"action_id": "7", "id": int64(7), "state": "x"}, false, nil, "7 x - - -"},
		{"BothIDsDiffer", map[string]any{"action_id": "7", "id": "8", "state": "x"}, false, []string{"id"}, ""},
		{"NoID", map[string]any{"state": "x"}, false, []string{"action_id"}, ""},
		{"BadID", map[string]any{"id": "x7", "state": "x"}, false, []string{"id"}, ""},
		{"ZeroID", map[string]any{"id": int64(0), "state": "x"}, false, []string{"id"}, ""},
		{"NoState", map[string]any{"id": "7"}, false, []string{"state"}, ""},
		{"EmptyState", map[string]any{"id": "7", "state": ""}, false, []string{"state"}, ""},
		{"LongState", map[string]any{"id": "7", "state": strings.Repeat("s", 65)}, false, []string{"state"}, ""},
		{"Progress101", map[string]any{"id": "7", "state": "x", "progress": int64(101)}, false, []string{"progress"}, ""},
		{"ProgressNegative", map[string]any{"id": "7", "state": "x", "progress": int64(-1)}, false, []string{"progress"}, ""},
		{"ProgressFraction", map[string]any{"id": "7", "state": "x", "progress": 50.5}, false, []string{"progress"}, ""},
		{"ProgressString101", map[string]any{"id": "7", "state": "x", "progress": "101"}, false, []string{"progress"}, ""},
		{"ErrorsNotStrings", map[string]any{"id": "7", "state": "x", "errors": []any{int64(1)}}, false, []string{"errors[0]"}, ""},
		{"TimestampString", map[string]any{"id": "7", "state": "x", "timestamp": "1"}, false, []string{"timestamp"}, ""},
		{"DeviceMissing", map[string]any{"id": "7", "state": "x"}, true, []string{"device_id"}, ""},
		{"DeviceInvalid", map[string]any{"device_id": "a b", "id": "7", "state": "x"}, true, []string{"device_id"}, ""},
		{"DeviceOverMQTT", map[string]any{"device_id": "d1", "id": "7", "state": "x"}, false, []string{"device_id"}, ""},
		{"Unknown", map[string]any{"id": "7", "state": "x", "stream": "action_status"}, false, []string{"stream"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := fleet.NewFields(tc.body)
			r := fleet.ReadStatusReport(f, tc.device)
			err := f.Err()
			if len(tc.bad) == 0 {
				if err != nil {
					t.Fatalf("error %v", err)
				}
				opt := func(p any) string {
					switch p := p.(type) {
					case *int:
						if p != nil {
							return fmt.Sprint(*p)
						}
					case *int64:
						if p != nil {
							return fmt.Sprint(*p)
						}
					}
					return "-"
				}
				if got := fmt.Sprintf("%d %s %s %s %s", r.ActionID, r.State, opt(r.Progress), opt(r.Timestamp), opt(r.Sequence)); got != tc.want {
					t.Fatalf("report = %s, want %s", got, tc.want)
				}
				return
			}
			fe, ok := err.(*fleet.Error)
			if !ok || fe.Code != fleet.EINVALID {
				t.Fatalf("error %v, want invalid", err)
			}
			var got []string
			for k := range fe.Fields {
				got = append(got, k)
			}
			if fmt.Sprint(sorted(got)) != fmt.Sprint(tc.bad) {
				t.Fatalf("problems with %v (%v), want %v", got, fe.Fields, tc.bad)
			}
		})
	}
}

func i64(n int64) *int64 { return &n }
func ip(n int) *int      { return &n }

// TestApplyReport is the ordering and idempotency of status reports
// (docs/actions.md#status-reports), as a table.
func TestApplyReport(t *testing.T) {
	now := time.UnixMilli(10_000)
	key := func(ts, seq int64) *fleet.ReportKey { return &fleet.ReportKey{Timestamp: ts, Sequence: seq} }
	running := fleet.ReportState{ActionStatus: fleet.StatusProgress, Status: "Running", Progress: 50, Last: key(5000, 2)}
	for _, tc := range []struct {
		name    string
		cur     fleet.ReportState
		r       fleet.StatusReport
		applied bool
		want    fleet.ReportState
	}{
		{"FirstReport", fleet.ReportState{ActionStatus: fleet.StatusQueued, Status: "Queued"},
			fleet.StatusReport{State: "Received", Timestamp: i64(1), Sequence: i64(1)}, true,
			fleet.ReportState{ActionStatus: fleet.StatusProgress, Status: "Received", Last: key(1, 1)}},
		{"FirstReportFromInitiated", fleet.ReportState{ActionStatus: fleet.StatusInitiated, Status: "Initiated"},
			fleet.StatusReport{State: "Completed"}, true,
			fleet.ReportState{ActionStatus: fleet.StatusCompleted, Status: "Completed", Progress: 100, Last: key(10_000, 0)}},
		{"Newer", running, fleet.StatusReport{State: "Installing", Progress: ip(80), Timestamp: i64(6000)}, true,
			fleet.ReportState{ActionStatus: fleet.StatusProgress, Status: "Installing", Progress: 80, Last: key(6000, 0)}},
		{"SameTimeLaterSequence", running, fleet.StatusReport{State: "Running", Progress: ip(60), Timestamp: i64(5000), Sequence: i64(3)}, true,
			fleet.ReportState{ActionStatus: fleet.StatusProgress, Status: "Running", Progress: 60, Last: key(5000, 3)}},
		{"Duplicate", running, fleet.StatusReport{State: "Running", Progress: ip(60), Timestamp: i64(5000), Sequence: i64(2)}, false, running},
		{"OlderTimestamp", running, fleet.StatusReport{State: "Old", Timestamp: i64(4999), Sequence: i64(99)}, false, running},
		{"SameTimeOlderSequence", running, fleet.StatusReport{State: "Old", Timestamp: i64(5000), Sequence: i64(1)}, false, running},
		{"TimestampWithoutSequenceAfterSameTime", running, fleet.StatusReport{State: "Old", Timestamp: i64(5000)}, false, running},
		{"NoTimestampIsNow", running, fleet.StatusReport{State: "Later"}, true,
			fleet.ReportState{ActionStatus: fleet.StatusProgress, Status: "Later", Progress: 50, Last: key(10_000, 0)}},
		{"NoTimestampAfterFutureReport", fleet.ReportState{ActionStatus: fleet.StatusProgress, Status: "Running", Last: key(20_000, 4)},
			fleet.StatusReport{State: "Later"}, true,
			fleet.ReportState{ActionStatus: fleet.StatusProgress, Status: "Later", Last: key(20_000, 5)}},
		{"Failed", running, fleet.StatusReport{State: "Failed", Errors: []string{"boom"}, Timestamp: i64(7000)}, true,
			fleet.ReportState{ActionStatus: fleet.StatusFailed, Status: "Failed", Progress: 50, Errors: map[string][]string{"Failed": {"boom"}}, Last: key(7000, 0)}},
		{"CompletedKeepsGivenProgress", running, fleet.StatusReport{State: "Completed", Progress: ip(90), Timestamp: i64(7000)}, true,
			fleet.ReportState{ActionStatus: fleet.StatusCompleted, Status: "Completed", Progress: 90, Last: key(7000, 0)}},
		{"AfterCompleted", fleet.ReportState{ActionStatus: fleet.StatusCompleted, Status: "Completed", Progress: 100, Last: key(1, 0)},
			fleet.StatusReport{State: "Running", Timestamp: i64(9000)}, false,
			fleet.ReportState{ActionStatus: fleet.StatusCompleted, Status: "Completed", Progress: 100, Last: key(1, 0)}},
		{"AfterCancelled", fleet.ReportState{ActionStatus: fleet.StatusCancelled, Status: "Cancelled"},
			fleet.StatusReport{State: "Completed"}, false,
			fleet.ReportState{ActionStatus: fleet.StatusCancelled, Status: "Cancelled"}},
		{"AfterTimedOut", fleet.ReportState{ActionStatus: fleet.StatusFailed, Status: "TimedOut"},
			fleet.StatusReport{State: "Completed"}, false,
			fleet.ReportState{ActionStatus: fleet.StatusFailed, Status: "TimedOut"}},
		{"ReportedQueuedIsProgress", running, fleet.StatusReport{State: "Queued", Timestamp: i64(6000)}, true,
			fleet.ReportState{ActionStatus: fleet.StatusProgress, Status: "Queued", Progress: 50, Last: key(6000, 0)}},
		// Asked to stop, the device keeps the word Cancelling through its
		// progress; its Failed is it stopping; its Completed counts.
		{"ProgressWhileCancelling", fleet.ReportState{ActionStatus: fleet.StatusProgress, Status: fleet.StateCancelling, Progress: 50},
			fleet.StatusReport{State: "Downloading", Progress: ip(60), Timestamp: i64(1)}, true,
			fleet.ReportState{ActionStatus: fleet.StatusProgress, Status: fleet.StateCancelling, Progress: 60, Last: key(1, 0)}},
		{"FailedWhileCancellingStopped", fleet.ReportState{ActionStatus: fleet.StatusInitiated, Status: fleet.StateCancelling},
			fleet.StatusReport{State: "Failed", Errors: []string{"Action cancelled by action_id: 9"}, Timestamp: i64(1)}, true,
			fleet.ReportState{ActionStatus: fleet.StatusCancelled, Status: fleet.StateCancelled, Errors: map[string][]string{"Failed": {"Action cancelled by action_id: 9"}}, Last: key(1, 0)}},
		{"CompletedWhileCancelling", fleet.ReportState{ActionStatus: fleet.StatusProgress, Status: fleet.StateCancelling},
			fleet.StatusReport{State: "Completed", Timestamp: i64(1)}, true,
			fleet.ReportState{ActionStatus: fleet.StatusCompleted, Status: "Completed", Progress: 100, Last: key(1, 0)}},
		{"FailedAfterCancelRejected", fleet.ReportState{ActionStatus: fleet.StatusProgress, Status: fleet.StateCancelRejected},
			fleet.StatusReport{State: "Failed", Timestamp: i64(1)}, true,
			fleet.ReportState{ActionStatus: fleet.StatusFailed, Status: "Failed", Last: key(1, 0)}},
		{"ErrorsKeptPerState", fleet.ReportState{ActionStatus: fleet.StatusProgress, Status: "Downloading", Errors: map[string][]string{"Downloading": {"retry"}}},
			fleet.StatusReport{State: "Installing", Errors: []string{"slow"}, Timestamp: i64(1)}, true,
			fleet.ReportState{ActionStatus: fleet.StatusProgress, Status: "Installing", Errors: map[string][]string{"Downloading": {"retry"}, "Installing": {"slow"}}, Last: key(1, 0)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, applied := fleet.ApplyReport(tc.cur, tc.r, now)
			if applied != tc.applied || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %+v (applied %v), want %+v (applied %v)", got, applied, tc.want, tc.applied)
			}
		})
	}
}

func TestCompletedComponents(t *testing.T) {
	params := []byte(`{"version":"2.0","components":[{"component_name":"app","version_number":"2.0.1"},{"component_name":"boot","version_number":"1.1"}]}`)
	if got := fleet.CompletedComponents(fleet.ActionUpdateFirmware, params); fmt.Sprint(got) != "map[app:2.0.1 boot:1.1]" {
		t.Errorf("update_firmware: %v", got)
	}
	if got := fleet.CompletedComponents("reboot", params); got != nil {
		t.Errorf("reboot: %v", got)
	}
	if got := fleet.CompletedComponents(fleet.ActionUpdateFirmware, []byte(`{"components":"x"}`)); got != nil {
		t.Errorf("malformed: %v", got)
	}
}
