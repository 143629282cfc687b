package fleetdtest

import (
	"bytes"
	"encoding/json"
	"net/http"
	"testing"
)

// DDI sends a DDI request with the Authorization header auth.
func (s *Server) DDI(t *testing.T, method, path, auth string, body any, header ...string) (*http.Response, []byte) {
	t.Helper()
	var rd *bytes.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	} else {
		rd = bytes.NewReader(nil)
	}
	hr, err := http.NewRequest(method, s.URL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if auth != "" {
		hr.Header.Set("Authorization", auth)
	}
	if body != nil {
		hr.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(header); i += 2 {
		hr.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(hr)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out bytes.Buffer
	out.ReadFrom(resp.Body)
	return resp, out.Bytes()
}
