package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet/ctl"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// The fleetctl tests run the client's Run against a real fleetd started
// through run: every command group, its output forms and its exit codes.

// fleetctl is the client with an environment of its own: a config
// directory and, when set, FLEETCTL_* variables.
type fleetctl struct {
	env map[string]string
	tty bool // its output is a terminal, where progress redraws in place
	// typed, when set, is what a person types at a prompt on the
	// terminal; prompts are the prompts shown.
	typed   string
	prompts []string
}

func (f *fleetctl) environment(stdin string, out, errOut io.Writer) ctl.Env {
	env := ctl.Env{
		Getenv: func(k string) string { return f.env[k] },
		Stdin:  strings.NewReader(stdin), Stdout: out, Stderr: errOut,
		IsTerminal: func(io.Writer) bool { return f.tty },
	}
	if f.typed != "" {
		env.ReadSecret = func(prompt string) (string, error) {
			f.prompts = append(f.prompts, prompt)
			return f.typed, nil
		}
	}
	return env
}

// newFleetctl returns a client with an empty config directory that acts
// as c on s through FLEETCTL_* variables (none when c is empty).
func (s *testServer) newFleetctl(t *testing.T, c creds) *fleetctl {
	t.Helper()
	f := &fleetctl{env: map[string]string{"XDG_CONFIG_HOME": t.TempDir()}}
	if c.Key != "" {
		f.env["FLEETCTL_URL"] = s.URL
		f.env["FLEETCTL_TENANT"] = c.Tenant
		f.env["FLEETCTL_API_KEY"] = c.Key
	}
	return f
}

// ctlResult is one run of fleetctl.
type ctlResult struct {
	args           []string
	stdout, stderr string
	code           int
}

func (r ctlResult) String() string {
	return fmt.Sprintf("fleetctl %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(r.args, " "), r.code, r.stdout, r.stderr)
}

func (f *fleetctl) run(stdin string, args ...string) ctlResult {
	var out, errOut bytes.Buffer
	code := ctl.Run(context.Background(), args, f.environment(stdin, &out, &errOut))
	return ctlResult{args: args, stdout: out.String(), stderr: errOut.String(), code: code}
}

// ok runs fleetctl and wants exit 0; it returns standard output.
func (f *fleetctl) ok(t *testing.T, args ...string) string {
	t.Helper()
	r := f.run("", args...)
	if r.code != 0 {
		t.Fatalf("%v", r)
	}
	return r.stdout
}

// fails runs fleetctl, wants exit code want and returns standard error.
func (f *fleetctl) fails(t *testing.T, want int, args ...string) string {
	t.Helper()
	r := f.run("", args...)
	if r.code != want {
		t.Fatalf("want exit %d; %v", want, r)
	}
	if r.stderr == "" {
		t.Fatalf("exit %d with nothing on stderr; %v", want, r)
	}
	return r.stderr
}

// json runs fleetctl with -o json and decodes its output into v.
func (f *fleetctl) json(t *testing.T, v any, args ...string) {
	t.Helper()
	out := f.ok(t, append(args, "-o", "json")...)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("fleetctl %s -o json: %v\n%s", strings.Join(args, " "), err, out)
	}
}

func wantContains(t *testing.T, what, got string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(got, w) {
			t.Fatalf("%s does not contain %q:\n%s", what, w, got)
		}
	}
}

func TestFleetctlContexts(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := startServer(t, b)
		acme := s.NewTenant(t, "acme")
		s.mustDevice(t, s.Admin(), "default-dev", nil)
		s.mustDevice(t, acme, "acme-dev", nil)
		f := s.newFleetctl(t, creds{})
		cfg := filepath.Join(f.env["XDG_CONFIG_HOME"], "fleetctl", "config")

		t.Run("NoServer", func(t *testing.T) {
			wantContains(t, "stderr", f.fails(t, ctl.ExitUsage, "devices", "list"), "fleetctl login")
		})
		t.Run("LoginRefusesABadKey", func(t *testing.T) {
			stderr := f.fails(t, ctl.ExitRefused, "login", "--url", s.URL, "--tenant", "default", "--api-key", "fk_wrong")
			wantContains(t, "stderr", stderr, "401 unauthenticated")
			if _, err := os.Stat(cfg); !os.IsNotExist(err) {
				t.Fatalf("a refused login wrote the config: %v", err)
			}
		})
		t.Run("Login", func(t *testing.T) {
			f.ok(t, "login", "--url", s.URL, "--tenant", "default", "--api-key", s.Key, "--name", "home")
			r := f.run(acme.Key+"\n", "login", "--url", s.URL, "--tenant", "acme", "--api-key", "-")
			if r.code != 0 {
				t.Fatalf("%v", r)
			}
			fi, err := os.Stat(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Perm() != 0o600 {
				t.Fatalf("config mode %v, want 0600", fi.Mode().Perm())
			}
			b, _ := os.ReadFile(cfg)
			wantContains(t, "config", string(b), "current-context: acme@", acme.Key, s.Key)
			// The last login is current.
			wantContains(t, "devices of acme", f.ok(t, "devices", "list"), "acme-dev")
			if out := f.ok(t, "devices", "list"); strings.Contains(out, "default-dev") {
				t.Fatalf("acme's context lists default's devices:\n%s", out)
			}
			wantContains(t, "devices of --context home", f.ok(t, "devices", "list", "--context", "home"), "default-dev")
			wantContains(t, "contexts", f.ok(t, "config", "get-contexts"), "home", "*  ")
		})
		t.Run("LoginKeyNotInArguments", func(t *testing.T) {
			// The key from FLEETCTL_API_KEY, then from a prompt on the
			// terminal; with neither, a usage error that says how.
			g := s.newFleetctl(t, creds{})
			g.env["FLEETCTL_API_KEY"] = acme.Key
			g.ok(t, "login", "--url", s.URL, "--tenant", "acme")
			delete(g.env, "FLEETCTL_API_KEY")
			wantContains(t, "devices of acme", g.ok(t, "devices", "list"), "acme-dev")
			wantContains(t, "stderr", g.fails(t, ctl.ExitUsage, "login", "--url", s.URL, "--tenant", "default"), "FLEETCTL_API_KEY", "--api-key -")
			g.typed = s.Key
			g.ok(t, "login", "--url", s.URL, "--tenant", "default")
			if len(g.prompts) != 1 || !strings.Contains(g.prompts[0], "default") {
				t.Fatalf("prompts %q, want one for tenant default", g.prompts)
			}
			wantContains(t, "devices of default", g.ok(t, "devices", "list"), "default-dev")
		})
		t.Run("Override", func(t *testing.T) {
			// The variables beat the context; a flag beats both.
			f.env["FLEETCTL_TENANT"], f.env["FLEETCTL_API_KEY"] = "default", s.Key
			defer delete(f.env, "FLEETCTL_TENANT")
			defer delete(f.env, "FLEETCTL_API_KEY")
			wantContains(t, "devices with FLEETCTL_*", f.ok(t, "devices", "list"), "default-dev")
			wantContains(t, "devices with flags", f.ok(t, "devices", "list", "--tenant", "acme", "--api-key", acme.Key), "acme-dev")
		})
		t.Run("UseAndDeleteContext", func(t *testing.T) {
			f.ok(t, "config", "use-context", "home")
			wantContains(t, "devices", f.ok(t, "devices", "list"), "default-dev")
			f.ok(t, "config", "delete-context", "home")
			b, _ := os.ReadFile(cfg)
			if strings.Contains(string(b), s.Key) {
				t.Fatalf("the deleted context's key is still in the config:\n%s", b)
			}
			f.fails(t, ctl.ExitUsage, "devices", "list") // no current context now
			f.fails(t, ctl.ExitUsage, "config", "use-context", "nosuch")
			f.fails(t, ctl.ExitUsage, "devices", "list", "--context", "nosuch")
		})
		t.Run("Usage", func(t *testing.T) {
			a := s.newFleetctl(t, s.Admin())
			for _, args := range [][]string{
				{"nosuch"},
				{"devices", "nosuch"},
				{"devices", "list", "--nosuch"},
				{"devices", "get"},
				{"devices", "list", "-o", "xml"},
				{"actions", "get", "abc"},
				{"actions", "dispatch", "reboot"},
				{"actions", "dispatch", "reboot", "--all", "--devices", "x"},
				{"devices", "create", "--file", filepath.Join(t.TempDir(), "none.csv")},
			} {
				a.fails(t, ctl.ExitUsage, args...)
			}
			wantContains(t, "help", a.ok(t, "--help"), "Exit codes", "devices", "actions")
		})
	})
}

