package ctl_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet/ctl"
	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// The fleetctl tests run the client's Run against a real fleetd started
// through run: every command group, its output forms and its exit codes.

func TestFleetctlContexts(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b)
		acme := s.NewTenant(t, "acme")
		s.MustDevice(t, s.Admin(), "default-dev", nil)
		s.MustDevice(t, acme, "acme-dev", nil)
		f := s.NewFleetctl(t, fleetdtest.Creds{})
		cfg := filepath.Join(f.Env["XDG_CONFIG_HOME"], "fleetctl", "config")

		t.Run("NoServer", func(t *testing.T) {
			fleetdtest.WantContains(t, "stderr", f.Fails(t, ctl.ExitUsage, "devices", "list"), "fleetctl login")
		})
		t.Run("LoginRefusesABadKey", func(t *testing.T) {
			stderr := f.Fails(t, ctl.ExitRefused, "login", "--url", s.URL, "--tenant", "default", "--api-key", "fk_wrong")
			fleetdtest.WantContains(t, "stderr", stderr, "401 unauthenticated")
			if _, err := os.Stat(cfg); !os.IsNotExist(err) {
				t.Fatalf("a refused login wrote the config: %v", err)
			}
		})
		t.Run("Login", func(t *testing.T) {
			f.OK(t, "login", "--url", s.URL, "--tenant", "default", "--api-key", s.Key, "--name", "home")
			r := f.Run(acme.Key+"\n", "login", "--url", s.URL, "--tenant", "acme", "--api-key", "-")
			if r.Code != 0 {
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
			fleetdtest.WantContains(t, "config", string(b), "current-context: acme@", acme.Key, s.Key)
			// The last login is current.
			fleetdtest.WantContains(t, "devices of acme", f.OK(t, "devices", "list"), "acme-dev")
			if out := f.OK(t, "devices", "list"); strings.Contains(out, "default-dev") {
				t.Fatalf("acme's context lists default's devices:\n%s", out)
			}
			fleetdtest.WantContains(t, "devices of --context home", f.OK(t, "devices", "list", "--context", "home"), "default-dev")
			fleetdtest.WantContains(t, "contexts", f.OK(t, "config", "get-contexts"), "home", "*  ")
		})
		t.Run("LoginKeyNotInArguments", func(t *testing.T) {
			// The key from FLEETCTL_API_KEY, then from a prompt on the
			// terminal; with neither, a usage error that says how.
			g := s.NewFleetctl(t, fleetdtest.Creds{})
			g.Env["FLEETCTL_API_KEY"] = acme.Key
			g.OK(t, "login", "--url", s.URL, "--tenant", "acme")
			delete(g.Env, "FLEETCTL_API_KEY")
			fleetdtest.WantContains(t, "devices of acme", g.OK(t, "devices", "list"), "acme-dev")
			fleetdtest.WantContains(t, "stderr", g.Fails(t, ctl.ExitUsage, "login", "--url", s.URL, "--tenant", "default"), "FLEETCTL_API_KEY", "--api-key -")
			g.Typed = s.Key
			g.OK(t, "login", "--url", s.URL, "--tenant", "default")
			if len(g.Prompts) != 1 || !strings.Contains(g.Prompts[0], "default") {
				t.Fatalf("prompts %q, want one for tenant default", g.Prompts)
			}
			fleetdtest.WantContains(t, "devices of default", g.OK(t, "devices", "list"), "default-dev")
		})
		t.Run("Override", func(t *testing.T) {
			// The variables beat the context; a flag beats both.
			f.Env["FLEETCTL_TENANT"], f.Env["FLEETCTL_API_KEY"] = "default", s.Key
			defer delete(f.Env, "FLEETCTL_TENANT")
			defer delete(f.Env, "FLEETCTL_API_KEY")
			fleetdtest.WantContains(t, "devices with FLEETCTL_*", f.OK(t, "devices", "list"), "default-dev")
			fleetdtest.WantContains(t, "devices with flags", f.OK(t, "devices", "list", "--tenant", "acme", "--api-key", acme.Key), "acme-dev")
		})
		t.Run("UseAndDeleteContext", func(t *testing.T) {
			f.OK(t, "config", "use-context", "home")
			fleetdtest.WantContains(t, "devices", f.OK(t, "devices", "list"), "default-dev")
			f.OK(t, "config", "delete-context", "home")
			b, _ := os.ReadFile(cfg)
			if strings.Contains(string(b), s.Key) {
				t.Fatalf("the deleted context's key is still in the config:\n%s", b)
			}
			f.Fails(t, ctl.ExitUsage, "devices", "list") // no current context now
			f.Fails(t, ctl.ExitUsage, "config", "use-context", "nosuch")
			f.Fails(t, ctl.ExitUsage, "devices", "list", "--context", "nosuch")
		})
		t.Run("Usage", func(t *testing.T) {
			a := s.NewFleetctl(t, s.Admin())
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
				a.Fails(t, ctl.ExitUsage, args...)
			}
			fleetdtest.WantContains(t, "help", a.OK(t, "--help"), "Exit codes", "devices", "actions")
		})
	})
}

