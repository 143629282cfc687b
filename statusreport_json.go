package fleet

import "sync/atomic"

// QuickStatusReport reads a status report that is one JSON object of the
// plain shape devices send, `{"device_id":"d1","action_id":7,"state":
// "Downloading","progress":40,"timestamp":…,"sequence":…}`, straight into a
// StatusReport, without making the canonical values (a map, a string per
// key) that codec and ReadStatusReport read it through: on S10 and MQTT
// status reports those were most of the decoding's allocations
// (docs/benchmarks-notebook.md, the front side of a status report).
//
// It answers ok only for a body that the full decode (codec's JSON, then
// ReadStatusReport with needDevice, and Fields.Err) accepts and reads into
// the same report. Anything else, valid or not, is not ok, and the caller
// decodes it the full way, which gives every error message: keys
// other than device_id (with needDevice only), action_id, id, state,
// progress, timestamp and sequence; a key twice; a null; errors; strings
// with an escape, a control character or a byte outside printable ASCII;
// numbers with a sign, a fraction, an exponent, a leading zero or more than
// 18 digits; any value out of its range.
func QuickStatusReport(b []byte, needDevice bool) (r StatusReport, ok bool) {
	q := quickJSON{b: b}
	q.space()
	if !q.byte('{') {
		return StatusReport{}, false
	}
	const (
		hasDevice = 1 << iota
		hasActionID
		hasID
		hasState
		hasProgress
		hasTimestamp
		hasSequence
	)
	var seen int
	var id, aid int64
	var nums *quickNums
	q.space()
	if q.peek() == '}' {
		return StatusReport{}, false // nothing in it: the full decode names what is missing
	}
	for {
		q.space()
		key, ok := q.raw()
		if !ok {
			return StatusReport{}, false
		}
		q.space()
		if !q.byte(':') {
			return StatusReport{}, false
		}
		q.space()
		var bit int
		switch string(key) { // compared without a copy
		case "device_id":
			bit = hasDevice
			if !needDevice {
				return StatusReport{}, false
			}
			s, ok := q.str()
			if !ok || !ValidDeviceID(s) {
				return StatusReport{}, false
			}
			r.DeviceID = s
		case "action_id", "id":
			n, ok := q.intOrDigits()
			if !ok || n < 1 {
				return StatusReport{}, false
			}
			if string(key) == "id" {
				bit, id = hasID, n
			} else {
				bit, aid = hasActionID, n
			}
		case "state":
			bit = hasState
			s, ok := q.raw()
			// Printable ASCII only (raw), so bytes are characters.
			if !ok || len(s) == 0 || len(s) > MaxStateLen {
				return StatusReport{}, false
			}
			r.State = states.intern(s)
		case "progress":
			bit = hasProgress
			n, ok := q.intOrDigits()
			if !ok || n < 0 || n > 100 {
				return StatusReport{}, false
			}
			if nums == nil {
				nums = new(quickNums)
			}
			nums.progress = int(n)
			r.Progress = &nums.progress
		case "timestamp", "sequence":
			n, ok := q.int()
			if !ok || n > 1<<62 {
				return StatusReport{}, false
			}
			if nums == nil {
				nums = new(quickNums)
			}
			if string(key) == "timestamp" {
				bit = hasTimestamp
				nums.timestamp = n
				r.Timestamp = &nums.timestamp
			} else {
				bit = hasSequence
				nums.sequence = n
				r.Sequence = &nums.sequence
			}
		default:
			return StatusReport{}, false
		}
		if seen&bit != 0 {
			return StatusReport{}, false // a duplicate key
		}
		seen |= bit
		q.space()
		if q.byte(',') {
			continue
		}
		if !q.byte('}') {
			return StatusReport{}, false
		}
		break
	}
	q.space()
	if q.i != len(q.b) {
		return StatusReport{}, false
	}
	if needDevice && seen&hasDevice == 0 || seen&hasState == 0 || seen&(hasID|hasActionID) == 0 {
		return StatusReport{}, false
	}
	switch {
	case seen&hasActionID != 0 && seen&hasID != 0 && id != aid:
		return StatusReport{}, false
	case seen&hasActionID != 0:
		r.ActionID = aid
	default:
		r.ActionID = id
	}
	return r, true
}