func TestFleetctlDevices(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		// MQTT over TLS, so that devices can be issued certificates.
		certFile, keyFile := writeServerCert(t, t.TempDir(), "fleetd test")
		s := startServer(t, b, "--tls-cert", certFile, "--tls-key", keyFile, "--http-tls=false", "--mqtts-addr", "127.0.0.1:0")
		f := s.newFleetctl(t, s.Admin())
		dir := t.TempDir()

		t.Run("Create", func(t *testing.T) {
			out := f.ok(t, "devices", "create", "pump-1", "--metadata", "site=berlin", "--metadata", "model=x1")
			wantContains(t, "created", out, "TOKEN", "pump-1", "fdt_", "model=x1,site=berlin")
			var gen struct{ ID, Token string }
			f.json(t, &gen, "devices", "create")
			if gen.ID == "" || !strings.HasPrefix(gen.Token, "fdt_") {
				t.Fatalf("generated device %+v", gen)
			}
			f.ok(t, "devices", "delete", gen.ID)
		})
		t.Run("Bulk", func(t *testing.T) {
			csvFile := filepath.Join(dir, "devices.csv")
			os.WriteFile(csvFile, []byte("\ufeffid,site,model\npump-2,paris,x1\nvalve-1,,v2\n"), 0o644) // as a spreadsheet saves it
			var got struct {
				Devices []struct{ ID, Token string }
			}
			f.json(t, &got, "devices", "create", "--file", csvFile)
			if len(got.Devices) != 2 || got.Devices[1].ID != "valve-1" || got.Devices[1].Token == "" {
				t.Fatalf("bulk from CSV: %+v", got)
			}
			r := f.run(`[{"id": "valve-2", "metadata": {"site": "paris"}}]`, "devices", "create", "-f", "-")
			if r.code != 0 || !strings.Contains(r.stdout, "valve-2") {
				t.Fatalf("bulk from JSON: %v", r)
			}
			// All or none: one bad id refuses the whole file.
			os.WriteFile(csvFile, []byte("id\nok-1\nnot ok\n"), 0o644)
			wantContains(t, "stderr", f.fails(t, ctl.ExitRefused, "devices", "create", "-f", csvFile), "400 invalid", "devices[1].id")
			f.fails(t, ctl.ExitRefused, "devices", "get", "ok-1")
		})
		t.Run("List", func(t *testing.T) {
			var list struct {
				Devices []struct{ ID string }
				Count   int
			}
			f.json(t, &list, "devices", "list", "--search", "PUMP")
			if list.Count != 2 {
				t.Fatalf("search pump: %+v", list)
			}
			f.json(t, &list, "devices", "list", "--metadata", "site=paris", "--metadata", "model=x1")
			if list.Count != 1 || list.Devices[0].ID != "pump-2" {
				t.Fatalf("metadata site=paris model=x1: %+v", list)
			}
			r := f.run("", "devices", "list", "--limit", "1")
			if r.code != 0 || strings.Count(r.stdout, "\n") != 2 || !strings.Contains(r.stderr, "1 of 4 shown") {
				t.Fatalf("a page of one: %v", r)
			}
		})
		t.Run("Formats", func(t *testing.T) {
			wantContains(t, "yaml", f.ok(t, "devices", "get", "pump-1", "-o", "yaml"), "id: pump-1\n", "metadata:\n  model: x1\n", "last_seen_at: null")
			wantContains(t, "edn", f.ok(t, "devices", "get", "pump-1", "-o", "edn"), `:id "pump-1"`, `:metadata {`)
			wantContains(t, "table", f.ok(t, "devices", "get", "pump-1"), "ID", "LAST SEEN", "pump-1")
		})
		t.Run("Patch", func(t *testing.T) {
			f.ok(t, "devices", "patch", "pump-1", "--set", "model=x2", "--set", "rack=7", "--unset", "site")
			var d struct{ Metadata map[string]string }
			f.json(t, &d, "devices", "get", "pump-1")
			if len(d.Metadata) != 2 || d.Metadata["model"] != "x2" || d.Metadata["rack"] != "7" {
				t.Fatalf("patched metadata %v", d.Metadata)
			}
			// A string that YAML would read as a number stays a string.
			wantContains(t, "yaml", f.ok(t, "devices", "get", "pump-1", "-o", "yaml"), `rack: "7"`)
			f.fails(t, ctl.ExitUsage, "devices", "patch", "pump-1")
		})
		t.Run("Credentials", func(t *testing.T) {
			var tok struct{ Token string }
			f.json(t, &tok, "devices", "rotate-token", "pump-1")
			if !strings.HasPrefix(tok.Token, "fdt_") {
				t.Fatalf("rotated token %+v", tok)
			}
			wantContains(t, "certificate", f.ok(t, "devices", "certificate", "pump-1"), "device_certificate: |", "BEGIN CERTIFICATE", "PRIVATE KEY")
			var up struct {
				ProjectID string `json:"project_id"`
				DeviceID  string `json:"device_id"`
			}
			f.json(t, &up, "devices", "uplink-config", "pump-1")
			if up.ProjectID != "default" || up.DeviceID != "pump-1" {
				t.Fatalf("uplink config %+v", up)
			}
		})
		t.Run("Delete", func(t *testing.T) {
			wantContains(t, "delete", f.ok(t, "devices", "delete", "valve-1", "valve-2"), "deleted device valve-2")
			wantContains(t, "stderr", f.fails(t, ctl.ExitRefused, "devices", "get", "valve-1"), "404 not_found")
		})
		t.Run("Roles", func(t *testing.T) {
			viewer := s.newFleetctl(t, s.NewKey(t, s.Admin(), "ro", "viewer"))
			viewer.ok(t, "devices", "list")
			wantContains(t, "stderr", viewer.fails(t, ctl.ExitRefused, "devices", "create", "x"), "403 forbidden")
		})
	})
}

// TestFleetctlTLS talks to fleetd over https, trusting its certificate
// through --ca-file and the context.
func TestFleetctlTLS(t *testing.T) {
	certFile, keyFile := writeServerCert(t, t.TempDir(), "fleetd test")
	s := startServer(t, sqlstoretest.Backends()[0], "--tls-cert", certFile, "--tls-key", keyFile)
	url := strings.Replace(s.URL, "http://", "https://", 1)
	f := s.newFleetctl(t, creds{})
	stderr := f.fails(t, ctl.ExitRefused, "login", "--url", url, "--tenant", "default", "--api-key", s.Key)
	wantContains(t, "stderr without the CA", stderr, "cannot reach", "certificate")
	f.ok(t, "login", "--url", url, "--tenant", "default", "--api-key", s.Key, "--ca-file", certFile)
	f.ok(t, "devices", "create", "tls-1")
	wantContains(t, "devices over https", f.ok(t, "devices", "list"), "tls-1")
}

