package action_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/action"
	"github.com/fleetd/fleet/sqlstore"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

const wait = 10 * time.Second

// sent is one message handed to a device.
type sent struct {
	Device string
	Msg    action.Message
}

// fakeSender is a broker: devices in online are connected and subscribed.
type fakeSender struct {
	mu     sync.Mutex
	online map[string]bool // device id; one tenant per test
	sent   chan sent
}

func newFakeSender(online ...string) *fakeSender {
	f := &fakeSender{online: map[string]bool{}, sent: make(chan sent, 10_000)}
	for _, d := range online {
		f.online[d] = true
	}
	return f
}

func (f *fakeSender) SendAction(tenant, device string, id int64, payload []byte) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.online[device] {
		return false
	}
	var m action.Message
	if err := json.Unmarshal(payload, &m); err != nil {
		panic(err)
	}
	if m.ID != strconv.FormatInt(id, 10) {
		panic(fmt.Sprintf("SendAction of action %d with the message of action %s", id, m.ID))
	}
	f.sent <- sent{device, m}
	return true
}

func (f *fakeSender) Online(tenant, device string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.online[device]
}

func (f *fakeSender) setOnline(device string, on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.online[device] = on
}

// next returns the next message sent.
func (f *fakeSender) next(t *testing.T) sent {
	t.Helper()
	select {
	case s := <-f.sent:
		return s
	case <-time.After(wait):
		t.Fatal("timed out waiting for a message to a device")
	}
	panic("unreachable")
}

// collect returns the next n messages, by device.
func (f *fakeSender) collect(t *testing.T, n int) map[string][]action.Message {
	t.Helper()
	out := map[string][]action.Message{}
	for range n {
		s := f.next(t)
		out[s.Device] = append(out[s.Device], s.Msg)
	}
	return out
}

// none asserts that nothing more was sent: once the service has handed
// every dispatch so far to the devices connected (Stats().Delivering is 0),
// whatever it sent is in f.sent.
func (f *fakeSender) none(t *testing.T, svc *action.Service) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for svc.Stats().Delivering != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the service is still delivering %d dispatches", svc.Stats().Delivering)
		}
		time.Sleep(time.Millisecond)
	}
	select {
	case s := <-f.sent:
		t.Fatalf("unexpected message to %s: %+v", s.Device, s.Msg)
	default:
	}
}

// subscribe plays the device channel when a device subscribes: it tells
// the service, then reads the device's backlog and sends it, as the broker
// does as the device's window has room.
func subscribe(t *testing.T, svc *action.Service, f *fakeSender, device string) {
	t.Helper()
	svc.DeviceSubscribed("acme", device)
	msgs, err := svc.PendingMessages(context.Background(), "acme", device, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		f.SendAction("acme", device, m.ActionID, m.Payload)
	}
}

// setup opens a store with devices and a service on it.
func setup(t *testing.T, b sqlstoretest.Backend, sender *fakeSender, devices ...string) (*action.Service, *sqlstore.DB) {
	t.Helper()
	db := sqlstoretest.MustOpen(t, b, sqlstoretest.Options{})
	ctx := context.Background()
	if _, _, err := db.CreateTenant(ctx, "acme"); err != nil {
		t.Fatal(err)
	}
	var nd []fleet.NewDevice
	for _, d := range devices {
		nd = append(nd, fleet.NewDevice{ID: d})
	}
	if _, err := db.CreateDevices(ctx, "acme", nd); err != nil {
		t.Fatal(err)
	}
	svc := &action.Service{Store: db, Sender: sender}
	svc.Open()
	t.Cleanup(func() { svc.Close() })
	return svc, db
}

func dispatch(name string, ids ...string) *fleet.Dispatch {
	d := &fleet.Dispatch{Action: name, Params: json.RawMessage(`{"n":1}`), SearchType: fleet.SearchAll, Timeout: 60}
	if len(ids) > 0 {
		d.SearchType, d.DeviceIDs = fleet.SearchDefault, ids
	}
	return d
}

