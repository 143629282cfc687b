package relay_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/remote"
	"github.com/fleetd/fleet/remote/relay"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// startAgent runs fleetd-agent --remote for a new device id of c's tenant
// on s, and waits until it is connected.
func startAgent(t *testing.T, s *fleetdtest.Server, c fleetdtest.Creds, id string) {
	t.Helper()
	a := s.StartAgent(t, fleetdtest.BuildAgent(t), id, s.MustDevice(t, c, id, nil).Token, "--remote", "--tenant", c.Tenant)
	fleetdtest.Eventually(t, "the agent to connect", func() bool { return strings.Contains(a.Output.String(), "level=INFO msg=connected") })
}

// open opens a shell session on device as c, on s.
func open(t *testing.T, s *fleetdtest.Server, c fleetdtest.Creds, device string) fleet.RemoteSession {
	t.Helper()
	var sess fleet.RemoteSession
	s.Do(t, c, "POST", "/api/v1/devices/"+device+"/remote-sessions", map[string]any{"kind": "shell"}).Want(t, 201).Decode(t, &sess)
	return sess
}

// shell runs a terminal session on device as c, opened on opener and
// joined on joiner: it types command, reads until the output has until,
// exits and returns the session once its end is recorded.
func shell(t *testing.T, opener, joiner *fleetdtest.Server, c fleetdtest.Creds, device, command, until string) fleet.RemoteSession {
	t.Helper()
	sess := open(t, opener, c, device)
	conn := joiner.JoinTerminal(t, c, sess.ID)
	if command != "" {
		conn.Write([]byte(command + "\n"))
		fleetdtest.ReadUntil(t, conn, until)
	}
	conn.Write([]byte("exit\n"))
	fleetdtest.SessionEnd(t, conn)
	return opener.EndedSession(t, c, device, sess.ID)
}

// cast is an asciicast v2 file read back.
type cast struct {
	header struct {
		Version       int
		Width, Height int
	}
	events [][3]any
}

func readCast(t *testing.T, b []byte) cast {
	t.Helper()
	var c cast
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<20)
	if !sc.Scan() || json.Unmarshal(sc.Bytes(), &c.header) != nil {
		t.Fatalf("no asciicast header: %.200q", b)
	}
	for sc.Scan() {
		var e [3]any
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("event %q: %v", sc.Bytes(), err)
		}
		c.events = append(c.events, e)
	}
	return c
}

// of returns the data of the events of kind, one after the other.
func (c cast) of(kind string) string {
	var b strings.Builder
	for _, e := range c.events {
		if e[1] == kind {
			b.WriteString(e[2].(string))
		}
	}
	return b.String()
}