// start runs fleetctl in the background until it ends or ctx does; out is
// its standard output, read while it runs.
func (f *fleetctl) start(ctx context.Context, args ...string) (out *LockedBuffer, done <-chan ctlResult) {
	out = &LockedBuffer{}
	ch := make(chan ctlResult, 1)
	go func() {
		var errOut bytes.Buffer
		code := ctl.Run(ctx, args, f.environment("", out, &errOut))
		ch <- ctlResult{args: args, stdout: out.String(), stderr: errOut.String(), code: code}
	}()
	return out, ch
}

// report is a device's status report through S10.
func (s *testServer) report(t *testing.T, device string, id int64, state string) {
	t.Helper()
	s.Do(t, s.Admin(), "POST", "/api/v1/devices/action/status", map[string]any{
		"device_id": device, "action_id": id, "state": state, "progress": 100}).Want(t, 204)
}

func TestFleetctlActions(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := startServer(t, b)
		f := s.newFleetctl(t, s.Admin())
		for _, id := range []string{"d1", "d2", "d3", "d4"} {
			f.ok(t, "devices", "create", id, "--metadata", "ring="+map[bool]string{true: "canary", false: "main"}[id == "d1"])
		}
		var dispatched struct {
			ID       int64
			Targeted int
		}

		t.Run("DispatchAndRead", func(t *testing.T) {
			f.json(t, &dispatched, "actions", "dispatch", "reboot", "--devices", "d1,d2", "--params", `{"delay": 5}`, "--param", "reason=test", "--timeout", "10m")
			if dispatched.ID == 0 || dispatched.Targeted != 2 {
				t.Fatalf("dispatched %+v", dispatched)
			}
			id := fmt.Sprint(dispatched.ID)
			var a struct {
				Params   map[string]any
				Timeout  int
				Statuses map[string]int
			}
			f.json(t, &a, "actions", "get", id)
			if a.Params["delay"] != 5.0 || a.Params["reason"] != "test" || a.Timeout != 600 || a.Statuses["Queued"] != 2 {
				t.Fatalf("action %+v", a)
			}
			wantContains(t, "list", f.ok(t, "actions", "list", "--action", "reboot"), "reboot", "Queued=2")
			s.report(t, "d1", dispatched.ID, "Rebooting")
			wantContains(t, "devices of the action", f.ok(t, "actions", "devices", id, "--status", "Progress"), "d1", "Rebooting")
			wantContains(t, "S7", f.ok(t, "devices", "actions", "d1", "--sort-by", "updated_at", "--order", "asc", "--type", "reboot"), "Progress", "Rebooting")

			var bySearch, byMeta, all struct{ Targeted int }
			f.json(t, &bySearch, "actions", "dispatch", "ping", "--search", "d", "--search-key", "")
			f.json(t, &byMeta, "actions", "dispatch", "ping", "--metadata-match", "ring=canary")
			f.json(t, &all, "actions", "dispatch", "ping", "--all")
			if bySearch.Targeted != 4 || byMeta.Targeted != 1 || all.Targeted != 4 {
				t.Fatalf("targeted: search %d, metadata %d, all %d", bySearch.Targeted, byMeta.Targeted, all.Targeted)
			}
			body := filepath.Join(t.TempDir(), "dispatch.yaml")
			os.WriteFile(body, []byte("action: configure\nparams: {level: 3}\nsearch_type: default\ndevice_ids: [d3]\n"), 0o644)
			var fromFile struct{ Targeted int }
			f.json(t, &fromFile, "actions", "dispatch", "-f", body)
			if fromFile.Targeted != 1 {
				t.Fatalf("dispatch from a file: %+v", fromFile)
			}
			wantContains(t, "stderr", f.fails(t, ctl.ExitRefused, "actions", "dispatch", "reboot", "--devices", "d1,nosuch"), "400 invalid", "nosuch")
			wantContains(t, "stderr", f.fails(t, ctl.ExitRefused, "actions", "get", "999999"), "404 not_found")
		})
		t.Run("WatchCompletes", func(t *testing.T) {
			id := fmt.Sprint(dispatched.ID)
			out, done := f.start(context.Background(), "actions", "watch", id, "--interval", "10ms")
			eventually(t, "watch to show the action", func() bool { return strings.Contains(out.String(), "0/2 final") })
			s.report(t, "d1", dispatched.ID, "Completed")
			eventually(t, "watch to see d1 complete", func() bool { return strings.Contains(out.String(), "1/2 final") })
			s.report(t, "d2", dispatched.ID, "Completed")
			r := <-done
			if r.code != 0 {
				t.Fatalf("%v", r)
			}
			wantContains(t, "watch", r.stdout, "2/2 final: Completed 2")
		})
		t.Run("WatchFails", func(t *testing.T) {
			var d struct{ ID int64 }
			f.json(t, &d, "actions", "dispatch", "reboot", "--devices", "d1,d2")
			id := fmt.Sprint(d.ID)
			// On a terminal the bars redraw in place.
			term := &fleetctl{env: f.env, tty: true}
			out, done := term.start(context.Background(), "actions", "watch", id, "--interval", "10ms")
			eventually(t, "watch to show the action", func() bool { return strings.Contains(out.String(), "0/2 final") })
			// A gateway's key of role device reports through fleetctl.
			gw := s.newFleetctl(t, s.NewKey(t, s.Admin(), "gateway", "device"))
			gw.ok(t, "actions", "report", id, "--device", "d1", "--state", "Failed", "--progress", "30", "--error", "disk full")
			wantContains(t, "report usage", gw.fails(t, ctl.ExitUsage, "actions", "report", id, "--state", "Failed"), "--device")
			wantContains(t, "devices", f.ok(t, "actions", "devices", id, "--status", "Failed"), "d1", "Failed=disk full")
			wantContains(t, "cancel", f.ok(t, "actions", "cancel", id), "Cancelled=1", "Failed=1")
			r := <-done
			if r.code != ctl.ExitAborted {
				t.Fatalf("want exit 6; %v", r)
			}
			wantContains(t, "stderr", r.stderr, "1 device action(s) cancelled: Failed 1, Cancelled 1")
			wantContains(t, "terminal", r.stdout, "  Queued     ████████████████████████ 2/2\n", "\x1b[2A\x1b[J", "  Failed     ████████████░░░░░░░░░░░░ 1/2\n")
			wantContains(t, "timeout", f.fails(t, ctl.ExitTimeout, "actions", "watch", fmt.Sprint(dispatched.ID+1), "--timeout", "1ns"), "gave up")
			// retry: the Failed device by default, or the statuses named.
			var retried struct {
				ID       int64
				Targeted int
			}
			f.json(t, &retried, "actions", "retry", id)
			var ra struct {
				RetryOf int64 `json:"retry_of"`
			}
			if f.json(t, &ra, "actions", "get", fmt.Sprint(retried.ID)); retried.Targeted != 1 || ra.RetryOf != d.ID {
				t.Fatalf("retry: %+v, %+v", retried, ra)
			}
			// d1's Failed device action was retried: only d2's Cancelled one is left.
			f.json(t, &retried, "actions", "retry", id, "--status", "Failed", "--status", "Cancelled")
			if retried.Targeted != 1 {
				t.Fatalf("retry both: %+v", retried)
			}
			wantContains(t, "retry again", f.fails(t, ctl.ExitRefused, "actions", "retry", id), "409 conflict", "retried already")
			wantContains(t, "retry nothing", f.fails(t, ctl.ExitRefused, "actions", "retry", id, "--status", "Completed"), "409 conflict", "is Completed")
		})
		t.Run("Rollout", func(t *testing.T) {
			var d struct{ ID int64 }
			f.json(t, &d, "actions", "dispatch", "update", "--devices", "d1,d2,d3", "--release-notes", "a test",
				"--phase", "canary d1", "--phase", "rest 100% trigger=manual max-failure-rate=0.5 min-finished=1")
			id := fmt.Sprint(d.ID)
			type rollout struct {
				Status         string
				PauseReason    string `json:"pause_reason"`
				Statuses       map[string]int
				StatusesPhased map[string]map[string]int `json:"statuses_phased"`
				Schedule       struct {
					ReleaseNotes string `json:"release_notes"`
					Phases       []struct{ Name string }
				}
			}
			var r rollout
			f.json(t, &r, "actions", "get", id)
			if r.Status != "running" || r.Statuses["Scheduled"] != 2 || r.Schedule.ReleaseNotes != "a test" || len(r.Schedule.Phases) != 2 {
				t.Fatalf("rollout %+v", r)
			}
			f.ok(t, "actions", "pause", id)
			res := f.run("", "actions", "watch", id, "--interval", "10ms")
			if res.code != ctl.ExitPaused || !strings.Contains(res.stderr, "is paused") {
				t.Fatalf("watching a paused rollout: %v", res)
			}
			wantContains(t, "resume", f.ok(t, "actions", "resume", id), "running")
			wantContains(t, "stderr", f.fails(t, ctl.ExitRefused, "actions", "resume", id), "409 conflict")
			f.ok(t, "actions", "append-phase", id, "--phase", "late d4 trigger=manual")
			// watch says what the running rollout waits for.
			ctx, stop := context.WithCancel(context.Background())
			out, done := f.start(ctx, "actions", "watch", id, "--interval", "10ms")
			eventually(t, "watch to say what the rollout waits for", func() bool {
				return strings.Contains(out.String(), "; rollout running; waiting: phase 1 (rest) waits for an operator to trigger it")
			})
			stop()
			<-done
			s.report(t, "d1", d.ID, "Completed")
			f.ok(t, "actions", "trigger-next-phase", id)
			f.json(t, &r, "actions", "get", id)
			if r.Statuses["Queued"] != 2 || r.Statuses["Scheduled"] != 1 || len(r.Schedule.Phases) != 3 || r.StatusesPhased["1"]["Queued"] != 2 {
				t.Fatalf("after the next phase: %+v", r)
			}
			wantContains(t, "abort", f.ok(t, "actions", "abort", id), "aborted")
			f.json(t, &r, "actions", "get", id)
			if r.Status != "aborted" || r.Statuses["Cancelled"] != 3 || r.Statuses["Completed"] != 1 {
				t.Fatalf("aborted: %+v", r)
			}
			sched := filepath.Join(t.TempDir(), "schedule.yaml")
			os.WriteFile(sched, []byte("release_notes: from a file\nmaintenance_window: {start: '02:00', end: '05:00', timezone: Europe/Berlin}\nphases:\n  - name: only\n    trigger_on: {type: manual}\n    info: {type: fixed_list, device_ids: [d4]}\n"), 0o644)
			f.json(t, &d, "actions", "dispatch", "update", "--devices", "d4", "--schedule", sched)
			f.json(t, &r, "actions", "get", fmt.Sprint(d.ID))
			if r.Status != "scheduled" || r.Schedule.ReleaseNotes != "from a file" || r.Statuses["Scheduled"] != 1 {
				t.Fatalf("rollout from a schedule file: %+v", r)
			}
			wantContains(t, "phase usage", f.fails(t, ctl.ExitUsage, "actions", "dispatch", "x", "--all", "--phase", "lonely"), "NAME SELECTION")
			// --phase takes finished-ratio= and a metadata selection.
			var phased struct {
				Schedule struct {
					Phases []struct {
						TriggerOn map[string]any `json:"trigger_on"`
						Info      map[string]any `json:"info"`
					}
				}
			}
			f.json(t, &d, "actions", "dispatch", "update", "--devices", "d1,d2", "--phase", "canary ring=canary trigger=manual", "--phase", "rest 100% finished-ratio=0.5")
			f.json(t, &phased, "actions", "get", fmt.Sprint(d.ID))
			if p := phased.Schedule.Phases; len(p) != 2 || fmt.Sprint(p[0].Info) != "map[metadata:map[ring:canary] type:metadata]" ||
				fmt.Sprint(p[1].TriggerOn) != "map[finished_ratio:0.5 type:after_previous]" {
				t.Fatalf("phases with a metadata selection and finished-ratio: %+v", phased)
			}
			wantContains(t, "finished-ratio 2", f.fails(t, ctl.ExitRefused, "actions", "dispatch", "update", "--devices", "d2,d3",
				"--phase", "canary d2", "--phase", "rest 100% finished-ratio=2"), "schedule.phases[1].trigger_on.finished_ratio")
		})
	})
}