func TestFleetctlDevices(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		// MQTT over TLS, so that devices can be issued certificates.
		certFile, keyFile := fleetdtest.WriteServerCert(t, t.TempDir(), "fleetd test")
		s := fleetdtest.Start(t, b, "--tls-cert", certFile, "--tls-key", keyFile, "--http-tls=false", "--mqtts-addr", "127.0.0.1:0")
		f := s.NewFleetctl(t, s.Admin())
		dir := t.TempDir()

		t.Run("Create", func(t *testing.T) {
			out := f.OK(t, "devices", "create", "pump-1", "--metadata", "site=berlin", "--metadata", "model=x1")
			fleetdtest.WantContains(t, "created", out, "TOKEN", "pump-1", "fdt_", "model=x1,site=berlin")
			var gen struct{ ID, Token string }
			f.JSON(t, &gen, "devices", "create")
			if gen.ID == "" || !strings.HasPrefix(gen.Token, "fdt_") {
				t.Fatalf("generated device %+v", gen)
			}
			f.OK(t, "devices", "delete", gen.ID)
		})
		t.Run("Bulk", func(t *testing.T) {
			csvFile := filepath.Join(dir, "devices.csv")
			os.WriteFile(csvFile, []byte("\ufeffid,site,model\npump-2,paris,x1\nvalve-1,,v2\n"), 0o644) // as a spreadsheet saves it
			var got struct {
				Devices []struct{ ID, Token string }
			}
			f.JSON(t, &got, "devices", "create", "--file", csvFile)
			if len(got.Devices) != 2 || got.Devices[1].ID != "valve-1" || got.Devices[1].Token == "" {
				t.Fatalf("bulk from CSV: %+v", got)
			}
			r := f.Run(`[{"id": "valve-2", "metadata": {"site": "paris"}}]`, "devices", "create", "-f", "-")
			if r.Code != 0 || !strings.Contains(r.Stdout, "valve-2") {
				t.Fatalf("bulk from JSON: %v", r)
			}
			// All or none: one bad id refuses the whole file.
			os.WriteFile(csvFile, []byte("id\nok-1\nnot ok\n"), 0o644)
			fleetdtest.WantContains(t, "stderr", f.Fails(t, ctl.ExitRefused, "devices", "create", "-f", csvFile), "400 invalid", "devices[1].id")
			f.Fails(t, ctl.ExitRefused, "devices", "get", "ok-1")
		})
		t.Run("List", func(t *testing.T) {
			var list struct {
				Devices []struct{ ID string }
				Count   int
			}
			f.JSON(t, &list, "devices", "list", "--search", "PUMP")
			if list.Count != 2 {
				t.Fatalf("search pump: %+v", list)
			}
			f.JSON(t, &list, "devices", "list", "--metadata", "site=paris", "--metadata", "model=x1")
			if list.Count != 1 || list.Devices[0].ID != "pump-2" {
				t.Fatalf("metadata site=paris model=x1: %+v", list)
			}
			r := f.Run("", "devices", "list", "--limit", "1")
			if r.Code != 0 || strings.Count(r.Stdout, "\n") != 2 || !strings.Contains(r.Stderr, "1 of 4 shown") {
				t.Fatalf("a page of one: %v", r)
			}
		})
		t.Run("Formats", func(t *testing.T) {
			fleetdtest.WantContains(t, "yaml", f.OK(t, "devices", "get", "pump-1", "-o", "yaml"), "id: pump-1\n", "metadata:\n  model: x1\n", "last_seen_at: null")
			fleetdtest.WantContains(t, "edn", f.OK(t, "devices", "get", "pump-1", "-o", "edn"), `:id "pump-1"`, `:metadata {`)
			fleetdtest.WantContains(t, "table", f.OK(t, "devices", "get", "pump-1"), "ID", "LAST SEEN", "pump-1")
		})
		t.Run("Patch", func(t *testing.T) {
			f.OK(t, "devices", "patch", "pump-1", "--set", "model=x2", "--set", "rack=7", "--unset", "site")
			var d struct{ Metadata map[string]string }
			f.JSON(t, &d, "devices", "get", "pump-1")
			if len(d.Metadata) != 2 || d.Metadata["model"] != "x2" || d.Metadata["rack"] != "7" {
				t.Fatalf("patched metadata %v", d.Metadata)
			}
			// A string that YAML would read as a number stays a string.
			fleetdtest.WantContains(t, "yaml", f.OK(t, "devices", "get", "pump-1", "-o", "yaml"), `rack: "7"`)
			f.Fails(t, ctl.ExitUsage, "devices", "patch", "pump-1")
		})
		t.Run("Credentials", func(t *testing.T) {
			var tok struct{ Token string }
			f.JSON(t, &tok, "devices", "rotate-token", "pump-1")
			if !strings.HasPrefix(tok.Token, "fdt_") {
				t.Fatalf("rotated token %+v", tok)
			}
			fleetdtest.WantContains(t, "certificate", f.OK(t, "devices", "certificate", "pump-1"), "device_certificate: |", "BEGIN CERTIFICATE", "PRIVATE KEY")
			var up struct {
				ProjectID string `json:"project_id"`
				DeviceID  string `json:"device_id"`
			}
			f.JSON(t, &up, "devices", "uplink-config", "pump-1")
			if up.ProjectID != "default" || up.DeviceID != "pump-1" {
				t.Fatalf("uplink config %+v", up)
			}
		})
		t.Run("Delete", func(t *testing.T) {
			fleetdtest.WantContains(t, "delete", f.OK(t, "devices", "delete", "valve-1", "valve-2"), "deleted device valve-2")
			fleetdtest.WantContains(t, "stderr", f.Fails(t, ctl.ExitRefused, "devices", "get", "valve-1"), "404 not_found")
		})
		t.Run("Roles", func(t *testing.T) {
			viewer := s.NewFleetctl(t, s.NewKey(t, s.Admin(), "ro", "viewer"))
			viewer.OK(t, "devices", "list")
			fleetdtest.WantContains(t, "stderr", viewer.Fails(t, ctl.ExitRefused, "devices", "create", "x"), "403 forbidden")
		})
	})
}

// TestFleetctlTLS talks to fleetd over https, trusting its certificate
// through --ca-file and the context.
func TestFleetctlTLS(t *testing.T) {
	t.Parallel()
	certFile, keyFile := fleetdtest.WriteServerCert(t, t.TempDir(), "fleetd test")
	s := fleetdtest.Start(t, sqlstoretest.Backends()[0], "--tls-cert", certFile, "--tls-key", keyFile)
	url := strings.Replace(s.URL, "http://", "https://", 1)
	f := s.NewFleetctl(t, fleetdtest.Creds{})
	stderr := f.Fails(t, ctl.ExitRefused, "login", "--url", url, "--tenant", "default", "--api-key", s.Key)
	fleetdtest.WantContains(t, "stderr without the CA", stderr, "cannot reach", "certificate")
	f.OK(t, "login", "--url", url, "--tenant", "default", "--api-key", s.Key, "--ca-file", certFile)
	f.OK(t, "devices", "create", "tls-1")
	fleetdtest.WantContains(t, "devices over https", f.OK(t, "devices", "list"), "tls-1")
}