// awaitStatus waits until the device action has status want.
func awaitStatus(t *testing.T, db *sqlstore.DB, id int64, device string, want fleet.ActionStatus) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for {
		da, err := db.FindDeviceAction(context.Background(), "acme", id, device)
		if err != nil {
			t.Fatal(err)
		}
		if da.ActionStatus == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s's action %d is %s, want %s", device, id, da.ActionStatus, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestDelivery(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		f := newFakeSender()
		svc, db := setup(t, b, f, "on-1", "on-2", "off-1")
		ctx := fleet.NewContextWithActor(context.Background(), &fleet.Actor{Tenant: "acme", Role: fleet.RoleOperator, UserName: "ops", UserEmail: "ops@example.com"})
		for _, d := range []string{"on-1", "on-2"} {
			f.setOnline(d, true)
			subscribe(t, svc, f, d) // nothing pending yet
		}

		a, err := svc.DispatchAction(ctx, "acme", dispatch("reboot"))
		if err != nil {
			t.Fatal(err)
		}
		if a.UserName != "ops" || a.UserEmail != "ops@example.com" {
			t.Fatalf("dispatcher = %q %q, want the actor", a.UserName, a.UserEmail)
		}
		got := f.collect(t, 2)
		f.none(t, svc)
		want := action.Message{ID: fmt.Sprint(a.ID), Kind: "process", Name: "reboot", Payload: `{"n":1}`}
		if len(got["on-1"]) != 1 || got["on-1"][0] != want || len(got["on-2"]) != 1 {
			t.Fatalf("sent %+v, want %+v to on-1 and on-2", got, want)
		}
		// Sent is not delivered: the devices acknowledge.
		svc.ActionDelivered("acme", "on-1", a.ID)
		awaitStatus(t, db, a.ID, "on-1", fleet.StatusInitiated)
		if da, _ := db.FindDeviceAction(ctx, "acme", a.ID, "on-2"); da.ActionStatus != fleet.StatusQueued {
			t.Fatalf("on-2 = %s before its acknowledgement", da.ActionStatus)
		}

		t.Run("RedeliveryOnSubscribe", func(t *testing.T) {
			b, err := svc.DispatchAction(ctx, "acme", dispatch("shell", "off-1"))
			if err != nil {
				t.Fatal(err)
			}
			f.none(t, svc)
			// on-2 reconnects without having acknowledged: it gets its
			// action again; off-1 comes online and gets both of its own,
			// oldest first.
			subscribe(t, svc, f, "on-2")
			if s := f.next(t); s.Device != "on-2" || s.Msg.ID != fmt.Sprint(a.ID) {
				t.Fatalf("redelivered %+v", s)
			}
			f.setOnline("off-1", true)
			subscribe(t, svc, f, "off-1")
			s1, s2 := f.next(t), f.next(t)
			if s1.Device != "off-1" || s1.Msg.ID != fmt.Sprint(a.ID) || s2.Msg.ID != fmt.Sprint(b.ID) || s2.Msg.Name != "shell" {
				t.Fatalf("off-1 got %+v then %+v", s1, s2)
			}
			// Acknowledged actions are not read again, even before their
			// acknowledgement was committed: PendingMessages records the
			// acknowledgements it was given first.
			svc.ActionDelivered("acme", "off-1", a.ID)
			svc.ActionDelivered("acme", "off-1", b.ID)
			if msgs, err := svc.PendingMessages(ctx, "acme", "off-1", 0, 10); err != nil || len(msgs) != 0 {
				t.Fatalf("pending after the acknowledgements = %+v, %v; want none", msgs, err)
			}
			awaitStatus(t, db, a.ID, "off-1", fleet.StatusInitiated)
		})

		t.Run("BacklogByWindow", func(t *testing.T) {
			// The channel reads a device's backlog a window at a time: above
			// the last id it has, up to a limit, oldest first.
			var ids []int64
			for range 3 {
				c, err := svc.DispatchAction(ctx, "acme", dispatch("queued", "off-1"))
				if err != nil {
					t.Fatal(err)
				}
				ids = append(ids, c.ID)
			}
			f.collect(t, 3) // off-1 is online: the dispatches were sent
			msgs, err := svc.PendingMessages(ctx, "acme", "off-1", ids[0], 1)
			if err != nil || len(msgs) != 1 || msgs[0].ActionID != ids[1] {
				t.Fatalf("PendingMessages above %d, 1 = %+v, %v; want action %d", ids[0], msgs, err, ids[1])
			}
			var m action.Message
			if err := json.Unmarshal(msgs[0].Payload, &m); err != nil || m.ID != fmt.Sprint(ids[1]) || m.Name != "queued" {
				t.Fatalf("message %s: %v", msgs[0].Payload, err)
			}
		})

		t.Run("OfflineInBetween", func(t *testing.T) {
			f.setOnline("on-2", false)
			d, err := svc.DispatchAction(ctx, "acme", dispatch("late", "on-2"))
			if err != nil {
				t.Fatal(err)
			}
			f.none(t, svc)
			if da, _ := db.FindDeviceAction(ctx, "acme", d.ID, "on-2"); da.ActionStatus != fleet.StatusQueued {
				t.Fatalf("on-2 = %+v", da)
			}
		})
	})
}