// TestFleetctlWatchExitCodes: a CI job gates on 'actions watch' and
// 'actions dispatch --watch' by their exit code, one for each way an
// action ends (docs/cli.md's table).
func TestFleetctlWatchExitCodes(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := startServer(t, b, "--rollout-interval", "20ms")
		f := s.newFleetctl(t, s.Admin())
		for _, id := range []string{"w1", "w2", "w3", "w4"} {
			f.ok(t, "devices", "create", id)
		}
		dispatch := func(t *testing.T, args ...string) (int64, string) {
			t.Helper()
			var d struct{ ID int64 }
			f.json(t, &d, append([]string{"actions", "dispatch", "reboot"}, args...)...)
			return d.ID, fmt.Sprint(d.ID)
		}
		watch := func(t *testing.T, want int, id string, args ...string) ctlResult {
			t.Helper()
			r := f.run("", append([]string{"actions", "watch", id, "--interval", "10ms"}, args...)...)
			if r.code != want {
				t.Fatalf("want exit %d; %v", want, r)
			}
			return r
		}
		// released waits for a rollout's first phase, which the rollout
		// loop releases, to release n devices.
		released := func(t *testing.T, sid string, n int) {
			t.Helper()
			eventually(t, "the first phase to release", func() bool {
				var a struct{ Statuses map[string]int }
				f.json(t, &a, "actions", "get", sid)
				return a.Statuses["Queued"] == n
			})
		}
		actions := func(t *testing.T) int {
			var l struct{ Actions []struct{ ID int64 } }
			f.json(t, &l, "actions", "list", "--limit", "1000")
			return len(l.Actions)
		}
		type line struct {
			Event  string
			Action struct {
				ID       int64
				Statuses map[string]int
			}
			ExitCode *int `json:"exit_code"`
			Reason   string
		}
		lines := func(t *testing.T, out string) []line {
			t.Helper()
			var ls []line
			for _, l := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
				var v line
				if err := json.Unmarshal([]byte(l), &v); err != nil {
					t.Fatalf("a line of -o json is not a JSON object: %v: %q\n%s", err, l, out)
				}
				ls = append(ls, v)
			}
			return ls
		}

		t.Run("0Finished", func(t *testing.T) {
			out, done := f.start(context.Background(), "actions", "dispatch", "reboot", "--devices", "w1,w2", "--watch", "--interval", "10ms", "-o", "json")
			eventually(t, "the first JSON line", func() bool { return strings.Contains(out.String(), "\n") })
			id := lines(t, out.String())[0].Action.ID
			s.report(t, "w1", id, "Completed")
			eventually(t, "a line with w1 completed", func() bool { return strings.Contains(out.String(), `"Completed":1`) })
			s.report(t, "w2", id, "Completed")
			r := <-done
			if r.code != ctl.ExitOK {
				t.Fatalf("%v", r)
			}
			wantContains(t, "stderr", r.stderr, fmt.Sprintf("dispatched action %d to 2 devices", id))
			ls := lines(t, r.stdout)
			if len(ls) < 3 {
				t.Fatalf("want a line per change (Queued 2, Completed 1, Completed 2) and the final one:\n%s", r.stdout)
			}
			for i, l := range ls[:len(ls)-1] {
				if l.Event != "change" || l.Action.ID != id || l.ExitCode != nil {
					t.Fatalf("line %d: %+v", i, l)
				}
			}
			last := ls[len(ls)-1]
			if last.Event != "final" || last.ExitCode == nil || *last.ExitCode != 0 || last.Action.Statuses["Completed"] != 2 {
				t.Fatalf("final line %+v", last)
			}
			wantContains(t, "final reason", last.Reason, "finished: Completed 2")
		})
		t.Run("0And4MaxFailed", func(t *testing.T) {
			id, sid := dispatch(t, "--devices", "w1,w2,w3,w4")
			s.report(t, "w1", id, "Failed")
			for _, d := range []string{"w2", "w3", "w4"} {
				s.report(t, d, id, "Completed")
			}
			wantContains(t, "stderr", watch(t, ctl.ExitFailed, sid).stderr, "1 of 4 devices failed, more than --max-failed 0 allows")
			watch(t, ctl.ExitOK, sid, "--max-failed", "1")
			watch(t, ctl.ExitOK, sid, "--max-failed", "25%")
			watch(t, ctl.ExitFailed, sid, "--max-failed", "24.9%")
			r := watch(t, ctl.ExitFailed, sid, "-o", "json")
			if last := lines(t, r.stdout)[1]; last.Event != "final" || *last.ExitCode != ctl.ExitFailed || !strings.Contains(last.Reason, "1 of 4 devices failed") {
				t.Fatalf("final line %+v", last)
			}
		})
		t.Run("1RequestFailed", func(t *testing.T) {
			wantContains(t, "stderr", watch(t, ctl.ExitRefused, "999999").stderr, "404 not_found")
		})
		t.Run("2Usage", func(t *testing.T) {
			before := actions(t)
			for _, args := range [][]string{
				{"actions", "watch", "1", "--max-failed", "some"},
				{"actions", "watch", "1", "--max-failed", "101%"},
				{"actions", "watch", "1", "-o", "yaml"},
				{"actions", "dispatch", "reboot", "--devices", "w1", "--max-failed", "2"},
				{"actions", "dispatch", "reboot", "--devices", "w1", "--watch-timeout", "1m"},
				{"actions", "dispatch", "reboot", "--devices", "w1", "--watch", "-o", "edn"},
				{"actions", "dispatch", "reboot", "--devices", "w1", "--watch", "--max-failed", "-1"},
			} {
				if r := f.run("", args...); r.code != ctl.ExitUsage {
					t.Fatalf("want exit 2; %v", r)
				}
			}
			if after := actions(t); after != before {
				t.Fatalf("a command line that cannot be run dispatched: %d actions, then %d", before, after)
			}
		})
		t.Run("3Paused", func(t *testing.T) {
			id, sid := dispatch(t, "--devices", "w1,w2", "--phase", "canary w1", "--phase", "rest 100% max-failure-rate=0.1 min-finished=1")
			released(t, sid, 1)
			s.report(t, "w1", id, "Failed")
			r := watch(t, ctl.ExitPaused, sid, "--timeout", "1m", "--max-failed", "1")
			wantContains(t, "a gate's pause", r.stderr, "the rollout is paused: phase 1 (rest) not released", "failed (100% > 10%)")

			_, sid = dispatch(t, "--devices", "w3", "--phase", "later w3 trigger=manual")
			f.ok(t, "actions", "pause", sid)
			wantContains(t, "an operator's pause", watch(t, ctl.ExitPaused, sid).stderr, "the rollout is paused: paused by")
		})
		t.Run("5Timeout", func(t *testing.T) {
			// Long enough for the first read, whatever the machine's load.
			_, sid := dispatch(t, "--devices", "w1")
			wantContains(t, "stderr", watch(t, ctl.ExitTimeout, sid, "--timeout", "1s").stderr, "gave up watching after 1s: Queued 1")
			r := watch(t, ctl.ExitTimeout, sid, "--timeout", "1s", "-o", "json")
			ls := lines(t, r.stdout)
			if last := ls[len(ls)-1]; len(ls) != 2 || last.Event != "final" || *last.ExitCode != ctl.ExitTimeout || last.Action.Statuses["Queued"] != 1 {
				t.Fatalf("lines %+v", ls)
			}
			r = f.run("", "actions", "dispatch", "reboot", "--devices", "w2", "--watch", "--interval", "10ms", "--watch-timeout", "50ms")
			if r.code != ctl.ExitTimeout {
				t.Fatalf("want exit 5; %v", r)
			}
			// A rollout that waits on a device says which, as it goes and
			// when the watch gives up.
			_, sid = dispatch(t, "--devices", "w3,w4", "--phase", "canary w3", "--phase", "rest 100%")
			released(t, sid, 1)
			r = watch(t, ctl.ExitTimeout, sid, "--timeout", "1s")
			wantContains(t, "waiting", r.stdout, "; waiting: phase 1 (rest) waits for 1 more device of earlier phases to finish; not finished: w3")
			wantContains(t, "waiting", r.stderr, "gave up watching after 1s: Scheduled 1, Queued 1; waiting: phase 1 (rest) waits for")
		})
		t.Run("6AbortedOrCancelled", func(t *testing.T) {
			id, sid := dispatch(t, "--devices", "w1,w2", "--phase", "canary w1", "--phase", "rest w2 trigger=manual")
			released(t, sid, 1)
			s.report(t, "w1", id, "Completed")
			f.ok(t, "actions", "abort", sid)
			wantContains(t, "abort", watch(t, ctl.ExitAborted, sid).stderr, "the rollout was aborted: Completed 1, Cancelled 1")

			_, sid = dispatch(t, "--devices", "w3,w4")
			f.ok(t, "actions", "cancel", sid)
			wantContains(t, "cancel", watch(t, ctl.ExitAborted, sid, "--max-failed", "100%").stderr, "2 device action(s) cancelled")
		})
	})
}

