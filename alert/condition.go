// Package alert evaluates alert rules on device data: it compiles
// conditions, keeps the per-rule, per-device state machine of
// docs/alerts.md#evaluation-and-thresholds in memory (written behind to the
// store on every transition), and runs the timers that let thresholds and
// no_data_seconds elapse without new data.
package alert

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/fleetd/fleet"
)

// Limits on the size of a condition, so that evaluation stays cheap.
const (
	MaxConditionDepth = 16
	MaxConditionNodes = 256
	MaxFieldLen       = 256
	MaxStringValueLen = 1024
	// MaxWindows bounds the windowed comparisons of a condition, and
	// MaxWindowSeconds the window of each: each keeps a window of at most
	// WindowSlices slices per device (docs/alerts.md#windows).
	MaxWindows       = 8
	MaxWindowSeconds = 86_400
)

// CompileCondition checks the canonical value v of a rule's condition and
// compiles it. Problems are keyed by their path below name ("condition",
// "condition.all[1].operator"), every one of them at once.
func CompileCondition(name string, v any) (*fleet.Condition, map[string]string) {
	c := &compiler{errs: map[string]string{}}
	cond := c.compile(name, v, 1)
	if len(c.errs) > 0 {
		return nil, c.errs
	}
	return cond, nil
}

type compiler struct {
	errs    map[string]string
	nodes   int
	windows int
}

func (c *compiler) fail(path, problem string) {
	if _, ok := c.errs[path]; !ok {
		c.errs[path] = problem
	}
}

const conditionShapes = `must be {"field", "operator", "value"}, {"all": [...]}, {"any": [...]}, {"not": {...}} or {"no_data_seconds": N}`

func (c *compiler) compile(path string, v any, depth int) *fleet.Condition {
	c.nodes++
	if c.nodes > MaxConditionNodes {
		c.fail(path, fmt.Sprintf("the condition has more than %d parts", MaxConditionNodes))
		return nil
	}
	if depth > MaxConditionDepth {
		c.fail(path, fmt.Sprintf("the condition nests deeper than %d levels", MaxConditionDepth))
		return nil
	}
	m, ok := v.(map[string]any)
	if !ok {
		c.fail(path, conditionShapes+"; not "+fleet.Describe(v))
		return nil
	}
	var kinds []string
	for _, k := range []string{"field", "all", "any", "not", "no_data_seconds"} {
		if _, ok := m[k]; ok {
			kinds = append(kinds, k)
		}
	}
	if len(kinds) == 0 {
		if len(m) == 0 {
			c.fail(path, conditionShapes+"; not an empty object")
		} else {
			c.unknown(path, m, nil)
			c.fail(path, conditionShapes)
		}
		return nil
	}
	if len(kinds) > 1 {
		c.fail(path, "must have one of field, all, any, not, no_data_seconds; not "+strings.Join(kinds, " and "))
		return nil
	}
	switch kinds[0] {
	case "field":
		c.unknown(path, m, []string{"field", "operator", "value", "aggregate", "window_seconds"})
		return c.compare(path, m)
	case "all", "any":
		c.unknown(path, m, kinds)
		p := path + "." + kinds[0]
		list, ok := m[kinds[0]].([]any)
		if !ok {
			c.fail(p, "must be an array of conditions, not "+fleet.Describe(m[kinds[0]]))
			return nil
		}
		if len(list) == 0 {
			c.fail(p, "must list at least one condition")
			return nil
		}
		cond := &fleet.Condition{Kind: fleet.CondAll}
		if kinds[0] == "any" {
			cond.Kind = fleet.CondAny
		}
		for i, e := range list {
			cond.Children = append(cond.Children, c.compile(fmt.Sprintf("%s[%d]", p, i), e, depth+1))
		}
		return cond
	case "not":
		c.unknown(path, m, kinds)
		child := c.compile(path+".not", m["not"], depth+1)
		return &fleet.Condition{Kind: fleet.CondNot, Children: []*fleet.Condition{child}}
	default: // no_data_seconds
		c.unknown(path, m, kinds)
		p := path + ".no_data_seconds"
		var secs float64
		switch n := m["no_data_seconds"].(type) {
		case int64:
			secs = float64(n)
		case float64:
			secs = n
		default:
			c.fail(p, "must be a number of seconds, not "+fleet.Describe(n))
			return nil
		}
		if !(secs > 0 && secs <= fleet.MaxThresholdSeconds) || secs*1000 < 1 {
			c.fail(p, fmt.Sprintf("must be a number of seconds above 0 and at most %d", fleet.MaxThresholdSeconds))
			return nil
		}
		return &fleet.Condition{Kind: fleet.CondNoData, NoData: time.Duration(secs * float64(time.Second)).Round(time.Millisecond)}
	}
}