// TestRemoteRecording records shell sessions of a tenant that turned it
// on, with a real fleetd-agent: off by default (no recording), turned on
// by an admin (audited), the output and resizes recorded and what is
// typed not, UTF-8 cut between reads kept whole, the cap's marker, the
// recording read by the API (the remote permission, the tenant's own) and
// by fleetctl.
func TestRemoteRecording(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b, "--remote-connect-timeout", "1m", "--remote-recording-max", "8192")
		admin := s.Admin()
		op := s.NewKey(t, admin, "ops", "operator")
		viewer := s.NewKey(t, admin, "eyes", "viewer")
		other := s.NewTenant(t, "other")
		startAgent(t, s, admin, "edge-1")
		recording := func(c fleetdtest.Creds, id string) *fleetdtest.Response {
			return s.Do(t, c, "GET", "/api/v1/devices/edge-1/remote-sessions/"+id+"/recording", nil)
		}

		t.Run("Off", func(t *testing.T) {
			rs := shell(t, s, s, op, "edge-1", "", "")
			if rs.Recording != "" || rs.Recorded {
				t.Fatalf("session %+v of a tenant that does not record", rs)
			}
			if r := s.NewFleetctl(t, op).Run("", "ssh", "edge-1", "--", "true"); r.Code != 0 || strings.Contains(r.Stderr, "recorded") {
				t.Fatalf("%v", r)
			}
			if code := recording(op, rs.ID).Want(t, 404).ErrorCode(t); code != fleet.ENOTFOUND {
				t.Fatalf("error %q", code)
			}
		})
		t.Run("TurnedOn", func(t *testing.T) {
			s.Do(t, op, "PUT", "/api/v1/tenants/default/remote-settings", map[string]any{"recording": true}).Want(t, 403)
			s.Do(t, admin, "PUT", "/api/v1/tenants/default/remote-settings", map[string]any{"recording": "yes"}).Want(t, 400)
			s.Do(t, admin, "PUT", "/api/v1/tenants/default/remote-settings", map[string]any{}).Want(t, 400)
			s.Do(t, admin, "PUT", "/api/v1/tenants/default/remote-settings", map[string]any{"recording": true}).Want(t, 204)
			var set fleet.RemoteSettings
			s.Do(t, viewer, "GET", "/api/v1/tenants/default/remote-settings", nil).Want(t, 200).Decode(t, &set)
			if !set.Recording {
				t.Fatal("recording is not on")
			}
			var audit struct {
				AuditLogs []map[string]any `json:"audit_logs"`
			}
			s.Do(t, admin, "GET", "/api/v1/audit-logs?action=tenant.remote_settings", nil).Want(t, 200).Decode(t, &audit)
			if len(audit.AuditLogs) != 1 {
				t.Fatalf("audit %+v", audit.AuditLogs)
			}
			s.Do(t, other, "GET", "/api/v1/tenants/other/remote-settings", nil).Want(t, 200).Decode(t, &set)
			if set.Recording {
				t.Fatal("the other tenant records too")
			}
		})
		t.Run("Recorded", func(t *testing.T) {
			sess := open(t, s, op, "edge-1")
			if !sess.Recorded {
				t.Fatalf("session %+v, want recorded", sess)
			}
			conn := s.JoinTerminal(t, op, sess.ID)
			conn.Send(remote.Control{Type: remote.TypeResize, Cols: 120, Rows: 40})
			// A password read without echo is typed but never shown: it
			// must not be in the recording. The é is split between two
			// writes of the device's terminal.
			conn.Write([]byte("stty -echo; printf 'pass''word:'; read pw; stty echo; printf 'caf\\303'; sleep 0.2; printf '\\251 %s-%s\\n' got ${#pw}\n"))
			fleetdtest.ReadUntil(t, conn, "password:")
			conn.Write([]byte("hunter2\n"))
			fleetdtest.ReadUntil(t, conn, "got-7")
			conn.Write([]byte("exit 3\n"))
			if end := fleetdtest.SessionEnd(t, conn); end != "exit" {
				t.Fatalf("end %q", end)
			}
			rs := s.EndedSession(t, admin, "edge-1", sess.ID)
			if rs.Recording != "/api/v1/devices/edge-1/remote-sessions/"+sess.ID+"/recording" || rs.RecordingSize == 0 {
				t.Fatalf("session %+v", rs)
			}
			recording(viewer, sess.ID).Want(t, 403)
			other := s.NewKey(t, other, "other-ops", "operator")
			s.Do(t, other, "GET", rs.Recording, nil).Want(t, 404)
			r := recording(op, sess.ID).Want(t, 200)
			if ct := r.Header.Get("Content-Type"); ct != "application/x-asciicast" {
				t.Fatalf("Content-Type %q", ct)
			}
			if int64(len(r.Body)) != rs.RecordingSize {
				t.Fatalf("%d bytes, the session says %d", len(r.Body), rs.RecordingSize)
			}
			if spooled, _ := filepath.Glob(filepath.Join(s.DataDir, "remote-spool", "*")); len(spooled) != 0 {
				t.Fatalf("spool files left: %v", spooled)
			}
			c := readCast(t, r.Body)
			// The header has the terminal's size when the first output
			// came: the operator's, or 80x24 when the shell's prompt came
			// before it, which a resize event then records.
			resizes := fmt.Sprintf("%dx%d", fleetdtest.TerminalCols, fleetdtest.TerminalRows) + "120x40"
			switch {
			case c.header.Version != 2:
				t.Fatalf("header %+v", c.header)
			case c.header.Width == fleetdtest.TerminalCols && c.header.Height == fleetdtest.TerminalRows:
				resizes = "120x40"
			case c.header.Width != 80 || c.header.Height != 24:
				t.Fatalf("header %+v", c.header)
			}
			out := c.of("o")
			if !strings.Contains(out, "café got-7") || strings.Contains(out, "hunter2") || strings.ContainsRune(out, '\uFFFD') {
				t.Fatalf("output recorded %q", out)
			}
			if got := c.of("r"); got != resizes {
				t.Fatalf("resizes %q after header %+v, want %q", got, c.header, resizes)
			}
			// fleetctl downloads the same file.
			file := filepath.Join(t.TempDir(), "s.cast")
			s.NewFleetctl(t, op).OK(t, "sessions", "recording", "edge-1", sess.ID, "--out", file)
			if got, _ := os.ReadFile(file); !bytes.Equal(got, r.Body) {
				t.Fatalf("fleetctl wrote %d bytes, the API sent %d", len(got), len(r.Body))
			}
			// The console's list links it for an operator, who downloads
			// the same file; a viewer sees its size only, and may not.
			link := "/console/devices/edge-1/remote-sessions/" + sess.ID + "/recording"
			b := fleetdtest.NewBrowser(t, s.URL)
			b.SignIn(op.Tenant, op.Key)
			if page := b.Get("/console/devices/edge-1/remote-sessions").Want(t, 200); !strings.Contains(page.Body, `href="`+link+`"`) {
				t.Fatalf("the operator's list has no link to the recording:\n%s", page.Body)
			}
			if file := b.Get(link).Want(t, 200); file.Body != string(r.Body) || file.Header.Get("Content-Type") != "application/x-asciicast" {
				t.Fatalf("the console's recording: %d bytes of %s", len(file.Body), file.Header.Get("Content-Type"))
			}
			v := fleetdtest.NewBrowser(t, s.URL)
			v.SignIn(viewer.Tenant, viewer.Key)
			if page := v.Get("/console/devices/edge-1/remote-sessions").Want(t, 200); strings.Contains(page.Body, link) {
				t.Fatal("the viewer's list links the recording")
			}
			v.Get(link).Want(t, 403)
			// The operator is told: fleetctl ssh says so, and so does the
			// console's terminal page.
			if r := s.NewFleetctl(t, op).Run("", "ssh", "edge-1", "--", "echo", "hi"); r.Code != 0 || r.Stdout != "hi\n" ||
				!strings.Contains(r.Stderr, "this session's output is recorded") {
				t.Fatalf("%v", r)
			}
			waiting := open(t, s, op, "edge-1")
			if page := b.Get("/console/remote-sessions/"+waiting.ID+"/terminal").Want(t, 200); !strings.Contains(page.Body, "Its output is recorded") {
				t.Fatalf("the terminal page does not say it is recorded:\n%s", page.Body)
			}
			s.Do(t, op, "POST", "/api/v1/devices/edge-1/remote-sessions/"+waiting.ID+"/end", nil).Want(t, 202)
			s.EndedSession(t, op, "edge-1", waiting.ID)
		})
		t.Run("Cap", func(t *testing.T) {
			rs := shell(t, s, s, op, "edge-1", "head -c 20000 /dev/zero | tr '\\0' x; echo; echo do''ne", "done")
			c := readCast(t, recording(op, rs.ID).Want(t, 200).Body)
			if rs.RecordingSize > 8192+512 || !strings.Contains(c.of("m"), "reached its cap of 8192 bytes") || strings.Contains(c.of("o"), "done") {
				t.Fatalf("%d bytes, markers %q", rs.RecordingSize, c.of("m"))
			}
		})
		t.Run("ConsoleSettings", func(t *testing.T) {
			b := fleetdtest.NewBrowser(t, s.URL)
			b.SignIn(admin.Tenant, admin.Key)
			page := b.Get("/console/settings/remote").Want(t, 200)
			if !strings.Contains(page.Body, `name="recording" checked`) {
				t.Fatalf("settings page:\n%s", page.Body)
			}
			b.Do("POST", "/console/settings/remote", url.Values{"csrf": {page.CSRF(t)}}).Want(t, http.StatusSeeOther)
			var set fleet.RemoteSettings
			s.Do(t, admin, "GET", "/api/v1/tenants/default/remote-settings", nil).Want(t, 200).Decode(t, &set)
			if set.Recording {
				t.Fatal("recording is still on")
			}
			o := fleetdtest.NewBrowser(t, s.URL)
			o.SignIn(op.Tenant, op.Key)
			o.Get("/console/settings/remote").Want(t, 403)
			if rs := shell(t, s, s, op, "edge-1", "", ""); rs.Recording != "" {
				t.Fatalf("recorded after the tenant turned recording off: %+v", rs)
			}
		})
	})
}

