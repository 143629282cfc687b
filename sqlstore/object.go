package sqlstore

import (
	"encoding/json"
	"unicode/utf8"
)

// decodeObject decodes text, a stored JSON object of strings (a device's
// metadata) or of lists of strings (a device action's errors), into *m,
// which must be nil, exactly as json.Unmarshal does. The objects fleetd
// stores are read without json.Unmarshal's reflection, and every string in
// them that needs no unescaping is a substring of text, not a copy: S7
// decodes two of these a row, and json.Unmarshal was a quarter of a page's
// garbage (docs/benchmarks-notebook.md, "S7's garbage"). Anything else (escapes, nulls,
// invalid UTF-8, other values) goes to json.Unmarshal. "{}", which most
// errors and many metadata are, leaves *m nil.
func decodeObject[V string | []string](text string, m *map[string]V, value func(*objectLexer) (V, bool)) error {
	if text == "{}" {
		return nil
	}
	if out, ok := plainObject(text, value); ok {
		*m = out
		return nil
	}
	return json.Unmarshal([]byte(text), m)
}

// objectMemo decodes the objects of one read's rows, remembering the last
// few: the rows that store the same object (a device's metadata on each of
// its actions, "{}", the usual errors) share one map rather than each
// decoding its own, which were half of an S7 page's garbage once they were
// decoded without json.Unmarshal. The maps are never nil.
type objectMemo[V string | []string] struct {
	value func(*objectLexer) (V, bool)
	texts [8]string
	maps  [8]map[string]V
	next  int
}

func (m *objectMemo[V]) decode(text string) (map[string]V, error) {
	for i, t := range m.texts {
		if t == text && m.maps[i] != nil {
			return m.maps[i], nil
		}
	}
	var out map[string]V
	if err := decodeObject(text, &out, m.value); err != nil {
		return nil, err
	}
	if out == nil {
		out = map[string]V{}
	}
	m.texts[m.next], m.maps[m.next] = text, out
	m.next = (m.next + 1) % len(m.texts)
	return out, nil
}

// plainObject reads an object whose keys and values need no unescaping;
// false means text is not one.
func plainObject[V any](text string, value func(*objectLexer) (V, bool)) (map[string]V, bool) {
	l := objectLexer{s: text}
	if !l.consume('{') {
		return nil, false
	}
	out := map[string]V{}
	for !l.consume('}') {
		if len(out) > 0 && !l.consume(',') {
			return nil, false
		}
		k, ok := l.str()
		if !ok || !l.consume(':') {
			return nil, false
		}
		if out[k], ok = value(&l); !ok {
			return nil, false
		}
	}
	l.space()
	return out, l.i == len(text)
}

// objectLexer reads the plain JSON of plainObject.
type objectLexer struct {
	s string
	i int
}

func (l *objectLexer) space() {
	for l.i < len(l.s) && (l.s[l.i] == ' ' || l.s[l.i] == '\t' || l.s[l.i] == '\n' || l.s[l.i] == '\r') {
		l.i++
	}
}

// consume reads c after any white space.
func (l *objectLexer) consume(c byte) bool {
	l.space()
	if l.i < len(l.s) && l.s[l.i] == c {
		l.i++
		return true
	}
	return false
}

// str reads a string without escapes, of valid UTF-8 (json.Unmarshal
// replaces invalid bytes), as a substring.
func (l *objectLexer) str() (string, bool) {
	if !l.consume('"') {
		return "", false
	}
	start := l.i
	for ; l.i < len(l.s) && l.s[l.i] != '"'; l.i++ {
		if l.s[l.i] == '\\' || l.s[l.i] < 0x20 {
			return "", false
		}
	}
	if l.i == len(l.s) || !utf8.ValidString(l.s[start:l.i]) {
		return "", false
	}
	l.i++
	return l.s[start : l.i-1], true
}

// strs reads a list of such strings; [] is an empty list, not nil, as
// json.Unmarshal has it.
func (l *objectLexer) strs() ([]string, bool) {
	if !l.consume('[') {
		return nil, false
	}
	out := []string{}
	for !l.consume(']') {
		if len(out) > 0 && !l.consume(',') {
			return nil, false
		}
		s, ok := l.str()
		if !ok {
			return nil, false
		}
		out = append(out, s)
	}
	return out, true
}