// TestFleetctlCompletion: the shells' completion asks the server for
// device and action ids (the scripts call fleetctl __complete).
func TestFleetctlCompletion(t *testing.T) {
	s := startServer(t, sqlstoretest.Backends()[0])
	f := s.newFleetctl(t, s.Admin())
	f.ok(t, "devices", "create", "pump-1")
	f.ok(t, "devices", "create", "pump-2")
	f.ok(t, "devices", "create", "valve-1")
	var d struct{ ID int64 }
	f.json(t, &d, "actions", "dispatch", "reboot", "--devices", "valve-1")

	out := f.ok(t, "__complete", "devices", "get", "pu")
	if !strings.HasPrefix(out, "pump-1\npump-2\n:") {
		t.Fatalf("completing device ids: %q", out)
	}
	wantContains(t, "completing action ids", f.ok(t, "__complete", "actions", "watch", ""), fmt.Sprintf("%d\treboot, 1 devices", d.ID))
	wantContains(t, "completing a flag", f.ok(t, "__complete", "devices", "actions", "pump-1", "--sort-by", ""), "updated_at")
	for _, shell := range []string{"bash", "zsh", "fish"} {
		wantContains(t, shell, f.ok(t, "completion", shell), "__complete")
	}
}

func TestFleetctlFirmware(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := startServer(t, b)
		f := s.newFleetctl(t, s.Admin())
		dir := t.TempDir()
		write := func(name, content string) string {
			p := filepath.Join(dir, name)
			if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
			return p
		}
		boot := write("boot.bin", "bootloader 1.2.0")
		app := write("app.bin", strings.Repeat("app 2.3.0 ", 50000))
		archive := filepath.Join(dir, "fw-2.3.0.tar.gz")

		t.Run("BundleCreate", func(t *testing.T) {
			out := f.ok(t, "firmware", "bundle", "create", "--version", "2.3.0", "--out", archive,
				"bootloader=1.2.0:"+boot, "app=2.3.0:"+app, "--depends", "app:bootloader>=1.1.0")
			wantContains(t, "bundle create", out, "wrote "+archive+": bundle 2.3.0 with 2 components", `"checksum":"`)
			// The same inputs make the same archive as fleetd bundle create.
			twin := filepath.Join(dir, "twin.tar.gz")
			if _, err := runCLI(t, "bundle", "create", "--version", "2.3.0", "--out", twin,
				"bootloader=1.2.0:"+boot, "app=2.3.0:"+app, "--depends", "app:bootloader>=1.1.0"); err != nil {
				t.Fatal(err)
			}
			a, _ := os.ReadFile(archive)
			b, _ := os.ReadFile(twin)
			if !bytes.Equal(a, b) {
				t.Fatal("fleetctl and fleetd built different archives of the same inputs")
			}
			wantContains(t, "refused", f.fails(t, ctl.ExitRefused, "firmware", "bundle", "create", "--version", "1.0-rc1", "--out", twin, "app=1.0.0:"+app), "version")
			f.fails(t, ctl.ExitUsage, "firmware", "bundle", "create", "app=1.0.0:"+app)
		})
		data, _ := os.ReadFile(archive)
		var bundle struct {
			ID, Version, Checksum string
			UploadStatus          string `json:"upload_status"`
			Firmwares             []struct {
				ComponentName string `json:"component_name"`
			}
		}
		t.Run("Upload", func(t *testing.T) {
			r := f.run("", "firmware", "upload", archive, "-o", "json")
			if r.code != 0 {
				t.Fatalf("%v", r)
			}
			json.Unmarshal([]byte(r.stdout), &bundle)
			if bundle.UploadStatus != "completed" || bundle.Checksum != sha256Hex(data) || len(bundle.Firmwares) != 2 {
				t.Fatalf("uploaded %+v", bundle)
			}
			wantContains(t, "progress", r.stderr, "uploaded fw-2.3.0.tar.gz: ", " in ", "/s)")
			// A re-run job uploads the same archive again: that bundle.
			var again struct{ ID string }
			f.json(t, &again, "firmware", "upload", archive)
			if again.ID != bundle.ID {
				t.Fatalf("the same archive again: bundle %s, want %s", again.ID, bundle.ID)
			}
			changed := filepath.Join(dir, "changed-2.3.0.tar.gz")
			f.ok(t, "firmware", "bundle", "create", "--version", "2.3.0", "--out", changed, "bootloader=1.2.0:"+boot)
			wantContains(t, "another archive", f.fails(t, ctl.ExitRefused, "firmware", "upload", changed), "409 conflict", "another archive")
			wantContains(t, "another archive", f.fails(t, ctl.ExitRefused, "firmware", "upload", changed, "--verified"), "409 conflict", "completed")
		})
		t.Run("UploadVerified", func(t *testing.T) {
			other := filepath.Join(dir, "fw-2.4.0.tar")
			f.ok(t, "firmware", "bundle", "create", "--version", "2.4.0", "--out", other, "app=2.4.0:"+boot)
			var v struct {
				UploadStatus string `json:"upload_status"`
				Declared     struct{ Checksum string }
			}
			f.json(t, &v, "firmware", "upload", other, "--verified")
			if v.UploadStatus != "completed" || v.Declared.Checksum == "" {
				t.Fatalf("verified upload %+v", v)
			}
			var again struct {
				UploadStatus string `json:"upload_status"`
				Version      string
			}
			f.json(t, &again, "firmware", "upload", other, "--verified")
			if again.UploadStatus != "completed" || again.Version != "2.4.0" {
				t.Fatalf("the same archive again, verified: %+v", again)
			}
			wantContains(t, "not a bundle", f.fails(t, ctl.ExitRefused, "firmware", "upload", boot, "--verified"), "not a bundle")
		})
		t.Run("Read", func(t *testing.T) {
			wantContains(t, "list", f.ok(t, "firmware", "list", "--status", "completed"), "2.3.0", "2.4.0", "completed")
			wantContains(t, "get by version", f.ok(t, "firmware", "get", "2.3.0"), bundle.ID, "COMPONENT", "bootloader", "app", "1.1.0")
			wantContains(t, "get by id", f.ok(t, "firmware", "get", bundle.ID, "-o", "yaml"), "version: 2.3.0", "component_name: bootloader")
			wantContains(t, "components", f.ok(t, "firmware", "components", "app"), "2.4.0", "2.3.0")
			f.fails(t, ctl.ExitRefused, "firmware", "get", "9.9.9")
		})
		t.Run("Download", func(t *testing.T) {
			out := filepath.Join(dir, "dl.tar.gz")
			wantContains(t, "download", f.ok(t, "firmware", "download", "2.3.0", "--out", out), "verified")
			if got, _ := os.ReadFile(out); !bytes.Equal(got, data) {
				t.Fatal("the download is not the archive")
			}
			// A partial file resumes where it ends.
			os.WriteFile(out, data[:len(data)/3], 0o644)
			r := f.run("", "firmware", "download", bundle.ID, "--out", out)
			if r.code != 0 || !strings.Contains(r.stderr, fmt.Sprintf("resumed at %d bytes", len(data)/3)) {
				t.Fatalf("resume: %v", r)
			}
			if got, _ := os.ReadFile(out); !bytes.Equal(got, data) {
				t.Fatal("the resumed download is not the archive")
			}
			// A partial file that is not the archive's start is fetched again whole.
			os.WriteFile(out, bytes.Repeat([]byte("x"), len(data)/2), 0o644)
			r = f.run("", "firmware", "download", "2.3.0", "--out", out)
			if r.code != 0 || !strings.Contains(r.stderr, "downloading it whole") {
				t.Fatalf("corrupt partial: %v", r)
			}
			if got, _ := os.ReadFile(out); !bytes.Equal(got, data) {
				t.Fatal("the download after a corrupt partial is not the archive")
			}
		})
		t.Run("Deactivate", func(t *testing.T) {
			f.ok(t, "devices", "create", "fw-dev")
			f.ok(t, "firmware", "deactivate", "bootloader", "1.2.0")
			wantContains(t, "components", f.ok(t, "firmware", "components", "bootloader", "-o", "json"), `"is_deactivated": true`)
			wantContains(t, "dispatch", f.fails(t, ctl.ExitRefused, "actions", "dispatch", "update_firmware", "--param", "version=2.3.0", "--devices", "fw-dev"), "deactivated")
			f.ok(t, "firmware", "activate", "bootloader", "1.2.0")
			f.ok(t, "actions", "dispatch", "update_firmware", "--param", "version=2.3.0", "--devices", "fw-dev")
		})
		t.Run("Delete", func(t *testing.T) {
			wantContains(t, "delete", f.ok(t, "firmware", "delete", "2.4.0"), "deleted bundle 2.4.0")
			f.fails(t, ctl.ExitRefused, "firmware", "get", "2.4.0")
		})
	})
}

