package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/fleetd/fleet/action"
	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/mqtt"
	"github.com/fleetd/fleet/mqtt/bridge"
	"github.com/fleetd/fleet/mqtt/mosquittotest"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// extDevice is a device of an external broker: it connects to the broker
// (which lets anyone in here) while the test plays the broker's calls to
// fleetd's broker-auth endpoints, in the order mosquitto-go-auth makes
// them: /user at CONNECT, /acl with acc 4 at SUBSCRIBE.
type extDevice struct {
	*paho.Client
	tenant, id string
	actions    chan action.Message
}

var extDeviceIDs atomic.Int64

func (s *testServer) arriveExternal(t *testing.T, brokerAddr, tenant, id, token string) *extDevice {
	t.Helper()
	if code := s.GoAuth(t, bridge.GoAuthUserPath, map[string]any{"username": tenant + "/" + id, "password": token, "clientid": id}); code != 200 {
		t.Fatalf("/user for %s: %d", id, code)
	}
	conn, err := net.Dial("tcp", brokerAddr)
	if err != nil {
		t.Fatal(err)
	}
	d := &extDevice{tenant: tenant, id: id, actions: make(chan action.Message, 100)}
	d.Client = paho.NewClient(paho.ClientConfig{
		Conn: conn,
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(pr paho.PublishReceived) (bool, error) {
			var m action.Message
			if err := json.Unmarshal(pr.Packet.Payload, &m); err != nil {
				panic(err)
			}
			d.actions <- m
			return true, nil
		}},
	})
	ctx, cancel := context.WithTimeout(context.Background(), fleetdtest.Bound)
	defer cancel()
	if _, err := d.Connect(ctx, &paho.Connect{ClientID: fmt.Sprintf("%s-%d", id, extDeviceIDs.Add(1)), CleanStart: true, KeepAlive: 30,
		Username: tenant + "/" + id, UsernameFlag: true, Password: []byte(token), PasswordFlag: true}); err != nil {
		t.Fatalf("connect %s: %v", id, err)
	}
	t.Cleanup(func() { d.leave() })
	topic := mqtt.ActionsTopic(tenant, id)
	if code := s.GoAuth(t, bridge.GoAuthACLPath, map[string]any{"username": tenant + "/" + id, "clientid": id, "topic": topic, "acc": 4}); code != 200 {
		t.Fatalf("/acl subscribe for %s: %d", id, code)
	}
	if _, err := d.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: topic, QoS: 1}}}); err != nil {
		t.Fatalf("subscribe %s: %v", id, err)
	}
	return d
}

func (d *extDevice) leave() {
	_ = d.Disconnect(&paho.Disconnect{})
	<-d.Done()
}

func (d *extDevice) next(t *testing.T) action.Message {
	t.Helper()
	select {
	case m := <-d.actions:
		return m
	case <-time.After(fleetdtest.Bound):
		t.Fatalf("%s received no action", d.id)
	}
	panic("unreachable")
}

func (d *extDevice) publish(t *testing.T, topic string, payload any) {
	t.Helper()
	fleetdtest.PublishJSON(t, d.Client, topic, payload)
}

// emqx calls an EMQX endpoint as EMQX does with docs/operations.md's
// configuration and returns the status and its result.
func (s *testServer) emqx(t *testing.T, path, secret string, body map[string]any) (int, string) {
	t.Helper()
	b, _ := json.Marshal(body)
	rq, _ := http.NewRequest("POST", s.URL+path, bytes.NewReader(b))
	rq.Header.Set("Content-Type", "application/json")
	if secret != "" {
		rq.Header.Set("Authorization", "Bearer "+secret)
	}
	resp, err := http.DefaultClient.Do(rq)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct{ Result string }
	json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out.Result
}