// unknown records every key of m not in known.
func (c *compiler) unknown(path string, m map[string]any, known []string) {
	var extra []string
	for k := range m {
		found := false
		for _, kk := range known {
			if k == kk {
				found = true
			}
		}
		if !found {
			extra = append(extra, k)
		}
	}
	sort.Strings(extra)
	for _, k := range extra {
		c.fail(path+"."+k, "is not a known field")
	}
}

func (c *compiler) compare(path string, m map[string]any) *fleet.Condition {
	cond := &fleet.Condition{Kind: fleet.CondCompare}
	ok := true
	switch f := m["field"].(type) {
	case string:
		if f == "" || utf8.RuneCountInString(f) > MaxFieldLen {
			c.fail(path+".field", fmt.Sprintf("must be 1 to %d characters", MaxFieldLen))
			ok = false
		}
		cond.Field = f
		if strings.Contains(f, ".") {
			cond.Path = strings.Split(f, ".")
		}
	default:
		c.fail(path+".field", "must be a string naming a data field, not "+fleet.Describe(f))
		ok = false
	}
	opv, present := m["operator"]
	op, isStr := opv.(string)
	o, known := fleet.Operators[op]
	opOK := false
	switch {
	case !present || opv == nil:
		c.fail(path+".operator", "is required: one of >, >=, <, <=, ==, !=")
	case !isStr || !known:
		c.fail(path+".operator", "must be one of >, >=, <, <=, ==, !=")
	default:
		cond.Op, opOK = o, true
	}
	ok = ok && opOK
	val, present := m["value"]
	if !present {
		c.fail(path+".value", "is required")
		return nil
	}
	ordered := cond.Op == fleet.OpGT || cond.Op == fleet.OpGE || cond.Op == fleet.OpLT || cond.Op == fleet.OpLE
	switch v := val.(type) {
	case int64:
		cond.Value, cond.Num, cond.Int, cond.IsInt = fleet.ValueNumber, float64(v), v, true
	case float64:
		if math.IsNaN(v) || math.IsInf(v, 0) {
			c.fail(path+".value", "must be a finite number")
			return nil
		}
		cond.Value, cond.Num = fleet.ValueNumber, v
		if v == math.Trunc(v) && math.Abs(v) < 1<<53 {
			cond.Int, cond.IsInt = int64(v), true
		}
	case string:
		if utf8.RuneCountInString(v) > MaxStringValueLen {
			c.fail(path+".value", fmt.Sprintf("must be at most %d characters", MaxStringValueLen))
			return nil
		}
		cond.Value, cond.Str = fleet.ValueString, v
	case bool:
		cond.Value, cond.Bool = fleet.ValueBool, v
	case nil:
		cond.Value = fleet.ValueNull
	default:
		c.fail(path+".value", "must be a number, string, boolean or null; not "+fleet.Describe(v))
		return nil
	}
	if opOK && ordered && cond.Value != fleet.ValueNumber {
		c.fail(path+".value", fmt.Sprintf("must be a number for operator %s; %s compares only with == and !=", op, fleet.Describe(val)))
		return nil
	}
	if !c.window(path, m, cond) || !ok {
		return nil
	}
	return cond
}

// shown names a value a client sent: short strings and numbers as they
// are, anything else by its type.
func shown(v any) string {
	switch v := v.(type) {
	case string:
		if utf8.RuneCountInString(v) <= 32 {
			return strconv.Quote(v)
		}
	case int64, float64:
		return fmt.Sprint(v)
	}
	return fleet.Describe(v)
}

// windowAggregates are the aggregates a windowed comparison may take.
var windowAggregates = []string{fleet.AggAvg, fleet.AggMin, fleet.AggMax}

