package fleethttp_test

import (
	"bufio"
	"bytes"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/textproto"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/fleetd/fleet/codec"
	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// badCase is one malformed request and the answer it must get.
type badCase struct {
	name   string // endpoint / mutation / encoding
	method string
	target string
	ct     string
	body   []byte
	want   int
}

// TestBadInputCorpus sends well over 300 malformed requests across every
// endpoint of the served OpenAPI document and all four encodings: wrong
// types, unknown, missing and null fields, out-of-range numbers, invalid
// UTF-8, deep nesting, oversized, truncated and empty bodies, trailing
// garbage, duplicate keys, unknown tags, bad Transit cache codes, wrong
// content types, bad query parameters and bad path ids; most generated
// from each endpoint's schema, the oddities written by hand under
// testdata/badinput. Every answer must be the documented 4xx with the error
// body, the server must stay up, and a count of the rows of every table,
// taken directly in the database before and after, must not change.
func TestBadInputCorpus(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		certFile, keyFile := fleetdtest.WriteServerCert(t, t.TempDir(), "fleetd test")
		// The remote sessions the end endpoint's cases are prepared with
		// are never joined: at the default --remote-connect-timeout (15 s)
		// each would end, and audit its end (remote.session.end), 15 s
		// after it opened, which a loaded machine's corpus outlasts. An
		// hour keeps them open until the server stops.
		s := fleetdtest.Start(t, b, append([]string{"--rate-limit", "-1", "--device-data-rate-limit", "-1", "--max-bulk-bytes", "2097152",
			"--tls-cert", certFile, "--tls-key", keyFile, "--http-tls=false", "--mqtts-addr", "127.0.0.1:0",
			"--remote-connect-timeout", "1h"}, fleetdtest.AlertFlags...)...)
		ops, _, doc := operations(t, s)
		covered(t, ops)
		idp := fleetdtest.NewIdentityProvider(t)
		var delivered atomic.Int32
		hook := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { delivered.Add(1) }))
		defer hook.Close()
		alpha := s.NewTenant(t, "alpha")
		w := seed(t, s, alpha, "MARK-ALPHA", hook.URL, idp, 0, 1)
		// Nothing may be written behind the corpus's back while the rows
		// are counted: the seeded alert's notification is delivered first.
		fleetdtest.Eventually(t, "the seeded notification", func() bool { return delivered.Load() > 0 })

		// Every case is prepared first (preparing makes fresh resources),
		// then the rows are counted, then the cases are sent.
		var cases []badCase
		for _, op := range ops {
			e := endpoints[op]
			if e.perm == "public" {
				cases = append(cases, queryCases(op, e, w, t, s, doc)...)
				continue
			}
			cases = append(cases, bodyCases(t, s, doc, op, e, w)...)
			cases = append(cases, queryCases(op, e, w, t, s, doc)...)
			cases = append(cases, pathCases(t, s, doc, op, e, w)...)
		}
		cases = append(cases, handWritten(t, w)...)

		// The same for the stream history's rollups of the seeded points,
		// which a background loop adds up from a queue.
		db := openDirect(t, s.DSN)
		fleetdtest.Eventually(t, "the seeded points' rollups", func() bool {
			var n int
			return db.QueryRow("SELECT count(*) FROM stream_rollup_queue").Scan(&n) == nil && n == 0
		})
		before := rowCounts(t, db)
		lastAudit := fleetdtest.Count(t, db, "SELECT coalesce(max(id), 0) FROM audit_logs")
		byStatus := map[int]int{}
		for _, c := range cases {
			rq := fleetdtest.Req{Method: c.method, Path: c.target, Creds: alpha, Raw: c.body, ContentType: c.ct}
			if strings.Contains(c.target, "/controller/v1/") { // hawkBit DDI
				rq.Header = ddiHeader(endpoint{perm: "ddi"}, alpha)
			}
			if c.body == nil && c.ct == "" {
				rq.Raw = nil
			}
			r := s.Send(t, rq)
			byStatus[r.Status]++
			if r.Status != c.want {
				t.Errorf("%s: %s %s: %d, want %d: %.300s", c.name, c.method, c.target, r.Status, c.want, r.Body)
				continue
			}
			var eb struct {
				Error   string `json:"error"`
				Message string `json:"message"`
			}
			if err := json.Unmarshal(r.Body, &eb); err != nil || eb.Message == "" || codeStatus[eb.Error] != r.Status {
				t.Errorf("%s: %d with a body that is not the error body: %.300s", c.name, r.Status, r.Body)
			}
		}
		s.Do(t, alpha, "GET", "/healthz", nil).Want(t, 200)
		after := rowCounts(t, db)
		for table, n := range before {
			if after[table] != n {
				t.Errorf("table %s had %d rows before the corpus and %d after: a malformed request wrote", table, n, after[table])
			}
		}
		if after["audit_logs"] != before["audit_logs"] {
			t.Errorf("audited during the corpus: %v", auditsAfter(t, db, lastAudit))
		}
		if len(cases) < 300 {
			t.Errorf("only %d cases", len(cases))
		}
		t.Logf("%d malformed requests over %d endpoints, answers by status %v; %d tables counted, unchanged", len(cases), len(ops), byStatus, len(before))
	})
}

