package relay_test

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/remote"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestRemoteSenderResetsWithinMessage: an operator whose connection is
// reset within a message, whose bytes fleetd splices from leg to leg,
// ended the session; the reason recorded is the operator's reset, not
// "a side stopped reading" (the device's fault), and the bytes that
// reached the device are counted.
func TestRemoteSenderResetsWithinMessage(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b)
		admin := s.Admin()
		startAgent(t, s, admin, "edge-r")
		const part = 100 << 10 // of a message of LargeMessage
		got := make(chan struct{})
		addr := fleetdtest.DeviceService(t, func(c net.Conn) {
			if _, err := io.ReadFull(c, make([]byte, part)); err == nil {
				close(got)
			}
			io.Copy(io.Discard, c)
		})
		_, port, _ := net.SplitHostPort(addr)
		var sess fleet.RemoteSession
		s.Do(t, admin, "POST", "/api/v1/devices/edge-r/remote-sessions", map[string]any{"kind": "forward", "target": port}).Want(t, 201).Decode(t, &sess)

		// The operator's stream leg, by hand.
		u, _ := url.Parse(s.URL)
		nc, err := net.Dial("tcp", u.Host)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		fmt.Fprintf(nc, "GET /api/v1/remote-sessions/%s/operator HTTP/1.1\r\nHost: %s\r\nX-Service-Tenant: %s\r\nX-Service-Api-Key: %s\r\n"+
			"Connection: Upgrade\r\nUpgrade: %s\r\n%s: %d\r\n\r\n",
			sess.ID, u.Host, admin.Tenant, admin.Key, remote.StreamProtocol, remote.MessageSizeHeader, remote.LargeMessage)
		resp, err := http.ReadResponse(bufio.NewReader(nc), nil)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusSwitchingProtocols {
			t.Fatalf("the operator's leg answered %s", resp.Status)
		}
		msg := make([]byte, 5+part)
		msg[0] = remote.StreamBytes
		binary.BigEndian.PutUint32(msg[1:], remote.LargeMessage)
		if _, err := nc.Write(msg); err != nil {
			t.Fatal(err)
		}
		<-got
		nc.(*net.TCPConn).SetLinger(0) // its close resets the connection
		nc.Close()

		ended := s.EndedSession(t, admin, "edge-r", sess.ID)
		if !strings.HasPrefix(ended.EndReason, "closed by the operator: ") || !strings.Contains(ended.EndReason, "connection reset") {
			t.Errorf("end reason %q, want the operator's connection reset", ended.EndReason)
		}
		if ended.BytesToDevice != part {
			t.Errorf("%d bytes to the device, want %d", ended.BytesToDevice, part)
		}
	})
}
