package ctl

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

// Stream history and logs (docs/telemetry.md).

// rangeFlags are --since, --from and --to of a read of history.
type rangeFlags struct {
	since    time.Duration
	from, to string
}

func (r *rangeFlags) add(c *cobra.Command, since time.Duration) {
	c.Flags().DurationVar(&r.since, "since", since, "read from this `DURATION` ago")
	c.Flags().StringVar(&r.from, "from", "", "read from this `TIME` (RFC 3339 or epoch milliseconds; instead of --since)")
	c.Flags().StringVar(&r.to, "to", "", "read up to this `TIME` (RFC 3339 or epoch milliseconds), exclusive")
}

// query sets from and to on q.
func (r *rangeFlags) query(q url.Values) url.Values {
	if r.from != "" {
		q.Set("from", r.from)
	} else if r.since > 0 {
		q.Set("from", strconv.FormatInt(time.Now().Add(-r.since).UnixMilli(), 10))
	}
	setIf(q, "to", r.to)
	return q
}

var pointCols = cols("TIMESTAMP", "timestamp", "SEQUENCE", "sequence", "DATA", "data", "RECEIVED", "received_at")

// historyCmds are fleetctl streams list, points and aggregate.
func (a *app) historyCmds() []*cobra.Command {
	list := &cobra.Command{
		Use:               "list DEVICE",
		Short:             "The streams a device has points of, with how many and their first and last times",
		Args:              exactArgs(1),
		ValidArgsFunction: a.completeDevices,
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.get(cmd, "/api/v1/devices/"+esc(args[0])+"/streams", nil,
				view{items: "streams", cols: cols("NAME", "name", "POINTS", "points", "FIRST", "first_timestamp", "LAST", "last_timestamp")})
		},
	}
	var pr rangeFlags
	var order, cursor string
	var limit int
	points := &cobra.Command{
		Use:   "points DEVICE STREAM",
		Short: "A page of a stream's points kept in history, oldest first; --cursor reads the next",
		Long: `Prints a page of the stream's points and, when there are more, the cursor
of the next page on standard error (with -o json, yaml or edn, it is the
answer's next). -o csv writes a column per data field (data.temperature).`,
		Args:              exactArgs(2),
		ValidArgsFunction: a.completeDevices,
		RunE: func(cmd *cobra.Command, args []string) error {
			q := pr.query(url.Values{})
			setIf(q, "order", order)
			setIf(q, "cursor", cursor)
			if limit > 0 {
				q.Set("limit", strconv.Itoa(limit))
			}
			path := "/api/v1/devices/" + esc(args[0]) + "/streams/" + esc(args[1]) + "/points"
			if a.output != "table" && a.output != "csv" {
				return a.get(cmd, path, q, view{items: "points", cols: pointCols})
			}
			c, err := a.connect(cmd.Context())
			if err != nil {
				return err
			}
			body, err := c.call(cmd.Context(), request{method: "GET", path: path, query: q})
			if err != nil {
				return err
			}
			if err := a.print(body, view{items: "points", cols: pointCols}); err != nil {
				return err
			}
			var page struct{ Next *string }
			if json.Unmarshal(body, &page) == nil && page.Next != nil {
				fmt.Fprintf(cmd.ErrOrStderr(), "more: --cursor %s\n", *page.Next)
			}
			return nil
		},
	}
	pr.add(points, 0)
	points.Flags().StringVar(&order, "order", "", "asc (default) or desc")
	points.Flags().StringVar(&cursor, "cursor", "", "the `CURSOR` of the page to read, as the last page gave it")
	points.Flags().IntVar(&limit, "limit", 0, "`N` points a page, 1 to 1000 (the server's default is 50)")

	var ar rangeFlags
	var field, fn, interval, by, group string
	var meta []string
	aggregate := &cobra.Command{
		Use:   "aggregate [DEVICE] STREAM --field FIELD",
		Short: "A numeric field of a device's stream, or of the fleet's (no DEVICE), aggregated in buckets aligned to UTC",
		Long: `Aggregates FIELD with --fn (avg, min, max, sum, count, last) in buckets of
--interval (30s, 5m, 1h, 7d). Without DEVICE, over every device of the
tenant, or those whose metadata matches each --metadata KEY=VALUE and that
are in --group; --by device gives one series per device.`,
		Args:              rangeArgs(1, 2),
		ValidArgsFunction: a.completeDevices,
		RunE: func(cmd *cobra.Command, args []string) error {
			if field == "" {
				return usagef("aggregate needs --field")
			}
			q := ar.query(url.Values{"field": {field}})
			setIf(q, "fn", fn)
			setIf(q, "interval", interval)
			bucketCols := cols("START", "start", "VALUE", "value", "COUNT", "count")
			if len(args) == 2 {
				return a.get(cmd, "/api/v1/devices/"+esc(args[0])+"/streams/"+esc(args[1])+"/aggregate", q, view{items: "buckets", cols: bucketCols})
			}
			for _, m := range meta {
				k, v, ok := strings.Cut(m, "=")
				if !ok || k == "" {
					return usagef("--metadata takes KEY=VALUE, not %q", m)
				}
				q.Set("metadata."+k, v)
			}
			setIf(q, "by", by)
			setIf(q, "group", group)
			v := view{items: "buckets", cols: bucketCols}
			if by == "device" {
				v = view{items: "series", cols: cols("DEVICE", "device_id", "BUCKETS", "buckets"), each: "buckets"}
			}
			return a.get(cmd, "/api/v1/streams/"+esc(args[0])+"/aggregate", q, v)
		},
	}
	ar.add(aggregate, 24*time.Hour)
	aggregate.Flags().StringVar(&field, "field", "", "the numeric data `FIELD` to aggregate")
	aggregate.Flags().StringVar(&fn, "fn", "", "avg (default), min, max, sum, count or last")
	aggregate.Flags().StringVar(&interval, "interval", "", "bucket length: under a minute in seconds (raw points, 6h at most), whole minutes or hours (rollups), or days like 7d; the server's default is 1h")
	aggregate.Flags().StringArrayVar(&meta, "metadata", nil, "fleet-wide: only devices whose metadata has `KEY=VALUE`; repeatable")
	aggregate.Flags().StringVar(&by, "by", "", "fleet-wide: device, for one series per device")
	aggregate.Flags().StringVar(&group, "group", "", "fleet-wide: only the devices of the group `NAME`")
	return []*cobra.Command{list, points, aggregate}
}