func TestFleetctlAlerts(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := startServer(t, b, alertFlags...)
		f := s.newFleetctl(t, s.Admin())
		dir := t.TempDir()
		hook := newReceiver(t, 0)
		f.ok(t, "devices", "create", "pump-1", "--metadata", "site=berlin")
		var rule struct{ ID, Name string }

		t.Run("Rules", func(t *testing.T) {
			file := filepath.Join(dir, "rule.yaml")
			os.WriteFile(file, []byte("name: overheating\nstream: telemetry\ncondition:\n  field: temperature\n  operator: '>'\n  value: 80\nmetadata_filters:\n  site: berlin\n"), 0o644)
			f.json(t, &rule, "alert-rules", "create", "-f", file)
			if rule.ID == "" || rule.Name != "overheating" {
				t.Fatalf("created rule %+v", rule)
			}
			out := f.ok(t, "alert-rules", "create", "--name", "silent", "--stream", "telemetry", "--condition", `{"no_data_seconds": 300}`, "--activation", "1m")
			wantContains(t, "created by flags", out, "silent", "no_data_seconds=300", "60")
			wantContains(t, "duplicate", f.fails(t, ctl.ExitRefused, "alert-rules", "create", "-f", file), "409 conflict")
			wantContains(t, "bad condition", f.fails(t, ctl.ExitRefused, "alert-rules", "create", "--name", "bad", "--stream", "x",
				"--condition", `{"all": [{"field": "t", "operator": "~", "value": 1}]}`), "400 invalid", "condition.all[0].operator")
			wantContains(t, "list", f.ok(t, "alert-rules", "list"), "overheating", "silent", "site=berlin")
			wantContains(t, "get", f.ok(t, "alert-rules", "get", rule.ID, "-o", "yaml"), "name: overheating", "operator: '>'")
		})
		t.Run("EditRule", func(t *testing.T) {
			var silent struct{ ID string }
			f.json(t, &silent, "alert-rules", "create", "--name", "silent-2", "--stream", "telemetry", "--condition", `{"no_data_seconds": 300}`)
			// What is not given stays: here the stream, the condition and
			// the absence of filters.
			wantContains(t, "renamed", f.ok(t, "alert-rules", "edit", silent.ID, "--name", "silent-edited", "--group", "pumps"),
				"silent-edited", "pumps", "no_data_seconds=300")
			changes := filepath.Join(dir, "changes.yaml")
			os.WriteFile(changes, []byte("condition:\n  field: temperature\n  operator: '>'\n  value: 90\ngroup: hot\n"), 0o644)
			f.ok(t, "alert-rules", "edit", rule.ID, "-f", changes, "--group", "hotter", "--deactivation", "2m")
			got := f.ok(t, "alert-rules", "get", rule.ID, "-o", "yaml")
			wantContains(t, "edited", got, "name: overheating", "stream: telemetry", "value: 90", "group: hotter", "deactivation_threshold_seconds: 120", "site: berlin")
			wantContains(t, "taken name", f.fails(t, ctl.ExitRefused, "alert-rules", "edit", rule.ID, "--name", "silent-edited"), "409 conflict")
			os.WriteFile(changes, []byte("stream: power\n"), 0o644)
			wantContains(t, "another stream", f.fails(t, ctl.ExitRefused, "alert-rules", "edit", rule.ID, "-f", changes), "400 invalid", "stream")
			wantContains(t, "bad condition", f.fails(t, ctl.ExitRefused, "alert-rules", "edit", rule.ID, "--condition", `{"field": "t", "operator": "~", "value": 1}`),
				"400 invalid", "condition.operator")
			wantContains(t, "unknown rule", f.fails(t, ctl.ExitRefused, "alert-rules", "edit", "00000000-0000-4000-8000-000000000000", "--name", "x"), "404 not_found")
			f.fails(t, ctl.ExitUsage, "alert-rules", "edit", rule.ID)
			f.fails(t, ctl.ExitUsage, "alert-rules", "edit", rule.ID, "--stream", "power")
			wantContains(t, "unchanged by refusals", f.ok(t, "alert-rules", "get", rule.ID, "-o", "yaml"), "name: overheating", "value: 90", "group: hotter")
		})
		var nid string
		t.Run("NotificationRules", func(t *testing.T) {
			var n struct{ ID string }
			f.json(t, &n, "alert-rules", "notifications", "create", rule.ID, "--webhook", hook.URL, "--secret", "s3cret", "--subject", "{{.Rule.Name}} {{.Event}}")
			nid = n.ID
			out := f.ok(t, "alert-rules", "notifications", "list", rule.ID)
			wantContains(t, "list", out, nid, "webhook", hook.URL)
			if strings.Contains(out, "s3cret") {
				t.Fatalf("a secret is shown:\n%s", out)
			}
			f.ok(t, "alert-rules", "notifications", "edit", rule.ID, nid, "--interval", "1m", "--timezone", "Europe/Berlin")
			wantContains(t, "edited", f.ok(t, "alert-rules", "notifications", "list", rule.ID), "60", "Europe/Berlin")
			wantContains(t, "bad zone", f.fails(t, ctl.ExitRefused, "alert-rules", "notifications", "edit", rule.ID, nid, "--timezone", "Mars/Olympus"), "400 invalid")
			f.fails(t, ctl.ExitUsage, "alert-rules", "notifications", "edit", rule.ID, nid)
			var other struct{ ID string }
			f.json(t, &other, "alert-rules", "notifications", "create", rule.ID, "--slack", hook.URL+"/slack")
			wantContains(t, "delete", f.ok(t, "alert-rules", "notifications", "delete", rule.ID, other.ID), "deleted")
		})
		t.Run("AlertsAndStreams", func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			watching, done := f.start(ctx, "alerts", "list", "--watch", "--interval", "10ms", "--state", "active")
			eventually(t, "the watch's first list", func() bool { return strings.Contains(watching.String(), "RULE") })
			points := filepath.Join(dir, "points.json")
			os.WriteFile(points, []byte(fmt.Sprintf(`[{"timestamp": %d, "sequence": 1, "temperature": 91.5}]`, time.Now().UnixMilli())), 0o644)
			wantContains(t, "ingest", f.ok(t, "streams", "ingest", "pump-1", "telemetry", "-f", points), "ACCEPTED", "1")
			eventually(t, "the watch to show the alert", func() bool { return strings.Contains(watching.String(), "overheating") })
			cancel()
			if r := <-done; r.code != 0 || !strings.Contains(r.stdout, "--- ") {
				t.Fatalf("interrupted watch: %v", r)
			}
			wantContains(t, "latest", f.ok(t, "streams", "latest", "pump-1", "telemetry"), "temperature=91.5")
			var alerts struct {
				Alerts []struct{ ID string }
			}
			f.json(t, &alerts, "alerts", "list", "--rule", rule.ID, "--device", "pump-1")
			if len(alerts.Alerts) != 1 {
				t.Fatalf("alerts %+v", alerts)
			}
			wantContains(t, "get", f.ok(t, "alerts", "get", alerts.Alerts[0].ID), "overheating", "pump-1", "active")
			eventually(t, "the webhook to be called", func() bool { return len(hook.got()) > 0 })
			eventually(t, "the notification to show delivered", func() bool {
				return strings.Contains(f.ok(t, "alerts", "notifications", alerts.Alerts[0].ID), "delivered")
			})
		})
		t.Run("RolloutRules", func(t *testing.T) {
			var r struct {
				ID     string
				Events []string
			}
			f.json(t, &r, "rollout-rules", "create", "--slack", hook.URL+"/rollouts", "--events", "paused,aborted")
			if len(r.Events) != 2 {
				t.Fatalf("rollout rule %+v", r)
			}
			f.ok(t, "rollout-rules", "edit", r.ID, "--events", "completed")
			wantContains(t, "get", f.ok(t, "rollout-rules", "get", r.ID), "slack", "completed")
			wantContains(t, "list", f.ok(t, "rollout-rules", "list"), r.ID)
			f.fails(t, ctl.ExitUsage, "rollout-rules", "create", "--slack", "https://a.example", "--webhook", "https://b.example")
			f.ok(t, "rollout-rules", "delete", r.ID)
			f.fails(t, ctl.ExitRefused, "rollout-rules", "get", r.ID)
		})
		t.Run("DeleteRule", func(t *testing.T) {
			f.ok(t, "alert-rules", "delete", rule.ID)
			wantContains(t, "gone", f.fails(t, ctl.ExitRefused, "alert-rules", "get", rule.ID), "404 not_found")
		})
	})
}

