package ctl

import (
	"bytes"
	"testing"
)

// TestWriteCSV: a field first seen in a later row is a column beside its
// object's others; arrays are JSON; null and missing fields are empty; a
// view's each makes a row of every element beside its item's fields.
func TestWriteCSV(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		v          view
		want       string
	}{
		{"Items", `{"points": [{"a": 1, "d": {"x": "p,q"}, "z": 2}, {"a": 2, "d": {"y": [1, {"k": "v"}]}, "z": null}], "next": null}`,
			view{items: "points"}, "a,d.x,d.y,z\n1,\"p,q\",,2\n2,,\"[1,{\"\"k\"\":\"\"v\"\"}]\",\n"},
		{"Each", `{"buckets": [], "series": [{"device_id": "d1", "buckets": [{"start": "s1", "value": 1.5}, {"start": "s2", "value": 2}]}, {"device_id": "d2", "buckets": []}]}`,
			view{items: "series", each: "buckets"}, "device_id,start,value\nd1,s1,1.5\nd1,s2,2\n"},
		{"OneObject", `{"retention_seconds": 86400, "server_default": false}`, view{}, "retention_seconds,server_default\n86400,false\n"},
		{"Empty", `{"points": [], "next": null}`, view{items: "points"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := writeCSV(&b, []byte(tc.body), tc.v); err != nil || b.String() != tc.want {
				t.Fatalf("writeCSV = %q, %v; want %q", b.String(), err, tc.want)
			}
		})
	}
}
