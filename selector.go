package fleet

import (
	"fmt"
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Selector chooses devices by their metadata and their shadow's reported
// state, in the grammar of Kubernetes' label selectors (docs/twin.md):
// requirements separated by commas, all of which must hold.
type Selector []Requirement

// The operators of a Requirement.
const (
	OpEquals    = "="
	OpNotEquals = "!="
	OpIn        = "in"
	OpNotIn     = "notin"
	OpExists    = "exists"
	OpNotExists = "!"
)

// ReportedPrefix starts a key that names a path in the reported state
// (reported.net.ssid) rather than a metadata key.
const ReportedPrefix = "reported."

// MaxSelectorLen bounds a selector's text.
const MaxSelectorLen = 4096

// Requirement is one condition of a Selector: Key Op Values. For OpEquals
// and OpNotEquals Values has one value; OpExists and OpNotExists have none.
// OpNotEquals, OpNotIn and OpNotExists hold for a device that lacks the key.
type Requirement struct {
	Key    string
	Op     string
	Values []string
}

// ReportedPath returns the path in the reported state that the key names,
// split at its dots, or nil for a metadata key.
func (r Requirement) ReportedPath() []string {
	rest, ok := strings.CutPrefix(r.Key, ReportedPrefix)
	if !ok {
		return nil
	}
	return strings.Split(rest, ".")
}

// Negated reports whether the requirement holds where its positive form
// (=, in, exists) does not.
func (r Requirement) Negated() bool {
	return r.Op == OpNotEquals || r.Op == OpNotIn || r.Op == OpNotExists
}

// reportedSegment is what one level of a reported path may be: it is put
// in SQL JSON paths, so it is kept to characters none of them quote.
var reportedSegment = regexp.MustCompile(`^[A-Za-z0-9_:-]{1,64}$`)

// special are the characters of the grammar; keys and values cannot hold
// them, nor white space.
const special = ",=!()<>"

// ParseSelector reads a selector. Any problem is EINVALID, with the
// position (from 1, in characters) where the selector stops making sense.
func ParseSelector(s string) (Selector, error) {
	if !PlainText(s) {
		return nil, selectorError(0, PlainTextRule)
	}
	if len(s) > MaxSelectorLen {
		return nil, selectorError(0, fmt.Sprintf("must be at most %d bytes", MaxSelectorLen))
	}
	p := &selectorParser{in: []rune(s)}
	var sel Selector
	for {
		r, err := p.requirement()
		if err != nil {
			return nil, err
		}
		sel = append(sel, r)
		p.space()
		if p.end() {
			return sel, nil
		}
		if !p.take(",") {
			return nil, p.fail("expected a comma or the end")
		}
	}
}

type selectorParser struct {
	in  []rune
	pos int
}

func (p *selectorParser) end() bool { return p.pos >= len(p.in) }

func (p *selectorParser) space() {
	for !p.end() && unicode.IsSpace(p.in[p.pos]) {
		p.pos++
	}
}

func (p *selectorParser) peek(tok string) bool {
	return strings.HasPrefix(string(p.in[p.pos:]), tok)
}

func (p *selectorParser) take(tok string) bool {
	if !p.peek(tok) {
		return false
	}
	p.pos += utf8.RuneCountInString(tok)
	return true
}

// word reads a key or a value: a run of characters that are neither
// special nor white space.
func (p *selectorParser) word() string {
	start := p.pos
	for !p.end() && !unicode.IsSpace(p.in[p.pos]) && !strings.ContainsRune(special, p.in[p.pos]) {
		p.pos++
	}
	return string(p.in[start:p.pos])
}

func (p *selectorParser) fail(problem string) error {
	return selectorError(p.pos+1, problem)
}

func selectorError(pos int, problem string) error {
	msg := "selector " + problem
	if pos > 0 {
		msg = fmt.Sprintf("selector: at position %d, %s", pos, problem)
	}
	return &Error{Code: EINVALID, Message: msg, Fields: map[string]string{"selector": msg}}
}

func (p *selectorParser) requirement() (Requirement, error) {
	p.space()
	if p.take("!") {
		p.space()
		k, err := p.key()
		return Requirement{Key: k, Op: OpNotExists}, err
	}
	k, err := p.key()
	if err != nil {
		return Requirement{}, err
	}
	p.space()
	switch {
	case p.end() || p.peek(","):
		return Requirement{Key: k, Op: OpExists}, nil
	case p.take("!="):
		v, err := p.value()
		return Requirement{Key: k, Op: OpNotEquals, Values: []string{v}}, err
	case p.take("=="), p.take("="):
		v, err := p.value()
		return Requirement{Key: k, Op: OpEquals, Values: []string{v}}, err
	}
	at := p.pos
	switch op := p.word(); op {
	case OpIn, OpNotIn:
		vs, err := p.set()
		return Requirement{Key: k, Op: op, Values: vs}, err
	case "":
		return Requirement{}, p.fail("expected an operator (=, ==, !=, in, notin), a comma or the end")
	default:
		p.pos = at
		return Requirement{}, p.fail(fmt.Sprintf("unknown operator %q: expected =, ==, !=, in or notin", op))
	}
}

func (p *selectorParser) key() (string, error) {
	at := p.pos
	k := p.word()
	if k == "" {
		return "", p.fail("expected a key")
	}
	if utf8.RuneCountInString(k) > MaxMetadataKeyLen && !strings.HasPrefix(k, ReportedPrefix) {
		p.pos = at
		return "", p.fail(fmt.Sprintf("key %q is longer than %d characters", k, MaxMetadataKeyLen))
	}
	if k == "reported" {
		p.pos = at
		return "", p.fail(`"reported" needs a path: reported.KEY`)
	}
	if rest, ok := strings.CutPrefix(k, ReportedPrefix); ok {
		path := strings.Split(rest, ".")
		if len(path) > MaxShadowDepth {
			p.pos = at
			return "", p.fail(fmt.Sprintf("%s is deeper than the reported state may be (%d levels)", k, MaxShadowDepth))
		}
		for _, seg := range path {
			if !reportedSegment.MatchString(seg) {
				p.pos = at
				return "", p.fail(fmt.Sprintf("%q: each level of a reported path must be 1 to 64 characters from A-Z a-z 0-9 _ : -", k))
			}
		}
	}
	return k, nil
}

// value reads the value after = or !=, which may be empty.
func (p *selectorParser) value() (string, error) {
	p.space()
	v := p.word()
	if !p.end() && strings.ContainsRune("=!(", p.in[p.pos]) {
		return "", p.fail(fmt.Sprintf("unexpected %q in a value", p.in[p.pos]))
	}
	return v, nil
}

// set reads "(a, b, …)", at least one value.
func (p *selectorParser) set() ([]string, error) {
	p.space()
	if !p.take("(") {
		return nil, p.fail("expected ( to open the set of values")
	}
	var vs []string
	for {
		p.space()
		v := p.word()
		if v == "" {
			return nil, p.fail("expected a value")
		}
		vs = append(vs, v)
		p.space()
		if p.take(")") {
			return vs, nil
		}
		if !p.take(",") {
			return nil, p.fail("expected a comma or ) in the set of values")
		}
	}
}

// String writes the selector back in its canonical form.
func (s Selector) String() string {
	parts := make([]string, len(s))
	for i, r := range s {
		switch r.Op {
		case OpExists:
			parts[i] = r.Key
		case OpNotExists:
			parts[i] = "!" + r.Key
		case OpEquals, OpNotEquals:
			parts[i] = r.Key + r.Op + r.Values[0]
		default:
			parts[i] = r.Key + " " + r.Op + " (" + strings.Join(r.Values, ",") + ")"
		}
	}
	return strings.Join(parts, ",")
}