// TestRemoteEnd ends sessions through the API and fleetctl: the operator
// is told who ended it, the end is recorded and audited, an ended one is
// a conflict, and only operators of the session's tenant may.
func TestRemoteEnd(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b, "--remote-connect-timeout", "1m")
		admin := s.Admin()
		op := s.NewKey(t, admin, "ops", "operator")
		viewer := s.NewKey(t, admin, "eyes", "viewer")
		other := s.NewTenant(t, "other")
		startAgent(t, s, admin, "edge-1")
		s.MustDevice(t, other, "edge-1", nil)

		sess := open(t, s, op, "edge-1")
		conn := s.JoinTerminal(t, op, sess.ID)
		end := "/api/v1/devices/edge-1/remote-sessions/" + sess.ID + "/end"
		s.Do(t, viewer, "POST", end, nil).Want(t, 403)
		s.Do(t, other, "POST", end, nil).Want(t, 404)
		s.Do(t, admin, "POST", "/api/v1/devices/edge-2/remote-sessions/"+sess.ID+"/end", nil).Want(t, 404)
		var asked fleet.RemoteSession
		s.Do(t, admin, "POST", end, nil).Want(t, 202).Decode(t, &asked)
		if asked.ID != sess.ID {
			t.Fatalf("answer %+v", asked)
		}
		if got := fleetdtest.SessionEnd(t, conn); got != "session ended: ended by admin" {
			t.Fatalf("the operator was told %q", got)
		}
		if rs := s.EndedSession(t, admin, "edge-1", sess.ID); rs.EndReason != "ended by admin" {
			t.Fatalf("reason %q", rs.EndReason)
		}
		if code := s.Do(t, admin, "POST", end, nil).Want(t, 409).ErrorCode(t); code != fleet.ECONFLICT {
			t.Fatalf("error %q", code)
		}

		// fleetctl lists and ends; a session still waiting for its
		// operator ends too.
		waiting := open(t, s, op, "edge-1")
		fleetctl := s.NewFleetctl(t, op)
		if out := fleetctl.OK(t, "sessions", "list", "edge-1"); !strings.Contains(out, waiting.ID) {
			t.Fatalf("fleetctl sessions list does not show %s:\n%s", waiting.ID, out)
		}
		fleetctl.OK(t, "sessions", "end", "edge-1", waiting.ID)
		if rs := s.EndedSession(t, admin, "edge-1", waiting.ID); rs.EndReason != "ended by ops" {
			t.Fatalf("reason %q", rs.EndReason)
		}
		if errOut := fleetctl.Fails(t, 1, "sessions", "end", "edge-1", waiting.ID); !strings.Contains(errOut, "ended already") {
			t.Fatalf("ending it again: %s", errOut)
		}
		var audit struct {
			AuditLogs []map[string]any `json:"audit_logs"`
		}
		s.Do(t, admin, "GET", "/api/v1/audit-logs?action=remote.session.stop", nil).Want(t, 200).Decode(t, &audit)
		if len(audit.AuditLogs) != 2 {
			t.Fatalf("audit %+v", audit.AuditLogs)
		}
	})
}

