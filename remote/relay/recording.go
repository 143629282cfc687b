package relay

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/blob"
	"github.com/fleetd/fleet/remote"
)

// Recording (docs/agent.md, Recording): a shell session of a tenant that
// records them has its output written as an asciicast v2 recording
// (https://docs.asciinema.org/manual/asciicast/v2/) while it is relayed,
// into a file of the replica's spool directory through a small buffer, and
// streamed from that file into the blob store when the session ends: a
// recorded session holds recordingBuffer bytes in memory, whatever the
// store (an S3 upload holds a part of megabytes while it runs, which a
// session open for hours would otherwise hold as long). The terminal's size
// changes are "r" events. What the operator types is not recorded: a
// terminal echoes what should be seen, and what it does not echo (a
// password asked for by sudo) must not be kept. At Limits.RecordingMax
// bytes a marker ("m") event says the recording stops there; the session
// goes on. Until the session ends the recording cannot be read.
//
// So that a replica that dies loses little of it, every
// Limits.RecordingFlush what the spool file gained since goes to the blob
// store as a part of its own (partKey, named by its offset; whole events,
// nothing when nothing was output). A session that ends on its replica
// stores the whole file as the recording and removes the parts; one
// whose replica was lost (heartbeat.go) keeps its parts, and they are
// served one after the other as its recording, as they are for a session
// whose whole file the store refused when it ended (finish). What is lost is what was
// output since the last part stored: at most Limits.RecordingFlush, and
// the time one part's upload takes.

// recordingBuffer is what a recorded session holds of its recording
// between writes to its spool file.
const recordingBuffer = 8 << 10

// recordingsPrefix holds every recording, a folder a tenant.
const recordingsPrefix = "remote-recordings"

// recordingKey is where session id of tenant keeps its recording.
func recordingKey(tenant, id string) string { return recordingsPrefix + "/" + tenant + "/" + id }

// partsPrefix holds the parts of open sessions' recordings, a folder a
// session.
const partsPrefix = "remote-recording-parts"

// partsOf is the folder of session id's parts.
func partsOf(tenant, id string) string { return partsPrefix + "/" + tenant + "/" + id }

// partKey is the part of session id's recording that begins at offset:
// the names sort as the offsets do.
func partKey(tenant, id string, offset int64) string {
	return fmt.Sprintf("%s/%012d", partsOf(tenant, id), offset)
}

// spoolPattern names the spool files (os.CreateTemp).
const spoolPattern = "recording-*.cast"

type recorder struct {
	mu         sync.Mutex
	f          *os.File
	w          *bufio.Writer
	started    time.Time
	title      string
	header     bool // written
	cols, rows int
	size, max  int64
	stopped    bool   // at the cap, or the file failed: nothing more is written
	closed     bool   // finish was called
	partial    []byte // an incomplete UTF-8 sequence that ended the last output
	err        error  // the write that failed

	// Parts (flush): one upload at a time, under upload.
	upload  sync.Mutex
	timer   *time.Timer
	flushed int64    // the bytes of the file stored as parts
	parts   []string // their keys
}

// record starts s's recording, or returns nil (and logs why) when its
// spool file cannot be made.
func (h *Hub) record(s *Session) *recorder {
	if err := os.MkdirAll(h.Spool, 0o700); err != nil {
		h.logRecording(s, err)
		return nil
	}
	f, err := os.CreateTemp(h.Spool, spoolPattern)
	if err != nil {
		h.logRecording(s, err)
		return nil
	}
	r := &recorder{f: f, w: bufio.NewWriterSize(f, recordingBuffer), started: time.Now(), cols: 80, rows: 24,
		max: h.Limits.RecordingMax, title: fmt.Sprintf("shell on %s by %s", s.DeviceID, s.UserName)}
	r.timer = time.AfterFunc(h.Limits.RecordingFlush, func() {
		r.flush(h, s)
		r.mu.Lock()
		if !r.closed {
			r.timer.Reset(h.Limits.RecordingFlush)
		}
		r.mu.Unlock()
	})
	return r
}

// flush stores what the spool file gained since the last part as a new
// part, read back from the file: whole events, as the buffer is flushed
// under mu. A part that cannot be stored is tried again, with what came
// after it, at the next flush.
func (r *recorder) flush(h *Hub, s *Session) {
	r.upload.Lock()
	defer r.upload.Unlock()
	r.mu.Lock()
	closed := r.closed
	r.mu.Unlock()
	if !closed {
		r.storePart(h, s)
	}
}

