package fleet_test

import (
	"reflect"
	"strings"
	"testing"

	"github.com/fleetd/fleet"
)

func TestParseSelector(t *testing.T) {
	req := func(k, op string, vs ...string) fleet.Requirement {
		return fleet.Requirement{Key: k, Op: op, Values: vs}
	}
	for _, tc := range []struct {
		in   string
		want fleet.Selector
	}{
		{"site=berlin", fleet.Selector{req("site", fleet.OpEquals, "berlin")}},
		{"site==berlin", fleet.Selector{req("site", fleet.OpEquals, "berlin")}},
		{" site = berlin ", fleet.Selector{req("site", fleet.OpEquals, "berlin")}},
		{"site!=berlin", fleet.Selector{req("site", fleet.OpNotEquals, "berlin")}},
		{"site=", fleet.Selector{req("site", fleet.OpEquals, "")}},
		{"site in (berlin,paris)", fleet.Selector{req("site", fleet.OpIn, "berlin", "paris")}},
		{"site in ( berlin , paris )", fleet.Selector{req("site", fleet.OpIn, "berlin", "paris")}},
		{"site notin (x)", fleet.Selector{req("site", fleet.OpNotIn, "x")}},
		{"site", fleet.Selector{req("site", fleet.OpExists)}},
		{"!site", fleet.Selector{req("site", fleet.OpNotExists)}},
		{"! site", fleet.Selector{req("site", fleet.OpNotExists)}},
		{"ring=canary,model in (x1,x2),!retired,reported.fw.version!=2.0",
			fleet.Selector{req("ring", fleet.OpEquals, "canary"), req("model", fleet.OpIn, "x1", "x2"), req("retired", fleet.OpNotExists), req("reported.fw.version", fleet.OpNotEquals, "2.0")}},
		{"reported.net:if-0.up_down=true", fleet.Selector{req("reported.net:if-0.up_down", fleet.OpEquals, "true")}},
		{"Straße=München", fleet.Selector{req("Straße", fleet.OpEquals, "München")}},
		{"in=notin", fleet.Selector{req("in", fleet.OpEquals, "notin")}},
	} {
		got, err := fleet.ParseSelector(tc.in)
		if err != nil {
			t.Errorf("ParseSelector(%q): %v", tc.in, err)
			continue
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ParseSelector(%q) = %+v, want %+v", tc.in, got, tc.want)
		}
	}
}

func TestParseSelectorErrors(t *testing.T) {
	for _, tc := range []struct {
		in       string
		position string // "at position N", or "" for a problem of the whole
	}{
		{"", "at position 1,"},
		{" ", "at position 2,"},
		{",", "at position 1,"},
		{"a,", "at position 3,"},
		{"a,,b", "at position 3,"},
		{"=v", "at position 1,"},
		{"!", "at position 2,"},
		{"!=v", "at position 2,"},
		{"a b", "at position 3,"},
		{"a in b", "at position 6,"},
		{"a in ()", "at position 7,"},
		{"a in (b", "at position 8,"},
		{"a in (b c)", "at position 9,"},
		{"a in (b,)", "at position 9,"},
		{"a=b=c", "at position 4,"},
		{"a=(b)", "at position 3,"},
		{"a=b)", "at position 4,"},
		{"a has b", "at position 3,"},
		{"a<3", "at position 2,"},
		{"reported", "at position 1,"},
		{"reported.", "at position 1,"},
		{"reported.a..b", "at position 1,"},
		{"reported.a/b=1", "at position 1,"},
		{"x=1,reported." + strings.Repeat("a.", 8) + "a", "at position 5,"},
		{strings.Repeat("k", 65) + "=v", "at position 1,"},
		{"a=\x00", ""},
		{"a=\xff", ""},
		{strings.Repeat("a", fleet.MaxSelectorLen+1), ""},
	} {
		_, err := fleet.ParseSelector(tc.in)
		e, ok := err.(*fleet.Error)
		if !ok || e.Code != fleet.EINVALID || e.Fields["selector"] == "" {
			t.Errorf("ParseSelector(%q) = %v, want invalid naming selector", tc.in, err)
			continue
		}
		if tc.position != "" && !strings.Contains(e.Message, tc.position) {
			t.Errorf("ParseSelector(%q): %q does not say %q", tc.in, e.Message, tc.position)
		}
	}
}

// FuzzParseSelector: any text is parsed or refused as invalid, never a
// panic, and what is parsed reads back the same from its String.
func FuzzParseSelector(f *testing.F) {
	for _, s := range []string{"a=b", "a in (b,c),!d", "reported.x.y!=1", "a notin (x), b", "a=b=c", "a in (", "!", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		sel, err := fleet.ParseSelector(s)
		if err != nil {
			if fleet.ErrorCode(err) != fleet.EINVALID {
				t.Fatalf("ParseSelector(%q): %v, want invalid", s, err)
			}
			return
		}
		again, err := fleet.ParseSelector(sel.String())
		if err != nil || !reflect.DeepEqual(again, sel) {
			t.Fatalf("ParseSelector(%q) = %+v, whose String %q reads back as %+v, %v", s, sel, sel.String(), again, err)
		}
	})
}
