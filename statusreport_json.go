package fleet

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
	q.space()
	if q.peek() == '}' {
		return StatusReport{}, false // nothing in it: the full decode names what is missing
	}
	for {
		q.space()
		key, ok := q.str()
		if !ok {
			return StatusReport{}, false
		}
		q.space()
		if !q.byte(':') {
			return StatusReport{}, false
		}
		q.space()
		var bit int
		switch key {
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
			if key == "id" {
				bit, id = hasID, n
			} else {
				bit, aid = hasActionID, n
			}
		case "state":
			bit = hasState
			s, ok := q.str()
			// Printable ASCII only (str), so bytes are characters.
			if !ok || s == "" || len(s) > MaxStateLen {
				return StatusReport{}, false
			}
			r.State = s
		case "progress":
			bit = hasProgress
			n, ok := q.intOrDigits()
			if !ok || n < 0 || n > 100 {
				return StatusReport{}, false
			}
			p := int(n)
			r.Progress = &p
		case "timestamp", "sequence":
			n, ok := q.int()
			if !ok || n > 1<<62 {
				return StatusReport{}, false
			}
			if key == "timestamp" {
				bit = hasTimestamp
				r.Timestamp = &n
			} else {
				bit = hasSequence
				r.Sequence = &n
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
	if !q.byte('"') {
		return "", false
	}
	start := q.i
	for ; q.i < len(q.b); q.i++ {
		switch c := q.b[q.i]; {
		case c == '"':
			s := string(q.b[start:q.i])
			q.i++
			return s, true
		case c < 0x20 || c > 0x7e || c == '\\':
			return "", false
		}
	}
	return "", false
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
	s, ok := q.str()
	if !ok {
		return 0, false
	}
	return digits(s)
}
