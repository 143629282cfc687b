package mqtt_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/pierrec/lz4/v4"

	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/mqtt"
	"github.com/fleetd/fleet/mqtt/mqtttest"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// lz4Frame compresses b into an LZ4 frame, as the uplink agent does for
// a stream with compression = "Lz4".
func lz4Frame(t *testing.T, b []byte) []byte {
	t.Helper()
	var out bytes.Buffer
	w := lz4.NewWriter(&out)
	if _, err := w.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

// TestUplinkStreams drives the stream topics the uplink agent publishes
// on, over MQTT 3.1.1 and MQTT 5: LZ4 frames and older uplinks' statistics
// without events/ are taken; a frame that inflates past the packet limit
// and a topic fleetd does not take are refused (MQTT 5: with a PUBACK
// reason code) without ending the connection, which would have the device
// publish them again on every reconnection.
func TestUplinkStreams(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		const limit = 4096
		s := fleetdtest.Start(t, b, "--mqtt-max-packet-size", fmt.Sprint(limit))
		admin := s.Admin()
		points := func(seq int, field string) []byte {
			return []byte(fmt.Sprintf(`[{"timestamp":%d,"sequence":%d,%q:%d}]`, time.Now().UnixMilli(), seq, field, seq))
		}
		latest := func(device, stream string) string {
			r := s.Do(t, admin, "GET", "/api/v1/devices/"+device+"/streams/"+stream+"/latest", nil)
			if r.Status == 404 {
				return ""
			}
			return string(r.Want(t, 200).Body)
		}
		awaitPoint := func(device, stream, want string) {
			t.Helper()
			fleetdtest.Eventually(t, stream+" of "+device, func() bool { return strings.Contains(latest(device, stream), want) })
		}
		// What inflates past the limit: 100 KB of spaces, a few hundred
		// bytes as a frame.
		bomb := lz4Frame(t, append(append([]byte(`[{"sequence":1,"pad":"`), bytes.Repeat([]byte(" "), 100_000)...), `"}]`...))
		if len(bomb) >= limit {
			t.Fatalf("the frame is %d bytes; it must fit in a packet", len(bomb))
		}

		t.Run("MQTT311", func(t *testing.T) {
			dev := s.MustDevice(t, admin, "uplink-3", nil)
			d := s.ConnectDevice(t, "default", "uplink-3", dev.Token)
			publish := func(topic string, payload []byte) {
				t.Helper()
				tok := d.Client.Publish(topic, 1, false, payload)
				if !tok.WaitTimeout(fleetdtest.Bound) || tok.Error() != nil {
					t.Fatalf("publish on %s: %v", topic, tok.Error())
				}
			}
			publish(mqtt.StreamTopic("default", "uplink-3", "gps")+"/lz4", lz4Frame(t, points(1, "lat")))
			awaitPoint("uplink-3", "gps", `"lat":1`)
			publish("/tenants/default/devices/uplink-3/uplink_disk_stats/jsonarray", points(2, "free"))
			awaitPoint("uplink-3", "uplink_disk_stats", `"free":2`)
			// Refused: MQTT 3.1.1 has no way to say so, so acknowledged
			// (and logged); the connection stays.
			publish(mqtt.StreamTopic("default", "uplink-3", "gps")+"/lz4", bomb)
			publish(mqtt.StreamTopic("default", "uplink-3", "gps")+"/lz4", []byte("not a frame"))
			publish("/tenants/default/devices/uplink-3/events/gps/jsonarray/zstd", points(3, "lat"))
			publish(mqtt.StreamTopic("default", "uplink-3", "gps")+"/lz4", lz4Frame(t, points(4, "lat")))
			awaitPoint("uplink-3", "gps", `"lat":4`)
			if !d.Client.IsConnectionOpen() {
				t.Fatal("the device was disconnected")
			}
		})

		t.Run("MQTT5", func(t *testing.T) {
			dev := s.MustDevice(t, admin, "uplink-5", nil)
			conn, err := net.Dial("tcp", s.MQTTAddr)
			if err != nil {
				t.Fatal(err)
			}
			d := mqtttest.NewDevice(conn, false)
			ctx, cancel := context.WithTimeout(context.Background(), fleetdtest.Bound)
			defer cancel()
			if _, err := d.Connect(ctx, &paho.Connect{KeepAlive: 30, ClientID: "uplink-5", CleanStart: true,
				Username: "default/uplink-5", UsernameFlag: true, Password: []byte(dev.Token), PasswordFlag: true}); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { d.Disconnect(&paho.Disconnect{}) })
			if err := d.Send(mqtt.StreamTopic("default", "uplink-5", "gps")+"/lz4", lz4Frame(t, points(1, "lat"))); err != nil {
				t.Fatal(err)
			}
			awaitPoint("uplink-5", "gps", `"lat":1`)
			for _, c := range []struct {
				topic   string
				payload []byte
				code    byte
			}{
				{mqtt.StreamTopic("default", "uplink-5", "gps") + "/lz4", bomb, 0x99},
				{mqtt.StreamTopic("default", "uplink-5", "gps") + "/lz4", []byte("not a frame"), 0x99},
				{"/tenants/default/devices/uplink-5/events/gps/jsonarray/zstd", points(2, "lat"), 0x90},
			} {
				var refusal *mqtttest.RefusedError
				if err := d.Send(c.topic, c.payload); !errors.As(err, &refusal) || refusal.Code != c.code {
					t.Errorf("publish on %s: %v, want PUBACK reason %#x", c.topic, err, c.code)
				}
			}
			if err := d.Send("/tenants/default/devices/uplink-5/uplink_processor_stats/jsonarray", points(3, "load")); err != nil {
				t.Fatalf("after the refusals: %v", err)
			}
			awaitPoint("uplink-5", "uplink_processor_stats", `"load":3`)
		})
	})
}
