package console_test

import (
	"fmt"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestRolloutBuilderScheduleEnd: the rollout builder takes the schedule's
// end (the API's end_timestamp), as a UTC date and time, so that it builds
// every rollout the API can; the action's page shows it, and a time that
// does not read as one is refused naming the API's field, the form kept.
func TestRolloutBuilderScheduleEnd(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b)
		admin := s.Admin()
		operator := s.NewKey(t, admin, "olivia", "operator")
		for _, id := range []string{"e-1", "e-2"} {
			s.Do(t, admin, "POST", "/api/v1/devices", map[string]any{"id": id}).Want(t, 201)
		}
		c := fleetdtest.NewBrowser(t, s.URL)
		tok := c.SignIn(operator.Tenant, operator.Key).CSRF(t)
		form := url.Values{"csrf": {tok}, "action": {"reboot"}, "params": {"{}"}, "search_type": {"all"}, "rollout": {"on"}, "phases": {"2"},
			"phase0_name": {"canary"}, "phase0_kind": {"percentage"}, "phase0_value": {"50"}, "phase0_trigger": {"now"},
			"phase1_name": {"rest"}, "phase1_kind": {"percentage"}, "phase1_value": {"100"}, "phase1_trigger": {"manual"},
			"end": {"2099-01-02T03:04"}, "dispatch": {"1"}}

		bad := url.Values{}
		for k, v := range form {
			bad[k] = v
		}
		bad.Set("end", "next tuesday")
		fleetdtest.WantContains(t, "a bad end", c.Do("POST", "/console/actions/new", bad).Want(t, 400).Body,
			"schedule.end_timestamp", "must be a date and time (UTC)", `name="end" type="datetime-local" value="next tuesday"`)

		res := c.Do("POST", "/console/actions/new", form).Want(t, http.StatusSeeOther)
		var id int64
		fmt.Sscanf(res.Header.Get("Location"), "/console/actions/%d", &id)
		var a struct {
			Schedule struct {
				EndTimestamp int64 `json:"end_timestamp"`
			}
		}
		s.Do(t, admin, "GET", fmt.Sprintf("/api/v1/actions/%d", id), nil).Want(t, 200).Decode(t, &a)
		if want := time.Date(2099, 1, 2, 3, 4, 0, 0, time.UTC).UnixMilli(); a.Schedule.EndTimestamp != want {
			t.Fatalf("end_timestamp %d, want %d", a.Schedule.EndTimestamp, want)
		}
		fleetdtest.WantContains(t, "the action's page", c.Get(fmt.Sprintf("/console/actions/%d", id)).Want(t, 200).Body,
			"<p data-schedule-end>No phase triggers after 2099-01-02 03:04:00 UTC</p>")
	})
}
