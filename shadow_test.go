package fleet_test

import (
	"strings"
	"testing"

	"github.com/fleetd/fleet"
)

func parse(t *testing.T, s string) map[string]any {
	t.Helper()
	v, err := fleet.ParseCanonical([]byte(s))
	if err != nil {
		t.Fatalf("parse %s: %v", s, err)
	}
	m, ok := v.(map[string]any)
	if !ok {
		t.Fatalf("%s is not an object", s)
	}
	return m
}

func text(t *testing.T, v any) string {
	t.Helper()
	b, err := fleet.MarshalCanonical(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestMergePatch: the examples of RFC 7386, appendix A, whose target and
// patch are objects, and that the target is left as it was.
func TestMergePatch(t *testing.T) {
	for _, tc := range []struct{ target, patch, want string }{
		{`{"a":"b"}`, `{"a":"c"}`, `{"a":"c"}`},
		{`{"a":"b"}`, `{"b":"c"}`, `{"a":"b","b":"c"}`},
		{`{"a":"b"}`, `{"a":null}`, `{}`},
		{`{"a":"b","b":"c"}`, `{"a":null}`, `{"b":"c"}`},
		{`{"a":["b"]}`, `{"a":"c"}`, `{"a":"c"}`},
		{`{"a":"c"}`, `{"a":["b"]}`, `{"a":["b"]}`},
		{`{"a":{"b":"c"}}`, `{"a":{"b":"d","c":null}}`, `{"a":{"b":"d"}}`},
		{`{"a":[{"b":"c"}]}`, `{"a":[1]}`, `{"a":[1]}`},
		{`{"e":null}`, `{"a":1}`, `{"a":1,"e":null}`},
		{`{}`, `{"a":{"bb":{"ccc":null}}}`, `{"a":{"bb":{}}}`},
		{`{"a":{"b":1}}`, `{"a":{"c":2}}`, `{"a":{"b":1,"c":2}}`},
		{`{"a":1}`, `{"a":{"b":null,"c":1}}`, `{"a":{"c":1}}`},
	} {
		target := parse(t, tc.target)
		if got := text(t, fleet.MergePatch(target, parse(t, tc.patch))); got != tc.want {
			t.Errorf("merge %s into %s = %s, want %s", tc.patch, tc.target, got, tc.want)
		}
		if got := text(t, target); got != tc.target {
			t.Errorf("merge %s changed its target %s to %s", tc.patch, tc.target, got)
		}
	}
}

// TestMergePatchFor: the patch holds only what differs, and merged into
// its source it gives the target (nulls of the target removed).
func TestMergePatchFor(t *testing.T) {
	for _, tc := range []struct{ from, to, want string }{
		{`{}`, `{}`, `{}`},
		{`{"a":1}`, `{"a":1.0}`, `{}`},
		{`{"a":1}`, `{"a":2}`, `{"a":2}`},
		{`{"a":1,"b":2}`, `{"b":2}`, `{"a":null}`},
		{`{"a":1}`, `{"a":null}`, `{"a":null}`},
		{`{}`, `{"a":null}`, `{}`},
		{`{"a":{"x":1,"y":2}}`, `{"a":{"x":1,"z":3}}`, `{"a":{"y":null,"z":3}}`},
		{`{"a":{"x":1}}`, `{"a":{}}`, `{"a":{"x":null}}`},
		{`{}`, `{"a":{}}`, `{"a":{}}`},
		{`{"a":5}`, `{"a":{"b":{"c":null,"d":1}}}`, `{"a":{"b":{"c":null,"d":1}}}`},
		{`{"a":{"b":1}}`, `{"a":[1]}`, `{"a":[1]}`},
		{`{"a":[1,{"b":2}]}`, `{"a":[1,{"b":2}]}`, `{}`},
		{`{"a":"1"}`, `{"a":1}`, `{"a":1}`},
	} {
		from, to := parse(t, tc.from), parse(t, tc.to)
		patch := fleet.MergePatchFor(from, to)
		if got := text(t, patch); got != tc.want {
			t.Errorf("patch from %s to %s = %s, want %s", tc.from, tc.to, got, tc.want)
		}
		want := fleet.MergePatch(map[string]any{}, to) // to without its nulls
		if got := fleet.MergePatch(from, patch); fleet.ShadowDelta(got, want) != nil || fleet.ShadowDelta(want, got) != nil || len(got) != len(want) {
			t.Errorf("merging %s into %s gives %s, want %s", text(t, patch), tc.from, text(t, got), text(t, want))
		}
	}
}

func TestShadowDelta(t *testing.T) {
	for _, tc := range []struct{ desired, reported, want string }{
		{`{}`, `{"a":1}`, `{}`},
		{`{"a":1}`, `{"a":1}`, `{}`},
		{`{"a":1}`, `{"a":1.0}`, `{}`},
		{`{"a":1}`, `{"a":1.5}`, `{"a":1}`},
		{`{"a":1}`, `{}`, `{"a":1}`},
		{`{"a":"1"}`, `{"a":1}`, `{"a":"1"}`},
		{`{"a":{"b":1,"c":2}}`, `{"a":{"b":1,"c":3,"d":4}}`, `{"a":{"c":2}}`},
		{`{"a":{"b":{"c":true}}}`, `{"a":{"b":{"c":true}}}`, `{}`},
		{`{"a":{"b":1}}`, `{"a":"x"}`, `{"a":{"b":1}}`},
		{`{"a":{}}`, `{"a":{"x":1}}`, `{}`},
		{`{"a":{}}`, `{}`, `{"a":{}}`},
		{`{"a":[1,{"b":2}]}`, `{"a":[1,{"b":2}]}`, `{}`},
		{`{"a":[1,2]}`, `{"a":[2,1]}`, `{"a":[1,2]}`},
		{`{"a":false}`, `{"a":null}`, `{"a":false}`},
	} {
		s := fleet.Shadow{Desired: parse(t, tc.desired), Reported: parse(t, tc.reported)}
		s.Compute()
		if got := text(t, s.Delta); got != tc.want || s.InSync != (tc.want == `{}`) {
			t.Errorf("delta of %s against %s = %s (in sync %v), want %s", tc.desired, tc.reported, got, s.InSync, tc.want)
		}
	}
}

func TestCheckShadowSection(t *testing.T) {
	deep := func(n int) map[string]any {
		var v any = 1
		for i := n; i > 1; i-- {
			v = map[string]any{string(rune('a' + i - 1)): v}
		}
		return map[string]any{"a": v}
	}
	if err := fleet.CheckShadowSection("desired", deep(fleet.MaxShadowDepth)); err != nil {
		t.Fatalf("depth %d: %v", fleet.MaxShadowDepth, err)
	}
	err := fleet.CheckShadowSection("desired", deep(fleet.MaxShadowDepth+1))
	if fleet.ErrorCode(err) != fleet.EINVALID {
		t.Fatalf("depth %d: %v, want invalid", fleet.MaxShadowDepth+1, err)
	}
	if e := err.(*fleet.Error); e.Fields["desired.a.b.c.d.e.f.g.h.i"] == "" {
		t.Fatalf("too deep names %v, want desired.a.b.c.d.e.f.g.h.i", e.Fields)
	}
	// An array is a level too.
	err = fleet.CheckShadowSection("reported", map[string]any{"a": []any{[]any{[]any{[]any{[]any{[]any{[]any{[]any{1}}}}}}}}})
	if e, ok := err.(*fleet.Error); !ok || e.Fields["reported.a[0][0][0][0][0][0][0][0]"] == "" {
		t.Fatalf("nested arrays: %v", err)
	}
	big := map[string]any{"k": strings.Repeat("x", fleet.MaxShadowSection-len(`{"k":""}`))}
	if err := fleet.CheckShadowSection("desired", big); err != nil {
		t.Fatalf("exactly %d bytes: %v", fleet.MaxShadowSection, err)
	}
	big["k"] = big["k"].(string) + "x"
	if err := fleet.CheckShadowSection("desired", big); fleet.ErrorCode(err) != fleet.ETOOLARGE {
		t.Fatalf("one byte over: %v, want too_large", err)
	}
}
