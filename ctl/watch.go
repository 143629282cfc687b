package ctl

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/fleetd/fleet"
	"github.com/spf13/cobra"
)

// statusOrder is the lifecycle's order, for showing counts.
var statusOrder = fleet.ActionStatuses

// watchOptions are the flags of a watch: how often to ask, how long to
// wait, how many failed devices still pass.
type watchOptions struct {
	interval  time.Duration
	timeout   time.Duration
	maxFailed failureBudget
}

// flags adds the watch's flags; timeout names its time limit (dispatch
// has a --timeout of its own).
func (w *watchOptions) flags(c *cobra.Command, timeout string) {
	c.Flags().DurationVar(&w.interval, "interval", 2*time.Second, "how often to ask the server")
	c.Flags().DurationVar(&w.timeout, timeout, 0, "give up watching (exit 5) after this long; 0 waits as long as it takes")
	c.Flags().Var(&w.maxFailed, "max-failed", "how many devices may fail and still exit 0: a count N, or P% of the targets")
}

// failureBudget is --max-failed: a count of devices, or a percentage of
// the targets (which an appended phase can grow, so it is applied to the
// last count read).
type failureBudget struct {
	text    string
	count   int
	percent float64 // when text ends in %
}

func (b *failureBudget) String() string {
	if b.text == "" {
		return "0"
	}
	return b.text
}

func (b *failureBudget) Type() string { return "N|P%" }

func (b *failureBudget) Set(s string) error {
	if pct, ok := strings.CutSuffix(s, "%"); ok {
		p, err := strconv.ParseFloat(pct, 64)
		if err != nil || p < 0 || p > 100 || math.IsNaN(p) {
			return fmt.Errorf("want a count such as 3 or a percentage from 0%% to 100%% such as 5%%, got %q", s)
		}
		*b = failureBudget{text: s, percent: p}
		return nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return fmt.Errorf("want a count such as 3 or a percentage such as 5%%, got %q", s)
	}
	*b = failureBudget{text: s, count: n}
	return nil
}

// allows reports whether failed devices of targeted are within the budget.
func (b *failureBudget) allows(failed, targeted int) bool {
	if strings.HasSuffix(b.text, "%") {
		return float64(failed)*100 <= b.percent*float64(targeted)
	}
	return failed <= b.count
}

// watchEnd ends a watch whose action did not pass: the exit code says
// how (ExitPaused and the others), the message why.
type watchEnd struct {
	code int
	msg  string
}

func (e *watchEnd) Error() string { return e.msg }

// watchedAction is what watch reads of an action.
type watchedAction struct {
	ID             int64                     `json:"id"`
	Action         string                    `json:"action"`
	Targeted       int                       `json:"targeted"`
	Statuses       map[string]int            `json:"statuses"`
	StatusesPhased map[string]map[string]int `json:"statuses_phased"`
	Schedule       *fleet.Schedule           `json:"schedule"`
	NextPhaseIndex *int                      `json:"next_phase_index"`
	Status         fleet.RolloutStatus       `json:"status"`
	PauseReason    string                    `json:"pause_reason"`
	WaitingReason  string                    `json:"waiting_reason"`
}

// pending counts the device actions not final.
func (w *watchedAction) pending() int {
	n := 0
	for s, c := range w.Statuses {
		if !fleet.ActionStatus(s).Final() {
			n += c
		}
	}
	return n
}

// outcome says whether the watch is over: nil while it goes on, else how
// it ended (code ExitOK when the action passed).
func (w *watchedAction) outcome(budget *failureBudget) *watchEnd {
	failed, cancelled := w.Statuses[string(fleet.StatusFailed)], w.Statuses[string(fleet.StatusCancelled)]
	switch {
	case w.Status == fleet.RolloutAborted:
		return &watchEnd{ExitAborted, fmt.Sprintf("action %d: the rollout was aborted: %s", w.ID, counts(w.Statuses))}
	case w.Status == fleet.RolloutPaused:
		return &watchEnd{ExitPaused, fmt.Sprintf("action %d: the rollout is paused: %s", w.ID, w.PauseReason)}
	case w.pending() > 0:
		return nil
	case w.Schedule != nil && !w.Status.Done() && w.NextPhaseIndex != nil && *w.NextPhaseIndex < len(w.Schedule.Phases):
		return nil // a phase is still to trigger, even if it releases no one
	case cancelled > 0:
		return &watchEnd{ExitAborted, fmt.Sprintf("action %d: %d device action(s) cancelled: %s", w.ID, cancelled, counts(w.Statuses))}
	case !budget.allows(failed, w.Targeted):
		return &watchEnd{ExitFailed, fmt.Sprintf("action %d: %d of %d devices failed, more than --max-failed %s allows: %s",
			w.ID, failed, w.Targeted, budget, counts(w.Statuses))}
	}
	return &watchEnd{ExitOK, fmt.Sprintf("action %d: finished: %s", w.ID, counts(w.Statuses))}
}

// watchLine is one line of a watch's -o json output: the action as GET
// answers it, at each change; the last line is the final one, with the
// exit code and why.
type watchLine struct {
	Event    string          `json:"event"` // change or final
	Action   json.RawMessage `json:"action"`
	ExitCode *int            `json:"exit_code,omitempty"`
	Reason   string          `json:"reason,omitempty"`
}