// codeStatus is the status of each error code of docs/api.md#errors that
// bad input can get.
var codeStatus = map[string]int{"invalid": 400, "unauthenticated": 401, "forbidden": 403, "not_found": 404,
	"method_not_allowed": 405, "conflict": 409, "too_large": 413, "unsupported_media_type": 415, "rate_limited": 429}

// requestSchema returns the JSON schema of an operation's body, nil for
// none.
func requestSchema(doc *openapi3.T, op string) *openapi3.Schema {
	method, path, _ := strings.Cut(op, " ")
	o := doc.Paths.Find(path).GetOperation(method)
	if o == nil || o.RequestBody == nil || o.RequestBody.Value == nil {
		return nil
	}
	mt := o.RequestBody.Value.Content.Get("application/json")
	if mt == nil || mt.Schema == nil {
		return nil
	}
	return mt.Schema.Value
}

// canonical turns a Go body into the value every decoder produces.
func canonical(t *testing.T, body any) any {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	v, err := codec.Decode(codec.JSON, b)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func clone(v any) any {
	b, _ := json.Marshal(v)
	out, _ := codec.Decode(codec.JSON, b)
	return out
}

// wrongValue is a value of another type than the schema's.
func wrongValue(s *openapi3.Schema) (any, bool) {
	if s == nil {
		return nil, false
	}
	if len(s.AllOf) == 1 && s.AllOf[0].Value != nil {
		s = s.AllOf[0].Value
	}
	switch {
	case s.Type.Is("string"):
		return int64(12345), true
	case s.Type.Is("integer"):
		return "30", true
	case s.Type.Is("number"):
		return "1.5", true
	case s.Type.Is("boolean"):
		return "true", true
	case s.Type.Is("array"):
		return map[string]any{"a": int64(1)}, true
	case s.Type.Is("object"):
		return []any{int64(1)}, true
	}
	return nil, false
}

// outOfRange lists, by field name, numbers the rules refuse.
var outOfRange = map[string][]any{
	"timeout":                        {int64(0), int64(-1), int64(31536001), 30.5},
	"progress":                       {int64(101), int64(-1)},
	"interval_seconds":               {int64(-1), int64(31536001), 1.5},
	"activation_threshold_seconds":   {-1.0, 1e12},
	"deactivation_threshold_seconds": {-1.0},
	"uncompressed_size":              {int64(-1)},
	"content_length":                 {int64(-1)},
}

// invalidStrings lists, by field name, strings the rules refuse.
var invalidStrings = map[string][]string{
	"id":          {"bad id", strings.Repeat("a", 129)},
	"device_id":   {"", "bad id"},
	"role":        {"root"},
	"method":      {"saml"},
	"search_type": {"nearby"},
	"stream":      {"bad stream", ""},
	"name":        {""},
	"state":       {""},
	"version":     {"1..2", "v1"},
	"file_name":   {"../escape.tar", ""},
	"checksum":    {"xyz"},
	"timezone":    {"Mars/Olympus"},
	"action":      {""},
	"jwks_url":    {"ftp://x.example.com/jwks"},
	"webhook_url": {"/relative"},
	"user_email":  {strings.Repeat("e", 300)},
}

const placeholder = "PLACEHOLDERXYZ" // replaced by invalid UTF-8 of the same length

// bodyCases mutates the endpoint's valid body by its schema and encodes
// each mutation in the four encodings; then byte-level damage per
// encoding, wrong content types and an oversized body.
func bodyCases(t *testing.T, s *fleetdtest.Server, doc *openapi3.T, op string, e endpoint, w *world) []badCase {
	t.Helper()
	method, _, _ := strings.Cut(op, " ")
	target, body := e.prepare(t, s, w)
	var out []badCase
	add := func(name string, ct string, b []byte, want int) {
		out = append(out, badCase{name: op + " / " + name, method: method, target: target, ct: ct, body: b, want: want})
	}
	schema := requestSchema(doc, op)
	if schema == nil && !e.rawBody {
		return nil // endpoints without a body ignore one: nothing to mutate
	}
	if e.rawBody {
		add("text/plain", "text/plain", []byte("hello"), 415)
		return out
	}
	valid := canonical(t, body)

	// Value mutations, each in the four encodings.
	type mutation struct {
		name string
		v    any
	}
	var muts []mutation
	if m, ok := valid.(map[string]any); ok {
		lenient := map[string]bool{}
		for _, f := range e.lenient {
			lenient[f] = true
		}
		names := make([]string, 0, len(schema.Properties))
		for name := range schema.Properties {
			names = append(names, name)
		}
		sort.Strings(names)
		for _, name := range names {
			if v, ok := wrongValue(schema.Properties[name].Value); ok && !lenient[name] {
				mm := clone(m).(map[string]any)
				mm[name] = v
				muts = append(muts, mutation{"wrong type of " + name, mm})
			}
			for _, bad := range outOfRange[name] {
				mm := clone(m).(map[string]any)
				mm[name] = bad
				muts = append(muts, mutation{fmt.Sprintf("%s = %v", name, bad), mm})
			}
			if _, present := m[name]; present {
				for _, bad := range invalidStrings[name] {
					mm := clone(m).(map[string]any)
					mm[name] = bad
					muts = append(muts, mutation{fmt.Sprintf("%s = %.20q", name, bad), mm})
				}
			}
		}
		for _, name := range schema.Required {
			mm := clone(m).(map[string]any)
			delete(mm, name)
			muts = append(muts, mutation{"missing " + name, mm})
			mm = clone(m).(map[string]any)
			mm[name] = nil
			muts = append(muts, mutation{"null " + name, mm})
		}
		if ap := schema.AdditionalProperties.Has; ap != nil && !*ap {
			mm := clone(m).(map[string]any)
			mm["bogus_field"] = int64(1)
			muts = append(muts, mutation{"unknown field", mm})
		}
		muts = append(muts, mutation{"an array for the object", []any{int64(1), int64(2)}})
		// Deep nesting and invalid UTF-8 go into the first field.
		first := names[0]
		if _, ok := m[first]; !ok {
			for k := range m {
				first = k
				break
			}
		}
		deep := any("x")
		for range 70 {
			deep = []any{deep}
		}
		mm := clone(m).(map[string]any)
		mm[first] = deep
		muts = append(muts, mutation{"nested 70 deep", mm})
		mm = clone(m).(map[string]any)
		mm[first] = placeholder
		muts = append(muts, mutation{"invalid UTF-8", mm})
	} else if a, ok := valid.([]any); ok && len(a) > 0 {
		muts = append(muts, mutation{"a string for the array", "points"})
		muts = append(muts, mutation{"an element that is no object", []any{"x"}})
		deep := any(int64(1))
		for range 70 {
			deep = []any{deep}
		}
		muts = append(muts, mutation{"nested 70 deep", []any{deep}})
		muts = append(muts, mutation{"invalid UTF-8", []any{map[string]any{"timestamp": placeholder}}})
	}
	for _, mu := range muts {
		for _, f := range codec.Formats {
			b, err := codec.Marshal(f, mu.v)
			if err != nil {
				t.Fatalf("%s %s: %v", op, mu.name, err)
			}
			b = bytes.ReplaceAll(b, []byte(placeholder), bytes.Repeat([]byte{0xff}, len(placeholder)))
			add(mu.name+" / "+f.String(), f.ContentType(), b, 400)
		}
	}

	// Byte-level damage of the valid body, per encoding.
	for _, f := range codec.Formats {
		b, err := codec.Marshal(f, valid)
		if err != nil {
			t.Fatal(err)
		}
		ct := f.ContentType()
		add("truncated / "+f.String(), ct, b[:len(b)/2], 400)
		add("empty / "+f.String(), ct, []byte{}, 400)
		if f == codec.TransitMsgpack {
			add("trailing garbage / "+f.String(), ct, append(bytes.Clone(b), 0xc1), 400)
			add("unknown tag / "+f.String(), ct, []byte("\x92\xa7~#point\x92\x01\x02"), 400)
			add("undefined cache code / "+f.String(), ct, []byte("\x93\xa2^ \xa2^Z\x01"), 400)
			continue
		}
		add("trailing garbage / "+f.String(), ct, append(bytes.Clone(b), []byte(" }x")...), 400)
		switch f {
		case codec.JSON:
			if bytes.HasPrefix(b, []byte("{")) {
				k := firstKey(valid)
				add("duplicate key / json", ct, append([]byte(`{"`+k+`":null,`), b[1:]...), 400)
			}
			add("integer beyond int64 / json", ct, []byte(`{"n": 18446744073709551616}`), 400)
			add("NaN / json", ct, []byte(`{"n": NaN}`), 400)
			add("lone surrogate / json", ct, []byte(`{"s": "\ud800"}`), 400)
		case codec.TransitJSON:
			add("unknown tag / transit+json", ct, []byte(`["~#point",[1,2]]`), 400)
			add("undefined cache code / transit+json", ct, []byte(`["^ ","^Z",1]`), 400)
			if bytes.HasPrefix(b, []byte(`["^ ",`)) {
				k := firstKey(valid)
				add("duplicate key / transit+json", ct, append([]byte(`["^ ","~:`+k+`",null,`), b[len(`["^ ",`):]...), 400)
			}
		case codec.EDN:
			add("unknown tag / edn", ct, []byte(`{:a #point [1 2]}`), 400)
			add("NaN / edn", ct, []byte(`{:a ##NaN}`), 400)
			add("ratio / edn", ct, []byte(`{:a 1/2}`), 400)
			if bytes.HasPrefix(b, []byte("{")) {
				k := firstKey(valid)
				add("duplicate key / edn", ct, append([]byte(`{:`+k+` nil `), b[1:]...), 400)
			}
		}
	}

	// Content types and size.
	jb, _ := codec.Marshal(codec.JSON, valid)
	add("text/plain", "text/plain", jb, 415)
	add("application/xml", "application/xml", jb, 415)
	add("no content type", "", jb, 415)
	switch {
	case target == "/api/v1/devices/bulk" || strings.HasSuffix(target, "/actions") || strings.HasSuffix(target, "/append_phase"):
		// Bulk provisioning, dispatch and append_phase (long device_ids) take
		// --max-bulk-bytes, which the corpus's server sets to 2 MiB.
		add("body over --max-bulk-bytes", "application/json", append(append([]byte(`{"pad": "`), bytes.Repeat([]byte("x"), 2<<20)...), '"', '}'), 413)
	case !strings.HasPrefix(target, "/api/v1/firmware-bundles"):
		add("body over 1 MiB", "application/json", append(append([]byte(`{"pad": "`), bytes.Repeat([]byte("x"), 1<<20)...), '"', '}'), 413)
	}
	return out
}

func firstKey(v any) string {
	m, _ := v.(map[string]any)
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	if len(keys) == 0 {
		return "a"
	}
	return keys[0]
}

// encodeBody is a prepared valid body as sent, with its Content-Type:
// JSON, or a file as it is; nothing for none.
func encodeBody(e endpoint, body any) ([]byte, string) {
	if body != nil && !e.rawBody {
		b, _ := json.Marshal(body)
		return b, "application/json"
	}
	if raw, ok := body.([]byte); ok {
		return raw, "application/octet-stream"
	}
	return nil, ""
}

// queryCases sends bad query strings.
func queryCases(op string, e endpoint, w *world, t *testing.T, s *fleetdtest.Server, doc *openapi3.T) []badCase {
	t.Helper()
	method, path, _ := strings.Cut(op, " ")
	target, body := e.prepare(t, s, w)
	base, _, _ := strings.Cut(target, "?")
	bb, ct := encodeBody(e, body)
	var out []badCase
	add := func(name, query string) {
		out = append(out, badCase{name: op + " / " + name, method: method, target: base + "?" + query, ct: ct, body: bb, want: 400})
	}
	o := doc.Paths.Find(path).GetOperation(method)
	if strings.Contains(path, "/controller/v1/") {
		// hawkBit's DDI resources read their query as upstream does
		// (docs/hawkbit.md): what they do not know, the cache-buster c
		// among it, is ignored, and actionHistory takes any integer. What
		// is not an integer is refused.
		for _, p := range o.Parameters {
			if p.Value != nil && p.Value.In == "query" && p.Value.Name == "actionHistory" {
				for _, v := range []string{"abc", "99999999999999999999", "1.5"} {
					add("actionHistory="+v, "actionHistory="+v)
				}
			}
		}
		return out
	}
	add("unknown parameter", "bogus=1")
	add("malformed query", "a=%zz")
	for _, p := range o.Parameters {
		if p.Value == nil || p.Value.In != "query" {
			continue
		}
		name := p.Value.Name
		if strings.Contains(name, "{") {
			continue
		}
		sch := p.Value.Schema.Value
		add("repeated "+name, name+"=1&"+name+"=2")
		switch {
		case sch.Type.Is("integer"):
			for _, v := range []string{"abc", "0", "-1", "1001", "99999999999999999999", "1.5"} {
				if v == "1001" && name != "limit" {
					continue
				}
				add(name+"="+v, name+"="+v)
			}
		case len(sch.Enum) > 0:
			add(name+" not in its enum", name+"=bogus")
		case sch.Format == "date-time":
			add(name+" not a time", name+"=yesterday")
		case sch.Format == "uuid":
			add(name+" not a uuid", name+"=nope")
		}
	}
	return out
}

// pathCases sends ids that could not exist.
func pathCases(t *testing.T, s *fleetdtest.Server, doc *openapi3.T, op string, e endpoint, w *world) []badCase {
	t.Helper()
	method, path, _ := strings.Cut(op, " ")
	target, body := e.prepare(t, s, w)
	base, query, _ := strings.Cut(target, "?")
	bb, ct := encodeBody(e, body)
	pattern := strings.Split(path, "/")
	actual := strings.Split(base, "/")
	o := doc.Paths.Find(path).GetOperation(method)
	var out []badCase
	for i, seg := range pattern {
		if !strings.HasPrefix(seg, "{") {
			continue
		}
		name := strings.Trim(seg, "{}")
		var sch *openapi3.Schema
		for _, p := range o.Parameters {
			if p.Value != nil && p.Value.In == "path" && p.Value.Name == name {
				sch = p.Value.Schema.Value
			}
		}
		var bad []string
		switch {
		case sch != nil && sch.Type.Is("integer"):
			bad = []string{"abc", "1.5", "-1", "99999999999999999999"}
		case sch != nil && sch.Format == "uuid":
			bad = []string{"not-a-uuid", "12345"}
		case name == "id" || name == "device_id":
			bad = []string{"bad%20id", strings.Repeat("a", 129), "%C3%A9t%C3%A9"}
		case name == "stream":
			bad = []string{"bad%20stream", strings.Repeat("s", 129)}
		case name == "name":
			bad = []string{"bad%20name", strings.Repeat("n", 65)}
		case name == "version" || name == "version_number":
			bad = []string{"1..2", "v1"}
		case name == "component_name":
			bad = []string{"bad%20name", strings.Repeat("c", 300)}
		}
		want := 400
		if name == "tenant_id" {
			// S9's tenant must be the caller's: any other name, valid or
			// not, is another tenant's and 404 (docs/api.md).
			bad, want = []string{"Bad_Tenant", "beta"}, 404
		}
		for _, v := range bad {
			segs := append([]string{}, actual...)
			segs[i] = v
			tg := strings.Join(segs, "/")
			if query != "" {
				tg += "?" + query
			}
			out = append(out, badCase{name: fmt.Sprintf("%s / {%s} = %.20s", op, name, v), method: method, target: tg, ct: ct, body: bb, want: want})
		}
	}
	return out
}

// handWritten reads testdata/badinput/*.http: a request line, headers, a
// blank line and the body, with "# want NNN" as the first line. "{device}"
// in the target is the seeded device.
func handWritten(t *testing.T, w *world) []badCase {
	t.Helper()
	files, err := filepath.Glob("testdata/badinput/*.http")
	if err != nil || len(files) == 0 {
		t.Fatalf("no testdata/badinput/*.http: %v", err)
	}
	var out []badCase
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(bytes.NewReader(raw))
		first, _ := br.ReadString('\n')
		want, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(first, "# want")))
		if err != nil {
			t.Fatalf("%s: first line must be # want NNN", f)
		}
		line, _ := br.ReadString('\n')
		method, target, _ := strings.Cut(strings.TrimSpace(line), " ")
		target = strings.ReplaceAll(target, "{device}", w.device)
		target = strings.ReplaceAll(target, "{rule}", w.ruleID)
		hdr, err := textproto.NewReader(br).ReadMIMEHeader()
		if err != nil && len(hdr) == 0 && err.Error() != "EOF" {
			t.Fatalf("%s: headers: %v", f, err)
		}
		body, _ := io.ReadAll(br)
		body = bytes.TrimSuffix(body, []byte("\n"))
		body = bytes.ReplaceAll(body, []byte("\\xff"), []byte{0xff})
		out = append(out, badCase{name: filepath.Base(f), method: method, target: target, ct: hdr.Get("Content-Type"), body: body, want: want})
	}
	return out
}

