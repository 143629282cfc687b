package broker_test

import (
	"bytes"
	"testing"

	"github.com/eclipse/paho.golang/paho"

	"github.com/fleetd/fleet/mqtt"
	"github.com/fleetd/fleet/mqtt/mqtttest"
)

// TestShadowTopics: a device subscribed to its delta is told so
// (DeltaSubscribed) and receives deltas at QoS 0; one that is not, or that
// unsubscribed, receives none; an empty delta is never sent; its reported
// state reaches HandleReported before the PUBACK.
func TestShadowTopics(t *testing.T) {
	h := mqtttest.NewHandler()
	s := MustOpenServer(t, h)
	c := mustConnect5(t, s, "acme/dev-1", "tok-1", false)
	deltaT := mqtt.ShadowDeltaTopic("acme", "dev-1")
	delta := []byte(`{"interval":10}`)

	if s.SendDelta("acme", "dev-1", delta) {
		t.Fatal("SendDelta to a device not subscribed = true")
	}
	// The actions topic alone does not subscribe it to deltas.
	c.MustSubscribe(t, actionsT, 1)
	mqtttest.Receive(t, h.Subscribed, "DeviceSubscribed")
	if s.SendDelta("acme", "dev-1", delta) {
		t.Fatal("SendDelta to a device subscribed to its actions only = true")
	}

	sa := c.MustSubscribe(t, deltaT, 1)
	if len(sa.Reasons) != 1 || sa.Reasons[0] != 0 {
		t.Fatalf("SUBACK reasons %v, want [0]: deltas go at QoS 0", sa.Reasons)
	}
	if got := mqtttest.Receive(t, h.Deltas, "DeltaSubscribed"); got.Tenant != "acme" || got.Device != "dev-1" {
		t.Fatalf("DeltaSubscribed(%q, %q)", got.Tenant, got.Device)
	}
	if s.SendDelta("acme", "dev-1", nil) {
		t.Fatal("an empty delta was sent")
	}
	if !s.SendDelta("acme", "dev-1", delta) {
		t.Fatal("SendDelta = false")
	}
	pb := mqtttest.Receive(t, c.Received, "delta")
	if pb.Topic != deltaT || pb.QoS != 0 || !bytes.Equal(pb.Payload, delta) {
		t.Fatalf("got %q at QoS %d: %s", pb.Topic, pb.QoS, pb.Payload)
	}
	// Actions still flow beside it.
	if !s.SendAction("acme", "dev-1", 42, action) {
		t.Fatal("SendAction = false")
	}
	if pb := mqtttest.Receive(t, c.Received, "action"); pb.Topic != actionsT {
		t.Fatalf("got %q, want the action", pb.Topic)
	}

	reported := []byte(`{"interval":10}`)
	if err := c.Send(mqtt.ShadowReportedTopic("acme", "dev-1"), reported); err != nil {
		t.Fatalf("publish: %v", err)
	}
	if got := mqtttest.Receive(t, h.Reported, "HandleReported"); got.Device != "dev-1" || !bytes.Equal(got.Payload, reported) {
		t.Fatalf("HandleReported(%q, %s)", got.Device, got.Payload)
	}

	ctx, cancel := mqtttest.Context()
	defer cancel()
	if ua, err := c.Unsubscribe(ctx, &paho.Unsubscribe{Topics: []string{deltaT}}); err != nil || len(ua.Reasons) != 1 || ua.Reasons[0] != 0 {
		t.Fatalf("unsubscribe: %v, %+v", err, ua)
	}
	if s.SendDelta("acme", "dev-1", delta) {
		t.Fatal("SendDelta after the device unsubscribed = true")
	}
}