// checkWatchOutput refuses the forms a watch cannot stream: it writes
// JSON lines or text.
func (a *app) checkWatchOutput() error {
	if a.output == "yaml" || a.output == "edn" {
		return usagef("a watch writes text, or JSON lines with -o json; -o %s cannot stream", a.output)
	}
	return nil
}

// watch polls the action until it is over (every device action final, the
// rollout paused or aborted, or the time limit ran out), showing its
// progress, and returns nil only if it passed: every device finished,
// no more failed than the budget allows.
func (a *app) watch(cmd *cobra.Command, id int64, o watchOptions) error {
	if err := a.checkWatchOutput(); err != nil {
		return err
	}
	if o.interval <= 0 {
		return usagef("--interval must be positive")
	}
	c, err := a.connect(cmd.Context())
	if err != nil {
		return err
	}
	ctx := cmd.Context()
	if o.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.timeout)
		defer cancel()
	}
	out := a.env.Stdout
	tty := a.env.IsTerminal != nil && a.env.IsTerminal(out)
	enc := json.NewEncoder(out)
	drawn, last := 0, ""
	var body []byte
	var w watchedAction
	end := func(e *watchEnd) error {
		if a.output == "json" {
			code := e.code
			enc.Encode(watchLine{Event: "final", Action: body, ExitCode: &code, Reason: e.msg})
		}
		if e.code == ExitOK {
			return nil
		}
		return e
	}
	timedOut := func() error {
		msg := fmt.Sprintf("action %d: gave up watching after %s", id, o.timeout)
		if body != nil {
			msg += ": " + counts(w.Statuses)
			if w.WaitingReason != "" {
				msg += "; waiting: " + w.WaitingReason
			}
		}
		return end(&watchEnd{ExitTimeout, msg})
	}
	tick := time.NewTicker(o.interval)
	defer tick.Stop()
	for {
		b, err := c.call(ctx, request{method: "GET", path: fmt.Sprintf("/api/v1/actions/%d", id)})
		if err != nil {
			if ctx.Err() != nil && cmd.Context().Err() == nil {
				return timedOut()
			}
			return err
		}
		w = watchedAction{}
		if err := json.Unmarshal(b, &w); err != nil {
			return err
		}
		body = bytes.TrimSpace(b)
		switch {
		case a.output == "json":
			if string(body) != last {
				last = string(body)
				enc.Encode(watchLine{Event: "change", Action: body})
			}
		case tty:
			if frame := renderFrame(&w); frame != last {
				last = frame
				if drawn > 0 {
					fmt.Fprintf(out, "\x1b[%dA\x1b[J", drawn)
				}
				io.WriteString(out, frame)
				drawn = strings.Count(frame, "\n")
			}
		default:
			if line := summaryLine(&w); line != last {
				fmt.Fprintln(out, line)
				last = line
			}
		}
		if e := w.outcome(&o.maxFailed); e != nil {
			return end(e)
		}
		select {
		case <-ctx.Done():
			if cmd.Context().Err() != nil {
				return cmd.Context().Err()
			}
			return timedOut()
		case <-tick.C:
		}
	}
}

// counts is "Completed 7, Failed 1" in lifecycle order.
func counts(m map[string]int) string {
	var parts []string
	for _, s := range statusOrder {
		if n := m[string(s)]; n > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", s, n))
		}
	}
	if len(parts) == 0 {
		return "no device actions"
	}
	return strings.Join(parts, ", ")
}

func finalOf(m map[string]int) (final, total int) {
	for s, n := range m {
		total += n
		if fleet.ActionStatus(s).Final() {
			final += n
		}
	}
	return final, total
}

// summaryLine is one line per change, for logs.
func summaryLine(w *watchedAction) string {
	final, _ := finalOf(w.Statuses)
	line := fmt.Sprintf("action %d %s: %d/%d final: %s", w.ID, w.Action, final, w.Targeted, counts(w.Statuses))
	if w.Status != "" {
		line += "; rollout " + string(w.Status)
		if w.PauseReason != "" {
			line += ": " + w.PauseReason
		}
		if w.WaitingReason != "" {
			line += "; waiting: " + w.WaitingReason
		}
	}
	return line
}

// renderFrame draws the action as progress bars: one per status, then one
// per phase of a rollout, each bar the share of the targets.
func renderFrame(w *watchedAction) string {
	var b strings.Builder
	b.WriteString(summaryLine(w) + "\n")
	for _, s := range statusOrder {
		if n := w.Statuses[string(s)]; n > 0 {
			fmt.Fprintf(&b, "  %-10s %s %d/%d\n", s, bar(n, w.Targeted), n, w.Targeted)
		}
	}
	if w.Schedule == nil {
		return b.String()
	}
	keys := make([]int, 0, len(w.StatusesPhased))
	for k := range w.StatusesPhased {
		if i, err := strconv.Atoi(k); err == nil {
			keys = append(keys, i)
		}
	}
	sort.Ints(keys)
	for _, i := range keys {
		m := w.StatusesPhased[strconv.Itoa(i)]
		name := "unphased"
		if i >= 0 && i < len(w.Schedule.Phases) {
			name = fmt.Sprintf("phase %d %s", i, w.Schedule.Phases[i].Name)
		}
		final, total := finalOf(m)
		fmt.Fprintf(&b, "  %-20s %s %d/%d final (%s)\n", name, bar(final, total), final, total, counts(m))
	}
	return b.String()
}

func bar(n, of int) string {
	const width = 24
	full := 0
	if of > 0 {
		full = n * width / of
	}
	return strings.Repeat("█", full) + strings.Repeat("░", width-full)
}