// TestDeliveryToFewOfMany checks that a dispatch to many devices with few
// online sends to exactly those.
func TestDeliveryToFewOfMany(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		f := newFakeSender()
		var devices []string
		for i := range 200 {
			devices = append(devices, fmt.Sprintf("d%03d", i))
		}
		svc, _ := setup(t, b, f, devices...)
		for _, d := range []string{"d007", "d100", "d199"} {
			f.setOnline(d, true)
			subscribe(t, svc, f, d)
		}
		// One that subscribed once and left is not sent to.
		f.setOnline("d050", true)
		subscribe(t, svc, f, "d050")
		f.setOnline("d050", false)
		if _, err := svc.DispatchAction(context.Background(), "acme", dispatch("reboot")); err != nil {
			t.Fatal(err)
		}
		got := f.collect(t, 3)
		f.none(t, svc)
		var devs []string
		for d := range got {
			devs = append(devs, d)
		}
		sort.Strings(devs)
		if fmt.Sprint(devs) != "[d007 d100 d199]" {
			t.Fatalf("sent to %v", devs)
		}
	})
}

func TestCancel(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		f := newFakeSender("busy", "away", "queued")
		svc, db := setup(t, b, f, "busy", "away", "queued", "done")
		ctx := context.Background()
		a, err := svc.DispatchAction(ctx, "acme", dispatch("reboot", "busy", "away", "done"))
		if err != nil {
			t.Fatal(err)
		}
		// The actions went nowhere: nobody subscribed yet. busy and away
		// acknowledge it; done finishes.
		f.none(t, svc)
		mustReport := func(r fleet.StatusReport) {
			t.Helper()
			if errs, err := svc.ReportStatus(ctx, "acme", []fleet.StatusReport{r}); err != nil || errs[0] != nil {
				t.Fatal(err, errs)
			}
		}
		mustReport(fleet.StatusReport{DeviceID: "busy", ActionID: a.ID, State: "Running"})
		mustReport(fleet.StatusReport{DeviceID: "away", ActionID: a.ID, State: "Running"})
		mustReport(fleet.StatusReport{DeviceID: "done", ActionID: a.ID, State: "Completed"})
		for _, d := range []string{"busy", "queued"} {
			svc.DeviceSubscribed("acme", d)
		}
		f.setOnline("away", false)

		if err := svc.CancelAction(ctx, "acme", a.ID); err != nil {
			t.Fatal(err)
		}
		s := f.next(t)
		f.none(t, svc)
		wantPayload := fmt.Sprintf(`{"action_id":"%d","name":"reboot"}`, a.ID)
		if s.Device != "busy" || s.Msg.Name != fleet.ActionCancel || s.Msg.ID == fmt.Sprint(a.ID) || s.Msg.Payload != wantPayload {
			t.Fatalf("sent %+v, want a cancel_action of its own id to busy", s)
		}
		cancelID, _ := fleet.ParseActionID(s.Msg.ID)
		// away is told when it comes back, until it acknowledges.
		f.setOnline("away", true)
		subscribe(t, svc, f, "away")
		if s := f.next(t); s.Device != "away" || s.Msg.Name != fleet.ActionCancel || s.Msg.ID != fmt.Sprint(cancelID) {
			t.Fatalf("sent %+v", s)
		}
		svc.ActionDelivered("acme", "away", cancelID)
		if msgs, err := svc.PendingMessages(ctx, "acme", "away", 0, 10); err != nil || len(msgs) != 0 {
			t.Fatalf("pending after the acknowledgement = %+v, %v; want none", msgs, err)
		}
		// The device's reports on the cancellation are its own.
		mustReport(fleet.StatusReport{DeviceID: "away", ActionID: cancelID, State: "Completed"})
		awaitStatus(t, db, cancelID, "away", fleet.StatusCompleted)

		// Cancelling a finished action is not an error and sends nothing.
		if err := svc.CancelAction(ctx, "acme", a.ID); err != nil {
			t.Fatal(err)
		}
		f.none(t, svc)
		wantCode(t, svc.CancelAction(ctx, "acme", 99), fleet.ENOTFOUND)

		t.Run("CancelActionDispatch", func(t *testing.T) {
			// params.action_id as a string of digits, then as an integer.
			for _, form := range []func(int64) any{func(id int64) any { return fmt.Sprint(id) }, func(id int64) any { return id }} {
				c, err := svc.DispatchAction(ctx, "acme", dispatch("reboot", "busy", "queued"))
				if err != nil {
					t.Fatal(err)
				}
				f.collect(t, 2)
				mustReport(fleet.StatusReport{DeviceID: "busy", ActionID: c.ID, State: "Running"})
				params, _ := json.Marshal(map[string]any{"action_id": form(c.ID)})
				d := &fleet.Dispatch{Action: fleet.ActionCancel, Params: params, SearchType: fleet.SearchDefault, DeviceIDs: []string{"busy", "queued"}, Timeout: 60}
				cc, err := svc.DispatchAction(ctx, "acme", d)
				if err != nil {
					t.Fatal(err)
				}
				s := f.next(t)
				f.none(t, svc)
				if s.Device != "busy" || s.Msg.ID != fmt.Sprint(cc.ID) || s.Msg.Name != fleet.ActionCancel || s.Msg.Payload != fmt.Sprintf(`{"action_id":"%d","name":"reboot"}`, c.ID) {
					t.Fatalf("sent %+v", s)
				}
				// queued never had it; busy has it until it answers.
				want := map[string]fleet.ActionStatus{"queued": fleet.StatusCancelled, "busy": fleet.StatusProgress}
				for dev, st := range want {
					if da, _ := db.FindDeviceAction(ctx, "acme", c.ID, dev); da.ActionStatus != st {
						t.Fatalf("%s = %+v, want %s", dev, da, st)
					}
				}
				mustReport(fleet.StatusReport{DeviceID: "busy", ActionID: cc.ID, State: "Completed"})
				awaitStatus(t, db, c.ID, "busy", fleet.StatusCancelled)
			}
			for _, bad := range []string{`{}`, `{"action_id":"x"}`, `{"action_id":0}`, `{"action_id":1.5}`, `{"action_id":99}`} {
				d := &fleet.Dispatch{Action: fleet.ActionCancel, Params: json.RawMessage(bad), SearchType: fleet.SearchAll, Timeout: 60}
				_, err := svc.DispatchAction(ctx, "acme", d)
				wantCode(t, err, fleet.EINVALID)
			}
		})
	})
}

