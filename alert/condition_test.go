package alert_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/fleetd/fleet/alert"
	"github.com/fleetd/fleet/codec"
)

// canon decodes JSON text to the canonical value a request body becomes.
func canon(t testing.TB, s string) any {
	t.Helper()
	v, err := codec.Decode(codec.JSON, []byte(s))
	if err != nil {
		t.Fatalf("decode %s: %v", s, err)
	}
	return v
}

func TestEvalCondition(t *testing.T) {
	point := `{"temperature": 81, "humidity": 40.5, "status": "ok", "door": true, "gone": null,
		"big": 9007199254740993, "gps": {"lat": 52.5, "fix": {"ok": true}}, "a.b": 1}`
	tests := []struct {
		name, cond string
		noData     bool // what every no_data leaf says
		want       bool
	}{
		{"GreaterInt", `{"field": "temperature", "operator": ">", "value": 80}`, false, true},
		{"GreaterFalse", `{"field": "temperature", "operator": ">", "value": 81}`, false, false},
		{"GreaterEqual", `{"field": "temperature", "operator": ">=", "value": 81}`, false, true},
		{"LessFloat", `{"field": "humidity", "operator": "<", "value": 40.6}`, false, true},
		{"LessEqual", `{"field": "humidity", "operator": "<=", "value": 40.5}`, false, true},
		{"IntEqualsFloat", `{"field": "temperature", "operator": "==", "value": 81.0}`, false, true},
		{"FloatVsInt", `{"field": "humidity", "operator": ">", "value": 40}`, false, true},
		{"BigIntExact", `{"field": "big", "operator": "==", "value": 9007199254740993}`, false, true},
		{"BigIntNotEqualNeighbour", `{"field": "big", "operator": "==", "value": 9007199254740992}`, false, false},
		{"NotEqualNumber", `{"field": "temperature", "operator": "!=", "value": 80}`, false, true},
		{"StringEqual", `{"field": "status", "operator": "==", "value": "ok"}`, false, true},
		{"StringNotEqual", `{"field": "status", "operator": "!=", "value": "fault"}`, false, true},
		{"BoolEqual", `{"field": "door", "operator": "==", "value": true}`, false, true},
		{"BoolNotEqual", `{"field": "door", "operator": "!=", "value": true}`, false, false},
		{"NullEqual", `{"field": "gone", "operator": "==", "value": null}`, false, true},
		{"NullNotEqualPresent", `{"field": "status", "operator": "!=", "value": null}`, false, true},
		{"MissingFieldFalse", `{"field": "pressure", "operator": "<", "value": 1}`, false, false},
		{"MissingFieldNotEqualFalse", `{"field": "pressure", "operator": "!=", "value": 1}`, false, false},
		{"MissingFieldNullFalse", `{"field": "pressure", "operator": "==", "value": null}`, false, false},
		{"TypeMismatchFalse", `{"field": "status", "operator": "==", "value": 1}`, false, false},
		{"TypeMismatchNotEqualFalse", `{"field": "status", "operator": "!=", "value": 1}`, false, false},
		{"NumberVsStringFalse", `{"field": "temperature", "operator": "==", "value": "81"}`, false, false},
		{"NestedPath", `{"field": "gps.lat", "operator": ">", "value": 50}`, false, true},
		{"NestedDeep", `{"field": "gps.fix.ok", "operator": "==", "value": true}`, false, true},
		{"NestedMissing", `{"field": "gps.lon", "operator": ">", "value": 0}`, false, false},
		{"NestedThroughScalar", `{"field": "status.x", "operator": "==", "value": "ok"}`, false, false},
		{"DottedKeyWins", `{"field": "a.b", "operator": "==", "value": 1}`, false, true},
		{"AllTrue", `{"all": [{"field": "temperature", "operator": ">", "value": 80}, {"field": "status", "operator": "==", "value": "ok"}]}`, false, true},
		{"AllOneFalse", `{"all": [{"field": "temperature", "operator": ">", "value": 80}, {"field": "status", "operator": "==", "value": "bad"}]}`, false, false},
		{"AnyOneTrue", `{"any": [{"field": "temperature", "operator": ">", "value": 90}, {"field": "door", "operator": "==", "value": true}]}`, false, true},
		{"AnyNoneTrue", `{"any": [{"field": "temperature", "operator": ">", "value": 90}, {"field": "pressure", "operator": ">", "value": 0}]}`, false, false},
		{"Not", `{"not": {"field": "temperature", "operator": ">", "value": 90}}`, false, true},
		{"NotMissing", `{"not": {"field": "pressure", "operator": ">", "value": 0}}`, false, true},
		{"NoDataOnData", `{"no_data_seconds": 60}`, false, false},
		{"NoDataByClock", `{"no_data_seconds": 60}`, true, true},
		{"NoDataInAny", `{"any": [{"no_data_seconds": 60}, {"field": "temperature", "operator": ">", "value": 90}]}`, true, true},
		{"NotNoData", `{"not": {"no_data_seconds": 60}}`, false, true},
	}
	data := canon(t, point).(map[string]any)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, errs := alert.CompileCondition("condition", canon(t, tt.cond))
			if errs != nil {
				t.Fatalf("compile: %v", errs)
			}
			var nd func(time.Duration) bool
			if tt.noData {
				nd = func(time.Duration) bool { return true }
			}
			if got := alert.Eval(c, data, nd); got != tt.want {
				t.Fatalf("Eval(%s) = %v, want %v", tt.cond, got, tt.want)
			}
		})
	}
}

