package fleethttp_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/golang-jwt/jwt/v5"

	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// caller is one column of the isolation matrix.
type caller struct {
	name   string
	creds  fleetdtest.Creds
	bearer string // an end user's token instead of a key
	role   string // the role it acts with in tenant alpha, "" for none
}

// TestIsolationMatrix sends every endpoint of the served OpenAPI document,
// aimed at tenant alpha's resources, as: no key, an unknown key, tenant
// bravo's admin, each role of alpha and an end user of alpha (S9 with a
// local JWKS). Each answer must be what docs/api.md#authentication and
// #roles say: 401, 403, 404 for another tenant's resource, or the endpoint's
// success. Both tenants are seeded with a resource of every kind carrying a
// marker, and no answer to one tenant may hold the other's markers or ids
// (but an id the caller itself sent).
func TestIsolationMatrix(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		certFile, keyFile := fleetdtest.WriteServerCert(t, t.TempDir(), "fleetd test")
		s := fleetdtest.Start(t, b, append([]string{"--rate-limit", "-1", "--device-data-rate-limit", "-1",
			"--tls-cert", certFile, "--tls-key", keyFile, "--http-tls=false", "--mqtts-addr", "127.0.0.1:0"}, fleetdtest.AlertFlags...)...)
		ops, okCodes, doc := operations(t, s)
		covered(t, ops)
		// Which creates answer 201 without a body is the contract of
		// docs/api.md#responses: the seed's (S1-S3), and no other.
		for _, op := range ops {
			if okCodes[op] != http.StatusCreated {
				continue
			}
			method, path, _ := strings.Cut(op, " ")
			created := doc.Paths.Find(path).GetOperation(method).Responses.Status(http.StatusCreated).Value
			if documented := created.Content == nil; documented != endpoints[op].quiet {
				t.Errorf("%s: the OpenAPI document has its 201 without a body: %v, want %v", op, documented, endpoints[op].quiet)
			}
		}

		idp := fleetdtest.NewIdentityProvider(t)
		hook := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
		defer hook.Close()
		alpha, bravo := s.NewTenant(t, "alpha"), s.NewTenant(t, "bravo")
		wa := seed(t, s, alpha, "SECRETMARK-ALPHA-3c1", hook.URL, idp, 5, 1)
		wb := seed(t, s, bravo, "SECRETMARK-BRAVO-9e4", hook.URL, idp, 0, 2)

		callers := []caller{
			{name: "no key", creds: fleetdtest.Creds{Tenant: "alpha"}},
			{name: "unknown key", creds: fleetdtest.Creds{Tenant: "alpha", Key: "fk_" + strings.Repeat("x", 43)}},
			{name: "bravo's admin", creds: bravo},
			{name: "viewer", creds: s.NewKey(t, alpha, "m-viewer", "viewer"), role: "viewer"},
			{name: "device", creds: s.NewKey(t, alpha, "m-device", "device"), role: "device"},
			{name: "operator", creds: s.NewKey(t, alpha, "m-operator", "operator"), role: "operator"},
			{name: "admin", creds: alpha, role: "admin"},
			{name: "end user (operator)", creds: fleetdtest.Creds{Tenant: "alpha"}, bearer: idp.Token(t, jwt.MapClaims{"role": "operator"}), role: "operator"},
		}

		// What each tenant must never see of the other: its markers always,
		// its ids unless the caller sent them.
		secrets := map[string][]string{"alpha": {wb.mark}, "bravo": {wa.mark}}
		ids := map[string][]string{
			"alpha": {wb.device, "bravo-dev-2", wb.ruleID, wb.bundleID, wb.notificationID, wb.alertID, wb.component, wb.rolloutRuleID},
			"bravo": {wa.device, "alpha-dev-2", wa.ruleID, wa.bundleID, wa.notificationID, wa.alertID, wa.component, wa.rolloutRuleID},
		}
		leaks := 0
		check := func(tenant, sent string, r *fleetdtest.Response) {
			t.Helper()
			body := string(r.Body)
			for _, m := range secrets[tenant] {
				if strings.Contains(body, m) {
					leaks++
					t.Errorf("%s: %s saw the other tenant's marker %s: %s", r.Req, tenant, m, body)
				}
			}
			for _, id := range ids[tenant] {
				if strings.Contains(body, id) && !strings.Contains(sent, id) {
					leaks++
					t.Errorf("%s: %s saw the other tenant's id %s: %s", r.Req, tenant, id, body)
				}
			}
		}

		var table strings.Builder
		fmt.Fprintf(&table, "%-84s", "endpoint")
		for _, c := range callers {
			fmt.Fprintf(&table, " %-8.8s", c.name)
		}
		table.WriteString("\n")
		answers := 0
		for _, op := range ops {
			e := endpoints[op]
			method, _, _ := strings.Cut(op, " ")
			fmt.Fprintf(&table, "%-84s", op)
			for _, c := range callers {
				target, body := e.prepare(t, s, wa)
				rq := fleetdtest.Req{Method: method, Path: target, Creds: c.creds, Body: body}
				if raw, ok := body.([]byte); ok {
					rq.Body, rq.Raw, rq.ContentType = nil, raw, "application/octet-stream"
				}
				rq.Header = ddiHeader(e, c.creds)
				if c.bearer != "" {
					rq.Header = http.Header{"Authorization": {"Bearer " + c.bearer}}
				}
				r := s.Send(t, rq)
				answers++
				want := expect(e, c, okCodes[op])
				if r.Status != want {
					t.Errorf("%s as %s: %d, want %d: %s", op, c.name, r.Status, want, r.Body)
				}
				if r.Status == http.StatusCreated && e.quiet != (len(r.Body) == 0) {
					t.Errorf("%s as %s: 201 with a body of %d bytes; want one only from a create that is not the seed's (S1-S3)", op, c.name, len(r.Body))
				}
				if r.Status >= 400 && want >= 400 && len(r.Body) > 0 {
					var eb struct{ Error, Message string }
					if json.Unmarshal(r.Body, &eb) != nil || eb.Error == "" || eb.Message == "" {
						t.Errorf("%s as %s: %d without the error body: %s", op, c.name, r.Status, r.Body)
					}
				}
				sent, _ := json.Marshal(body)
				tenant := "alpha"
				if c.creds.Tenant == "bravo" {
					tenant = "bravo"
				}
				check(tenant, target+string(sent), r)
				fmt.Fprintf(&table, " %-8d", r.Status)
			}
			table.WriteString("\n")
		}

		// And the other way round: bravo's own reads of everything it has
		// show nothing of alpha.
		for _, op := range ops {
			e := endpoints[op]
			if method, _, _ := strings.Cut(op, " "); method != "GET" || e.perm == "public" {
				continue
			}
			target, _ := e.prepare(t, s, wb)
			check("bravo", target, s.Send(t, fleetdtest.Req{Method: "GET", Path: target, Creds: bravo, Header: ddiHeader(e, bravo)}))
			answers++
		}
		t.Logf("%d endpoints × %d callers, %d answers checked, %d leaks\n%s", len(ops), len(callers), answers, leaks, table.String())
	})
}

// expect is the answer docs/api.md#authentication and #roles prescribe to
// caller c for endpoint e, whose success is ok.
func expect(e endpoint, c caller, ok int) int {
	if e.perm == "public" {
		return http.StatusOK
	}
	switch {
	case c.creds.Key == "" && c.bearer == "":
		return http.StatusUnauthorized
	case e.perm == "ddi" && c.bearer != "":
		// Devices authenticate to DDI with tokens and keys, never as
		// end users (docs/hawkbit.md).
		return http.StatusUnauthorized
	case c.role == "" && c.creds.Tenant == "alpha":
		return http.StatusUnauthorized
	case c.creds.Tenant == "bravo":
		if e.other != 0 {
			return e.other
		}
		return http.StatusNotFound
	}
	allowed := map[string][]string{
		"read":     {"viewer", "operator", "admin"},
		"artifact": {"viewer", "operator", "admin"},
		"device":   {"device", "operator", "admin"},
		"ddi":      {"device", "operator", "admin"},
		"operate":  {"operator", "admin"},
		"remote":   {"operator", "admin"},
		"admin":    {"admin"},
	}[e.perm]
	for _, r := range allowed {
		if r == c.role {
			return ok
		}
	}
	return http.StatusForbidden
}