func wantCode(t *testing.T, err error, code string) {
	t.Helper()
	if got := fleet.ErrorCode(err); got != code {
		t.Fatalf("error code = %q (%v), want %q", got, err, code)
	}
}

func TestPreparers(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		f := newFakeSender("d1", "d2")
		svc, db := setup(t, b, f, "d1", "d2")
		for _, d := range []string{"d1", "d2"} {
			svc.DeviceSubscribed("acme", d)
		}
		ctx := context.Background()
		svc.Preparers["special"] = fleet.ActionPreparerFunc(func(ctx context.Context, tenant string, d *fleet.Dispatch) error {
			var p struct{ Version string }
			json.Unmarshal(d.Params, &p)
			if p.Version == "" {
				return fleet.FieldErrors(map[string]string{"params.version": "is required"})
			}
			d.DeviceParams = json.RawMessage(`{"url":"https://example.com/` + p.Version + `"}`)
			d.CheckDevice = func(map[string]string) string { return "never asked: no device has components" }
			return nil
		})
		_, err := svc.DispatchAction(ctx, "acme", &fleet.Dispatch{Action: "special", Params: json.RawMessage(`{}`), SearchType: fleet.SearchAll, Timeout: 60})
		wantCode(t, err, fleet.EINVALID)
		a, err := svc.DispatchAction(ctx, "acme", &fleet.Dispatch{Action: "special", Params: json.RawMessage(`{"version":"2"}`), SearchType: fleet.SearchAll, Timeout: 60})
		if err != nil {
			t.Fatal(err)
		}
		got := f.collect(t, 2)
		if got["d1"][0].Payload != `{"url":"https://example.com/2"}` {
			t.Fatalf("sent %+v", got)
		}
		full, _ := db.FindAction(ctx, "acme", a.ID)
		if string(full.Params) != `{"version":"2"}` {
			t.Fatalf("the action shows params %s, want what the operator sent", full.Params)
		}
	})
}

