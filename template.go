package fleet

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"text/template"
	"text/template/parse"
	"time"
)

// TemplateLimits bound what rendering one notification subject or body may
// cost. A template is code a tenant wrote that fleetd runs, on every save and
// on every delivery: without a bound, {{range 100000000000000}}…{{end}}
// fills memory or holds a core forever.
type TemplateLimits struct {
	Timeout   time.Duration // wall time of one render; default 50ms
	MaxOutput int           // bytes one render, and any string it builds, may hold; default 64 KiB
}

// DefaultTemplateLimits are the documented defaults
// (--template-timeout, --template-max-output-bytes).
var DefaultTemplateLimits = TemplateLimits{Timeout: 50 * time.Millisecond, MaxOutput: 64 << 10}

// WithDefaults fills the zero fields from DefaultTemplateLimits.
func (l TemplateLimits) WithDefaults() TemplateLimits {
	if l.Timeout <= 0 {
		l.Timeout = DefaultTemplateLimits.Timeout
	}
	if l.MaxOutput <= 0 {
		l.MaxOutput = DefaultTemplateLimits.MaxOutput
	}
	return l
}

// ErrTemplateBudget is wrapped by the error of a render that went over its
// TemplateLimits. The same template over the same data goes over again, so
// such a render is not retried.
var ErrTemplateBudget = errors.New("template exceeded its budget")

// budgetFunc is the function fleetd calls at the start of every template
// and of every range iteration, so that a render which ran out of time or
// was abandoned stops at its next step instead of running on unseen.
const budgetFunc = "_fleetd_budget"

// budget is one render's account: the waiter sets stopped when it gives up;
// the render sets exceeded to say which limit it met.
type budget struct {
	max      int
	timeout  time.Duration
	steps    atomic.Int64 // loop iterations, template calls, writes
	stopped  atomic.Bool
	exceeded atomic.Pointer[error]
}

// A render is stopped at its timeout only once it has taken busySteps
// steps: one that has taken fewer was held up by a busy machine (the
// scheduler, a collection), not by its own work, and it gets until
// graceTimeouts times the timeout. Loops that run out the budget take
// millions of steps; the default templates take a few dozen.
const (
	busySteps     = 1000
	graceTimeouts = 20
)

func (b *budget) fail(err error) error {
	b.exceeded.CompareAndSwap(nil, &err)
	return err
}

func (b *budget) tooLong() error {
	return b.fail(fmt.Errorf("%w: rendered more than %d bytes", ErrTemplateBudget, b.max))
}

// step is called by the template at every loop iteration and template call.
func (b *budget) step() (string, error) {
	b.steps.Add(1)
	if b.stopped.Load() {
		return "", b.fail(fmt.Errorf("%w: took longer than %v", ErrTemplateBudget, b.timeout))
	}
	return "", nil
}

// measure returns an error if the arguments' text exceeds the output cap;
// each is formatted alone, so no more than one argument is held at once.
func (b *budget) measure(args []any) (int, int, error) {
	total, longest := 0, 0
	for _, a := range args {
		n := len(fmt.Sprint(a))
		total += n + 1
		longest = max(longest, n)
		if total > b.max {
			return 0, 0, b.tooLong()
		}
	}
	return total, longest, nil
}

// capped wraps a builtin that builds a string from its arguments: the
// arguments are measured first, the result after.
func (b *budget) capped(f func(...any) string) func(...any) (string, error) {
	return func(args ...any) (string, error) {
		if _, err := b.step(); err != nil {
			return "", err
		}
		if _, _, err := b.measure(args); err != nil {
			return "", err
		}
		if s := f(args...); len(s) <= b.max {
			return s, nil
		}
		return "", b.tooLong()
	}
}

// printf is fmt.Sprintf refusing formats that could build a string beyond
// the cap: verbs can repeat an argument (%[1]s%[1]s…) and pad it (%9999d),
// so the bound counts both before anything is formatted.
func (b *budget) printf(format string, args ...any) (string, error) {
	if _, err := b.step(); err != nil {
		return "", err
	}
	if len(format) > b.max {
		return "", b.tooLong()
	}
	_, longest, err := b.measure(args)
	if err != nil {
		return "", err
	}
	widest := 0 // the largest width or precision the format may ask for
	for _, f := range strings.FieldsFunc(format, func(r rune) bool { return r < '0' || r > '9' }) {
		if len(f) > 9 {
			return "", b.tooLong()
		}
		var n int
		fmt.Sscan(f, &n)
		widest = max(widest, n)
	}
	if strings.Contains(format, "*") {
		for _, a := range args {
			if n, ok := a.(int); ok {
				widest = max(widest, n, -n)
			}
		}
	}
	// %q and %x may write up to ten bytes for one of the argument's.
	verbs := strings.Count(format, "%")
	if len(format)+verbs*(widest+10*longest+32) > b.max {
		return "", b.tooLong()
	}
	return fmt.Sprintf(format, args...), nil
}

// funcs replaces the builtins that build strings with capped ones.
func (b *budget) funcs() template.FuncMap {
	return template.FuncMap{
		budgetFunc: b.step,
		"printf":   b.printf,
		"print":    b.capped(fmt.Sprint),
		"println":  b.capped(fmt.Sprintln),
		"html":     b.capped(template.HTMLEscaper),
		"js":       b.capped(template.JSEscaper),
		"urlquery": b.capped(template.URLQueryEscaper),
	}
}