// TestExternalBroker runs fleetd against Mosquitto: actions reach devices,
// including one that subscribes later; status reports are committed and
// visible; stream data is ingested; the broker-auth endpoints check real
// device tokens.
func TestExternalBroker(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		broker := mosquittotest.Start(t)
		s := startServer(t, b, fleetdtest.ExternalBrokerFlags(broker)...)
		admin := s.Admin()
		if s.MQTTAddr != broker.URL {
			t.Fatalf("startup line names mqtt=%s, want the broker %s", s.MQTTAddr, broker.URL)
		}
		tok := map[string]string{}
		for _, id := range []string{"pump-1", "pump-2"} {
			tok[id] = s.MustDevice(t, admin, id, nil).Token
		}

		t.Run("BrokerAuth", func(t *testing.T) {
			login := func(user, pw string) map[string]any {
				return map[string]any{"clientid": "c", "username": user, "password": pw, "peerhost": "127.0.0.1"}
			}
			for _, tc := range []struct {
				secret, user, pw string
				code             int
				result           string
			}{
				{fleetdtest.BrokerSecret, "default/pump-1", tok["pump-1"], 200, "allow"},
				{fleetdtest.BrokerSecret, "default/pump-1", tok["pump-2"], 200, "deny"},
				{fleetdtest.BrokerSecret, "default/ghost", tok["pump-1"], 200, "deny"},
				{fleetdtest.BrokerSecret, "fleetd", "fleetd-pw", 200, "allow"},
				{"", "default/pump-1", tok["pump-1"], 401, ""},
				{"nope", "default/pump-1", tok["pump-1"], 401, ""},
			} {
				if code, res := s.emqx(t, bridge.EMQXAuthnPath, tc.secret, login(tc.user, tc.pw)); code != tc.code || res != tc.result {
					t.Errorf("authn %s (secret %q): %d %q, want %d %q", tc.user, tc.secret, code, res, tc.code, tc.result)
				}
			}
			if code := s.GoAuth(t, bridge.GoAuthUserPath, map[string]any{"username": "default/pump-2", "password": "wrong", "clientid": "c"}); code != 403 {
				t.Errorf("go-auth /user with a wrong token: %d", code)
			}
			// Not part of the API: absent from its document.
			var doc struct{ Paths map[string]any }
			s.Do(t, admin, "GET", "/api/v1/openapi.json", nil).Want(t, 200).Decode(t, &doc)
			for p := range doc.Paths {
				if strings.HasPrefix(p, "/broker/") {
					t.Errorf("the API document lists %s", p)
				}
			}
		})

		// pump-2 is offline when the action is dispatched; it arrives later
		// and gets it once subscribed. (This also waits for fleetd's own
		// connection to the broker.)
		late := s.Dispatch(t, admin, map[string]any{"action": "reboot", "params": map[string]any{}, "search_type": "default", "device_ids": []string{"pump-2"}})
		d2 := s.arriveExternal(t, broker.Addr, "default", "pump-2", tok["pump-2"])
		if m := d2.next(t); m.ID != fmt.Sprint(late) || m.Name != "reboot" {
			t.Fatalf("pump-2 received %+v", m)
		}
		// No report yet: it stays Queued (fleetd cannot see the device's
		// PUBACK) and comes again at the device's next arrival.
		if da := s.DeviceAction(t, admin, "pump-2", late); da.ActionStatus != "Queued" {
			t.Fatalf("pump-2's action before any report: %+v", da)
		}
		d2.leave()
		d2 = s.arriveExternal(t, broker.Addr, "default", "pump-2", tok["pump-2"])
		if m := d2.next(t); m.ID != fmt.Sprint(late) {
			t.Fatalf("pump-2 received %+v again, want %d", m, late)
		}
		// Its first report initiates it; it is not sent again after that.
		d2.publish(t, mqtt.ActionStatusTopic("default", "pump-2"), map[string]any{"id": fmt.Sprint(late), "state": "Rebooting", "progress": 10})
		s.AwaitActionStatus(t, admin, "pump-2", late, "Progress")
		d2.leave()
		d2 = s.arriveExternal(t, broker.Addr, "default", "pump-2", tok["pump-2"])
		select {
		case m := <-d2.actions:
			t.Fatalf("pump-2 received %+v after reporting on it", m)
		case <-time.After(time.Second): // the arrival is served after half a second
		}

		// pump-1 is subscribed when the action is dispatched: it gets it at
		// once, reports over MQTT, and the reports are visible.
		d1 := s.arriveExternal(t, broker.Addr, "default", "pump-1", tok["pump-1"])
		id := s.Dispatch(t, admin, map[string]any{"action": "update", "params": map[string]any{"v": 2}, "search_type": "all"})
		if m := d1.next(t); m.ID != fmt.Sprint(id) || m.Payload != `{"v":2}` {
			t.Fatalf("pump-1 received %+v", m)
		}
		now := time.Now().UnixMilli()
		d1.publish(t, mqtt.ActionStatusTopic("default", "pump-1"), []map[string]any{
			{"id": fmt.Sprint(id), "state": "Downloading", "progress": 50, "timestamp": now, "sequence": 1},
			{"id": fmt.Sprint(id), "state": "Completed", "progress": 100, "timestamp": now + 1, "sequence": 2},
		})
		da := s.AwaitActionStatus(t, admin, "pump-1", id, "Completed")
		if da.Progress != 100 || da.Status != "Completed" {
			t.Fatalf("pump-1's record %+v", da)
		}

		// Stream data reaches the store through the shared subscription.
		d1.publish(t, mqtt.StreamTopic("default", "pump-1", "temp"), []map[string]any{{"sequence": 1, "timestamp": now, "celsius": 21.5}})
		fleetdtest.Eventually(t, "the stream's latest point", func() bool {
			r := s.Do(t, admin, "GET", "/api/v1/devices/pump-1/streams/temp/latest", nil)
			return r.Status == 200 && strings.Contains(string(r.Body), "21.5")
		})
	})
}
