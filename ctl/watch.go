package ctl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/fleetd/fleet"
	"github.com/spf13/cobra"
)

// errNotCompleted ends a watch whose action did not complete on every
// device: exit 1, the reason already shown.
var errNotCompleted = errors.New("the action did not complete on every device")

// statusOrder is the lifecycle's order, for showing counts.
var statusOrder = []fleet.ActionStatus{fleet.StatusScheduled, fleet.StatusQueued, fleet.StatusInitiated,
	fleet.StatusProgress, fleet.StatusCompleted, fleet.StatusFailed, fleet.StatusCancelled}

type watchOptions struct {
	interval time.Duration
	timeout  time.Duration
}

// flags adds the watch's flags; timeout names its time limit (dispatch
// has a --timeout of its own).
func (w *watchOptions) flags(c *cobra.Command, timeout string) {
	c.Flags().DurationVar(&w.interval, "interval", 2*time.Second, "how often to ask the server")
	c.Flags().DurationVar(&w.timeout, timeout, 0, "give up watching (exit 1) after this long; 0 waits as long as it takes")
}

// watchedAction is what watch reads of an action.
type watchedAction struct {
	ID             int64                     `json:"id"`
	Action         string                    `json:"action"`
	Targeted       int                       `json:"targeted"`
	Statuses       map[string]int            `json:"statuses"`
	StatusesPhased map[string]map[string]int `json:"statuses_phased"`
	Schedule       *fleet.Schedule           `json:"schedule"`
	Status         fleet.RolloutStatus       `json:"status"`
	PauseReason    string                    `json:"pause_reason"`
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

// watch polls the action until it is final or paused, showing its
// progress, and returns nil only if every device action Completed.
func (a *app) watch(cmd *cobra.Command, id int64, o watchOptions) error {
	c, err := a.connect(cmd.Context())
	if err != nil {
		return err
	}
	if o.interval <= 0 {
		return usagef("--interval must be positive")
	}
	ctx := cmd.Context()
	if o.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.timeout)
		defer cancel()
	}
	out := a.env.Stdout
	tty := a.env.IsTerminal != nil && a.env.IsTerminal(out)
	drawn, last := 0, ""
	tick := time.NewTicker(o.interval)
	defer tick.Stop()
	for {
		var w watchedAction
		err := c.getJSON(ctx, fmt.Sprintf("/api/v1/actions/%d", id), nil, &w)
		if err != nil {
			if ctx.Err() != nil && cmd.Context().Err() == nil {
				fmt.Fprintf(a.env.Stderr, "fleetctl: gave up watching action %d after %s\n", id, o.timeout)
				return errNotCompleted
			}
			return err
		}
		if frame := renderFrame(&w); tty && frame != last {
			last = frame
			if drawn > 0 {
				fmt.Fprintf(out, "\x1b[%dA\x1b[J", drawn)
			}
			io.WriteString(out, frame)
			drawn = strings.Count(frame, "\n")
		} else if line := summaryLine(&w); !tty && line != last {
			fmt.Fprintln(out, line)
			last = line
		}
		pending := w.pending()
		switch {
		case w.Status == fleet.RolloutPaused:
			fmt.Fprintf(a.env.Stderr, "fleetctl: action %d is paused: %s\n", id, w.PauseReason)
			return errNotCompleted
		case pending == 0 && w.Statuses[string(fleet.StatusCompleted)] == w.Targeted && w.Targeted > 0:
			return nil
		case pending == 0:
			fmt.Fprintf(a.env.Stderr, "fleetctl: action %d did not complete on every device: %s\n", id, counts(w.Statuses))
			return errNotCompleted
		}
		select {
		case <-ctx.Done():
			if cmd.Context().Err() != nil {
				return cmd.Context().Err()
			}
			fmt.Fprintf(a.env.Stderr, "fleetctl: gave up watching action %d after %s: %s\n", id, o.timeout, counts(w.Statuses))
			return errNotCompleted
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
