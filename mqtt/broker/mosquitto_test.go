package broker_test

import (
	"bytes"
	"context"
	"net"
	"os"
	"os/exec"
	"testing"

	"github.com/fleetd/fleet/mqtt"
	"github.com/fleetd/fleet/mqtt/mqtttest"
)

// mosquittoClients returns the paths of Debian's mosquitto_pub and
// mosquitto_sub. CI installs them, so there their absence fails the test.
func mosquittoClients(t *testing.T) (pub, sub string) {
	t.Helper()
	pub, errPub := exec.LookPath("mosquitto_pub")
	sub, errSub := exec.LookPath("mosquitto_sub")
	if err := errPub; err != nil || errSub != nil {
		if err == nil {
			err = errSub
		}
		if os.Getenv("CI") == "true" {
			t.Fatalf("mosquitto clients not installed: %v", err)
		}
		t.Skipf("mosquitto clients not installed (apt-get install mosquitto-clients): %v", err)
	}
	return pub, sub
}

// TestMosquittoClients drives the broker with Debian's mosquitto_sub and
// mosquitto_pub as the device, in both protocol versions.
func TestMosquittoClients(t *testing.T) {
	pub, sub := mosquittoClients(t)
	for _, version := range []string{"mqttv311", "mqttv5"} {
		t.Run(version, func(t *testing.T) {
			h := mqtttest.NewHandler()
			s := MustOpenServer(t, h)
			_, port, _ := net.SplitHostPort(s.Addr().String())
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			mosquitto := func(name string, username, password string, args ...string) *exec.Cmd {
				base := []string{"-h", "127.0.0.1", "-p", port, "-V", version, "-u", username, "-P", password, "-q", "1"}
				return exec.CommandContext(ctx, name, append(base, args...)...)
			}

			t.Run("Action", func(t *testing.T) {
				var out, errOut bytes.Buffer
				cmd := mosquitto(sub, "acme/dev-1", "tok-1", "-i", "dev-1", "-t", actionsT, "-C", "1", "-N")
				cmd.Stdout, cmd.Stderr = &out, &errOut
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				mqtttest.Receive(t, h.Subscribed, "DeviceSubscribed")
				if !s.SendAction("acme", "dev-1", 42, action) {
					err := cmd.Wait()
					t.Fatalf("SendAction = false, want true (mosquitto_sub: %v: %s%s)", err, out.Bytes(), errOut.Bytes())
				}
				if err := cmd.Wait(); err != nil {
					t.Fatalf("mosquitto_sub: %v: %s", err, errOut.Bytes())
				}
				if !bytes.Equal(out.Bytes(), action) {
					t.Errorf("mosquitto_sub printed %q, want %q", out.Bytes(), action)
				}
				if got := mqtttest.Receive(t, h.Delivered, "ActionDelivered"); got.ActionID != 42 {
					t.Errorf("ActionDelivered action id %d, want 42", got.ActionID)
				}
			})

			t.Run("Status", func(t *testing.T) {
				// mosquitto_pub exits 0 only after its PUBACK, which comes after
				// the handler: the report is committed when it returns.
				if out, err := mosquitto(pub, "acme/dev-1", "tok-1", "-t", statusT, "-m", string(status)).CombinedOutput(); err != nil {
					t.Fatalf("mosquitto_pub: %v: %s", err, out)
				}
				got := mqtttest.Receive(t, h.Statuses, "HandleStatus")
				if got.Tenant != "acme" || got.Device != "dev-1" || !bytes.Equal(got.Payload, status) {
					t.Errorf("HandleStatus(%q, %q, %s)", got.Tenant, got.Device, got.Payload)
				}
			})

			t.Run("Stream", func(t *testing.T) {
				if out, err := mosquitto(pub, "acme/dev-1", "tok-1", "-t", gpsT, "-m", string(points)).CombinedOutput(); err != nil {
					t.Fatalf("mosquitto_pub: %v: %s", err, out)
				}
				got := mqtttest.Receive(t, h.Streams, "HandleStream")
				if got.Stream != "gps" || !bytes.Equal(got.Payload, points) {
					t.Errorf("HandleStream(%q, %s)", got.Stream, got.Payload)
				}
			})

			t.Run("WrongToken", func(t *testing.T) {
				if out, err := mosquitto(pub, "acme/dev-1", "tok-2", "-t", statusT, "-m", "x").CombinedOutput(); err == nil {
					t.Fatalf("mosquitto_pub with a wrong token succeeded: %s", out)
				}
				if len(h.Statuses) != 0 {
					t.Error("Handler called")
				}
			})

			t.Run("OtherDevicesTopic", func(t *testing.T) {
				before := s.Stats().ACLViolations
				if out, err := mosquitto(pub, "acme/dev-1", "tok-1", "-t", mqtt.ActionStatusTopic("acme", "dev-2"), "-m", "x").CombinedOutput(); err == nil {
					t.Fatalf("mosquitto_pub on another device's topic succeeded: %s", out)
				}
				if got := s.Stats().ACLViolations; got != before+1 {
					t.Errorf("ACLViolations = %d, want %d", got, before+1)
				}
				if len(h.Statuses) != 0 {
					t.Error("Handler called")
				}
			})
		})
	}
}
