package twin_test

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/mqtt"
	"github.com/fleetd/fleet/mqtt/bridge"
	"github.com/fleetd/fleet/mqtt/mosquittotest"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// twinDevice is a device speaking MQTT 5 (paho) that subscribes to its
// shadow delta and reports its state.
type twinDevice struct {
	*paho.Client
	tenant, id string
	deltas     chan []byte
}

var twinDeviceIDs atomic.Int64

func dialTwinDevice(t *testing.T, addr, tenant, id, token string) *twinDevice {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	d := &twinDevice{tenant: tenant, id: id, deltas: make(chan []byte, 100)}
	d.Client = paho.NewClient(paho.ClientConfig{Conn: conn,
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(pr paho.PublishReceived) (bool, error) {
			if pr.Packet.Topic == mqtt.ShadowDeltaTopic(tenant, id) {
				d.deltas <- pr.Packet.Payload
			}
			return true, nil
		}}})
	ctx, cancel := context.WithTimeout(context.Background(), fleetdtest.Bound)
	defer cancel()
	if _, err := d.Connect(ctx, &paho.Connect{ClientID: fmt.Sprintf("%s-%d", id, twinDeviceIDs.Add(1)), CleanStart: true, KeepAlive: 30,
		Username: tenant + "/" + id, UsernameFlag: true, Password: []byte(token), PasswordFlag: true}); err != nil {
		t.Fatalf("connect %s: %v", id, err)
	}
	t.Cleanup(func() { d.leave() })
	if _, err := d.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: mqtt.ShadowDeltaTopic(tenant, id), QoS: 1}}}); err != nil {
		t.Fatalf("subscribe %s: %v", id, err)
	}
	return d
}

func (d *twinDevice) leave() {
	_ = d.Disconnect(&paho.Disconnect{})
	<-d.Done()
}

// nextDelta returns the next delta message's payload.
func (d *twinDevice) nextDelta(t *testing.T) string {
	t.Helper()
	select {
	case b := <-d.deltas:
		return string(b)
	case <-time.After(fleetdtest.Bound):
		t.Fatalf("%s received no delta", d.id)
	}
	panic("unreachable")
}

func (d *twinDevice) publish(t *testing.T, topic string, payload any) {
	t.Helper()
	fleetdtest.PublishJSON(t, d.Client, topic, payload)
}

// TestShadowOverMQTT: a device gets its delta when it subscribes and at
// each change of it, reports its state on shadow/reported or, as uplink
// does, on the device_shadow stream; on the embedded broker and through
// Mosquitto, where the delta is the topic's retained message and an empty
// delta clears it.
func TestShadowOverMQTT(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		for _, external := range []bool{false, true} {
			name := "Embedded"
			if external {
				name = "Mosquitto"
			}
			t.Run(name, func(t *testing.T) {
				var s *fleetdtest.Server
				addr := ""
				if external {
					broker := mosquittotest.Start(t)
					s = fleetdtest.Start(t, b, fleetdtest.ExternalBrokerFlags(broker)...)
					addr = broker.Addr
				} else {
					s = fleetdtest.Start(t, b)
					addr = s.MQTTAddr
				}
				admin := s.Admin()
				tok := s.MustDevice(t, admin, "tw-1", nil).Token
				path := "/api/v1/devices/tw-1/shadow"
				if external {
					// The broker asks fleetd: the device may subscribe to its
					// delta and publish its reported state.
					for _, acl := range []struct {
						topic string
						acc   int
					}{{mqtt.ShadowDeltaTopic("default", "tw-1"), 4}, {mqtt.ShadowDeltaTopic("default", "tw-1"), 1}, {mqtt.ShadowReportedTopic("default", "tw-1"), 2}} {
						if code := s.GoAuth(t, bridge.GoAuthACLPath, map[string]any{"username": "default/tw-1", "clientid": "tw-1", "topic": acl.topic, "acc": acl.acc}); code != 200 {
							t.Fatalf("/acl %s acc %d: %d", acl.topic, acl.acc, code)
						}
					}
					// fleetd's own connection to the broker is up before the
					// desired state is set, so that its delta is retained.
					fleetdtest.Eventually(t, "fleetd connected to the broker", func() bool {
						return s.Do(t, admin, "GET", "/readyz", nil).Status == 200
					})
				}
				s.Do(t, admin, "PATCH", path, map[string]any{"desired": map[string]any{"interval": 10, "log": map[string]any{"level": "debug"}}}).Want(t, 200)

				d := dialTwinDevice(t, addr, "default", "tw-1", tok)
				if got, want := d.nextDelta(t), `{"interval":10,"log":{"level":"debug"}}`; got != want {
					t.Fatalf("delta on subscribing = %s, want %s", got, want)
				}
				d.publish(t, mqtt.ShadowReportedTopic("default", "tw-1"), map[string]any{"interval": 10, "log": map[string]any{"level": "info"}, "uptime": 5})
				if got, want := d.nextDelta(t), `{"log":{"level":"debug"}}`; got != want {
					t.Fatalf("delta after a report = %s, want %s", got, want)
				}
				d.publish(t, mqtt.ShadowReportedTopic("default", "tw-1"), map[string]any{"log": map[string]any{"level": "debug"}})
				if external {
					// The retained delta is cleared, which the subscribers
					// of the moment receive as an empty message.
					if got := d.nextDelta(t); got != "" {
						t.Fatalf("delta when in sync = %q, want the empty clearing message", got)
					}
				}
				fleetdtest.Eventually(t, "the shadow in sync", func() bool {
					var sh fleetdtest.Shadow
					s.Do(t, admin, "GET", path, nil).Want(t, 200).Decode(t, &sh)
					return sh.InSync && sh.Reported["uptime"] == float64(5)
				})
				// No empty delta came on the embedded broker: the next
				// message is the next change.
				s.Do(t, admin, "PATCH", path, map[string]any{"desired": map[string]any{"interval": 20}}).Want(t, 200)
				if got, want := d.nextDelta(t), `{"interval":20}`; got != want {
					t.Fatalf("delta after a desired change = %s, want %s", got, want)
				}

				// Subscribing again, the device gets the current delta.
				d.leave()
				d = dialTwinDevice(t, addr, "default", "tw-1", tok)
				if got, want := d.nextDelta(t), `{"interval":20}`; got != want {
					t.Fatalf("delta on subscribing again = %s, want %s", got, want)
				}

				// uplink's device_shadow stream fills the reported state: its
				// latest point, without sequence and timestamp.
				now := time.Now().UnixMilli()
				d.publish(t, mqtt.StreamTopic("default", "tw-1", "device_shadow"), []map[string]any{
					{"sequence": 2, "timestamp": now + 1, "interval": 20, "Status": "running"},
					{"sequence": 1, "timestamp": now, "interval": 15, "Status": "starting"},
				})
				if external {
					if got := d.nextDelta(t); got != "" {
						t.Fatalf("delta after the stream's point = %q, want the empty clearing message", got)
					}
				}
				fleetdtest.Eventually(t, "the stream's point in the reported state", func() bool {
					var sh fleetdtest.Shadow
					s.Do(t, admin, "GET", path, nil).Want(t, 200).Decode(t, &sh)
					_, seq := sh.Reported["sequence"]
					_, ts := sh.Reported["timestamp"]
					return sh.InSync && sh.Reported["Status"] == "running" && !seq && !ts
				})
				if !external {
					select {
					case m := <-d.deltas:
						t.Fatalf("an empty delta was sent: %q", m)
					default:
					}
				}
			})
		}
	})
}
