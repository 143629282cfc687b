package relay_test

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/gorilla/websocket"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/remote"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestRemoteMessageSizes relays a session whose one leg is of before the
// message size was negotiated (docs/agent.md, The session's messages): it
// announces nothing and reads messages of at most 32 KiB, as an agent or
// a fleetctl of then does, and the browser's console still does. fleetd
// hands it the other leg's large messages in pieces it reads, in order,
// and relays its own as they come; both ways, with an old device and with
// an old operator.
func TestRemoteMessageSizes(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b, "--remote-connect-timeout", "1m")
		admin := s.Admin()
		dev := s.MustDevice(t, admin, "edge-1", nil)
		operator := http.Header{"X-Service-Tenant": {admin.Tenant}, "X-Service-Api-Key": {admin.Key}}
		device := http.Header{"X-Service-Tenant": {admin.Tenant}, "Authorization": {"TargetToken " + dev.Token}}
		big := make([]byte, remote.LargeMessage-100)
		for i := range big {
			big[i] = byte(i * 7 / 3)
		}
		// A forward session (the agent that would dial back is the test):
		// newLeg and oldLeg join it as the legs they are named for.
		session := func(t *testing.T, newLeg, oldLeg string) (*remote.Conn, *websocket.Conn) {
			var sess fleet.RemoteSession
			s.Do(t, admin, "POST", "/api/v1/devices/edge-1/remote-sessions", map[string]any{"kind": "forward", "target": "22"}).Want(t, 201).Decode(t, &sess)
			base := s.URL + "/api/v1/remote-sessions/" + sess.ID + "/"
			h := map[string]http.Header{"operator": operator, "device": device}
			c, err := remote.Dial(context.Background(), base+newLeg, h[newLeg], nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			old, _, err := websocket.DefaultDialer.Dial("ws"+strings.TrimPrefix(base, "http")+oldLeg, h[oldLeg])
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { old.Close() })
			old.SetReadLimit(remote.MaxMessage + 1024)
			return c, old
		}
		relayed := func(t *testing.T, c *remote.Conn, old *websocket.Conn) {
			t.Helper()
			if c.MaxSend() != remote.LargeMessage {
				t.Fatalf("fleetd said it reads %d", c.MaxSend())
			}
			// The new leg's large message reaches the old one in pieces.
			c.Write(big)
			c.Send(remote.Control{Type: remote.TypeEOF})
			var got []byte
			var sizes []int
			for {
				typ, b, err := old.ReadMessage()
				if err != nil {
					t.Fatalf("the old leg, after messages of %v: %v", sizes, err)
				}
				if typ == websocket.TextMessage {
					break
				}
				if len(b) > remote.MaxMessage {
					t.Fatalf("the old leg got a message of %d bytes", len(b))
				}
				sizes = append(sizes, len(b))
				got = append(got, b...)
			}
			if !bytes.Equal(got, big) {
				t.Fatalf("the old leg got %d bytes in messages of %v, not the %d sent", len(got), sizes, len(big))
			}
			// The old leg's messages reach the new one as they are.
			for i := range 3 {
				if err := old.WriteMessage(websocket.BinaryMessage, big[i*remote.MaxMessage:(i+1)*remote.MaxMessage]); err != nil {
					t.Fatal(err)
				}
			}
			old.WriteMessage(websocket.TextMessage, []byte(`{"type":"eof"}`))
			got = got[:0]
			for {
				b, ctl, err := c.Read()
				if err != nil {
					t.Fatalf("the new leg: %v", err)
				}
				if ctl != nil {
					break
				}
				got = append(got, b...)
			}
			if !bytes.Equal(got, big[:3*remote.MaxMessage]) {
				t.Fatalf("the new leg got %d bytes, not the %d sent", len(got), 3*remote.MaxMessage)
			}
		}
		t.Run("OldDevice", func(t *testing.T) {
			c, old := session(t, "operator", "device")
			relayed(t, c, old)
		})
		t.Run("OldOperator", func(t *testing.T) {
			c, old := session(t, "device", "operator")
			relayed(t, c, old)
		})
	})
}
