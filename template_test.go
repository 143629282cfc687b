package fleet_test

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet"
)

func sampleData(value map[string]any) fleet.NotificationData {
	t0 := time.Date(2026, 11, 21, 10, 0, 0, 0, time.UTC)
	a := &fleet.Alert{ID: "a1", RuleID: "r1", DeviceID: "d1", Stream: "env", State: fleet.AlertActive, StartedAt: t0,
		Value: &fleet.DataPoint{DeviceID: "d1", Stream: "env", Timestamp: t0, Data: value}}
	return fleet.NewNotificationData(fleet.EventOpened, a, &fleet.AlertRule{ID: "r1", Name: "hot"}, time.UTC, t0)
}

// waitGoroutines waits until no more goroutines run than before: an
// abandoned render must stop, not spin on unseen.
func waitGoroutines(t *testing.T, before int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines, %d before the render:\n%s", runtime.NumGoroutine(), before, buf[:runtime.Stack(buf, true)])
		}
		runtime.Gosched()
		time.Sleep(time.Millisecond)
	}
}

// TestTemplateBudget: a template that loops without end, builds a string
// without end or recurses without end is stopped within its limits, and
// the goroutine that ran it ends.
func TestTemplateBudget(t *testing.T) {
	lim := fleet.TemplateLimits{Timeout: 50 * time.Millisecond, MaxOutput: 64 << 10}
	for _, tc := range []struct {
		name, body string
		value      map[string]any
	}{
		{"output of a huge range", `{{range 100000000000000}}AAAA{{end}}`, nil},
		{"silent huge range", `{{range 100000000000000}}{{end}}`, nil},
		{"silent nested ranges", `{{range 100000}}{{range 100000}}{{if true}}{{end}}{{end}}{{end}}`, nil},
		{"range over a value of the data", `{{range .Value.n}}{{end}}`, map[string]any{"n": int64(1e14)}},
		{"doubling printf", `{{$x := "ab"}}{{range 64}}{{$x = printf "%s%s" $x $x}}{{end}}{{len $x}}`, nil},
		{"repeated argument", `{{printf "` + strings.Repeat("%[1]s", 1000) + `" .Value.s}}`, map[string]any{"s": strings.Repeat("x", 1000)}},
		{"wide padding", `{{printf "%0999999d%0999999d" 1 2}}`, nil},
		{"print of many arguments", `{{print .Value.s .Value.s .Value.s .Value.s .Value.s}}`, map[string]any{"s": strings.Repeat("x", 20000)}},
		{"escaper", `{{html .Value.s .Value.s .Value.s .Value.s}}`, map[string]any{"s": strings.Repeat("<", 20000)}},
		{"ranges over calls", `{{define "a"}}{{range 10000}}{{end}}{{end}}{{define "b"}}{{range 10000}}{{template "a"}}{{end}}{{end}}{{range 10000}}{{template "b"}}{{end}}`, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := runtime.NumGoroutine()
			_, _, err := fleet.RenderNotification(context.Background(), lim, fleet.NotificationTemplate{Body: tc.body}, sampleData(tc.value))
			if !errors.Is(err, fleet.ErrTemplateBudget) {
				t.Fatalf("err %v, want ErrTemplateBudget", err)
			}
			waitGoroutines(t, before)
		})
	}
}

// TestTemplateAbandonedOnCancel: a render whose caller goes away returns
// at once and stops.
func TestTemplateAbandonedOnCancel(t *testing.T) {
	before := runtime.NumGoroutine()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, _, err := fleet.RenderNotification(ctx, fleet.TemplateLimits{Timeout: time.Hour}, fleet.NotificationTemplate{Body: `{{range 100000000000000}}{{end}}`}, sampleData(nil))
		errc <- err
	}()
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want context.Canceled", err)
	}
	waitGoroutines(t, before)
}

// TestTemplateWithinBudget: what templates are for still works, the
// builtins that build strings included.
func TestTemplateWithinBudget(t *testing.T) {
	d := sampleData(map[string]any{"temp": 81.5, "list": []any{"a", "b", "c"}})
	body := `{{.Rule.Name}} {{printf "%.1f" .Value.temp}} {{range $i, $e := .Value.list}}{{if $i}},{{end}}{{$e}}{{end}} {{print "x" 1}} {{html "<b>"}} {{urlquery "a b"}} {{js "'"}} {{len .Value.list}}{{define "t"}}[{{.}}]{{end}} {{template "t" "x"}}`
	_, got, err := fleet.RenderNotification(context.Background(), fleet.TemplateLimits{}, fleet.NotificationTemplate{Body: body}, d)
	if want := `hot 81.5 a,b,c x1 &lt;b&gt; a+b \' 3 [x]`; err != nil || got != want {
		t.Fatalf("got %q, %v, want %q", got, err, want)
	}
	// Exactly the cap is allowed, a byte more is not.
	lim := fleet.TemplateLimits{MaxOutput: 10}
	if _, got, err := fleet.RenderNotification(context.Background(), lim, fleet.NotificationTemplate{Subject: "s", Body: `{{range 10}}a{{end}}`}, d); err != nil || got != "aaaaaaaaaa" {
		t.Fatalf("at the cap: %q, %v", got, err)
	}
	if _, _, err := fleet.RenderNotification(context.Background(), lim, fleet.NotificationTemplate{Subject: "s", Body: `{{range 11}}a{{end}}`}, d); !errors.Is(err, fleet.ErrTemplateBudget) {
		t.Fatalf("over the cap: %v", err)
	}
}

