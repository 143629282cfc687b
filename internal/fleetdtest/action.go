package fleetdtest

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/fleetd/fleet/internal/poll"
)

// Bound is how long any awaited condition may take; none takes a tenth.
const Bound = 15 * time.Second

// Eventually polls cond until it holds, for at most bound: the one way the
// end-to-end tests wait for what fleetd does in the background.
func Eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	EventuallyWithin(t, Bound, what, cond)
}

// EventuallyWithin is eventually with a bound of its own: shorter, for a
// condition that must hold sooner because that is what the test proves;
// longer, for one that waits on a whole other process.
func EventuallyWithin(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	poll.Until(t, d, what, cond)
}

// DeviceActionBody is one device's record of an action (S7).
type DeviceActionBody struct {
	ActionID       int64               `json:"action_id"`
	DeviceID       string              `json:"device_id"`
	Type           string              `json:"type"`
	Status         string              `json:"status"`
	ActionStatus   string              `json:"action_status"`
	Phase          int                 `json:"phase"`
	Progress       int                 `json:"progress"`
	Params         string              `json:"params"`
	Errors         map[string][]string `json:"errors"`
	UserEmail      string              `json:"user_email"`
	UserName       string              `json:"user_name"`
	SerialMetadata map[string]string   `json:"-serial_metadata"`
	CreatedAt      string              `json:"created_at"`
	UpdatedAt      string              `json:"updated_at"`
}

// ActionBody is an action as the API shows it.
type ActionBody struct {
	ID         int64           `json:"id"`
	Action     string          `json:"action"`
	Params     json.RawMessage `json:"params"`
	SearchType string          `json:"search_type"`
	Metadata   json.RawMessage `json:"metadata"`
	Timeout    int64           `json:"timeout"`
	UserEmail  string          `json:"user_email"`
	UserName   string          `json:"user_name"`
	CreatedAt  string          `json:"created_at"`
	Targeted   int             `json:"targeted"`
	Statuses   map[string]int  `json:"statuses"`
}

// Dispatch posts to the modern endpoint and returns the new action's id.
func (s *Server) Dispatch(t *testing.T, c Creds, body map[string]any) int64 {
	t.Helper()
	var out struct {
		ID        int64  `json:"id"`
		CreatedAt string `json:"created_at"`
		Targeted  int    `json:"targeted"`
	}
	s.Do(t, c, "POST", "/api/v1/actions", body).Want(t, 201).Decode(t, &out)
	if out.ID == 0 || out.Targeted == 0 || out.CreatedAt == "" {
		t.Fatalf("dispatch answered %+v", out)
	}
	return out.ID
}

// Action returns action id as c sees it.
func (s *Server) Action(t *testing.T, c Creds, id int64) ActionBody {
	t.Helper()
	var a ActionBody
	s.Do(t, c, "GET", fmt.Sprintf("/api/v1/actions/%d", id), nil).Want(t, 200).Decode(t, &a)
	return a
}

// DeviceAction returns one device's record of an action, through S7.
func (s *Server) DeviceAction(t *testing.T, c Creds, device string, id int64) DeviceActionBody {
	t.Helper()
	var list struct {
		DeviceActions []DeviceActionBody `json:"device_actions"`
	}
	s.Do(t, c, "GET", "/api/v1/devices/"+device+"/actions?limit=1000", nil).Want(t, 200).Decode(t, &list)
	for _, da := range list.DeviceActions {
		if da.ActionID == id {
			return da
		}
	}
	t.Fatalf("device %s has no action %d", device, id)
	panic("unreachable")
}

// AwaitActionStatus waits until the device's record has action_status want.
func (s *Server) AwaitActionStatus(t *testing.T, c Creds, device string, id int64, want string) DeviceActionBody {
	t.Helper()
	var da DeviceActionBody
	Eventually(t, fmt.Sprintf("%s's action %d to be %s", device, id, want), func() bool {
		da = s.DeviceAction(t, c, device, id)
		return da.ActionStatus == want
	})
	return da
}