func TestFleetctlActions(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b)
		f := s.NewFleetctl(t, s.Admin())
		for _, id := range []string{"d1", "d2", "d3", "d4"} {
			f.OK(t, "devices", "create", id, "--metadata", "ring="+map[bool]string{true: "canary", false: "main"}[id == "d1"])
		}
		var dispatched struct {
			ID       int64
			Targeted int
		}

		t.Run("DispatchAndRead", func(t *testing.T) {
			f.JSON(t, &dispatched, "actions", "dispatch", "reboot", "--devices", "d1,d2", "--params", `{"delay": 5}`, "--param", "reason=test", "--timeout", "10m")
			if dispatched.ID == 0 || dispatched.Targeted != 2 {
				t.Fatalf("dispatched %+v", dispatched)
			}
			id := fmt.Sprint(dispatched.ID)
			var a struct {
				Params   map[string]any
				Timeout  int
				Statuses map[string]int
			}
			f.JSON(t, &a, "actions", "get", id)
			if a.Params["delay"] != 5.0 || a.Params["reason"] != "test" || a.Timeout != 600 || a.Statuses["Queued"] != 2 {
				t.Fatalf("action %+v", a)
			}
			fleetdtest.WantContains(t, "list", f.OK(t, "actions", "list", "--action", "reboot"), "reboot", "Queued=2")
			s.Report(t, "d1", dispatched.ID, "Rebooting")
			fleetdtest.WantContains(t, "devices of the action", f.OK(t, "actions", "devices", id, "--status", "Progress"), "d1", "Rebooting")
			fleetdtest.WantContains(t, "S7", f.OK(t, "devices", "actions", "d1", "--sort-by", "updated_at", "--order", "asc", "--type", "reboot"), "Progress", "Rebooting")

			var bySearch, byMeta, all struct{ Targeted int }
			f.JSON(t, &bySearch, "actions", "dispatch", "ping", "--search", "d", "--search-key", "")
			f.JSON(t, &byMeta, "actions", "dispatch", "ping", "--metadata-match", "ring=canary")
			f.JSON(t, &all, "actions", "dispatch", "ping", "--all")
			if bySearch.Targeted != 4 || byMeta.Targeted != 1 || all.Targeted != 4 {
				t.Fatalf("targeted: search %d, metadata %d, all %d", bySearch.Targeted, byMeta.Targeted, all.Targeted)
			}
			body := filepath.Join(t.TempDir(), "dispatch.yaml")
			os.WriteFile(body, []byte("action: configure\nparams: {level: 3}\nsearch_type: default\ndevice_ids: [d3]\n"), 0o644)
			var fromFile struct{ Targeted int }
			f.JSON(t, &fromFile, "actions", "dispatch", "-f", body)
			if fromFile.Targeted != 1 {
				t.Fatalf("dispatch from a file: %+v", fromFile)
			}
			fleetdtest.WantContains(t, "stderr", f.Fails(t, ctl.ExitRefused, "actions", "dispatch", "reboot", "--devices", "d1,nosuch"), "400 invalid", "nosuch")
			fleetdtest.WantContains(t, "stderr", f.Fails(t, ctl.ExitRefused, "actions", "get", "999999"), "404 not_found")
		})
		t.Run("WatchCompletes", func(t *testing.T) {
			id := fmt.Sprint(dispatched.ID)
			out, done := f.Start(context.Background(), "actions", "watch", id, "--interval", "10ms")
			fleetdtest.Eventually(t, "watch to show the action", func() bool { return strings.Contains(out.String(), "0/2 final") })
			s.Report(t, "d1", dispatched.ID, "Completed")
			fleetdtest.Eventually(t, "watch to see d1 complete", func() bool { return strings.Contains(out.String(), "1/2 final") })
			s.Report(t, "d2", dispatched.ID, "Completed")
			r := <-done
			if r.Code != 0 {
				t.Fatalf("%v", r)
			}
			fleetdtest.WantContains(t, "watch", r.Stdout, "2/2 final: Completed 2")
		})
		t.Run("WatchFails", func(t *testing.T) {
			var d struct{ ID int64 }
			f.JSON(t, &d, "actions", "dispatch", "reboot", "--devices", "d1,d2")
			id := fmt.Sprint(d.ID)
			// On a terminal the bars redraw in place.
			term := &fleetdtest.Fleetctl{Env: f.Env, TTY: true}
			out, done := term.Start(context.Background(), "actions", "watch", id, "--interval", "10ms")
			fleetdtest.Eventually(t, "watch to show the action", func() bool { return strings.Contains(out.String(), "0/2 final") })
			// A gateway's key of role device reports through fleetctl.
			gw := s.NewFleetctl(t, s.NewKey(t, s.Admin(), "gateway", "device"))
			gw.OK(t, "actions", "report", id, "--device", "d1", "--state", "Failed", "--progress", "30", "--error", "disk full")
			fleetdtest.WantContains(t, "report usage", gw.Fails(t, ctl.ExitUsage, "actions", "report", id, "--state", "Failed"), "--device")
			fleetdtest.WantContains(t, "devices", f.OK(t, "actions", "devices", id, "--status", "Failed"), "d1", "Failed=disk full")
			fleetdtest.WantContains(t, "cancel", f.OK(t, "actions", "cancel", id), "Cancelled=1", "Failed=1")
			r := <-done
			if r.Code != ctl.ExitAborted {
				t.Fatalf("want exit 6; %v", r)
			}
			fleetdtest.WantContains(t, "stderr", r.Stderr, "1 device action(s) cancelled: Failed 1, Cancelled 1")
			fleetdtest.WantContains(t, "terminal", r.Stdout, "  Queued     ████████████████████████ 2/2\n", "\x1b[2A\x1b[J", "  Failed     ████████████░░░░░░░░░░░░ 1/2\n")
			fleetdtest.WantContains(t, "timeout", f.Fails(t, ctl.ExitTimeout, "actions", "watch", fmt.Sprint(dispatched.ID+1), "--timeout", "1ns"), "gave up")
			// retry: the Failed device by default, or the statuses named.
			var retried struct {
				ID       int64
				Targeted int
			}
			f.JSON(t, &retried, "actions", "retry", id)
			var ra struct {
				RetryOf int64 `json:"retry_of"`
			}
			if f.JSON(t, &ra, "actions", "get", fmt.Sprint(retried.ID)); retried.Targeted != 1 || ra.RetryOf != d.ID {
				t.Fatalf("retry: %+v, %+v", retried, ra)
			}
			// d1's Failed device action was retried: only d2's Cancelled one is left.
			f.JSON(t, &retried, "actions", "retry", id, "--status", "Failed", "--status", "Cancelled")
			if retried.Targeted != 1 {
				t.Fatalf("retry both: %+v", retried)
			}
			fleetdtest.WantContains(t, "retry again", f.Fails(t, ctl.ExitRefused, "actions", "retry", id), "409 conflict", "retried already")
			fleetdtest.WantContains(t, "retry nothing", f.Fails(t, ctl.ExitRefused, "actions", "retry", id, "--status", "Completed"), "409 conflict", "is Completed")
		})
		t.Run("Rollout", func(t *testing.T) {
			var d struct{ ID int64 }
			f.JSON(t, &d, "actions", "dispatch", "update", "--devices", "d1,d2,d3", "--release-notes", "a test",
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
			f.JSON(t, &r, "actions", "get", id)
			if r.Status != "running" || r.Statuses["Scheduled"] != 2 || r.Schedule.ReleaseNotes != "a test" || len(r.Schedule.Phases) != 2 {
				t.Fatalf("rollout %+v", r)
			}
			f.OK(t, "actions", "pause", id)
			res := f.Run("", "actions", "watch", id, "--interval", "10ms")
			if res.Code != ctl.ExitPaused || !strings.Contains(res.Stderr, "is paused") {
				t.Fatalf("watching a paused rollout: %v", res)
			}
			fleetdtest.WantContains(t, "resume", f.OK(t, "actions", "resume", id), "running")
			fleetdtest.WantContains(t, "stderr", f.Fails(t, ctl.ExitRefused, "actions", "resume", id), "409 conflict")
			f.OK(t, "actions", "append-phase", id, "--phase", "late d4 trigger=manual")
			// watch says what the running rollout waits for.
			ctx, stop := context.WithCancel(context.Background())
			out, done := f.Start(ctx, "actions", "watch", id, "--interval", "10ms")
			fleetdtest.Eventually(t, "watch to say what the rollout waits for", func() bool {
				return strings.Contains(out.String(), "; rollout running; waiting: phase 1 (rest) waits for an operator to trigger it")
			})
			stop()
			<-done
			s.Report(t, "d1", d.ID, "Completed")
			f.OK(t, "actions", "trigger-next-phase", id)
			f.JSON(t, &r, "actions", "get", id)
			if r.Statuses["Queued"] != 2 || r.Statuses["Scheduled"] != 1 || len(r.Schedule.Phases) != 3 || r.StatusesPhased["1"]["Queued"] != 2 {
				t.Fatalf("after the next phase: %+v", r)
			}
			fleetdtest.WantContains(t, "abort", f.OK(t, "actions", "abort", id), "aborted")
			f.JSON(t, &r, "actions", "get", id)
			if r.Status != "aborted" || r.Statuses["Cancelled"] != 3 || r.Statuses["Completed"] != 1 {
				t.Fatalf("aborted: %+v", r)
			}
			sched := filepath.Join(t.TempDir(), "schedule.yaml")
			os.WriteFile(sched, []byte("release_notes: from a file\nmaintenance_window: {start: '02:00', end: '05:00', timezone: Europe/Berlin}\nphases:\n  - name: only\n    trigger_on: {type: manual}\n    info: {type: fixed_list, device_ids: [d4]}\n"), 0o644)
			f.JSON(t, &d, "actions", "dispatch", "update", "--devices", "d4", "--schedule", sched)
			f.JSON(t, &r, "actions", "get", fmt.Sprint(d.ID))
			if r.Status != "scheduled" || r.Schedule.ReleaseNotes != "from a file" || r.Statuses["Scheduled"] != 1 {
				t.Fatalf("rollout from a schedule file: %+v", r)
			}
			fleetdtest.WantContains(t, "phase usage", f.Fails(t, ctl.ExitUsage, "actions", "dispatch", "x", "--all", "--phase", "lonely"), "NAME SELECTION")
			// --phase takes finished-ratio= and a metadata selection.
			var phased struct {
				Schedule struct {
					Phases []struct {
						TriggerOn map[string]any `json:"trigger_on"`
						Info      map[string]any `json:"info"`
					}
				}
			}
			f.JSON(t, &d, "actions", "dispatch", "update", "--devices", "d1,d2", "--phase", "canary ring=canary trigger=manual", "--phase", "rest 100% finished-ratio=0.5")
			f.JSON(t, &phased, "actions", "get", fmt.Sprint(d.ID))
			if p := phased.Schedule.Phases; len(p) != 2 || fmt.Sprint(p[0].Info) != "map[metadata:map[ring:canary] type:metadata]" ||
				fmt.Sprint(p[1].TriggerOn) != "map[finished_ratio:0.5 type:after_previous]" {
				t.Fatalf("phases with a metadata selection and finished-ratio: %+v", phased)
			}
			fleetdtest.WantContains(t, "finished-ratio 2", f.Fails(t, ctl.ExitRefused, "actions", "dispatch", "update", "--devices", "d2,d3",
				"--phase", "canary d2", "--phase", "rest 100% finished-ratio=2"), "schedule.phases[1].trigger_on.finished_ratio")
		})
	})
}