// TestRemoteAcrossReplicas runs two replicas on one PostgreSQL database
// and one blob store, with a real fleetd-agent that connects to A: the
// replica that relays a session records it, whichever replica each leg
// came to, and either replica serves the recording; the per-device and
// per-person caps count the sessions open on both, also when both replicas
// open sessions at the same moment, and a session ended on the other
// replica frees its place.
func TestRemoteAcrossReplicas(t *testing.T) {
	pg := sqlstoretest.Postgres(t, "replicas share a PostgreSQL database")
	flags := []string{"--remote-connect-timeout", "1m", "--remote-max-per-device", "2", "--remote-max-per-user", "3",
		"--blob-store", "file://" + t.TempDir()}
	a := fleetdtest.Start(t, pg, flags...)
	bs := fleetdtest.New(a.DSN, t.TempDir())
	bs.Start(t, flags...)
	t.Cleanup(func() { bs.Stop(t) })
	bs.Key = a.Key
	admin := a.Admin()
	startAgent(t, a, admin, "edge-1")
	for _, d := range []string{"edge-2", "edge-3", "edge-4", "edge-5"} {
		a.MustDevice(t, admin, d, nil)
	}

	t.Run("Recording", func(t *testing.T) {
		// Opened on B, which relays and records it; the operator joins
		// through A and the device dials A (its --server; its MQTT
		// connection is B's, whose broker asks it): both legs are proxied
		// to B.
		ag := bs.StartAgent(t, fleetdtest.BuildAgent(t), "edge-r", a.MustDevice(t, admin, "edge-r", nil).Token, "--remote", "--server", a.URL)
		fleetdtest.Eventually(t, "the agent to connect", func() bool { return strings.Contains(ag.Output.String(), "level=INFO msg=connected") })
		a.Do(t, admin, "PUT", "/api/v1/tenants/default/remote-settings", map[string]any{"recording": true}).Want(t, 204)
		t.Cleanup(func() {
			a.Do(t, admin, "PUT", "/api/v1/tenants/default/remote-settings", map[string]any{"recording": false}).Want(t, 204)
		})
		rs := shell(t, bs, a, admin, "edge-r", "echo across-''replicas", "across-replicas")
		if rs.Recording == "" {
			t.Fatalf("no recording: %+v", rs)
		}
		for _, s := range []*fleetdtest.Server{a, bs} {
			if out := readCast(t, s.Do(t, admin, "GET", rs.Recording, nil).Want(t, 200).Body).of("o"); !strings.Contains(out, "across-replicas") {
				t.Fatalf("recording output %q", out)
			}
		}
	})

	t.Run("Forward", func(t *testing.T) {
		// Opened on B, which relays it; the device dials A and the
		// operator joins through A, both as streams: A passes each leg's
		// bytes on as they are, B splices one leg's to the other.
		_, port, _ := net.SplitHostPort(fleetdtest.DeviceService(t, fleetdtest.Echo))
		ag := bs.StartAgent(t, fleetdtest.BuildAgent(t), "edge-f", a.MustDevice(t, admin, "edge-f", nil).Token, "--remote", "--server", a.URL)
		fleetdtest.Eventually(t, "the agent to connect", func() bool { return strings.Contains(ag.Output.String(), "level=INFO msg=connected") })
		var sess fleet.RemoteSession
		bs.Do(t, admin, "POST", "/api/v1/devices/edge-f/remote-sessions", map[string]any{"kind": "forward", "target": port}).Want(t, 201).Decode(t, &sess)
		conn, err := remote.DialStream(context.Background(), a.URL+"/api/v1/remote-sessions/"+sess.ID+"/operator",
			http.Header{"X-Service-Tenant": {admin.Tenant}, "X-Service-Api-Key": {admin.Key}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		if !conn.Stream() {
			t.Fatal("the operator's leg through A is no stream")
		}
		// B's refusal of a second operator's leg comes back through A as
		// B answered it.
		_, err = remote.DialStream(context.Background(), a.URL+"/api/v1/remote-sessions/"+sess.ID+"/operator",
			http.Header{"X-Service-Tenant": {admin.Tenant}, "X-Service-Api-Key": {admin.Key}}, nil)
		var refused *remote.RefusedError
		if !errors.As(err, &refused) || refused.Status != http.StatusConflict || !strings.Contains(refused.Message, "joined already") {
			t.Fatalf("a second operator's leg: %v", err)
		}
		data := bytes.Repeat([]byte("across replicas, spliced\n"), 40000)
		go func() {
			conn.Write(data)
			conn.Send(remote.Control{Type: remote.TypeEOF})
		}()
		var got []byte
		for {
			b, ctl, err := conn.Read()
			if err != nil {
				t.Fatalf("after %d bytes: %v", len(got), err)
			}
			if ctl != nil {
				if ctl.Type != remote.TypeEOF {
					t.Fatalf("control %+v", ctl)
				}
				break
			}
			got = append(got, b...)
		}
		if !bytes.Equal(got, data) {
			t.Fatalf("%d bytes came back of %d", len(got), len(data))
		}
		// Both ways ended at the device (the service closed after the
		// eof), whose agent ends the session.
		rs := a.EndedSession(t, admin, "edge-f", sess.ID)
		if rs.BytesToDevice != int64(len(data)) || rs.BytesFromDevice != int64(len(data)) || rs.EndReason != "closed by the device" {
			t.Fatalf("the session: %+v", rs)
		}
		db, err := sql.Open("pgx", a.DSN)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		var u string
		if err := db.QueryRow("SELECT relay_url FROM remote_sessions WHERE id = $1", sess.ID).Scan(&u); err != nil || u != bs.URL {
			t.Fatalf("relayed by %q (%v), want B's %q", u, err, bs.URL)
		}
	})
	t.Run("FinishProxied", func(t *testing.T) {
		// Opened on B, joined through A: the operator's half-close
		// passes through A, and A closes the leg only once B has closed
		// it, after recording the end (docs/agent.md, Caps), which is
		// held back a moment here. Over each kind of leg. A forward whose
		// service waits for more: only the operator's half-close ends
		// it (a get's device would end it itself).
		relay.SetEndPause(t, 300*time.Millisecond)
		_, port, _ := net.SplitHostPort(fleetdtest.DeviceService(t, fleetdtest.Echo))
		ag := bs.StartAgent(t, fleetdtest.BuildAgent(t), "edge-p", a.MustDevice(t, admin, "edge-p", nil).Token, "--remote", "--server", a.URL)
		fleetdtest.Eventually(t, "the agent to connect", func() bool { return strings.Contains(ag.Output.String(), "level=INFO msg=connected") })
		for _, dial := range []func(context.Context, string, http.Header, *tls.Config) (*remote.Conn, error){remote.DialStream, remote.Dial} {
			var sess fleet.RemoteSession
			bs.Do(t, admin, "POST", "/api/v1/devices/edge-p/remote-sessions", map[string]any{"kind": "forward", "target": port}).Want(t, 201).Decode(t, &sess)
			conn, err := dial(context.Background(), a.URL+"/api/v1/remote-sessions/"+sess.ID+"/operator",
				http.Header{"X-Service-Tenant": {admin.Tenant}, "X-Service-Api-Key": {admin.Key}}, nil)
			if err != nil {
				t.Fatal(err)
			}
			// The service's echo: the device has joined.
			if err := conn.Write([]byte("proxied\n")); err != nil {
				t.Fatal(err)
			}
			var got []byte
			for len(got) < len("proxied\n") {
				b, ctl, err := conn.Read()
				if err != nil {
					t.Fatal(err)
				}
				if ctl != nil {
					t.Fatalf("control %+v", ctl)
				}
				got = append(got, b...)
			}
			if err := conn.Finish(time.Minute); err != nil {
				t.Fatal(err)
			}
			var list struct{ Count int }
			a.Do(t, admin, "GET", "/api/v1/devices/edge-p/remote-sessions?open=true", nil).Want(t, 200).Decode(t, &list)
			if list.Count != 0 {
				t.Fatalf("the leg (a stream: %v) closed with %d sessions open", conn.Stream(), list.Count)
			}
			if rs := a.EndedSession(t, admin, "edge-p", sess.ID); rs.EndReason != "closed by the operator" {
				t.Fatalf("the session (a stream: %v): %+v", conn.Stream(), rs)
			}
		}
	})
	t.Run("Device", func(t *testing.T) {
		k := a.NewKey(t, admin, "dev-cap", "operator")
		first := open(t, a, k, "edge-1")
		conn := a.JoinTerminal(t, k, first.ID)
		open(t, bs, k, "edge-1")
		r := a.Do(t, k, "POST", "/api/v1/devices/edge-1/remote-sessions", map[string]any{"kind": "shell"}).Want(t, 429)
		if !strings.Contains(string(r.Body), "device edge-1 has 2 remote sessions open") {
			t.Fatalf("refusal %s", r.Body)
		}
		// Ended through B, relayed by A: the place is free again.
		bs.Do(t, admin, "POST", "/api/v1/devices/edge-1/remote-sessions/"+first.ID+"/end", nil).Want(t, 202)
		fleetdtest.SessionEnd(t, conn)
		bs.EndedSession(t, admin, "edge-1", first.ID)
		open(t, bs, k, "edge-1")
	})
	t.Run("Person", func(t *testing.T) {
		k := a.NewKey(t, admin, "person-cap", "operator")
		open(t, a, k, "edge-2")
		open(t, bs, k, "edge-3")
		open(t, a, k, "edge-3")
		r := bs.Do(t, k, "POST", "/api/v1/devices/edge-4/remote-sessions", map[string]any{"kind": "shell"}).Want(t, 429)
		if !strings.Contains(string(r.Body), "you have 3 remote sessions open") {
			t.Fatalf("refusal %s", r.Body)
		}
	})
	t.Run("AtOnce", func(t *testing.T) {
		// Sixteen people ask for edge-5 at once, half on each replica: two
		// get it.
		const n = 16
		keys := make([]fleetdtest.Creds, n)
		for i := range keys {
			keys[i] = a.NewKey(t, admin, fmt.Sprintf("at-once-%d", i), "operator")
		}
		var wg sync.WaitGroup
		responses := make(chan *fleetdtest.Response, n)
		start := make(chan struct{})
		for i, k := range keys {
			s := []*fleetdtest.Server{a, bs}[i%2]
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				responses <- s.Do(t, k, "POST", "/api/v1/devices/edge-5/remote-sessions", map[string]any{"kind": "shell"})
			}()
		}
		close(start)
		wg.Wait()
		close(responses)
		got := map[int]int{}
		var others []string // why an open got neither the session nor the cap
		for r := range responses {
			got[r.Status]++
			if r.Status != 201 && r.Status != 429 {
				others = append(others, fmt.Sprintf("%d %s", r.Status, bytes.TrimSpace(r.Body)))
			}
		}
		if got[201] != 2 || got[429] != n-2 {
			t.Fatalf("statuses %v, want two 201 and the others 429; the others: %s\nA's warnings:\n%s\nB's warnings:\n%s",
				got, strings.Join(others, "; "), warnings(a), warnings(bs))
		}
	})
}

// warnings are the lines of what s logged at WARN or ERROR, for a failure
// message: why a request got what it should not have.
func warnings(s *fleetdtest.Server) string {
	var b strings.Builder
	for line := range strings.Lines(s.Output.String()) {
		if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") {
			b.WriteString(line)
		}
	}
	return b.String()
}