func TestCompileConditionErrors(t *testing.T) {
	tests := []struct {
		name, cond, path string
	}{
		{"NotObject", `"temperature > 80"`, "condition"},
		{"Empty", `{}`, "condition"},
		{"UnknownShape", `{"fld": "x"}`, "condition.fld"},
		{"TwoShapes", `{"field": "x", "operator": ">", "value": 1, "all": []}`, "condition"},
		{"BadOperator", `{"field": "x", "operator": "=>", "value": 1}`, "condition.operator"},
		{"MissingOperator", `{"field": "x", "value": 1}`, "condition.operator"},
		{"OperatorNotString", `{"field": "x", "operator": 1, "value": 1}`, "condition.operator"},
		{"MissingValue", `{"field": "x", "operator": ">"}`, "condition.value"},
		{"ObjectValue", `{"field": "x", "operator": "==", "value": {}}`, "condition.value"},
		{"OrderedString", `{"field": "x", "operator": ">", "value": "a"}`, "condition.value"},
		{"OrderedBool", `{"field": "x", "operator": "<=", "value": true}`, "condition.value"},
		{"EmptyField", `{"field": "", "operator": ">", "value": 1}`, "condition.field"},
		{"FieldNotString", `{"field": 3, "operator": ">", "value": 1}`, "condition.field"},
		{"UnknownKeyInCompare", `{"field": "x", "operator": ">", "value": 1, "unit": "C"}`, "condition.unit"},
		{"AllNotArray", `{"all": {"field": "x"}}`, "condition.all"},
		{"AllEmpty", `{"any": []}`, "condition.any"},
		{"NestedOperator", `{"all": [{"field": "x", "operator": ">", "value": 1}, {"field": "y", "operator": "~", "value": 1}]}`, "condition.all[1].operator"},
		{"NotNested", `{"not": {"any": [{"field": "y"}]}}`, "condition.not.any[0].operator"},
		{"NoDataZero", `{"no_data_seconds": 0}`, "condition.no_data_seconds"},
		{"NoDataString", `{"no_data_seconds": "60"}`, "condition.no_data_seconds"},
		{"NoDataTooLong", `{"no_data_seconds": 31536001}`, "condition.no_data_seconds"},
		{"NoDataExtra", `{"no_data_seconds": 5, "field": "x"}`, "condition"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, errs := alert.CompileCondition("condition", canon(t, tt.cond))
			if c != nil || errs == nil {
				t.Fatalf("compiled %s, want an error at %s", tt.cond, tt.path)
			}
			if _, ok := errs[tt.path]; !ok {
				t.Fatalf("errors %v, want one at %s", errs, tt.path)
			}
		})
	}
	t.Run("TooDeep", func(t *testing.T) {
		s := `{"field": "x", "operator": ">", "value": 1}`
		for range alert.MaxConditionDepth + 1 {
			s = `{"not": ` + s + `}`
		}
		if _, errs := alert.CompileCondition("condition", canon(t, s)); errs == nil {
			t.Fatal("compiled a condition nested too deep")
		}
	})
	t.Run("TooMany", func(t *testing.T) {
		var list []any
		for range alert.MaxConditionNodes {
			list = append(list, map[string]any{"field": "x", "operator": ">", "value": int64(1)})
		}
		if _, errs := alert.CompileCondition("condition", map[string]any{"all": list}); errs == nil {
			t.Fatal("compiled a condition with too many parts")
		}
	})
	t.Run("AllProblemsAtOnce", func(t *testing.T) {
		_, errs := alert.CompileCondition("condition", canon(t, `{"any": [{"field": "", "operator": "?", "value": 1}, {"no_data_seconds": -1}]}`))
		for _, p := range []string{"condition.any[0].field", "condition.any[0].operator", "condition.any[1].no_data_seconds"} {
			if _, ok := errs[p]; !ok {
				t.Errorf("errors %v lack %s", errs, p)
			}
		}
	})
}

// FuzzCompileCondition feeds arbitrary JSON to the compiler: it must never
// panic, and whatever compiles must evaluate without panicking.
func FuzzCompileCondition(f *testing.F) {
	for _, s := range []string{
		`{"field": "t", "operator": ">", "value": 1}`,
		`{"all": [{"field": "a.b", "operator": "==", "value": "x"}, {"not": {"no_data_seconds": 5}}]}`,
		`{"any": [{"field": "t", "operator": "!=", "value": null}]}`,
		`{"not": {"not": {"field": "t", "operator": "<=", "value": 1.5}}}`,
		`{"any": [{"field": "t", "aggregate": "avg", "window_seconds": 60, "operator": ">", "value": 1}]}`,
		`[1, 2]`, `null`, `{"all": [[]]}`,
	} {
		f.Add(s)
	}
	data := map[string]any{"t": int64(3), "a": map[string]any{"b": "x"}, "s": "y"}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := codec.Decode(codec.JSON, []byte(s))
		if err != nil {
			return
		}
		c, errs := alert.CompileCondition("condition", v)
		if (c == nil) == (errs == nil) {
			t.Fatalf("CompileCondition(%s) = %v, %v: want exactly one", s, c, errs)
		}
		if c != nil {
			alert.Eval(c, data, nil)
			alert.Eval(c, data, func(time.Duration) bool { return true })
			if _, err := json.Marshal(c); err != nil {
				t.Fatal(err)
			}
		}
	})
}