// window reads a comparison's aggregate and window_seconds, which go
// together, into cond; it reports whether they are usable (or absent).
func (c *compiler) window(path string, m map[string]any, cond *fleet.Condition) bool {
	agg, hasAgg := m["aggregate"]
	secs, hasSecs := m["window_seconds"]
	if !hasAgg && !hasSecs {
		return true
	}
	ok := true
	secsRule := fmt.Sprintf("a whole number of seconds from 1 to %d", MaxWindowSeconds)
	aggRule := "one of " + strings.Join(windowAggregates, ", ")
	if s, isStr := agg.(string); !hasAgg {
		c.fail(path+".aggregate", "is required with window_seconds: "+aggRule)
		ok = false
	} else if !isStr || !slices.Contains(windowAggregates, s) {
		c.fail(path+".aggregate", "must be "+aggRule+", not "+shown(agg))
		ok = false
	} else {
		cond.Aggregate = s
	}
	if n, isInt := fleet.AsInt(secs); !hasSecs {
		c.fail(path+".window_seconds", "is required with aggregate: "+secsRule)
		ok = false
	} else if !isInt || n < 1 || n > MaxWindowSeconds {
		c.fail(path+".window_seconds", "must be "+secsRule+", not "+shown(secs))
		ok = false
	} else {
		cond.Window = time.Duration(n) * time.Second
	}
	if cond.Value != fleet.ValueNumber {
		c.fail(path+".value", "must be a number: the "+aggRule+" of a window is a number")
		ok = false
	}
	if c.windows++; c.windows > MaxWindows {
		c.fail(path, fmt.Sprintf("the condition has more than %d windowed comparisons", MaxWindows))
		ok = false
	}
	cond.WindowIndex = c.windows - 1
	return ok
}

// Eval reports whether data satisfies c. noData answers a no_data_seconds
// leaf: whether nothing arrived on the stream for that long; nil means data
// just arrived, so every such leaf is false. A windowed comparison is false:
// its windows are the engine's (eval).
func Eval(c *fleet.Condition, data map[string]any, noData func(time.Duration) bool) bool {
	return eval(c, data, noData, nil)
}

// eval is Eval with the device's windows, one for each windowed
// comparison of c by its WindowIndex.
func eval(c *fleet.Condition, data map[string]any, noData func(time.Duration) bool, wins []*window) bool {
	switch c.Kind {
	case fleet.CondCompare:
		if c.Aggregate != "" {
			if c.WindowIndex >= len(wins) {
				return false
			}
			v, ok := wins[c.WindowIndex].value(c.Aggregate)
			return ok && cmpOrdered(v, c.Num, c.Op)
		}
		v, ok := lookup(data, c)
		return ok && compare(c, v)
	case fleet.CondAll:
		for _, ch := range c.Children {
			if !eval(ch, data, noData, wins) {
				return false
			}
		}
		return true
	case fleet.CondAny:
		for _, ch := range c.Children {
			if eval(ch, data, noData, wins) {
				return true
			}
		}
		return false
	case fleet.CondNot:
		return !eval(c.Children[0], data, noData, wins)
	case fleet.CondNoData:
		return noData != nil && noData(c.NoData)
	}
	return false
}

// lookup finds the compared field: by its whole name first, then, for a
// dotted name, through nested objects.
func lookup(data map[string]any, c *fleet.Condition) (any, bool) {
	if v, ok := data[c.Field]; ok {
		return v, true
	}
	if c.Path == nil {
		return nil, false
	}
	m := data
	for i, k := range c.Path {
		v, ok := m[k]
		if !ok {
			return nil, false
		}
		if i == len(c.Path)-1 {
			return v, true
		}
		if m, ok = v.(map[string]any); !ok {
			return nil, false
		}
	}
	return nil, false
}

func compare(c *fleet.Condition, v any) bool {
	switch c.Value {
	case fleet.ValueNumber:
		switch n := v.(type) {
		case int64:
			if c.IsInt {
				return cmpOrdered(n, c.Int, c.Op)
			}
			return cmpOrdered(float64(n), c.Num, c.Op)
		case float64:
			return cmpOrdered(n, c.Num, c.Op)
		}
		return false
	case fleet.ValueString:
		s, ok := v.(string)
		return ok && eqOp(s == c.Str, c.Op)
	case fleet.ValueBool:
		b, ok := v.(bool)
		return ok && eqOp(b == c.Bool, c.Op)
	case fleet.ValueNull:
		// A present field is null or not; a missing one is false already.
		return eqOp(v == nil, c.Op)
	}
	return false
}

func eqOp(equal bool, op fleet.Operator) bool {
	switch op {
	case fleet.OpEQ:
		return equal
	case fleet.OpNE:
		return !equal
	}
	return false
}

func cmpOrdered[T int64 | float64](a, b T, op fleet.Operator) bool {
	switch op {
	case fleet.OpGT:
		return a > b
	case fleet.OpGE:
		return a >= b
	case fleet.OpLT:
		return a < b
	case fleet.OpLE:
		return a <= b
	case fleet.OpEQ:
		return a == b
	case fleet.OpNE:
		return a != b
	}
	return false
}
