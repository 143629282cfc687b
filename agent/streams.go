package agent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/fleetd/fleet/mqtt"
)

// The streams the agent sends, named as the uplink agent names them, so
// that what reads uplink's streams reads the agent's.
const (
	logsStream  = "logs"
	statsStream = "uplink_system_stats"
)

// maxBatch is how many points of a stream go in one publish at most; a
// batch is sent when it is full or --flush-interval after its first point.
const maxBatch = 100

// point is one data point of a stream: sequence and timestamp, and its
// fields (docs/device-protocol.md, Messages).
type point map[string]any

// batcher collects points per stream and hands batches to the stream
// publisher.
type batcher struct {
	a      *Agent
	in     chan streamPoint
	out    chan outgoing
	seq    map[string]int64
	flushT time.Duration
}

type streamPoint struct {
	stream string
	p      point
}

// startStreams starts what the configuration asks for: a followed log
// file, the journal, system statistics; and the batcher and publisher
// they feed. Streams have a publisher of their own, so a backlog of logs
// never holds up a status report.
func (a *Agent) startStreams(ctx context.Context) {
	if a.cfg.LogFile == "" && !a.cfg.Journald && a.cfg.StatsInterval == 0 {
		return
	}
	b := &batcher{a: a, in: make(chan streamPoint, 1024), out: make(chan outgoing, 16), seq: map[string]int64{}, flushT: a.cfg.FlushInterval}
	a.goStream(func() { a.publishLoop(ctx, b.out) })
	a.goStream(func() { b.run(ctx) })
	if a.cfg.LogFile != "" {
		a.goStream(func() { a.followFile(ctx, a.cfg.LogFile, b) })
	}
	if a.cfg.Journald {
		a.goStream(func() { a.followJournal(ctx, b) })
	}
	if a.cfg.StatsInterval > 0 {
		a.goStream(func() { a.sendStats(ctx, b) })
	}
}

func (a *Agent) goStream(f func()) {
	a.wg.Add(1)
	go func() { defer a.wg.Done(); f() }()
}

// add queues a point, waiting while the batcher is behind (a log that
// grows faster than it can be sent is read more slowly, not dropped).
func (b *batcher) add(ctx context.Context, stream string, p point) {
	select {
	case b.in <- streamPoint{stream, p}:
	case <-ctx.Done():
	}
}

func (b *batcher) run(ctx context.Context) {
	pending := map[string][]point{}
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	flush := func(stream string) {
		pts := pending[stream]
		if len(pts) == 0 {
			return
		}
		delete(pending, stream)
		payload, err := json.Marshal(pts)
		if err != nil {
			b.a.log.Error("a stream point cannot be encoded", "stream", stream, "err", err)
			return
		}
		select {
		case b.out <- outgoing{mqtt.StreamTopic(b.a.cfg.Tenant, b.a.cfg.Device, stream), payload}:
		case <-ctx.Done():
		}
	}
	for {
		select {
		case sp := <-b.in:
			b.seq[sp.stream]++
			sp.p["sequence"] = b.seq[sp.stream]
			if _, ok := sp.p["timestamp"]; !ok {
				sp.p["timestamp"] = b.a.now().UnixMilli()
			}
			if len(pending) == 0 {
				timer.Reset(b.flushT)
			}
			pending[sp.stream] = append(pending[sp.stream], sp.p)
			if len(pending[sp.stream]) >= maxBatch {
				flush(sp.stream)
			}
		case <-timer.C:
			for stream := range pending {
				flush(stream)
			}
		case <-ctx.Done():
			return
		}
	}
}

// logEntry is a line of a log in the uplink agent's LogEntry shape: level
// as a name, log_timestamp in microseconds (as text), tag, message and
// the line as read.
func logEntry(level, microseconds, tag, message, line string) point {
	return point{"level": level, "log_timestamp": microseconds, "tag": tag, "message": message, "line": line}
}

// followPoll is how often a followed file is looked at for new lines.
const followPoll = 200 * time.Millisecond