func TestFleetctlAdmin(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := startServer(t, b)
		f := s.newFleetctl(t, s.Admin())

		t.Run("APIKeys", func(t *testing.T) {
			var k struct{ Name, Role, Key string }
			f.json(t, &k, "apikeys", "create", "ci", "--role", "operator", "--email", "ci@example.com")
			if k.Role != "operator" || !strings.HasPrefix(k.Key, "fk_") {
				t.Fatalf("key %+v", k)
			}
			out := f.ok(t, "apikeys", "list")
			wantContains(t, "list", out, "ci", "operator", "ci@example.com")
			if strings.Contains(out, k.Key) {
				t.Fatal("the list shows a key")
			}
			ci := s.newFleetctl(t, creds{Tenant: "default", Key: k.Key})
			ci.ok(t, "devices", "create", "by-ci")
			wantContains(t, "operator lists keys", ci.fails(t, ctl.ExitRefused, "apikeys", "list"), "403 forbidden")
			f.ok(t, "apikeys", "delete", "ci")
			wantContains(t, "deleted key", ci.fails(t, ctl.ExitRefused, "devices", "list"), "401 unauthenticated")
			f.fails(t, ctl.ExitUsage, "apikeys", "create", "nobody")
		})
		t.Run("TenantAuth", func(t *testing.T) {
			f.ok(t, "tenant", "auth", "set", "--method", "webhook", "--webhook-url", "https://auth.example.com/check", "--default-role", "operator")
			wantContains(t, "get", f.ok(t, "tenant", "auth", "get"), "webhook", "https://auth.example.com/check", "operator")
			file := filepath.Join(t.TempDir(), "auth.json")
			os.WriteFile(file, []byte(`{"method": "jwks", "jwks_url": "https://idp.example.com/jwks.json", "issuer": "https://idp.example.com/", "audience": "fleet"}`), 0o644)
			f.ok(t, "tenant", "auth", "set", "-f", file)
			var got struct{ Method, Audience string }
			f.json(t, &got, "tenant", "auth", "get")
			if got.Method != "jwks" || got.Audience != "fleet" {
				t.Fatalf("auth %+v", got)
			}
			wantContains(t, "bad method", f.fails(t, ctl.ExitRefused, "tenant", "auth", "set", "--method", "ldap"), "400 invalid", "method")
		})
		t.Run("TenantDDI", func(t *testing.T) {
			type settings struct {
				RequireConfirmation bool `json:"require_confirmation"`
				GatewayRegistration bool `json:"gateway_registration"`
			}
			var got settings
			f.json(t, &got, "tenant", "ddi", "get")
			if got != (settings{}) {
				t.Fatalf("a new tenant's DDI settings: %+v", got)
			}
			f.json(t, &got, "tenant", "ddi", "set", "--gateway-registration")
			if got != (settings{GatewayRegistration: true}) {
				t.Fatalf("after --gateway-registration: %+v", got)
			}
			// A setting not given stays as it is.
			f.json(t, &got, "tenant", "ddi", "set", "--require-confirmation=true")
			if got != (settings{true, true}) {
				t.Fatalf("after --require-confirmation: %+v", got)
			}
			f.ok(t, "tenant", "ddi", "set", "--gateway-registration=false")
			wantContains(t, "get", f.ok(t, "tenant", "ddi", "get"), "REQUIRE CONFIRMATION", "true", "false")
			f.fails(t, ctl.ExitUsage, "tenant", "ddi", "set")
			viewer := s.newFleetctl(t, s.NewKey(t, s.Admin(), "ddi-viewer", "viewer"))
			wantContains(t, "viewer", viewer.fails(t, ctl.ExitRefused, "tenant", "ddi", "set", "--require-confirmation=false"), "403 forbidden")
		})
		t.Run("AuditLogs", func(t *testing.T) {
			var all, none struct {
				AuditLogs []struct{ Actor, Action string } `json:"audit_logs"`
				Count     int
			}
			f.json(t, &all, "audit-logs", "list", "--since", "1h")
			f.json(t, &none, "audit-logs", "list", "--until", "1h")
			if all.Count < 5 || none.Count != 0 {
				t.Fatalf("since 1h ago: %d; until 1h ago: %d", all.Count, none.Count)
			}
			var byActor struct{ Count int }
			f.json(t, &byActor, "audit-logs", "list", "--actor", all.AuditLogs[0].Actor)
			if byActor.Count == 0 || byActor.Count > all.Count {
				t.Fatalf("by actor %s: %d of %d", all.AuditLogs[0].Actor, byActor.Count, all.Count)
			}
			wantContains(t, "table", f.ok(t, "audit-logs", "list", "--limit", "3"), "ACTOR", all.AuditLogs[0].Action)
			f.fails(t, ctl.ExitUsage, "audit-logs", "list", "--since", "yesterday")
		})
	})
}

