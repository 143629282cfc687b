package fleetdtest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/fleetd/fleet/ctl"
)

// Fleetctl is the client with an environment of its own: a config
// directory and, when set, FLEETCTL_* variables.
type Fleetctl struct {
	Env map[string]string
	TTY bool // its output is a terminal, where progress redraws in place
	// typed, when set, is what a person types at a prompt on the
	// terminal; prompts are the prompts shown.
	Typed   string
	Prompts []string
}

func (f *Fleetctl) environment(stdin string, out, errOut io.Writer) ctl.Env {
	env := ctl.Env{
		Getenv: func(k string) string { return f.Env[k] },
		Stdin:  strings.NewReader(stdin), Stdout: out, Stderr: errOut,
		IsTerminal: func(io.Writer) bool { return f.TTY },
	}
	if f.Typed != "" {
		env.ReadSecret = func(prompt string) (string, error) {
			f.Prompts = append(f.Prompts, prompt)
			return f.Typed, nil
		}
	}
	return env
}

// NewFleetctl returns a client with an empty config directory that acts
// as c on s through FLEETCTL_* variables (none when c is empty).
func (s *Server) NewFleetctl(t *testing.T, c Creds) *Fleetctl {
	t.Helper()
	f := &Fleetctl{Env: map[string]string{"XDG_CONFIG_HOME": t.TempDir()}}
	if c.Key != "" {
		f.Env["FLEETCTL_URL"] = s.URL
		f.Env["FLEETCTL_TENANT"] = c.Tenant
		f.Env["FLEETCTL_API_KEY"] = c.Key
	}
	return f
}

// CtlResult is one run of fleetctl.
type CtlResult struct {
	Args           []string
	Stdout, Stderr string
	Code           int
}

// String is the run for a failure message.
func (r CtlResult) String() string {
	return fmt.Sprintf("fleetctl %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(r.Args, " "), r.Code, r.Stdout, r.Stderr)
}

// Run runs fleetctl with stdin and args and returns what it did.
func (f *Fleetctl) Run(stdin string, args ...string) CtlResult {
	var out, errOut bytes.Buffer
	code := ctl.Run(context.Background(), args, f.environment(stdin, &out, &errOut))
	return CtlResult{Args: args, Stdout: out.String(), Stderr: errOut.String(), Code: code}
}

// OK runs fleetctl and wants exit 0; it returns standard output.
func (f *Fleetctl) OK(t *testing.T, args ...string) string {
	t.Helper()
	r := f.Run("", args...)
	if r.Code != 0 {
		t.Fatalf("%v", r)
	}
	return r.Stdout
}

// Fails runs fleetctl, wants exit code want and returns standard error.
func (f *Fleetctl) Fails(t *testing.T, want int, args ...string) string {
	t.Helper()
	r := f.Run("", args...)
	if r.Code != want {
		t.Fatalf("want exit %d; %v", want, r)
	}
	if r.Stderr == "" {
		t.Fatalf("exit %d with nothing on stderr; %v", want, r)
	}
	return r.Stderr
}

// JSON runs fleetctl with -o json and decodes its output into v.
func (f *Fleetctl) JSON(t *testing.T, v any, args ...string) {
	t.Helper()
	out := f.OK(t, append(args, "-o", "json")...)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("fleetctl %s -o json: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// WantContains fails the test unless got (what) contains each of wants.
func WantContains(t *testing.T, what, got string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(got, w) {
			t.Fatalf("%s does not contain %q:\n%s", what, w, got)
		}
	}
}

// Start runs fleetctl in the background until it ends or ctx does; out is
// its standard output, read while it runs.
func (f *Fleetctl) Start(ctx context.Context, args ...string) (out *LockedBuffer, done <-chan CtlResult) {
	out = &LockedBuffer{}
	ch := make(chan CtlResult, 1)
	go func() {
		var errOut bytes.Buffer
		code := ctl.Run(ctx, args, f.environment("", out, &errOut))
		ch <- CtlResult{Args: args, Stdout: out.String(), Stderr: errOut.String(), Code: code}
	}()
	return out, ch
}

// Report is a device's status report through S10.
func (s *Server) Report(t *testing.T, device string, id int64, state string) {
	t.Helper()
	s.Do(t, s.Admin(), "POST", "/api/v1/devices/action/status", map[string]any{
		"device_id": device, "action_id": id, "state": state, "progress": 100}).Want(t, 204)
}