// TestFleetctlWatchExitCodes: a CI job gates on 'actions watch' and
// 'actions dispatch --watch' by their exit code, one for each way an
// action ends (docs/cli.md's table).
func TestFleetctlWatchExitCodes(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b, "--rollout-interval", "20ms")
		f := s.NewFleetctl(t, s.Admin())
		for _, id := range []string{"w1", "w2", "w3", "w4"} {
			f.OK(t, "devices", "create", id)
		}
		dispatch := func(t *testing.T, args ...string) (int64, string) {
			t.Helper()
			var d struct{ ID int64 }
			f.JSON(t, &d, append([]string{"actions", "dispatch", "reboot"}, args...)...)
			return d.ID, fmt.Sprint(d.ID)
		}
		watch := func(t *testing.T, want int, id string, args ...string) fleetdtest.CtlResult {
			t.Helper()
			r := f.Run("", append([]string{"actions", "watch", id, "--interval", "10ms"}, args...)...)
			if r.Code != want {
				t.Fatalf("want exit %d; %v", want, r)
			}
			return r
		}
		// released waits for a rollout's first phase, which the rollout
		// loop releases, to release n devices.
		released := func(t *testing.T, sid string, n int) {
			t.Helper()
			fleetdtest.Eventually(t, "the first phase to release", func() bool {
				var a struct{ Statuses map[string]int }
				f.JSON(t, &a, "actions", "get", sid)
				return a.Statuses["Queued"] == n
			})
		}
		actions := func(t *testing.T) int {
			var l struct{ Actions []struct{ ID int64 } }
			f.JSON(t, &l, "actions", "list", "--limit", "1000")
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
			out, done := f.Start(context.Background(), "actions", "dispatch", "reboot", "--devices", "w1,w2", "--watch", "--interval", "10ms", "-o", "json")
			fleetdtest.Eventually(t, "the first JSON line", func() bool { return strings.Contains(out.String(), "\n") })
			id := lines(t, out.String())[0].Action.ID
			s.Report(t, "w1", id, "Completed")
			fleetdtest.Eventually(t, "a line with w1 completed", func() bool { return strings.Contains(out.String(), `"Completed":1`) })
			s.Report(t, "w2", id, "Completed")
			r := <-done
			if r.Code != ctl.ExitOK {
				t.Fatalf("%v", r)
			}
			fleetdtest.WantContains(t, "stderr", r.Stderr, fmt.Sprintf("dispatched action %d to 2 devices", id))
			ls := lines(t, r.Stdout)
			if len(ls) < 3 {
				t.Fatalf("want a line per change (Queued 2, Completed 1, Completed 2) and the final one:\n%s", r.Stdout)
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
			fleetdtest.WantContains(t, "final reason", last.Reason, "finished: Completed 2")
		})
		t.Run("0And4MaxFailed", func(t *testing.T) {
			id, sid := dispatch(t, "--devices", "w1,w2,w3,w4")
			s.Report(t, "w1", id, "Failed")
			for _, d := range []string{"w2", "w3", "w4"} {
				s.Report(t, d, id, "Completed")
			}
			fleetdtest.WantContains(t, "stderr", watch(t, ctl.ExitFailed, sid).Stderr, "1 of 4 devices failed, more than --max-failed 0 allows")
			watch(t, ctl.ExitOK, sid, "--max-failed", "1")
			watch(t, ctl.ExitOK, sid, "--max-failed", "25%")
			watch(t, ctl.ExitFailed, sid, "--max-failed", "24.9%")
			r := watch(t, ctl.ExitFailed, sid, "-o", "json")
			if last := lines(t, r.Stdout)[1]; last.Event != "final" || *last.ExitCode != ctl.ExitFailed || !strings.Contains(last.Reason, "1 of 4 devices failed") {
				t.Fatalf("final line %+v", last)
			}
		})
		t.Run("1RequestFailed", func(t *testing.T) {
			fleetdtest.WantContains(t, "stderr", watch(t, ctl.ExitRefused, "999999").Stderr, "404 not_found")
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
				if r := f.Run("", args...); r.Code != ctl.ExitUsage {
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
			s.Report(t, "w1", id, "Failed")
			r := watch(t, ctl.ExitPaused, sid, "--timeout", "1m", "--max-failed", "1")
			fleetdtest.WantContains(t, "a gate's pause", r.Stderr, "the rollout is paused: phase 1 (rest) not released", "failed (100% > 10%)")

			_, sid = dispatch(t, "--devices", "w3", "--phase", "later w3 trigger=manual")
			f.OK(t, "actions", "pause", sid)
			fleetdtest.WantContains(t, "an operator's pause", watch(t, ctl.ExitPaused, sid).Stderr, "the rollout is paused: paused by")
		})
		t.Run("5Timeout", func(t *testing.T) {
			// Long enough for the first read, whatever the machine's load.
			_, sid := dispatch(t, "--devices", "w1")
			fleetdtest.WantContains(t, "stderr", watch(t, ctl.ExitTimeout, sid, "--timeout", "1s").Stderr, "gave up watching after 1s: Queued 1")
			r := watch(t, ctl.ExitTimeout, sid, "--timeout", "1s", "-o", "json")
			ls := lines(t, r.Stdout)
			if last := ls[len(ls)-1]; len(ls) != 2 || last.Event != "final" || *last.ExitCode != ctl.ExitTimeout || last.Action.Statuses["Queued"] != 1 {
				t.Fatalf("lines %+v", ls)
			}
			r = f.Run("", "actions", "dispatch", "reboot", "--devices", "w2", "--watch", "--interval", "10ms", "--watch-timeout", "50ms")
			if r.Code != ctl.ExitTimeout {
				t.Fatalf("want exit 5; %v", r)
			}
			// A rollout that waits on a device says which, as it goes and
			// when the watch gives up.
			_, sid = dispatch(t, "--devices", "w3,w4", "--phase", "canary w3", "--phase", "rest 100%")
			released(t, sid, 1)
			r = watch(t, ctl.ExitTimeout, sid, "--timeout", "1s")
			fleetdtest.WantContains(t, "waiting", r.Stdout, "; waiting: phase 1 (rest) waits for 1 more device of earlier phases to finish; not finished: w3")
			fleetdtest.WantContains(t, "waiting", r.Stderr, "gave up watching after 1s: Scheduled 1, Queued 1; waiting: phase 1 (rest) waits for")
		})
		t.Run("6AbortedOrCancelled", func(t *testing.T) {
			id, sid := dispatch(t, "--devices", "w1,w2", "--phase", "canary w1", "--phase", "rest w2 trigger=manual")
			released(t, sid, 1)
			s.Report(t, "w1", id, "Completed")
			f.OK(t, "actions", "abort", sid)
			fleetdtest.WantContains(t, "abort", watch(t, ctl.ExitAborted, sid).Stderr, "the rollout was aborted: Completed 1, Cancelled 1")

			_, sid = dispatch(t, "--devices", "w3,w4")
			f.OK(t, "actions", "cancel", sid)
			fleetdtest.WantContains(t, "cancel", watch(t, ctl.ExitAborted, sid, "--max-failed", "100%").Stderr, "2 device action(s) cancelled")
		})
	})
}

