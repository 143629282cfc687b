package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet/internal/cli"
	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/internal/server"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

func TestOperations(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := startServer(t, b)
		t.Run("Health", func(t *testing.T) {
			s.Do(t, fleetdtest.Creds{}, "GET", "/healthz", nil).Want(t, 200)
			var body struct{ Status string }
			s.Do(t, fleetdtest.Creds{}, "GET", "/readyz", nil).Want(t, 200).Decode(t, &body)
			if body.Status != "ready" {
				t.Fatalf("readyz = %+v", body)
			}
		})
		t.Run("Metrics", func(t *testing.T) {
			s.Do(t, s.Admin(), "GET", "/api/v1/devices", nil).Want(t, 200)
			s.MustDevice(t, s.Admin(), "metered", nil)
			s.Do(t, s.Admin(), "POST", "/api/v1/actions", map[string]any{"action": "ping", "params": map[string]any{}, "search_type": "default", "device_ids": []string{"metered"}}).Want(t, 201)
			r := s.Do(t, fleetdtest.Creds{}, "GET", "/metrics", nil).Want(t, 200)
			for _, want := range []string{"fleetd_actions_dispatched_total 1", "fleetd_device_actions_created_total 1"} {
				if !bytes.Contains(r.Body, []byte(want+"\n")) {
					t.Errorf("metrics lack %q after one dispatch to one device", want)
				}
			}
			for _, want := range []string{
				`fleetd_http_requests_total{code="200",route="GET /api/v1/devices"}`,
				`fleetd_http_request_duration_seconds_bucket{route="GET /api/v1/devices"`,
				"go_goroutines", "process_resident_memory_bytes",
				"fleetd_db_commits_total", "fleetd_db_write_queue", "fleetd_status_reports_total", "fleetd_actions_dispatched_total",
				"fleetd_stream_points_total", "fleetd_alerts_opened_total", "fleetd_notifications_delivered_total", "fleetd_mqtt_connections",
				"fleetd_sqlite_page_cache_bytes",
			} {
				if !bytes.Contains(r.Body, []byte(want)) {
					t.Errorf("metrics lack %s", want)
				}
			}
			// The devices were read: the read pool has a connection open.
			if n := fleetdtest.Metric(t, s.URL, "fleetd_db_read_connections"); n < 1 {
				t.Errorf("fleetd_db_read_connections = %v after a read, want at least 1", n)
			}
		})
		t.Run("OpenAPIDescribesEveryRoute", func(t *testing.T) {
			var doc struct {
				OpenAPI string                                `json:"openapi"`
				Paths   map[string]map[string]json.RawMessage `json:"paths"`
			}
			s.Do(t, fleetdtest.Creds{}, "GET", "/api/v1/openapi.json", nil).Want(t, 200).Decode(t, &doc)
			for _, want := range []string{"GET /api/v1/devices", "POST /api/v1/devices/bulk", "DELETE /api/v1/apikeys/{name}", "GET /api/v1/audit-logs", "GET /metrics"} {
				method, path, _ := strings.Cut(want, " ")
				if _, ok := doc.Paths[path][strings.ToLower(method)]; !ok {
					t.Errorf("the document lacks %s", want)
				}
			}
		})
		t.Run("RequestID", func(t *testing.T) {
			r := s.Send(t, fleetdtest.Req{Method: "GET", Path: "/healthz", Header: http.Header{"X-Request-Id": {"trace-42"}}}).Want(t, 200)
			if got := r.Header.Get("X-Request-Id"); got != "trace-42" {
				t.Fatalf("X-Request-Id = %q, want the client's", got)
			}
			r = s.Send(t, fleetdtest.Req{Method: "GET", Path: "/healthz", Header: http.Header{"X-Request-Id": {"bad id with spaces"}}}).Want(t, 200)
			if got := r.Header.Get("X-Request-Id"); got == "" || strings.Contains(got, " ") {
				t.Fatalf("X-Request-Id = %q, want a fresh one", got)
			}
		})
		t.Run("ErrorsFollowAccept", func(t *testing.T) {
			r := s.Send(t, fleetdtest.Req{Method: "GET", Path: "/api/v1/devices/nope", Creds: s.Admin(), Header: http.Header{"Accept": {"application/edn"}}}).Want(t, 404)
			if ct := r.Header.Get("Content-Type"); ct != "application/edn" || !bytes.Contains(r.Body, []byte(":error")) {
				t.Fatalf("EDN error: %s %s", ct, r.Body)
			}
		})
	})
}

