package ctl

import (
	"fmt"
	"io"
	"time"
)

// progress shows a transfer on stderr: a bar with bytes and rate redrawn
// on a terminal, one line at the end elsewhere.
type progress struct {
	w      io.Writer
	tty    bool
	label  string
	total  int64 // -1 when unknown
	done   int64
	start  time.Time
	drawn  time.Time
	offset int64 // bytes there before this transfer (a resumed download)
}

func (a *app) newProgress(label string, total, offset int64) *progress {
	tty := a.env.IsTerminal != nil && a.env.IsTerminal(a.env.Stderr)
	return &progress{w: a.env.Stderr, tty: tty, label: label, total: total, done: offset, offset: offset, start: time.Now()}
}

func (p *progress) add(n int) {
	p.done += int64(n)
	if p.tty && time.Since(p.drawn) >= 100*time.Millisecond {
		p.drawn = time.Now()
		fmt.Fprintf(p.w, "\r\x1b[K%s", p.line())
	}
}

func (p *progress) line() string {
	rate := float64(p.done-p.offset) / time.Since(p.start).Seconds()
	if p.total > 0 {
		pct := int(100 * p.done / p.total)
		return fmt.Sprintf("%s %s %3d%% %s/%s %s/s", p.label, bar(int(p.done), int(p.total)), pct, size(p.done), size(p.total), size(int64(rate)))
	}
	return fmt.Sprintf("%s %s %s/s", p.label, size(p.done), size(int64(rate)))
}

// finish writes the last line: what moved, in how long, how fast.
func (p *progress) finish(verb string) {
	if p.tty {
		fmt.Fprint(p.w, "\r\x1b[K")
	}
	took := time.Since(p.start)
	rate := float64(p.done-p.offset) / took.Seconds()
	fmt.Fprintf(p.w, "%s %s: %s in %s (%s/s)\n", verb, p.label, size(p.done-p.offset), took.Round(time.Millisecond), size(int64(rate)))
}

// reader counts what r reads.
func (p *progress) reader(r io.Reader) io.Reader { return &progressReader{r, p} }

type progressReader struct {
	r io.Reader
	p *progress
}

func (r *progressReader) Read(b []byte) (int, error) {
	n, err := r.r.Read(b)
	r.p.add(n)
	return n, err
}

// size says a byte count as a person reads it: 512 B, 3.4 MiB.
func size(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