// followFile sends each new line of path to the logs stream, from the end
// of the file as it is at start; a file that is replaced (rotated) or
// truncated is read again from its beginning.
func (a *Agent) followFile(ctx context.Context, path string, b *batcher) {
	tag := filepath.Base(path)
	var f *os.File
	var r *bufio.Reader
	var partial []byte
	defer func() {
		if f != nil {
			f.Close()
		}
	}()
	open := func(fromEnd bool) {
		if f != nil {
			f.Close()
			f = nil
		}
		nf, err := os.Open(path)
		if err != nil {
			return
		}
		if fromEnd {
			nf.Seek(0, io.SeekEnd)
		}
		f, r, partial = nf, bufio.NewReader(nf), nil
	}
	open(true)
	if f == nil {
		a.log.Warn("the log file cannot be read yet; waiting for it", "file", path)
	}
	tick := time.NewTicker(followPoll)
	defer tick.Stop()
	for {
		if f != nil {
			for {
				line, err := r.ReadBytes('\n')
				partial = append(partial, line...)
				if err != nil {
					break
				}
				text := strings.TrimRight(string(partial), "\r\n")
				partial = nil
				now := a.now()
				p := logEntry("Info", strconv.FormatInt(now.UnixMicro(), 10), tag, text, text)
				p["timestamp"] = now.UnixMilli()
				b.add(ctx, logsStream, p)
			}
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return
		}
		// Rotated (another file at the path) or truncated: start again
		// from the top of what is there now.
		fi, err := os.Stat(path)
		switch {
		case err != nil:
		case f == nil:
			open(false)
		default:
			cur, serr := f.Stat()
			pos, _ := f.Seek(0, io.SeekCurrent)
			if serr != nil || !os.SameFile(fi, cur) || fi.Size() < pos {
				open(false)
			}
		}
	}
}

// journalLevels are syslog priorities as the uplink agent names them.
var journalLevels = []string{"Emergency", "Alert", "Critical", "Error", "Warn", "Notice", "Info", "Debug"}

// followJournal sends the journal's new entries to the logs stream, read
// from `journalctl -f -o json`, as the uplink agent does.
func (a *Agent) followJournal(ctx context.Context, b *batcher) {
	cmd := exec.CommandContext(ctx, "journalctl", "-f", "-o", "json", "-n", "0")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.StdoutPipe()
	if err == nil {
		err = cmd.Start()
	}
	if err != nil {
		a.log.Warn("the journal cannot be followed (--journald)", "err", err)
		return
	}
	defer cmd.Wait()
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var e struct {
			Priority string `json:"PRIORITY"`
			Realtime string `json:"__REALTIME_TIMESTAMP"`
			Tag      string `json:"SYSLOG_IDENTIFIER"`
			Message  any    `json:"MESSAGE"` // a string, or bytes as numbers
		}
		line := sc.Bytes()
		if json.Unmarshal(line, &e) != nil {
			continue
		}
		level := "Info"
		if n, err := strconv.Atoi(e.Priority); err == nil && n >= 0 && n < len(journalLevels) {
			level = journalLevels[n]
		}
		msg, _ := e.Message.(string)
		p := logEntry(level, e.Realtime, e.Tag, msg, string(line))
		if us, err := strconv.ParseInt(e.Realtime, 10, 64); err == nil {
			p["timestamp"] = us / 1000
		}
		b.add(ctx, logsStream, p)
	}
	if err := sc.Err(); err != nil && !errors.Is(err, os.ErrClosed) && ctx.Err() == nil {
		a.log.Warn("reading the journal stopped", "err", err)
	}
}

// sendStats sends the system's statistics every --stats-interval, in the
// fields of the uplink agent's uplink_system_stats.
func (a *Agent) sendStats(ctx context.Context, b *batcher) {
	tick := time.NewTicker(a.cfg.StatsInterval)
	defer tick.Stop()
	for {
		if p, err := systemStats(); err != nil {
			a.log.Warn("system statistics cannot be read", "err", err)
		} else {
			b.add(ctx, statsStream, p)
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return
		}
	}
}

// systemStats reads /proc: memory in bytes, load averages, uptime in
// seconds, the number of processes and the kernel's version.
func systemStats() (point, error) {
	p := point{}
	mem, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return nil, err
	}
	kb := map[string]int64{}
	for _, line := range strings.Split(string(mem), "\n") {
		name, rest, ok := strings.Cut(line, ":")
		if f := strings.Fields(rest); ok && len(f) > 0 {
			n, _ := strconv.ParseInt(f[0], 10, 64)
			kb[name] = n * 1024
		}
	}
	p["total_memory"], p["available_memory"] = kb["MemTotal"], kb["MemAvailable"]
	p["used_memory"] = kb["MemTotal"] - kb["MemAvailable"]
	if load, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(load)); len(f) >= 3 {
			for i, name := range []string{"load_avg_one", "load_avg_five", "load_avg_fifteen"} {
				p[name], _ = strconv.ParseFloat(f[i], 64)
			}
		}
	}
	if up, err := os.ReadFile("/proc/uptime"); err == nil {
		if f := strings.Fields(string(up)); len(f) > 0 {
			s, _ := strconv.ParseFloat(f[0], 64)
			p["uptime"] = int64(s)
		}
	}
	if entries, err := os.ReadDir("/proc"); err == nil {
		n := 0
		for _, e := range entries {
			if _, err := strconv.Atoi(e.Name()); err == nil {
				n++
			}
		}
		p["no_processes"] = n
	}
	if v, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		p["kernel_version"] = string(bytes.TrimSpace(v))
	}
	return p, nil
}