// TestGracefulShutdown: requests in flight when the server is told to stop
// still get their answer, and run returns nil.
func TestGracefulShutdown(t *testing.T) {
	b := sqlstoretest.Backends()[0]
	s := startServer(t, b)
	// A slow client: send the headers of a device creation, then the body
	// after the stop signal. Its Expect: 100-continue has the server say
	// when the handler begins to read the body: the request is in flight.
	conn, err := net.Dial("tcp", strings.TrimPrefix(s.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"id":"late-1"}`
	io.WriteString(conn, "POST /api/v1/devices HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nExpect: 100-continue\r\n"+
		"x-service-tenant: default\r\nx-service-api-key: "+s.Key+"\r\nContent-Length: "+itoa(len(body))+"\r\n\r\n")
	br := bufioReader(conn)
	if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != http.StatusContinue {
		t.Fatalf("want 100 Continue once the handler reads: %v, %v", resp, err)
	}
	stopped := make(chan struct{})
	go func() { s.Stop(t); close(stopped) }()
	// Shutting down begins with closing the listener.
	fleetdtest.Eventually(t, "the server to stop accepting connections", func() bool {
		c, err := net.Dial("tcp", strings.TrimPrefix(s.URL, "http://"))
		if err == nil {
			c.Close()
		}
		return err != nil
	})
	io.WriteString(conn, body)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("in-flight request lost: %v", err)
	}
	if resp.StatusCode != 201 {
		t.Fatalf("in-flight request: %d", resp.StatusCode)
	}
	select {
	case <-stopped:
	case <-time.After(30 * time.Second):
		t.Fatal("server did not stop")
	}
	// The write was committed: a restarted server has the device.
	s.Start(t)
	defer s.Stop(t)
	s.Do(t, s.Admin(), "GET", "/api/v1/devices/late-1", nil).Want(t, 200)
}

func TestCommandLine(t *testing.T) {
	runCmd := func(env map[string]string, args ...string) (string, string, error) {
		var out, errOut bytes.Buffer
		err := run(context.Background(), args, func(k string) string { return env[k] }, strings.NewReader(""), &out, &errOut)
		return out.String(), errOut.String(), err
	}
	db := t.TempDir() + "/cli.db"

	t.Run("HelpNamesEveryCommand", func(t *testing.T) {
		help, _, err := runCmd(nil, "--help")
		if !errors.Is(err, flag.ErrHelp) {
			t.Fatalf("err = %v", err)
		}
		for _, c := range commands() {
			if !strings.Contains(help, c.name) {
				t.Errorf("help lacks %q", c.name)
			}
		}
	})
	t.Run("CommandHelpShowsEnv", func(t *testing.T) {
		help, _, err := runCmd(nil, "serve", "--help")
		if !errors.Is(err, flag.ErrHelp) {
			t.Fatalf("err = %v", err)
		}
		for _, want := range []string{"--http-addr", "FLEETD_HTTP_ADDR", "--database", "FLEETD_DATABASE", ":8080"} {
			if !strings.Contains(help, want) {
				t.Errorf("serve --help lacks %q:\n%s", want, help)
			}
		}
	})
	t.Run("UnknownCommand", func(t *testing.T) {
		if _, _, err := runCmd(nil, "frobnicate"); !errors.Is(err, cli.ErrUsage) || exitCode(err) != 2 {
			t.Fatalf("err = %v", err)
		}
	})
	// Help is asked for and given, on stdout (fleetd --help | less): exit
	// 0, for every command, every group of commands, and "fleetd help
	// COMMAND".
	t.Run("EveryHelpExitsZero", func(t *testing.T) {
		lines := [][]string{{"--help"}, {"help"}, {"-h"}}
		for _, c := range commands() {
			words := strings.Fields(c.name)
			lines = append(lines, append(words, "--help"), append(words, "-h"), append([]string{"help"}, words...))
			if len(words) > 1 {
				lines = append(lines, []string{words[0], "--help"}, []string{"help", words[0]})
			}
		}
		for _, args := range lines {
			help, errOut, err := runCmd(nil, args...)
			if !errors.Is(err, flag.ErrHelp) || exitCode(err) != 0 {
				t.Errorf("fleetd %s: err = %v, exit %d, want help and exit 0", strings.Join(args, " "), err, exitCode(err))
			}
			if !strings.Contains(help, "Usage: fleetd") || errOut != "" {
				t.Errorf("fleetd %s: stdout %q, stderr %q; want the usage on stdout alone", strings.Join(args, " "), help, errOut)
			}
		}
	})
	t.Run("GroupListsItsCommands", func(t *testing.T) {
		for _, args := range [][]string{{"tenant", "--help"}, {"tenant"}, {"tenant", "frobnicate"}} {
			out, errOut, err := runCmd(nil, args...)
			help := errOut // a command line that cannot run: the usage is the error's
			if args[len(args)-1] == "--help" {
				help = out
			}
			for _, want := range []string{"tenant create", "tenant list", "create a tenant"} {
				if !strings.Contains(help, want) {
					t.Errorf("fleetd %s lacks %q:\n%s", strings.Join(args, " "), want, help)
				}
			}
			if len(args) > 1 && args[1] == "--help" {
				continue
			}
			if !errors.Is(err, cli.ErrUsage) || exitCode(err) != 2 {
				t.Errorf("fleetd %s: err = %v, want a usage error", strings.Join(args, " "), err)
			}
		}
		if _, _, err := runCmd(nil, "tenant"); err == nil || !strings.Contains(err.Error(), "create or list") {
			t.Errorf("fleetd tenant: %v, want it to name the commands", err)
		}
	})
	// A wrong flag is an error: the usage goes to stderr with it, exit 2,
	// and nothing to stdout, which a script may be reading.
	t.Run("WrongFlagUsageOnStderr", func(t *testing.T) {
		for _, args := range [][]string{{"--no-such-flag"}, {"serve", "--no-such-flag"}, {"tenant", "list", "--no-such-flag"}, {"frobnicate"}} {
			out, errOut, err := runCmd(nil, args...)
			if !errors.Is(err, cli.ErrUsage) || exitCode(err) != 2 {
				t.Errorf("fleetd %s: err = %v, want a usage error (exit 2)", strings.Join(args, " "), err)
			}
			if out != "" || !strings.Contains(errOut, "Usage: fleetd") {
				t.Errorf("fleetd %s: stdout %q, stderr %q; want the usage on stderr alone", strings.Join(args, " "), out, errOut)
			}
		}
	})
	t.Run("UsageErrorsNameWhatIsMissing", func(t *testing.T) {
		for _, tc := range []struct {
			args []string
			want []string
		}{
			{[]string{"apikey", "create", "--tenant", "acme"}, []string{"--name", "--role"}},
			{[]string{"apikey", "create"}, []string{"--tenant", "--name", "--role"}},
			{[]string{"tenant", "create"}, []string{"NAME"}},
			{[]string{"tenant", "create", "a", "b"}, []string{"unexpected", "b"}},
			{[]string{"bundle", "create", "--out", "x.tar"}, []string{"--version", "NAME=VERSION:PATH"}},
			{[]string{"serve", "now"}, []string{"unexpected", "now"}},
			{[]string{"tenant", "list", "--no-such-flag"}, []string{"no-such-flag"}},
			{[]string{"sim"}, []string{"--provision, or --tokens"}},
		} {
			_, _, err := runCmd(nil, tc.args...) // each fails before it opens a database
			if !errors.Is(err, cli.ErrUsage) || exitCode(err) != 2 {
				t.Errorf("fleetd %s: err = %v, want a usage error (exit 2)", strings.Join(tc.args, " "), err)
				continue
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("fleetd %s: %q does not name %s", strings.Join(tc.args, " "), err, w)
				}
			}
		}
	})
	t.Run("TenantCreatePrintsKeyLast", func(t *testing.T) {
		out, _, err := runCmd(nil, "tenant", "create", "acme", "--database", db)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if !strings.HasPrefix(lines[len(lines)-1], "fk_") || strings.Contains(lines[len(lines)-1], " ") {
			t.Fatalf("last line %q is not the key alone", lines[len(lines)-1])
		}
		if _, _, err := runCmd(nil, "tenant", "create", "acme", "--database", db); err == nil || !strings.Contains(err.Error(), "exists") {
			t.Fatalf("second create: %v", err)
		}
	})
	t.Run("EnvironmentSetsFlags", func(t *testing.T) {
		out, _, err := runCmd(map[string]string{"FLEETD_DATABASE": db}, "tenant", "list")
		if err != nil || !strings.Contains(out, "acme") {
			t.Fatalf("tenant list with FLEETD_DATABASE: %q, %v", out, err)
		}
		// A flag wins over the environment.
		other := t.TempDir() + "/other.db"
		out, _, err = runCmd(map[string]string{"FLEETD_DATABASE": db}, "tenant", "list", "--database", other)
		if err != nil || strings.Contains(out, "acme") {
			t.Fatalf("--database did not win: %q, %v", out, err)
		}
	})
	t.Run("APIKeyCreate", func(t *testing.T) {
		out, _, err := runCmd(nil, "apikey", "create", "--tenant", "acme", "--name", "ci", "--role", "operator", "--email", "ci@example.com", "--database", db)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if !strings.HasPrefix(lines[len(lines)-1], "fk_") {
			t.Fatalf("last line %q", lines[len(lines)-1])
		}
		if _, _, err := runCmd(nil, "apikey", "create", "--tenant", "acme", "--name", "x", "--role", "root", "--database", db); err == nil {
			t.Fatal("role root accepted")
		}
		if _, _, err := runCmd(nil, "apikey", "create", "--tenant", "nobody", "--name", "x", "--role", "viewer", "--database", db); err == nil || !strings.Contains(err.Error(), "nobody") {
			t.Fatalf("unknown tenant: %v", err)
		}
	})
	t.Run("Migrate", func(t *testing.T) {
		out, _, err := runCmd(nil, "migrate", "--database", t.TempDir()+"/m.db")
		if err != nil || !strings.Contains(out, "up to date") {
			t.Fatalf("migrate: %q, %v", out, err)
		}
	})
	t.Run("Version", func(t *testing.T) {
		out, _, err := runCmd(nil, "version")
		if err != nil || !strings.HasPrefix(out, "fleetd ") {
			t.Fatalf("version: %q, %v", out, err)
		}
	})
	t.Run("PortInUseNamesTheFlag", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		_, _, err = runCmd(nil, "serve", "--database", t.TempDir()+"/p.db", "--http-addr", ln.Addr().String(), "--mqtt-addr", "127.0.0.1:0")
		if err == nil || !strings.Contains(err.Error(), "--http-addr") {
			t.Fatalf("err = %v, want one naming --http-addr", err)
		}
	})
	// A start that fails on a taken port creates nothing, so the retry on a
	// free one is the start that prints the one-time key, and says how to
	// make another.
	t.Run("TakenPortKeepsTheKey", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		s := &testServer{fleetdtest.New(t.TempDir()+"/k.db", t.TempDir())}
		for _, taken := range []string{"--http-addr", "--mqtt-addr"} {
			args := []string{"serve", "--database", s.DSN, "--data-dir", s.DataDir, "--http-addr", "127.0.0.1:0", "--mqtt-addr", "127.0.0.1:0", taken, ln.Addr().String()}
			out, _, err := runCmd(nil, args...)
			if err == nil || !strings.Contains(err.Error(), taken) {
				t.Fatalf("%s taken: err = %v, want one naming it", taken, err)
			}
			if strings.Contains(out, "fk_") {
				t.Fatalf("%s taken: a key was printed and spent:\n%s", taken, out)
			}
		}
		s.Start(t)
		defer s.Stop(t)
		if s.Key == "" {
			t.Fatalf("the retry printed no key:\n%s", s.Output)
		}
		out := s.Output.String()
		if !strings.Contains(out, "fleetd apikey create --tenant default") || !strings.Contains(out, "--database") {
			t.Fatalf("the key's message does not say how to make another, with which database:\n%s", out)
		}
		// As the message says.
		if key := s.Command(t, server.APIKeyCreate, "--tenant", "default", "--name", "admin-2", "--role", "admin"); !strings.HasPrefix(key, "fk_") {
			t.Fatalf("apikey create printed %q", key)
		}
	})
	t.Run("BadAPIKey", func(t *testing.T) {
		// The API's rules: a name the API could not delete is refused.
		_, _, err := runCmd(nil, "apikey", "create", "--tenant", "default", "--name", "two words", "--role", "chief", "--database", db)
		if err == nil || !strings.Contains(err.Error(), "--name must be") || !strings.Contains(err.Error(), "--role must be") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("BadLogLevel", func(t *testing.T) {
		_, _, err := runCmd(nil, "tenant", "list", "--database", db, "--log-level", "loud")
		if err == nil || !strings.Contains(err.Error(), "--log-level") {
			t.Fatalf("err = %v", err)
		}
	})
}

func itoa(n int) string { return strconv.Itoa(n) }

func bufioReader(r io.Reader) *bufio.Reader { return bufio.NewReader(r) }