// TestFleetctlCompletion: the shells' completion asks the server for
// device and action ids (the scripts call fleetctl __complete).
func TestFleetctlCompletion(t *testing.T) {
	t.Parallel()
	s := fleetdtest.Start(t, sqlstoretest.Backends()[0])
	f := s.NewFleetctl(t, s.Admin())
	f.OK(t, "devices", "create", "pump-1")
	f.OK(t, "devices", "create", "pump-2")
	f.OK(t, "devices", "create", "valve-1")
	var d struct{ ID int64 }
	f.JSON(t, &d, "actions", "dispatch", "reboot", "--devices", "valve-1")

	out := f.OK(t, "__complete", "devices", "get", "pu")
	if !strings.HasPrefix(out, "pump-1\npump-2\n:") {
		t.Fatalf("completing device ids: %q", out)
	}
	fleetdtest.WantContains(t, "completing action ids", f.OK(t, "__complete", "actions", "watch", ""), fmt.Sprintf("%d\treboot, 1 devices", d.ID))
	fleetdtest.WantContains(t, "completing a flag", f.OK(t, "__complete", "devices", "actions", "pump-1", "--sort-by", ""), "updated_at")
	for _, shell := range []string{"bash", "zsh", "fish"} {
		fleetdtest.WantContains(t, shell, f.OK(t, "completion", shell), "__complete")
	}
}