// TestTemplateShape: recursion, which the budget could stop only after
// unwinding deep stacks, and ranges nested deeper than anyone writes are
// refused before the template runs.
func TestTemplateShape(t *testing.T) {
	for _, tc := range []struct{ name, body, want string }{
		{"recursion", `{{define "a"}}{{range 2}}{{template "a" $}}{{end}}{{end}}{{template "a" .}}`, "calls itself"},
		{"mutual recursion", `{{define "a"}}{{template "b"}}{{end}}{{define "b"}}{{template "a"}}{{end}}{{template "a"}}`, "calls itself"},
		{"deep ranges", strings.Repeat("{{range 1}}", 33) + strings.Repeat("{{end}}", 33), "ranges nest 33 deep"},
		{"deep ranges through calls", `{{define "a"}}` + strings.Repeat("{{range 1}}", 20) + strings.Repeat("{{end}}", 20) + `{{end}}` +
			strings.Repeat("{{range 1}}", 13) + `{{template "a"}}` + strings.Repeat("{{end}}", 13), "ranges nest 33 deep"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs := fleet.CheckNotificationTemplate(context.Background(), fleet.TemplateLimits{}, fleet.NotificationTemplate{Body: tc.body})
			if msg := errs["notification_template.body"]; !strings.Contains(msg, tc.want) {
				t.Fatalf("got %q, want it to say %q", msg, tc.want)
			}
		})
	}
	ok := strings.Repeat("{{range 1}}", 32) + "x" + strings.Repeat("{{end}}", 32)
	if errs := fleet.CheckNotificationTemplate(context.Background(), fleet.TemplateLimits{}, fleet.NotificationTemplate{Body: ok}); len(errs) != 0 {
		t.Fatalf("32 nested ranges: %v", errs)
	}
}

// TestCheckTemplateBudget: a template over its budget is refused when
// saved, with a message that says why.
func TestCheckTemplateBudget(t *testing.T) {
	for _, body := range []string{`{{range 100000000000000}}AAAA{{end}}`, `{{range 100000000000000}}{{end}}`} {
		errs := fleet.CheckNotificationTemplate(context.Background(), fleet.TemplateLimits{}, fleet.NotificationTemplate{Body: body})
		if msg := errs["notification_template.body"]; !strings.Contains(msg, "must render within 50ms and 65536 bytes") {
			t.Errorf("%s: %q", body, msg)
		}
		errs = fleet.CheckRolloutTemplate(context.Background(), fleet.TemplateLimits{}, fleet.NotificationTemplate{Subject: body})
		if msg := errs["notification_template.subject"]; !strings.Contains(msg, "must render within") {
			t.Errorf("rollout %s: %q", body, msg)
		}
	}
}

// FuzzRenderTemplate: whatever a tenant writes as a template, and
// whatever a device sends as the value it ranges over, the render returns
// within its budget's bound (at most 20 timeouts) with no more output than
// the cap, and never panics.
func FuzzRenderTemplate(f *testing.F) {
	for _, s := range []string{`{{.Rule.Name}} {{.Value.n}}`, `{{range .Value.n}}A{{end}}`, `{{range 100000000000000}}{{end}}`,
		`{{printf "%[1]s%[1]s" .Value.s}}`, `{{define "a"}}{{template "a"}}{{end}}{{template "a"}}`, `{{with .Alert.EndedAt}}{{.Format "2006"}}{{end}}`} {
		f.Add(s, int64(1e6), "abc")
	}
	lim := fleet.TemplateLimits{Timeout: 20 * time.Millisecond, MaxOutput: 4 << 10}
	f.Fuzz(func(t *testing.T, body string, n int64, s string) {
		start := time.Now()
		_, got, err := fleet.RenderNotification(context.Background(), lim, fleet.NotificationTemplate{Subject: "s", Body: body}, sampleData(map[string]any{"n": n, "s": s}))
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("rendered in %v", d)
		}
		if err == nil && len(got) > lim.MaxOutput {
			t.Fatalf("%d bytes of output, over the cap of %d", len(got), lim.MaxOutput)
		}
	})
}