// logsCmd is fleetctl logs DEVICE.
func (a *app) logsCmd() *cobra.Command {
	var r rangeFlags
	var level, contains string
	var follow bool
	var limit int
	c := &cobra.Command{
		Use:   "logs DEVICE",
		Short: "A device's log lines (its logs stream, as the uplink agent sends it); -f follows new lines",
		Long: `Prints the device's log lines of the last --since (1h by default), oldest
first, at --level or above and containing --grep; with -f, goes on printing
lines as they arrive until interrupted. -o json prints each line as a JSON
object, one a line.`,
		Args:              exactArgs(1),
		ValidArgsFunction: a.completeDevices,
		RunE: func(cmd *cobra.Command, args []string) error {
			q := r.query(url.Values{})
			setIf(q, "level", level)
			setIf(q, "q", contains)
			if limit > 0 {
				q.Set("limit", strconv.Itoa(limit))
			}
			path := "/api/v1/devices/" + esc(args[0]) + "/logs"
			cl, err := a.connect(cmd.Context())
			if err != nil {
				return err
			}
			if !follow {
				var page struct{ Logs []json.RawMessage }
				if err := cl.getJSON(cmd.Context(), path, q, &page); err != nil {
					return err
				}
				for _, l := range page.Logs {
					a.printLog(l)
				}
				return nil
			}
			q.Set("follow", "true")
			resp, err := cl.send(cmd.Context(), request{method: "GET", path: path, query: q, accept: "text/event-stream"})
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			sc := bufio.NewScanner(resp.Body)
			sc.Buffer(make([]byte, 64<<10), 1<<20)
			for sc.Scan() {
				if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
					a.printLog(json.RawMessage(data))
				}
			}
			if cmd.Context().Err() != nil {
				return nil // interrupted
			}
			return sc.Err()
		},
	}
	r.add(c, time.Hour)
	c.Flags().StringVar(&level, "level", "", "only lines at this `LEVEL` or above: trace, debug, info, warn, error, critical")
	c.Flags().StringVar(&contains, "grep", "", "only lines whose message, tag or line contains `TEXT`, ignoring case")
	c.Flags().BoolVarP(&follow, "follow", "f", false, "go on printing lines as they arrive")
	c.Flags().IntVar(&limit, "limit", 0, "at most `N` lines, 1 to 1000 (the server's default is 100)")
	return c
}

// printLog prints a log line: as it came with -o json, else as text.
func (a *app) printLog(raw json.RawMessage) {
	if a.output == "json" {
		fmt.Fprintf(a.env.Stdout, "%s\n", raw)
		return
	}
	var l struct {
		Timestamp                 time.Time
		Level, Tag, Message, Line string
	}
	if json.Unmarshal(raw, &l) != nil {
		return
	}
	where := l.Tag
	if l.Line != "" {
		where += " " + l.Line
	}
	fmt.Fprintf(a.env.Stdout, "%s %-5s %s: %s\n", l.Timestamp.Format("2006-01-02T15:04:05.000Z07:00"), strings.ToUpper(l.Level), where, l.Message)
}
