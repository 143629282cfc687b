package fleet_test

import (
	"maps"
	"slices"
	"testing"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/alert"
	"github.com/fleetd/fleet/codec"
)

// TestReadRule checks that a rule's body is read with every problem named
// by its field at once, and a good one compiled.
func TestReadRule(t *testing.T) {
	tests := []struct {
		name, body string
		fields     []string // the fields named as problems; none for a good rule
	}{
		{"Good", `{"name": "hot", "stream": "env", "condition": {"field": "t", "operator": ">", "value": 80}, "metadata_filters": {"site": ["a", "b"]}}`, nil},
		{"Missing", `{}`, []string{"condition", "name", "stream"}},
		{"BadOperator", `{"name": "hot", "stream": "env", "condition": {"all": [{"field": "t", "operator": ">", "value": 1}, {"field": "t", "operator": "~", "value": 1}]}}`,
			[]string{"condition.all[1].operator"}},
		{"BadFilterWithoutCondition", `{"name": "hot", "stream": "env", "metadata_filters": {"site": 1}}`, []string{"condition", "metadata_filters.site"}},
		{"Everything", `{"name": "", "stream": "a b", "group": 1, "condition": [], "activation_threshold_seconds": -1, "extra": true}`,
			[]string{"activation_threshold_seconds", "condition", "extra", "group", "name", "stream"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, err := codec.Decode(codec.JSON, []byte(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			f := fleet.NewFields(v)
			r := fleet.ReadRule(f, alert.CompileRule)
			err = f.Err()
			var got []string
			if err != nil {
				if fleet.ErrorCode(err) != fleet.EINVALID {
					t.Fatalf("error %v, want EINVALID", err)
				}
				got = slices.Sorted(maps.Keys(err.(*fleet.Error).Fields))
			}
			if !slices.Equal(got, tt.fields) {
				t.Fatalf("problems with %v, want %v (%v)", got, tt.fields, err)
			}
			if err == nil && (r.Compiled == nil || len(r.Filters["site"]) != 2) {
				t.Errorf("a good rule is not compiled: %+v", r)
			}
		})
	}
}