func TestFleetctlFirmware(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b)
		f := s.NewFleetctl(t, s.Admin())
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
			out := f.OK(t, "firmware", "bundle", "create", "--version", "2.3.0", "--out", archive,
				"bootloader=1.2.0:"+boot, "app=2.3.0:"+app, "--depends", "app:bootloader>=1.1.0")
			fleetdtest.WantContains(t, "bundle create", out, "wrote "+archive+": bundle 2.3.0 with 2 components", `"checksum":"`)
			twin := filepath.Join(dir, "twin.tar.gz")
			fleetdtest.WantContains(t, "refused", f.Fails(t, ctl.ExitRefused, "firmware", "bundle", "create", "--version", "1.0-rc1", "--out", twin, "app=1.0.0:"+app), "version")
			f.Fails(t, ctl.ExitUsage, "firmware", "bundle", "create", "app=1.0.0:"+app)
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
			r := f.Run("", "firmware", "upload", archive, "-o", "json")
			if r.Code != 0 {
				t.Fatalf("%v", r)
			}
			json.Unmarshal([]byte(r.Stdout), &bundle)
			if bundle.UploadStatus != "completed" || bundle.Checksum != fleetdtest.SHA256Hex(data) || len(bundle.Firmwares) != 2 {
				t.Fatalf("uploaded %+v", bundle)
			}
			fleetdtest.WantContains(t, "progress", r.Stderr, "uploaded fw-2.3.0.tar.gz: ", " in ", "/s)")
			// A re-run job uploads the same archive again: that bundle.
			var again struct{ ID string }
			f.JSON(t, &again, "firmware", "upload", archive)
			if again.ID != bundle.ID {
				t.Fatalf("the same archive again: bundle %s, want %s", again.ID, bundle.ID)
			}
			changed := filepath.Join(dir, "changed-2.3.0.tar.gz")
			f.OK(t, "firmware", "bundle", "create", "--version", "2.3.0", "--out", changed, "bootloader=1.2.0:"+boot)
			fleetdtest.WantContains(t, "another archive", f.Fails(t, ctl.ExitRefused, "firmware", "upload", changed), "409 conflict", "another archive")
			fleetdtest.WantContains(t, "another archive", f.Fails(t, ctl.ExitRefused, "firmware", "upload", changed, "--verified"), "409 conflict", "completed")
		})
		t.Run("UploadVerified", func(t *testing.T) {
			other := filepath.Join(dir, "fw-2.4.0.tar")
			f.OK(t, "firmware", "bundle", "create", "--version", "2.4.0", "--out", other, "app=2.4.0:"+boot)
			var v struct {
				UploadStatus string `json:"upload_status"`
				Declared     struct{ Checksum string }
			}
			f.JSON(t, &v, "firmware", "upload", other, "--verified")
			if v.UploadStatus != "completed" || v.Declared.Checksum == "" {
				t.Fatalf("verified upload %+v", v)
			}
			var again struct {
				UploadStatus string `json:"upload_status"`
				Version      string
			}
			f.JSON(t, &again, "firmware", "upload", other, "--verified")
			if again.UploadStatus != "completed" || again.Version != "2.4.0" {
				t.Fatalf("the same archive again, verified: %+v", again)
			}
			fleetdtest.WantContains(t, "not a bundle", f.Fails(t, ctl.ExitRefused, "firmware", "upload", boot, "--verified"), "not a bundle")
		})
		t.Run("Read", func(t *testing.T) {
			fleetdtest.WantContains(t, "list", f.OK(t, "firmware", "list", "--status", "completed"), "2.3.0", "2.4.0", "completed")
			fleetdtest.WantContains(t, "get by version", f.OK(t, "firmware", "get", "2.3.0"), bundle.ID, "COMPONENT", "bootloader", "app", "1.1.0")
			fleetdtest.WantContains(t, "get by id", f.OK(t, "firmware", "get", bundle.ID, "-o", "yaml"), "version: 2.3.0", "component_name: bootloader")
			fleetdtest.WantContains(t, "components", f.OK(t, "firmware", "components", "app"), "2.4.0", "2.3.0")
			f.Fails(t, ctl.ExitRefused, "firmware", "get", "9.9.9")
		})
		t.Run("Download", func(t *testing.T) {
			out := filepath.Join(dir, "dl.tar.gz")
			fleetdtest.WantContains(t, "download", f.OK(t, "firmware", "download", "2.3.0", "--out", out), "verified")
			if got, _ := os.ReadFile(out); !bytes.Equal(got, data) {
				t.Fatal("the download is not the archive")
			}
			// A partial file resumes where it ends.
			os.WriteFile(out, data[:len(data)/3], 0o644)
			r := f.Run("", "firmware", "download", bundle.ID, "--out", out)
			if r.Code != 0 || !strings.Contains(r.Stderr, fmt.Sprintf("resumed at %d bytes", len(data)/3)) {
				t.Fatalf("resume: %v", r)
			}
			if got, _ := os.ReadFile(out); !bytes.Equal(got, data) {
				t.Fatal("the resumed download is not the archive")
			}
			// A partial file that is not the archive's start is fetched again whole.
			os.WriteFile(out, bytes.Repeat([]byte("x"), len(data)/2), 0o644)
			r = f.Run("", "firmware", "download", "2.3.0", "--out", out)
			if r.Code != 0 || !strings.Contains(r.Stderr, "downloading it whole") {
				t.Fatalf("corrupt partial: %v", r)
			}
			if got, _ := os.ReadFile(out); !bytes.Equal(got, data) {
				t.Fatal("the download after a corrupt partial is not the archive")
			}
		})
		t.Run("Deactivate", func(t *testing.T) {
			f.OK(t, "devices", "create", "fw-dev")
			f.OK(t, "firmware", "deactivate", "bootloader", "1.2.0")
			fleetdtest.WantContains(t, "components", f.OK(t, "firmware", "components", "bootloader", "-o", "json"), `"is_deactivated": true`)
			fleetdtest.WantContains(t, "dispatch", f.Fails(t, ctl.ExitRefused, "actions", "dispatch", "update_firmware", "--param", "version=2.3.0", "--devices", "fw-dev"), "deactivated")
			f.OK(t, "firmware", "activate", "bootloader", "1.2.0")
			f.OK(t, "actions", "dispatch", "update_firmware", "--param", "version=2.3.0", "--devices", "fw-dev")
		})
		t.Run("Delete", func(t *testing.T) {
			fleetdtest.WantContains(t, "delete", f.OK(t, "firmware", "delete", "2.4.0"), "deleted bundle 2.4.0")
			f.Fails(t, ctl.ExitRefused, "firmware", "get", "2.4.0")
		})
	})
}

