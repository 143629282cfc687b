package ctl

import (
	"net/http"
	"testing"
)

// TestKeepCredentialsHome: a redirect to another host or port (a presigned
// URL of the bucket) is followed without the key; one on the same server
// keeps it.
func TestKeepCredentialsHome(t *testing.T) {
	for _, tt := range []struct {
		from, to string
		keep     bool
	}{
		{"http://127.0.0.1:8080/a", "http://127.0.0.1:8080/b", true},
		{"http://127.0.0.1:8080/a", "http://127.0.0.1:9000/bucket/x", false},
		{"http://fleet.example.com/a", "https://fleet.example.com/a", false},
		{"https://fleet.example.com/a", "https://bucket.s3.example.com/x", false},
	} {
		first, _ := http.NewRequest("GET", tt.from, nil)
		next, _ := http.NewRequest("GET", tt.to, nil)
		next.Header.Set("x-service-api-key", "fk_secret")
		next.Header.Set("x-service-tenant", "acme")
		next.Header.Set("Range", "bytes=10-")
		if err := keepCredentialsHome(next, []*http.Request{first}); err != nil {
			t.Fatal(err)
		}
		if got := next.Header.Get("x-service-api-key") != ""; got != tt.keep {
			t.Errorf("%s -> %s: key kept %v, want %v", tt.from, tt.to, got, tt.keep)
		}
		if next.Header.Get("Range") == "" {
			t.Errorf("%s -> %s: Range dropped", tt.from, tt.to)
		}
	}
}