// TestRemoteRecordingRetention removes a recording once its retention has
// passed: the file goes, and the session, which stays listed, no longer
// names it.
func TestRemoteRecordingRetention(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b, "--remote-recording-retention", "5s")
		admin := s.Admin()
		startAgent(t, s, admin, "edge-1")
		s.Do(t, admin, "PUT", "/api/v1/tenants/default/remote-settings", map[string]any{"recording": true}).Want(t, 204)
		rs := shell(t, s, s, admin, "edge-1", "", "")
		if rs.Recording == "" {
			t.Fatalf("no recording: %+v", rs)
		}
		s.Do(t, admin, "GET", rs.Recording, nil).Want(t, 200)
		// The blob store is files under the data directory, named by the
		// session's id: the removal must delete the file, not only forget it.
		files := func() (found []string) {
			filepath.WalkDir(s.DataDir, func(p string, d fs.DirEntry, err error) error {
				if err == nil && !d.IsDir() && strings.Contains(p, rs.ID) {
					found = append(found, p)
				}
				return nil
			})
			return found
		}
		if len(files()) == 0 {
			t.Fatalf("no file of recording %s under %s", rs.ID, s.DataDir)
		}
		fleetdtest.Eventually(t, "the recording to be removed", func() bool {
			return s.Do(t, admin, "GET", rs.Recording, nil).Status == 404
		})
		if rs := s.EndedSession(t, admin, "edge-1", rs.ID); rs.Recording != "" || rs.RecordingSize != 0 {
			t.Fatalf("the session still names its recording: %+v", rs)
		}
		fleetdtest.Eventually(t, "the recording's file to be deleted", func() bool { return len(files()) == 0 })
	})
}