// fakeTimeouts records the sweeper's calls.
type fakeTimeouts struct {
	mu      sync.Mutex
	overdue int
	calls   []time.Time
}

func (f *fakeTimeouts) TimeOutDeviceActions(ctx context.Context, now time.Time, limit int) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, now)
	n := min(f.overdue, limit)
	f.overdue -= n
	return n, nil
}

func TestSweeper(t *testing.T) {
	t.Run("Batches", func(t *testing.T) {
		now := time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)
		f := &fakeTimeouts{overdue: 5}
		s := &action.Sweeper{Store: f, Batch: 2, Now: func() time.Time { return now }}
		n, err := s.Sweep(context.Background())
		if err != nil || n != 5 || len(f.calls) != 3 || !f.calls[2].Equal(now) {
			t.Fatalf("swept %d (%v) in %d calls", n, err, len(f.calls))
		}
	})
	t.Run("WithTheStore", func(t *testing.T) {
		sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
			svc, db := setup(t, b, newFakeSender(), "d1", "d2", "d3")
			ctx := context.Background()
			d := dispatch("reboot")
			d.Timeout = 30
			a, err := svc.DispatchAction(ctx, "acme", d)
			if err != nil {
				t.Fatal(err)
			}
			for _, dev := range []string{"d1", "d2"} {
				svc.ActionDelivered("acme", dev, a.ID)
				awaitStatus(t, db, a.ID, dev, fleet.StatusInitiated)
			}
			now := time.Now()
			s := &action.Sweeper{Store: db, Batch: 1, Now: func() time.Time { return now }}
			if n, err := s.Sweep(ctx); err != nil || n != 0 {
				t.Fatalf("now: %d, %v", n, err)
			}
			now = now.Add(31 * time.Second)
			if n, err := s.Sweep(ctx); err != nil || n != 2 {
				t.Fatalf("after the timeout: %d, %v", n, err)
			}
			full, _ := db.FindAction(ctx, "acme", a.ID)
			if full.Statuses["Failed"] != 2 || full.Statuses["Queued"] != 1 {
				t.Fatalf("statuses = %v", full.Statuses)
			}
		})
	})
	t.Run("RunStops", func(t *testing.T) {
		f := &fakeTimeouts{overdue: 3}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		s := &action.Sweeper{Store: f, Interval: time.Millisecond}
		go func() { s.Run(ctx); close(done) }()
		deadline := time.Now().Add(wait)
		for {
			f.mu.Lock()
			left := f.overdue
			f.mu.Unlock()
			if left == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the sweeper did not sweep")
			}
			time.Sleep(time.Millisecond)
		}
		cancel()
		select {
		case <-done:
		case <-time.After(wait):
			t.Fatal("Run did not return")
		}
	})
}