// quickNums are the numbers a report QuickStatusReport reads points to,
// in one allocation rather than one each.
type quickNums struct {
	progress            int
	timestamp, sequence int64
}

// quickJSON scans the plain JSON QuickStatusReport takes.
type quickJSON struct {
	b []byte
	i int
}

func (q *quickJSON) space() {
	for q.i < len(q.b) {
		switch q.b[q.i] {
		case ' ', '\t', '\n', '\r':
			q.i++
		default:
			return
		}
	}
}

func (q *quickJSON) peek() byte {
	if q.i < len(q.b) {
		return q.b[q.i]
	}
	return 0
}

// byte consumes c if it is next.
func (q *quickJSON) byte(c byte) bool {
	if q.i < len(q.b) && q.b[q.i] == c {
		q.i++
		return true
	}
	return false
}

// str reads a string of printable ASCII without escapes.
func (q *quickJSON) str() (string, bool) {
	b, ok := q.raw()
	return string(b), ok
}

// raw reads a string of printable ASCII without escapes, and returns its
// bytes in q.b: keys are compared and numbers read without a copy.
func (q *quickJSON) raw() ([]byte, bool) {
	if !q.byte('"') {
		return nil, false
	}
	start := q.i
	for ; q.i < len(q.b); q.i++ {
		switch c := q.b[q.i]; {
		case c == '"':
			b := q.b[start:q.i]
			q.i++
			return b, true
		case c < 0x20 || c > 0x7e || c == '\\':
			return nil, false
		}
	}
	return nil, false
}

// int reads a non-negative integer of at most 18 digits, without a
// leading zero, that is followed by neither a fraction nor an exponent.
func (q *quickJSON) int() (int64, bool) {
	start := q.i
	var n int64
	for q.i < len(q.b) && q.b[q.i] >= '0' && q.b[q.i] <= '9' {
		n = n*10 + int64(q.b[q.i]-'0')
		q.i++
	}
	digits := q.i - start
	if digits == 0 || digits > 18 || digits > 1 && q.b[start] == '0' {
		return 0, false
	}
	switch q.peek() {
	case ' ', '\t', '\n', '\r', ',', '}':
		return n, true
	}
	return 0, false
}

// intOrDigits reads an integer, or a string of digits as ReadStatusReport
// takes for ids and progress.
func (q *quickJSON) intOrDigits() (int64, bool) {
	if q.peek() != '"' {
		return q.int()
	}
	b, ok := q.raw()
	if !ok {
		return 0, false
	}
	if len(b) == 0 || len(b) > 18 {
		return digits(string(b)) // rare: 19 digits may not fit an int64
	}
	var n int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}

// states interns the state words of reports read by QuickStatusReport:
// devices report a few words ("Downloading", "Installing") again and
// again, and each report would otherwise copy its word into a string of
// its own.
var states stateWords

// stateWords is a small cache of strings, a slot a hash of their bytes;
// a word whose slot holds another takes it over. Safe for concurrent use.
type stateWords struct {
	slots [64]atomic.Pointer[string]
}

// intern returns b as a string, one made earlier if its slot holds it.
func (w *stateWords) intern(b []byte) string {
	h := uint32(2166136261) // FNV-1a
	for _, c := range b {
		h = (h ^ uint32(c)) * 16777619
	}
	slot := &w.slots[h%uint32(len(w.slots))]
	if p := slot.Load(); p != nil && *p == string(b) {
		return *p
	}
	s := string(b)
	slot.Store(&s)
	return s
}