// TestRemoteRecordingStoreRefuses: when the blob store refuses a
// session's whole recording as the session ends (a file of the file
// store stands where the tenant's folder of recordings goes), the parts
// stored while it was open, with a last one for what they lacked, are its
// recording, served as one file, and the retention removes them.
func TestRemoteRecordingStoreRefuses(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b, "--remote-recording-flush", "200ms")
		admin := s.Admin()
		startAgent(t, s, admin, "edge-1")
		s.Do(t, admin, "PUT", "/api/v1/tenants/default/remote-settings", map[string]any{"recording": true}).Want(t, 204)
		blobs := filepath.Join(s.DataDir, "blobs")
		if err := os.MkdirAll(filepath.Join(blobs, "remote-recordings"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(blobs, "remote-recordings", "default"), []byte("in the way"), 0o644); err != nil {
			t.Fatal(err)
		}
		sess, conn := s.OpenTerminal(t, admin, "edge-1")
		conn.Write([]byte("echo first-''words\n"))
		fleetdtest.ReadUntil(t, conn, "first-words")
		parts := filepath.Join(blobs, "remote-recording-parts", "default", sess.ID)
		stored := func() (n int, all string) {
			files, _ := os.ReadDir(parts)
			for _, f := range files {
				b, _ := os.ReadFile(filepath.Join(parts, f.Name()))
				all += string(b)
			}
			return len(files), all
		}
		fleetdtest.Eventually(t, "the first words to reach a part", func() bool {
			_, all := stored()
			return strings.Contains(all, "first-words")
		})
		// The last words come as the session ends: a part may not have them.
		conn.Write([]byte("echo last-''words; exit\n"))
		fleetdtest.SessionEnd(t, conn)
		rs := s.EndedSession(t, admin, "edge-1", sess.ID)
		if rs.Recording == "" || rs.RecordingSize == 0 {
			t.Fatalf("no recording: %+v", rs)
		}
		if n, all := stored(); n < 2 || !strings.Contains(all, "last-words") {
			t.Fatalf("%d parts, the last words not among them: %q", n, all)
		}
		body := s.Do(t, admin, "GET", rs.Recording, nil).Want(t, 200).Body
		if int64(len(body)) != rs.RecordingSize {
			t.Fatalf("a recording of %d bytes, %d said", len(body), rs.RecordingSize)
		}
		if out := readCast(t, body).of("o"); !strings.Contains(out, "first-words") || !strings.Contains(out, "last-words") {
			t.Fatalf("recording output %q", out)
		}

		s.Restart(t, "--remote-recording-retention", "1s")
		// The row forgets the recording before its parts go. A GET begun
		// before that may be cut short as the parts are deleted under it
		// (its Content-Length then says so), so the test waits on the row,
		// and asks for the recording only after.
		fleetdtest.Eventually(t, "the session to forget its recording", func() bool {
			rs := s.EndedSession(t, admin, "edge-1", rs.ID)
			return rs.Recording == "" && rs.RecordingSize == 0
		})
		s.Do(t, admin, "GET", rs.Recording, nil).Want(t, 404)
		fleetdtest.Eventually(t, "the parts to be deleted", func() bool {
			files, err := os.ReadDir(parts)
			return len(files) == 0 && (err == nil || errors.Is(err, fs.ErrNotExist))
		})
	})
}