func TestMessages(t *testing.T) {
	if got := string(action.NewMessage(42, "reboot", `{"a":1}`)); got != `{"id":"42","kind":"process","name":"reboot","payload":"{\"a\":1}"}` {
		t.Errorf("NewMessage = %s", got)
	}
}

// TestReportBatching checks that concurrent callers, whose reports share
// store calls, each get their own answers, and that the devices that
// reported are recorded as seen.
func TestReportBatching(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		var devices []string
		for i := range 50 {
			devices = append(devices, fmt.Sprintf("d%02d", i))
		}
		svc, db := setup(t, b, newFakeSender(), devices...)
		ctx := context.Background()
		a, err := svc.DispatchAction(ctx, "acme", dispatch("reboot"))
		if err != nil {
			t.Fatal(err)
		}
		const callers = 200
		errs := make([][]error, callers)
		fails := make([]error, callers)
		var wg sync.WaitGroup
		for i := range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				dev := devices[i%len(devices)]
				if i%10 == 0 {
					dev = "ghost"
				}
				errs[i], fails[i] = svc.ReportStatus(ctx, "acme", []fleet.StatusReport{
					{DeviceID: dev, ActionID: a.ID, State: "Running", Timestamp: i64(int64(i)), Sequence: i64(1)},
					{DeviceID: dev, ActionID: a.ID + 1, State: "Running"},
				})
			}()
		}
		wg.Wait()
		for i := range callers {
			if fails[i] != nil || len(errs[i]) != 2 {
				t.Fatalf("caller %d: %v, %d answers", i, fails[i], len(errs[i]))
			}
			wantCode(t, errs[i][1], fleet.ENOTFOUND)
			if i%10 == 0 {
				wantCode(t, errs[i][0], fleet.ENOTFOUND)
			} else if errs[i][0] != nil {
				t.Fatalf("caller %d: %v", i, errs[i][0])
			}
		}
		// d01's reports came from callers 1, 51, 101 and 151: the latest
		// timestamp wins whatever the order they were applied in.
		da, _ := db.FindDeviceAction(ctx, "acme", a.ID, "d01")
		if da.ActionStatus != fleet.StatusProgress {
			t.Fatalf("d01 = %+v", da)
		}
		deadline := time.Now().Add(wait)
		for {
			d, err := db.FindDevice(ctx, "acme", "d01")
			if err != nil {
				t.Fatal(err)
			}
			if d.LastSeenAt != nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("last_seen_at was not recorded")
			}
			time.Sleep(10 * time.Millisecond)
		}
		if d, _ := db.FindDevice(ctx, "acme", "d00"); d.LastSeenAt != nil {
			t.Fatalf("d00 only ever sent reports for ghost's slot; last_seen_at = %v", d.LastSeenAt)
		}

		t.Run("CancelledCaller", func(t *testing.T) {
			cctx, cancel := context.WithCancel(ctx)
			cancel()
			_, err := svc.ReportStatus(cctx, "acme", []fleet.StatusReport{{DeviceID: "d02", ActionID: a.ID, State: "x"}})
			if err == nil {
				t.Fatal("a cancelled caller got no error")
			}
		})
		t.Run("AfterClose", func(t *testing.T) {
			svc.Close()
			_, err := svc.ReportStatus(ctx, "acme", []fleet.StatusReport{{DeviceID: "d02", ActionID: a.ID, State: "x"}})
			wantCode(t, err, fleet.EUNAVAILABLE)
		})
	})
}

