package fleet_test

import (
	"testing"

	"github.com/fleetd/fleet"
)

func TestFields(t *testing.T) {
	body := map[string]any{
		"name": "x", "count": int64(3), "integral": 30.0, "fraction": 30.5, "text": "30",
		"flag": true, "list": []any{"a", int64(1)}, "obj": map[string]any{"k": "v", "n": int64(2)},
		"null": nil, "extra": "?",
	}
	f := fleet.NewFields(body)
	if got := f.String("name", true); got != "x" {
		t.Errorf("String = %q", got)
	}
	if got := f.Int("count", true, 1, 5); got != 3 {
		t.Errorf("Int = %d", got)
	}
	if got := f.Int("integral", true, 1, 100); got != 30 {
		t.Errorf("Int of 30.0 = %d", got)
	}
	f.Int("fraction", true, 1, 100)
	f.Int("text", true, 1, 100)
	f.Int("count", true, 5, 10) // out of range; the first problem of a field wins
	f.Bool("flag", true)
	f.Strings("list", true)
	sub := f.Nested("obj", true)
	sub.String("k", true)
	sub.String("n", true)
	sub.String("missing", true)
	sub.Unknown()
	if f.Has("null") {
		t.Error("a null field must count as absent")
	}
	f.String("absent", true)
	err := f.Err()
	fe, ok := err.(*fleet.Error)
	if !ok || fe.Code != fleet.EINVALID {
		t.Fatalf("Err = %v, want EINVALID", err)
	}
	want := []string{"fraction", "text", "count", "list[1]", "obj.n", "obj.missing", "absent", "extra"}
	for _, name := range want {
		if fe.Fields[name] == "" {
			t.Errorf("no problem for %s; got %v", name, fe.Fields)
		}
	}
	if len(fe.Fields) != len(want) {
		t.Errorf("problems = %v, want exactly %v", fe.Fields, want)
	}
}

func TestFieldsNotAnObject(t *testing.T) {
	for _, v := range []any{nil, "s", []any{}, int64(1)} {
		f := fleet.NewFields(v)
		f.String("a", true)
		if code := fleet.ErrorCode(f.Err()); code != fleet.EINVALID {
			t.Errorf("NewFields(%#v).Err() code = %q", v, code)
		}
	}
}

func TestRoles(t *testing.T) {
	for _, tc := range []struct {
		role fleet.Role
		can  []fleet.Permission
	}{
		{fleet.RoleViewer, []fleet.Permission{fleet.PermRead}},
		{fleet.RoleDevice, []fleet.Permission{fleet.PermDeviceData}},
		{fleet.RoleOperator, []fleet.Permission{fleet.PermRead, fleet.PermDeviceData, fleet.PermOperate}},
		{fleet.RoleAdmin, []fleet.Permission{fleet.PermRead, fleet.PermDeviceData, fleet.PermOperate, fleet.PermAdmin}},
		{fleet.Role("root"), nil},
	} {
		for _, p := range []fleet.Permission{fleet.PermRead, fleet.PermDeviceData, fleet.PermOperate, fleet.PermAdmin} {
			want := false
			for _, c := range tc.can {
				want = want || c == p
			}
			if got := tc.role.Can(p); got != want {
				t.Errorf("%s.Can(%d) = %v, want %v", tc.role, p, got, want)
			}
		}
	}
}