// openDirect opens the server's database beside it, for counting.
func openDirect(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	driver, name := "sqlite", "file:"+dsn+"?_pragma=query_only(1)"
	if strings.HasPrefix(dsn, "postgres") {
		driver, name = "pgx", dsn
	}
	db, err := sql.Open(driver, name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// auditsAfter lists the audit records after the one of id last, each as
// its action, target and request id: a request's, or (none) a background
// job's.
func auditsAfter(t *testing.T, db *sql.DB, last int) []string {
	t.Helper()
	rows, err := db.Query(fmt.Sprintf("SELECT action, target, request_id FROM audit_logs WHERE id > %d ORDER BY id", last))
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var action, target, request string
		if err := rows.Scan(&action, &target, &request); err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprintf("%s %s (request %q)", action, target, request))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// rowCounts counts the rows of every table.
func rowCounts(t *testing.T, db *sql.DB) map[string]int {
	t.Helper()
	q := "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
	if _, err := db.Exec("SELECT 1 FROM information_schema.tables LIMIT 1"); err == nil {
		q = "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'"
	}
	rows, err := db.Query(q)
	if err != nil {
		t.Fatal(err)
	}
	var tables []string
	for rows.Next() {
		var n string
		rows.Scan(&n)
		tables = append(tables, n)
	}
	rows.Close()
	counts := map[string]int{}
	for _, tb := range tables {
		counts[tb] = fleetdtest.Count(t, db, "SELECT count(*) FROM "+tb)
	}
	if len(counts) < 10 {
		t.Fatalf("only %d tables: %v", len(counts), tables)
	}
	return counts
}