func TestFleetctlAlerts(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b, fleetdtest.AlertFlags...)
		f := s.NewFleetctl(t, s.Admin())
		dir := t.TempDir()
		hook := fleetdtest.NewReceiver(t, 0)
		f.OK(t, "devices", "create", "pump-1", "--metadata", "site=berlin")
		var rule struct{ ID, Name string }

		t.Run("Rules", func(t *testing.T) {
			file := filepath.Join(dir, "rule.yaml")
			os.WriteFile(file, []byte("name: overheating\nstream: telemetry\ncondition:\n  field: temperature\n  operator: '>'\n  value: 80\nmetadata_filters:\n  site: berlin\n"), 0o644)
			f.JSON(t, &rule, "alert-rules", "create", "-f", file)
			if rule.ID == "" || rule.Name != "overheating" {
				t.Fatalf("created rule %+v", rule)
			}
			out := f.OK(t, "alert-rules", "create", "--name", "silent", "--stream", "telemetry", "--condition", `{"no_data_seconds": 300}`, "--activation", "1m")
			fleetdtest.WantContains(t, "created by flags", out, "silent", "no_data_seconds=300", "60")
			fleetdtest.WantContains(t, "duplicate", f.Fails(t, ctl.ExitRefused, "alert-rules", "create", "-f", file), "409 conflict")
			fleetdtest.WantContains(t, "bad condition", f.Fails(t, ctl.ExitRefused, "alert-rules", "create", "--name", "bad", "--stream", "x",
				"--condition", `{"all": [{"field": "t", "operator": "~", "value": 1}]}`), "400 invalid", "condition.all[0].operator")
			fleetdtest.WantContains(t, "list", f.OK(t, "alert-rules", "list"), "overheating", "silent", "site=berlin")
			fleetdtest.WantContains(t, "get", f.OK(t, "alert-rules", "get", rule.ID, "-o", "yaml"), "name: overheating", "operator: '>'")
		})
		t.Run("EditRule", func(t *testing.T) {
			var silent struct{ ID string }
			f.JSON(t, &silent, "alert-rules", "create", "--name", "silent-2", "--stream", "telemetry", "--condition", `{"no_data_seconds": 300}`)
			// What is not given stays: here the stream, the condition and
			// the absence of filters.
			fleetdtest.WantContains(t, "renamed", f.OK(t, "alert-rules", "edit", silent.ID, "--name", "silent-edited", "--group", "pumps"),
				"silent-edited", "pumps", "no_data_seconds=300")
			changes := filepath.Join(dir, "changes.yaml")
			os.WriteFile(changes, []byte("condition:\n  field: temperature\n  operator: '>'\n  value: 90\ngroup: hot\n"), 0o644)
			f.OK(t, "alert-rules", "edit", rule.ID, "-f", changes, "--group", "hotter", "--deactivation", "2m")
			got := f.OK(t, "alert-rules", "get", rule.ID, "-o", "yaml")
			fleetdtest.WantContains(t, "edited", got, "name: overheating", "stream: telemetry", "value: 90", "group: hotter", "deactivation_threshold_seconds: 120", "site: berlin")
			fleetdtest.WantContains(t, "taken name", f.Fails(t, ctl.ExitRefused, "alert-rules", "edit", rule.ID, "--name", "silent-edited"), "409 conflict")
			os.WriteFile(changes, []byte("stream: power\n"), 0o644)
			fleetdtest.WantContains(t, "another stream", f.Fails(t, ctl.ExitRefused, "alert-rules", "edit", rule.ID, "-f", changes), "400 invalid", "stream")
			fleetdtest.WantContains(t, "bad condition", f.Fails(t, ctl.ExitRefused, "alert-rules", "edit", rule.ID, "--condition", `{"field": "t", "operator": "~", "value": 1}`),
				"400 invalid", "condition.operator")
			fleetdtest.WantContains(t, "unknown rule", f.Fails(t, ctl.ExitRefused, "alert-rules", "edit", "00000000-0000-4000-8000-000000000000", "--name", "x"), "404 not_found")
			f.Fails(t, ctl.ExitUsage, "alert-rules", "edit", rule.ID)
			f.Fails(t, ctl.ExitUsage, "alert-rules", "edit", rule.ID, "--stream", "power")
			fleetdtest.WantContains(t, "unchanged by refusals", f.OK(t, "alert-rules", "get", rule.ID, "-o", "yaml"), "name: overheating", "value: 90", "group: hotter")
		})
		var nid string
		t.Run("NotificationRules", func(t *testing.T) {
			var n struct{ ID string }
			f.JSON(t, &n, "alert-rules", "notifications", "create", rule.ID, "--webhook", hook.URL, "--secret", "s3cret", "--subject", "{{.Rule.Name}} {{.Event}}")
			nid = n.ID
			out := f.OK(t, "alert-rules", "notifications", "list", rule.ID)
			fleetdtest.WantContains(t, "list", out, nid, "webhook", hook.URL)
			if strings.Contains(out, "s3cret") {
				t.Fatalf("a secret is shown:\n%s", out)
			}
			f.OK(t, "alert-rules", "notifications", "edit", rule.ID, nid, "--interval", "1m", "--timezone", "Europe/Berlin")
			fleetdtest.WantContains(t, "edited", f.OK(t, "alert-rules", "notifications", "list", rule.ID), "60", "Europe/Berlin")
			fleetdtest.WantContains(t, "bad zone", f.Fails(t, ctl.ExitRefused, "alert-rules", "notifications", "edit", rule.ID, nid, "--timezone", "Mars/Olympus"), "400 invalid")
			f.Fails(t, ctl.ExitUsage, "alert-rules", "notifications", "edit", rule.ID, nid)
			var other struct{ ID string }
			f.JSON(t, &other, "alert-rules", "notifications", "create", rule.ID, "--slack", hook.URL+"/slack")
			fleetdtest.WantContains(t, "delete", f.OK(t, "alert-rules", "notifications", "delete", rule.ID, other.ID), "deleted")
		})
		t.Run("AlertsAndStreams", func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			watching, done := f.Start(ctx, "alerts", "list", "--watch", "--interval", "10ms", "--state", "active")
			fleetdtest.Eventually(t, "the watch's first list", func() bool { return strings.Contains(watching.String(), "RULE") })
			points := filepath.Join(dir, "points.json")
			os.WriteFile(points, []byte(fmt.Sprintf(`[{"timestamp": %d, "sequence": 1, "temperature": 91.5}]`, time.Now().UnixMilli())), 0o644)
			fleetdtest.WantContains(t, "ingest", f.OK(t, "streams", "ingest", "pump-1", "telemetry", "-f", points), "ACCEPTED", "1")
			fleetdtest.Eventually(t, "the watch to show the alert", func() bool { return strings.Contains(watching.String(), "overheating") })
			cancel()
			if r := <-done; r.Code != 0 || !strings.Contains(r.Stdout, "--- ") {
				t.Fatalf("interrupted watch: %v", r)
			}
			fleetdtest.WantContains(t, "latest", f.OK(t, "streams", "latest", "pump-1", "telemetry"), "temperature=91.5")
			var alerts struct {
				Alerts []struct{ ID string }
			}
			f.JSON(t, &alerts, "alerts", "list", "--rule", rule.ID, "--device", "pump-1")
			if len(alerts.Alerts) != 1 {
				t.Fatalf("alerts %+v", alerts)
			}
			fleetdtest.WantContains(t, "get", f.OK(t, "alerts", "get", alerts.Alerts[0].ID), "overheating", "pump-1", "active")
			fleetdtest.Eventually(t, "the webhook to be called", func() bool { return len(hook.Got()) > 0 })
			fleetdtest.Eventually(t, "the notification to show delivered", func() bool {
				return strings.Contains(f.OK(t, "alerts", "notifications", alerts.Alerts[0].ID), "delivered")
			})
		})
		t.Run("RolloutRules", func(t *testing.T) {
			var r struct {
				ID     string
				Events []string
			}
			f.JSON(t, &r, "rollout-rules", "create", "--slack", hook.URL+"/rollouts", "--events", "paused,aborted")
			if len(r.Events) != 2 {
				t.Fatalf("rollout rule %+v", r)
			}
			f.OK(t, "rollout-rules", "edit", r.ID, "--events", "completed")
			fleetdtest.WantContains(t, "get", f.OK(t, "rollout-rules", "get", r.ID), "slack", "completed")
			fleetdtest.WantContains(t, "list", f.OK(t, "rollout-rules", "list"), r.ID)
			f.Fails(t, ctl.ExitUsage, "rollout-rules", "create", "--slack", "https://a.example", "--webhook", "https://b.example")
			f.OK(t, "rollout-rules", "delete", r.ID)
			f.Fails(t, ctl.ExitRefused, "rollout-rules", "get", r.ID)
		})
		t.Run("DeleteRule", func(t *testing.T) {
			f.OK(t, "alert-rules", "delete", rule.ID)
			fleetdtest.WantContains(t, "gone", f.Fails(t, ctl.ExitRefused, "alert-rules", "get", rule.ID), "404 not_found")
		})
	})
}