// TestRemoteRecordingS3 records a session into an S3 bucket (a private
// VersityGW), where the upload is streamed from the spool file when the
// session ends.
func TestRemoteRecordingS3(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.StartOn(t, b, "s3")
		admin := s.Admin()
		startAgent(t, s, admin, "edge-1")
		s.Do(t, admin, "PUT", "/api/v1/tenants/default/remote-settings", map[string]any{"recording": true}).Want(t, 204)
		rs := shell(t, s, s, admin, "edge-1", "echo in-''the-bucket", "in-the-bucket")
		if out := readCast(t, s.Do(t, admin, "GET", rs.Recording, nil).Want(t, 200).Body).of("o"); !strings.Contains(out, "in-the-bucket") {
			t.Fatalf("recording output %q", out)
		}
	})
}

// TestRemoteReplicaLost takes replica A, which relays a session, for dead
// (its heartbeat made older than --remote-replica-timeout, here an hour
// so that neither replica beats or sweeps again during the test): on B
// the session no longer counts under the device's cap, and an end
// request ends it at once, saying who and why, audited. On SQLite, which
// one process serves, no replica is ever lost.
func TestRemoteReplicaLost(t *testing.T) {
	pg := sqlstoretest.Postgres(t, "replicas share a PostgreSQL database")
	flags := []string{"--remote-connect-timeout", "1h", "--remote-replica-timeout", "1h", "--remote-max-per-device", "1"}
	a := fleetdtest.Start(t, pg, flags...)
	bs := fleetdtest.New(a.DSN, t.TempDir())
	bs.Start(t, flags...)
	t.Cleanup(func() { bs.Stop(t) })
	bs.Key = a.Key
	admin := a.Admin()
	a.MustDevice(t, admin, "edge-1", nil)
	sess := open(t, a, admin, "edge-1") // waits for its device, for an hour
	bs.Do(t, admin, "POST", "/api/v1/devices/edge-1/remote-sessions", map[string]any{"kind": "shell"}).Want(t, 429)

	raw, err := sql.Open("pgx", a.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	if n, err := raw.Exec("UPDATE remote_relays SET seen_at = seen_at - 7200000 WHERE relay_url = $1", a.URL); err != nil {
		t.Fatal(err)
	} else if rows, _ := n.RowsAffected(); rows != 1 {
		t.Fatalf("%d heartbeats of A", rows)
	}
	// The cap counts it no more: B opens one, which B relays.
	other := open(t, bs, admin, "edge-1")

	bs.Do(t, admin, "POST", "/api/v1/devices/edge-1/remote-sessions/"+sess.ID+"/end", nil).Want(t, 202)
	rs := bs.EndedSession(t, admin, "edge-1", sess.ID)
	if want := "ended by admin; replica lost: " + a.URL + ", which relayed it, sent no heartbeat for 1h0m0s"; !strings.HasPrefix(rs.EndReason, want) {
		t.Fatalf("reason %q, want %q…", rs.EndReason, want)
	}
	bs.Do(t, admin, "POST", "/api/v1/devices/edge-1/remote-sessions/"+sess.ID+"/end", nil).Want(t, 409)
	var audit struct {
		AuditLogs []struct {
			Target  string         `json:"target"`
			Details map[string]any `json:"details"`
		} `json:"audit_logs"`
	}
	bs.Do(t, admin, "GET", "/api/v1/audit-logs?action=remote.session.end", nil).Want(t, 200).Decode(t, &audit)
	if len(audit.AuditLogs) != 1 || audit.AuditLogs[0].Details["end_reason"] != rs.EndReason {
		t.Fatalf("audit %+v", audit.AuditLogs)
	}
	// B's own session is B's to end, as any.
	bs.Do(t, admin, "POST", "/api/v1/devices/edge-1/remote-sessions/"+other.ID+"/end", nil).Want(t, 202)
	if r := bs.EndReason(t, admin, "edge-1", other.ID); r != "ended by admin" {
		t.Fatalf("reason %q", r)
	}
}