// TestFleetctlRateLimited: a 429 says when to try again.
func TestFleetctlRateLimited(t *testing.T) {
	s := startServer(t, sqlstoretest.Backends()[0], "--rate-limit", "0.001", "--rate-burst", "1")
	f := s.newFleetctl(t, s.Admin())
	f.ok(t, "devices", "list")
	stderr := f.fails(t, ctl.ExitRefused, "devices", "list")
	wantContains(t, "stderr", stderr, "(retry after ", "429 rate_limited")
}

// TestFleetctlPresignedDownload: with presign, fleetd redirects downloads
// to the bucket (VersityGW here); fleetctl follows, without its key, and
// resumes there too.
func TestFleetctlPresignedDownload(t *testing.T) {
	s := startServerOn(t, sqlstoretest.Backends()[0], "s3+presign")
	f := s.newFleetctl(t, s.Admin())
	data := makeBundle(t, "5.0.0", bootloader, app230)
	dir := t.TempDir()
	archive := filepath.Join(dir, "fw-5.0.0.tar.gz")
	os.WriteFile(archive, data, 0o644)
	f.ok(t, "firmware", "upload", archive)
	out := filepath.Join(dir, "dl.tar.gz")
	wantContains(t, "download", f.ok(t, "firmware", "download", "5.0.0", "--out", out), "verified")
	os.WriteFile(out, data[:len(data)/2], 0o644)
	r := f.run("", "firmware", "download", "5.0.0", "--out", out)
	if r.code != 0 || !strings.Contains(r.stdout, "verified") {
		t.Fatalf("resume from the bucket: %v", r)
	}
	if got, _ := os.ReadFile(out); !bytes.Equal(got, data) {
		t.Fatal("the download from the bucket is not the archive")
	}
}