// MaxRangeNesting bounds how deep ranges nest, counted through the
// templates a template calls. An error unwinds nested ranges in time
// that grows with the square of their depth (a thousand take seconds), so
// a render stopped deep in them would not stop soon.
const MaxRangeNesting = 32

// instrument checks the shape of t's templates (no recursion, ranges
// nested at most MaxRangeNesting deep) and puts a call of budgetFunc at the
// start of every template and every range body, the only places a
// template can loop.
func instrument(t *template.Template) error {
	call, err := template.New("budget").Funcs(template.FuncMap{budgetFunc: func() string { return "" }}).Parse("{{" + budgetFunc + "}}")
	if err != nil {
		return err
	}
	step := call.Tree.Root.Nodes[0]
	type site struct {
		name  string // the template called
		depth int    // ranges around the call
	}
	deepest := map[string]int{} // each template's own deepest range
	calls := map[string][]site{}
	var walk func(name string, l *parse.ListNode, depth int)
	walk = func(name string, l *parse.ListNode, depth int) {
		if l == nil {
			return
		}
		deepest[name] = max(deepest[name], depth)
		for _, n := range l.Nodes {
			switch n := n.(type) {
			case *parse.IfNode:
				walk(name, n.List, depth)
				walk(name, n.ElseList, depth)
			case *parse.WithNode:
				walk(name, n.List, depth)
				walk(name, n.ElseList, depth)
			case *parse.RangeNode:
				walk(name, n.List, depth+1)
				walk(name, n.ElseList, depth)
				n.List.Nodes = append([]parse.Node{step}, n.List.Nodes...)
			case *parse.ListNode:
				walk(name, n, depth)
			case *parse.TemplateNode:
				calls[name] = append(calls[name], site{n.Name, depth})
			}
		}
	}
	for _, tt := range t.Templates() {
		if tt.Tree == nil || tt.Tree.Root == nil {
			continue
		}
		walk(tt.Name(), tt.Tree.Root, 0)
		tt.Tree.Root.Nodes = append([]parse.Node{step}, tt.Tree.Root.Nodes...)
	}
	// A template's nesting is its own or that of a call plus the callee's.
	nesting := map[string]int{}
	const visiting = -1
	var depth func(name string) (int, error)
	depth = func(name string) (int, error) {
		switch d, ok := nesting[name]; {
		case ok && d == visiting:
			return 0, fmt.Errorf("template %q calls itself, directly or through another; recursion is not allowed", name)
		case ok:
			return d, nil
		}
		nesting[name] = visiting
		d := deepest[name]
		for _, c := range calls[name] {
			cd, err := depth(c.name)
			if err != nil {
				return 0, err
			}
			d = max(d, c.depth+cd)
		}
		nesting[name] = d
		return d, nil
	}
	for _, tt := range t.Templates() {
		d, err := depth(tt.Name())
		if err != nil {
			return err
		}
		if d > MaxRangeNesting {
			return fmt.Errorf("ranges nest %d deep in template %q; at most %d are allowed", d, tt.Name(), MaxRangeNesting)
		}
	}
	return nil
}

// cappedWriter holds a render's output up to the cap; a write beyond it,
// or after the render was abandoned, fails, which ends the render.
type cappedWriter struct {
	b   *budget
	buf strings.Builder
}

func (w *cappedWriter) Write(p []byte) (int, error) {
	if _, err := w.b.step(); err != nil {
		return 0, err
	}
	if w.buf.Len()+len(p) > w.b.max {
		return 0, w.b.tooLong()
	}
	return w.buf.Write(p)
}

// render executes the template text over d within lim. The render runs on
// a goroutine of its own: when the time is up, or ctx ends, render returns
// at once and the abandoned render stops at its next step.
func render(ctx context.Context, lim TemplateLimits, name, text string, d any) (string, error) {
	lim = lim.WithDefaults()
	b := &budget{max: lim.MaxOutput, timeout: lim.Timeout}
	tmpl, err := template.New(name).Funcs(b.funcs()).Parse(text)
	if err != nil {
		return "", err
	}
	if err := instrument(tmpl); err != nil {
		return "", err
	}
	type result struct {
		out string
		err error
	}
	done := make(chan result, 1)
	go func() {
		w := &cappedWriter{b: b}
		err := tmpl.Execute(w, d)
		done <- result{w.buf.String(), err}
	}()
	t := time.NewTimer(lim.Timeout)
	defer t.Stop()
	for waited := 1; ; waited++ {
		select {
		case r := <-done:
			if e := b.exceeded.Load(); e != nil {
				return "", *e // the budget's own words, not text/template's
			}
			return r.out, r.err
		case <-t.C:
			if b.steps.Load() < busySteps && waited < graceTimeouts {
				t.Reset(lim.Timeout)
				continue
			}
			b.stopped.Store(true)
			return "", fmt.Errorf("%w: took longer than %v", ErrTemplateBudget, lim.Timeout)
		case <-ctx.Done():
			b.stopped.Store(true)
			return "", ctx.Err()
		}
	}
}