func i64(n int64) *int64 { return &n }

// BenchmarkReportStatus measures status reports through the service, as
// S10's handlers and the MQTT handler send them: 64 concurrent callers,
// one report each, whose reports share store calls.
func BenchmarkReportStatus(b *testing.B) {
	for _, be := range sqlstoretest.Backends() {
		b.Run(be.Name, func(b *testing.B) {
			db := sqlstoretest.MustOpen(b, be, sqlstoretest.Options{})
			ctx := context.Background()
			if _, _, err := db.CreateTenant(ctx, "bench"); err != nil {
				b.Fatal(err)
			}
			const devices = 10_000
			devs := make([]fleet.NewDevice, devices)
			for i := range devs {
				devs[i] = fleet.NewDevice{ID: fmt.Sprintf("dev-%05d", i)}
			}
			if _, err := db.CreateDevices(ctx, "bench", devs); err != nil {
				b.Fatal(err)
			}
			a, err := db.DispatchAction(ctx, "bench", &fleet.Dispatch{Action: "reboot", Params: json.RawMessage(`{}`), SearchType: fleet.SearchAll, Timeout: 3600})
			if err != nil {
				b.Fatal(err)
			}
			svc := &action.Service{Store: db}
			svc.Open()
			defer svc.Close()
			var seq atomic.Int64
			b.SetParallelism(32) // 64 callers on 2 cores
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					i := seq.Add(1)
					p := int(i % 100)
					errs, err := svc.ReportStatus(ctx, "bench", []fleet.StatusReport{{DeviceID: fmt.Sprintf("dev-%05d", i%devices), ActionID: a.ID,
						State: "Downloading", Progress: &p, Timestamp: i64(i), Sequence: i64(i)}})
					if err != nil || errs[0] != nil {
						b.Fatal(err, errs)
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "reports/s")
		})
	}
}

// TestPendingMessagesKeepToTheWindow checks that a device's backlog leaves
// out the actions of a rollout whose maintenance window is closed, and
// reads on past them: a short page means the backlog ends.
func TestPendingMessagesKeepToTheWindow(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		f := newFakeSender()
		svc, db := setup(t, b, f, "d1")
		ctx := context.Background()
		now := time.Now().UTC()
		closed := &fleet.MaintenanceWindow{Start: now.Add(2 * time.Hour).Format("15:04"), End: now.Add(3 * time.Hour).Format("15:04"), Timezone: "UTC"}
		var windowed []int64
		for range 3 {
			d := dispatch("flash", "d1")
			d.Schedule = &fleet.Schedule{MaintenanceWindow: closed, Phases: []fleet.Phase{{Name: "all", TriggerOn: fleet.Trigger{Type: fleet.TriggerNow}, Info: fleet.PhaseInfo{Type: "percentage", Percentage: 100}}}}
			a, err := svc.DispatchAction(ctx, "acme", d)
			if err != nil {
				t.Fatal(err)
			}
			windowed = append(windowed, a.ID)
			if da, err := db.FindDeviceAction(ctx, "acme", a.ID, "d1"); err != nil || da.ActionStatus != fleet.StatusQueued {
				t.Fatalf("the rollout's device action = %+v, %v; want it released (Queued)", da, err)
			}
		}
		plain, err := svc.DispatchAction(ctx, "acme", dispatch("ping", "d1"))
		if err != nil {
			t.Fatal(err)
		}
		msgs, err := svc.PendingMessages(ctx, "acme", "d1", 0, 2)
		if err != nil || len(msgs) != 1 || msgs[0].ActionID != plain.ID {
			t.Fatalf("PendingMessages = %+v, %v; want only action %d, not those of the closed window %v", msgs, err, plain.ID, windowed)
		}
	})
}