// storePart stores what the spool file gained since the last part as a
// new part (under upload), and reports whether the parts now hold all of
// it.
func (r *recorder) storePart(h *Hub, s *Session) bool {
	r.mu.Lock()
	if r.err != nil {
		r.mu.Unlock()
		return false
	}
	if err := r.w.Flush(); err != nil {
		r.stopped, r.err = true, err
		r.mu.Unlock()
		return false
	}
	end := r.size
	r.mu.Unlock()
	if end == r.flushed {
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	key := partKey(s.Tenant, s.ID, r.flushed)
	if err := h.put(ctx, key, io.NewSectionReader(r.f, r.flushed, end-r.flushed)); err != nil {
		h.logRecording(s, err)
		return false
	}
	r.flushed = end
	r.parts = append(r.parts, key)
	return true
}

// put stores what src reads under key.
func (h *Hub) put(ctx context.Context, key string, src io.Reader) error {
	p, err := h.Blobs.Put(ctx, key, src)
	if err != nil {
		return err
	}
	if err = p.Commit(ctx); err != nil {
		p.Abort(ctx)
	}
	return err
}

func (h *Hub) logRecording(s *Session, err error) {
	if h.Logger != nil {
		h.Logger.Error("a remote session's recording could not be stored", "session", s.ID, "err", err)
	}
}

// removeSpool removes the spool files a run that died left behind.
func (h *Hub) removeSpool() {
	old, _ := filepath.Glob(filepath.Join(h.Spool, spoolPattern))
	for _, f := range old {
		os.Remove(f)
	}
}

// message records what the relay passes: the device's bytes as output,
// the operator's resize controls as "r" events; nothing else.
func (r *recorder) message(fromDevice, binary bool, b []byte) {
	switch {
	case fromDevice && binary:
		r.mu.Lock()
		defer r.mu.Unlock()
		whole := b
		if len(r.partial) > 0 {
			whole = append(r.partial, b...)
		}
		whole, rest := splitUTF8(whole)
		r.partial = append(r.partial[:0:0], rest...)
		if len(whole) > 0 {
			r.event("o", string(whole))
		}
	case !fromDevice && !binary:
		var c remote.Control
		if json.Unmarshal(b, &c) != nil || c.Type != remote.TypeResize || c.Cols <= 0 || c.Rows <= 0 {
			return
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if !r.header {
			r.cols, r.rows = c.Cols, c.Rows // the header says it
			return
		}
		r.event("r", strconv.Itoa(c.Cols)+"x"+strconv.Itoa(c.Rows))
	}
}

// splitUTF8 holds back an incomplete UTF-8 sequence at b's end: the
// device's reads cut characters in two, and the event's JSON string must
// not replace each half.
func splitUTF8(b []byte) (whole, rest []byte) {
	for i := 1; i <= utf8.UTFMax-1 && i <= len(b); i++ {
		c := b[len(b)-i]
		if c < utf8.RuneSelf {
			break
		}
		if utf8.RuneStart(c) {
			if !utf8.FullRune(b[len(b)-i:]) {
				return b[:len(b)-i], b[len(b)-i:]
			}
			break
		}
	}
	return b, nil
}

// event writes one event line, the header before the first (under mu).
func (r *recorder) event(kind, data string) {
	if r.stopped || r.closed {
		return
	}
	if !r.header {
		h, _ := json.Marshal(map[string]any{"version": 2, "width": r.cols, "height": r.rows,
			"timestamp": r.started.Unix(), "title": r.title})
		r.write(append(h, '\n'))
		r.header = true
	}
	at := time.Since(r.started).Seconds()
	line := eventLine(at, kind, data)
	if r.size+int64(len(line)) > r.max {
		r.write(eventLine(at, "m", fmt.Sprintf("fleetd stopped recording here: the recording reached its cap of %d bytes (--remote-recording-max)", r.max)))
		r.stopped = true
		return
	}
	r.write(line)
}

func eventLine(at float64, kind, data string) []byte {
	d, _ := json.Marshal(data)
	return fmt.Appendf(nil, "[%s, %q, %s]\n", strconv.FormatFloat(at, 'f', 6, 64), kind, d)
}

func (r *recorder) write(b []byte) {
	n, err := r.w.Write(b)
	r.size += int64(n)
	if err != nil {
		r.stopped, r.err = true, err
	}
}

// finish ends the recording and streams it from its spool file into the
// blob store, removes its parts, and returns its size: 0 when there is
// none (nothing was output, or nothing of it could be stored). When the
// whole file cannot be stored, what the parts lack is stored as a last
// part, and the parts are the recording, as a lost session's are: served
// one after the other, removed with the retention. Its size is then what
// they hold: all of it, or what was stored before the store failed.
func (r *recorder) finish(h *Hub, s *Session) int64 {
	r.timer.Stop()
	r.upload.Lock() // a part being stored is, before the parts go
	defer r.upload.Unlock()
	r.mu.Lock()
	if len(r.partial) > 0 && r.header {
		r.event("o", string(r.partial))
	}
	r.closed = true
	empty, size, err := !r.header, r.size, r.err
	if err == nil {
		err = r.w.Flush()
	}
	r.mu.Unlock()
	defer func() {
		r.f.Close()
		os.Remove(r.f.Name())
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if !empty && err == nil {
		if _, err = r.f.Seek(0, io.SeekStart); err == nil {
			err = h.put(ctx, recordingKey(s.Tenant, s.ID), r.f)
		}
	}
	if err != nil {
		h.logRecording(s, err)
		if empty {
			return 0
		}
		r.storePart(h, s)
		return r.flushed
	}
	for _, key := range r.parts {
		if err := h.Blobs.Delete(ctx, key); err != nil && !errors.Is(err, blob.ErrNotFound) {
			h.logRecording(s, err) // the retention removes it
		}
	}
	if empty {
		return 0
	}
	return size
}

// partsSize is the size of what session id's parts hold: the last one's
// offset and size (they are stored in order, each where the one before
// ended); 0 when there are none.
func (h *Hub) partsSize(ctx context.Context, tenant, id string) int64 {
	parts, err := h.partKeys(ctx, tenant, id)
	if err != nil || len(parts) == 0 {
		return 0
	}
	last := parts[len(parts)-1]
	o, err := h.Blobs.Open(ctx, last)
	if err != nil {
		return 0
	}
	defer o.Close()
	off, _ := strconv.ParseInt(last[strings.LastIndexByte(last, '/')+1:], 10, 64)
	return off + o.Size()
}

// partKeys lists the keys of session id's parts in order.
func (h *Hub) partKeys(ctx context.Context, tenant, id string) ([]string, error) {
	if h.Blobs == nil {
		return nil, nil
	}
	var keys []string
	err := h.Blobs.Walk(ctx, partsOf(tenant, id), func(key string, _ time.Time) error {
		keys = append(keys, key)
		return nil
	})
	sort.Strings(keys)
	return keys, err
}

// partsReader reads parts one after the other.
type partsReader struct {
	ctx  context.Context
	h    *Hub
	keys []string
	size int64
	cur  blob.Object
}

func (p *partsReader) Size() int64 { return p.size }

func (p *partsReader) Read(b []byte) (int, error) {
	for {
		if p.cur == nil {
			if len(p.keys) == 0 {
				return 0, io.EOF
			}
			o, err := p.h.Blobs.Open(p.ctx, p.keys[0])
			if err != nil {
				return 0, err
			}
			p.cur, p.keys = o, p.keys[1:]
		}
		n, err := p.cur.Read(b)
		if err == io.EOF {
			p.cur.Close()
			p.cur, err = nil, nil
			if n == 0 {
				continue
			}
		}
		return n, err
	}
}

func (p *partsReader) Close() error {
	if p.cur != nil {
		return p.cur.Close()
	}
	return nil
}

// ServeRecording answers r with session id's recording, an asciicast v2
// file, as a person of tenant may read it: ENOTFOUND (for the caller to
// answer) for a session of another device or tenant, or one with none.
// The API and the console both serve it.
func (h *Hub) ServeRecording(w http.ResponseWriter, r *http.Request, tenant, device, id string) error {
	o, err := h.recording(r.Context(), tenant, device, id)
	if err != nil {
		return err
	}
	defer o.Close()
	hd := w.Header()
	hd.Set("Content-Type", "application/x-asciicast")
	hd.Set("Content-Length", strconv.FormatInt(o.Size(), 10))
	hd.Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": id + ".cast"}))
	hd.Set("Cache-Control", "private, no-cache")
	w.WriteHeader(http.StatusOK)
	io.Copy(w, o)
	return nil
}

// recordingFile is a recording being read: Size is its length.
type recordingFile interface {
	io.ReadCloser
	Size() int64
}

func (h *Hub) recording(ctx context.Context, tenant, device, id string) (recordingFile, error) {
	s, err := h.Sessions.FindRemoteSession(ctx, tenant, device, id)
	if err != nil {
		return nil, err
	}
	if s.RecordingSize == 0 || h.Blobs == nil {
		why := "its tenant did not record shell sessions when it opened"
		switch {
		case s.Recorded && s.EndedAt == nil:
			why = "it is stored when the session ends"
		case s.Recorded:
			why = "it had no output, could not be stored, or was removed when its retention passed (--remote-recording-retention)"
		}
		return nil, fleet.Errorf(fleet.ENOTFOUND, "remote session %s has no recording: %s", id, why)
	}
	o, err := h.Blobs.Open(ctx, recordingKey(tenant, id))
	if errors.Is(err, blob.ErrNotFound) {
		// Its replica was lost: what reached the store is its parts.
		keys, err := h.partKeys(ctx, tenant, id)
		if err != nil {
			return nil, err
		}
		if len(keys) == 0 {
			return nil, fleet.Errorf(fleet.ENOTFOUND, "remote session %s's recording is gone from the blob store", id)
		}
		return &partsReader{ctx: ctx, h: h, keys: keys, size: s.RecordingSize}, nil
	}
	return o, err
}

// RemoveOldRecordings deletes the recordings stored longer ago than the
// retention (a deleted tenant's too) and returns how many. A session's row forgets its recording before the file goes: a
// failure in between leaves a file the next pass removes, never a row
// that points to nothing.
func (h *Hub) RemoveOldRecordings(ctx context.Context) (int, error) {
	if h.Blobs == nil {
		return 0, nil
	}
	cutoff := time.Now().Add(-h.Limits.RecordingRetention)
	var old []string
	err := h.Blobs.Walk(ctx, recordingsPrefix, func(key string, mod time.Time) error {
		if mod.Before(cutoff) {
			old = append(old, key)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, key := range old {
		tenant, id, ok := strings.Cut(strings.TrimPrefix(key, recordingsPrefix+"/"), "/")
		if !ok {
			continue
		}
		if err := h.Sessions.ForgetRemoteRecording(ctx, tenant, id); err != nil {
			return n, err
		}
		if err := h.Blobs.Delete(ctx, key); err != nil && !errors.Is(err, blob.ErrNotFound) {
			return n, err
		}
		n++
	}
	m, err := h.removeOldParts(ctx, cutoff)
	return n + m, err
}

// removeOldParts deletes the parts of sessions whose last part was
// stored before cutoff: those of a session whose replica was lost, which
// are its recording (the session forgets it first), and any a replica left
// behind when it stored the whole recording. A session's parts go
// together, once its newest is old: the first parts of a session still
// open (one longer than the retention) are the start of what its parts
// would be served as, were its replica lost. It returns how many
// sessions' recordings went.
func (h *Hub) removeOldParts(ctx context.Context, cutoff time.Time) (int, error) {
	old := map[string][]string{} // by tenant/id
	recent := map[string]bool{}
	err := h.Blobs.Walk(ctx, partsPrefix, func(key string, mod time.Time) error {
		session := key[:strings.LastIndexByte(key, '/')]
		if mod.Before(cutoff) {
			old[session] = append(old[session], key)
		} else {
			recent[session] = true
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	n := 0
	for session, keys := range old {
		if recent[session] {
			continue
		}
		tenant, id, ok := strings.Cut(strings.TrimPrefix(session, partsPrefix+"/"), "/")
		if !ok {
			continue
		}
		o, err := h.Blobs.Open(ctx, recordingKey(tenant, id))
		if err == nil {
			o.Close()
		} else if errors.Is(err, blob.ErrNotFound) {
			if err := h.Sessions.ForgetRemoteRecording(ctx, tenant, id); err != nil {
				return n, err
			}
			n++
		} else {
			return n, err
		}
		for _, key := range keys {
			if err := h.Blobs.Delete(ctx, key); err != nil && !errors.Is(err, blob.ErrNotFound) {
				return n, err
			}
		}
	}
	return n, nil
}

// RunRecordingRemoval runs RemoveOldRecordings at once and then at least
// twice within the retention, at most hourly, until ctx ends. Replicas
// sharing the blob store may all run it: removing a recording twice is
// harmless.
func (h *Hub) RunRecordingRemoval(ctx context.Context) {
	t := time.NewTicker(min(time.Hour, h.Limits.RecordingRetention/2))
	defer t.Stop()
	for {
		if _, err := h.RemoveOldRecordings(ctx); err != nil && ctx.Err() == nil && h.Logger != nil {
			h.Logger.Error("remove old remote-session recordings", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