func TestFleetctlAdmin(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b)
		f := s.NewFleetctl(t, s.Admin())

		t.Run("APIKeys", func(t *testing.T) {
			var k struct{ Name, Role, Key string }
			f.JSON(t, &k, "apikeys", "create", "ci", "--role", "operator", "--email", "ci@example.com")
			if k.Role != "operator" || !strings.HasPrefix(k.Key, "fk_") {
				t.Fatalf("key %+v", k)
			}
			out := f.OK(t, "apikeys", "list")
			fleetdtest.WantContains(t, "list", out, "ci", "operator", "ci@example.com")
			if strings.Contains(out, k.Key) {
				t.Fatal("the list shows a key")
			}
			ci := s.NewFleetctl(t, fleetdtest.Creds{Tenant: "default", Key: k.Key})
			ci.OK(t, "devices", "create", "by-ci")
			fleetdtest.WantContains(t, "operator lists keys", ci.Fails(t, ctl.ExitRefused, "apikeys", "list"), "403 forbidden")
			f.OK(t, "apikeys", "delete", "ci")
			fleetdtest.WantContains(t, "deleted key", ci.Fails(t, ctl.ExitRefused, "devices", "list"), "401 unauthenticated")
			f.Fails(t, ctl.ExitUsage, "apikeys", "create", "nobody")
		})
		t.Run("TenantAuth", func(t *testing.T) {
			f.OK(t, "tenant", "auth", "set", "--method", "webhook", "--webhook-url", "https://auth.example.com/check", "--default-role", "operator")
			fleetdtest.WantContains(t, "get", f.OK(t, "tenant", "auth", "get"), "webhook", "https://auth.example.com/check", "operator")
			file := filepath.Join(t.TempDir(), "auth.json")
			os.WriteFile(file, []byte(`{"method": "jwks", "jwks_url": "https://idp.example.com/jwks.json", "issuer": "https://idp.example.com/", "audience": "fleet"}`), 0o644)
			f.OK(t, "tenant", "auth", "set", "-f", file)
			var got struct{ Method, Audience string }
			f.JSON(t, &got, "tenant", "auth", "get")
			if got.Method != "jwks" || got.Audience != "fleet" {
				t.Fatalf("auth %+v", got)
			}
			fleetdtest.WantContains(t, "bad method", f.Fails(t, ctl.ExitRefused, "tenant", "auth", "set", "--method", "ldap"), "400 invalid", "method")
		})
		t.Run("TenantDDI", func(t *testing.T) {
			type settings struct {
				RequireConfirmation bool `json:"require_confirmation"`
				GatewayRegistration bool `json:"gateway_registration"`
			}
			var got settings
			f.JSON(t, &got, "tenant", "ddi", "get")
			if got != (settings{}) {
				t.Fatalf("a new tenant's DDI settings: %+v", got)
			}
			f.JSON(t, &got, "tenant", "ddi", "set", "--gateway-registration")
			if got != (settings{GatewayRegistration: true}) {
				t.Fatalf("after --gateway-registration: %+v", got)
			}
			// A setting not given stays as it is.
			f.JSON(t, &got, "tenant", "ddi", "set", "--require-confirmation=true")
			if got != (settings{true, true}) {
				t.Fatalf("after --require-confirmation: %+v", got)
			}
			f.OK(t, "tenant", "ddi", "set", "--gateway-registration=false")
			fleetdtest.WantContains(t, "get", f.OK(t, "tenant", "ddi", "get"), "REQUIRE CONFIRMATION", "true", "false")
			f.Fails(t, ctl.ExitUsage, "tenant", "ddi", "set")
			viewer := s.NewFleetctl(t, s.NewKey(t, s.Admin(), "ddi-viewer", "viewer"))
			fleetdtest.WantContains(t, "viewer", viewer.Fails(t, ctl.ExitRefused, "tenant", "ddi", "set", "--require-confirmation=false"), "403 forbidden")
		})
		t.Run("AuditLogs", func(t *testing.T) {
			var all, none struct {
				AuditLogs []struct{ Actor, Action string } `json:"audit_logs"`
				Count     int
			}
			f.JSON(t, &all, "audit-logs", "list", "--since", "1h")
			f.JSON(t, &none, "audit-logs", "list", "--until", "1h")
			if all.Count < 5 || none.Count != 0 {
				t.Fatalf("since 1h ago: %d; until 1h ago: %d", all.Count, none.Count)
			}
			var byActor struct{ Count int }
			f.JSON(t, &byActor, "audit-logs", "list", "--actor", all.AuditLogs[0].Actor)
			if byActor.Count == 0 || byActor.Count > all.Count {
				t.Fatalf("by actor %s: %d of %d", all.AuditLogs[0].Actor, byActor.Count, all.Count)
			}
			fleetdtest.WantContains(t, "table", f.OK(t, "audit-logs", "list", "--limit", "3"), "ACTOR", all.AuditLogs[0].Action)
			f.Fails(t, ctl.ExitUsage, "audit-logs", "list", "--since", "yesterday")
		})
	})
}

// TestFleetctlRateLimited: a 429 says when to try again.
func TestFleetctlRateLimited(t *testing.T) {
	t.Parallel()
	s := fleetdtest.Start(t, sqlstoretest.Backends()[0], "--rate-limit", "0.001", "--rate-burst", "1")
	f := s.NewFleetctl(t, s.Admin())
	f.OK(t, "devices", "list")
	stderr := f.Fails(t, ctl.ExitRefused, "devices", "list")
	fleetdtest.WantContains(t, "stderr", stderr, "(retry after ", "429 rate_limited")
}

// TestFleetctlPresignedDownload: with presign, fleetd redirects downloads
// to the bucket (VersityGW here); fleetctl follows, without its key, and
// resumes there too.
func TestFleetctlPresignedDownload(t *testing.T) {
	t.Parallel()
	s := fleetdtest.StartOn(t, sqlstoretest.Backends()[0], "s3+presign")
	f := s.NewFleetctl(t, s.Admin())
	data := fleetdtest.MakeBundle(t, "5.0.0", fleetdtest.Bootloader, fleetdtest.App230)
	dir := t.TempDir()
	archive := filepath.Join(dir, "fw-5.0.0.tar.gz")
	os.WriteFile(archive, data, 0o644)
	f.OK(t, "firmware", "upload", archive)
	out := filepath.Join(dir, "dl.tar.gz")
	fleetdtest.WantContains(t, "download", f.OK(t, "firmware", "download", "5.0.0", "--out", out), "verified")
	os.WriteFile(out, data[:len(data)/2], 0o644)
	r := f.Run("", "firmware", "download", "5.0.0", "--out", out)
	if r.Code != 0 || !strings.Contains(r.Stdout, "verified") {
		t.Fatalf("resume from the bucket: %v", r)
	}
	if got, _ := os.ReadFile(out); !bytes.Equal(got, data) {
		t.Fatal("the download from the bucket is not the archive")
	}
}
