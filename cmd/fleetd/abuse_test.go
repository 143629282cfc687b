package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/golang-jwt/jwt/v5"

	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/mqtt"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestRateLimits: each API key and end user has its own bucket; device data
// has buckets of its own; an exhausted bucket is 429 rate_limited with
// Retry-After, and nobody else notices.
func TestRateLimits(t *testing.T) {
	s := startServer(t, sqlstoretest.Backends()[0],
		"--rate-limit", "0.001", "--rate-burst", "5",
		"--device-data-rate-limit", "0.001", "--device-data-rate-burst", "3")
	admin := s.Admin()
	// Keys and the configuration are made first, while admin has tokens.
	viewer := s.NewKey(t, admin, "dashboard", "viewer")
	gateway := s.NewKey(t, admin, "gateway", "device")
	idp := fleetdtest.NewIdentityProvider(t)
	s.Do(t, admin, "PUT", "/api/v1/tenants/default/auth", map[string]any{"method": "jwks", "jwks_url": idp.Server.URL,
		"issuer": "https://id.example.com", "audience": "fleetd"}).Want(t, 204)
	s.MustDevice(t, admin, "pump-1", nil)
	s.Do(t, admin, "GET", "/api/v1/devices", nil).Want(t, 200) // admin's fifth request

	limited := func(r *fleetdtest.Response) {
		t.Helper()
		r.Want(t, 429)
		if code := r.ErrorCode(t); code != "rate_limited" {
			t.Fatalf("error %q, want rate_limited", code)
		}
		if n, err := strconv.Atoi(r.Header.Get("Retry-After")); err != nil || n < 1 {
			t.Fatalf("Retry-After %q, want whole seconds", r.Header.Get("Retry-After"))
		}
	}
	limited(s.Do(t, admin, "GET", "/api/v1/devices", nil))

	// Another key of the same tenant, and another tenant, are unaffected.
	for range 5 {
		s.Do(t, viewer, "GET", "/api/v1/devices", nil).Want(t, 200)
	}
	limited(s.Do(t, viewer, "GET", "/api/v1/devices", nil))
	other := s.NewTenant(t, "other")
	s.Do(t, other, "GET", "/api/v1/devices", nil).Want(t, 200)

	// End users are limited one by one.
	ada := idp.Token(t, nil)
	for range 5 {
		s.bearer(t, "default", ada, "GET", "/api/v1/devices", nil).Want(t, 200)
	}
	limited(s.bearer(t, "default", ada, "GET", "/api/v1/devices", nil))
	grace := idp.Token(t, jwt.MapClaims{"name": "Grace Hopper", "email": "grace@example.com"})
	s.bearer(t, "default", grace, "GET", "/api/v1/devices", nil).Want(t, 200)

	// Device data has its own bucket: a gateway's status reports do not
	// spend its dashboard reads, and the reverse.
	report := map[string]any{"device_id": "pump-1", "action_id": 999, "state": "Running"}
	for range 3 {
		s.Do(t, gateway, "POST", "/api/v1/devices/action/status", report).Want(t, 404) // no such action, but counted
	}
	limited(s.Do(t, gateway, "POST", "/api/v1/devices/action/status", report))
	limited(s.Do(t, admin, "GET", "/api/v1/devices", nil))
	s.Do(t, admin, "POST", "/api/v1/devices/action/status", report).Want(t, 404) // admin's device-data bucket is full

	// Downloads with a key count too (their route is public so that signed
	// URLs work, and the handler checks the key itself).
	hr, _ := http.NewRequest("GET", s.URL+"/api/v1/firmware-bundles/id/00000000-0000-0000-0000-000000000000/artifact", nil)
	hr.Header.Set("X-Service-Tenant", "default")
	hr.Header.Set("X-Service-Api-Key", viewer.Key)
	if r := s.sendRaw(t, hr); r.Status != 429 || r.Header.Get("Retry-After") == "" {
		t.Fatalf("a download by a key that used its bucket: %d %s", r.Status, r.Body)
	}

	// Unauthenticated requests are 401, not counted against anyone.
	s.Do(t, fleetdtest.Creds{Tenant: "default", Key: "fk_nope"}, "GET", "/api/v1/devices", nil).Want(t, 401)
	s.Do(t, fleetdtest.Creds{}, "GET", "/healthz", nil).Want(t, 200)
}

// rawConn opens a TCP connection to the API for a hand-written request.
func (s *testServer) rawConn(t *testing.T) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(s.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// cutOff waits until the server closes c, sending trickle every interval
// until then (a slow client); it returns what the server sent.
func cutOff(t *testing.T, c net.Conn, trickle []byte, interval time.Duration) string {
	t.Helper()
	got := make(chan string, 1)
	go func() {
		b, _ := io.ReadAll(c)
		got <- string(b)
	}()
	deadline := time.After(fleetdtest.Bound)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case b := <-got:
			return b
		case <-deadline:
			t.Fatal("the slow client was not cut off")
		case <-tick.C:
			if len(trickle) > 0 {
				c.Write(trickle) // fails once cut off; the reader notices
			}
		}
	}
}

// TestSlowClients: slowloris in the headers and in the body is cut off by
// the timeouts while other clients are served; uploads and downloads,
// which may be long, may be slow as long as they keep moving.
func TestSlowClients(t *testing.T) {
	s := startServer(t, sqlstoretest.Backends()[0],
		"--http-read-header-timeout", "300ms", "--http-read-timeout", "2s", "--http-write-timeout", "2s")
	admin := s.Admin()

	t.Run("headers", func(t *testing.T) {
		var conns []net.Conn
		for range 20 {
			c := s.rawConn(t)
			fmt.Fprintf(c, "GET /api/v1/devices HTTP/1.1\r\nHost: x\r\n")
			conns = append(conns, c)
		}
		// While they dawdle, others are served.
		s.Do(t, admin, "GET", "/api/v1/devices", nil).Want(t, 200)
		for _, c := range conns {
			cutOff(t, c, []byte("X-Slow: 1\r\n"), 50*time.Millisecond)
		}
	})

	t.Run("body", func(t *testing.T) {
		c := s.rawConn(t)
		fmt.Fprintf(c, "POST /api/v1/devices HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n"+
			"X-Service-Tenant: default\r\nX-Service-Api-Key: %s\r\n\r\n{", s.Key)
		s.Do(t, admin, "GET", "/api/v1/devices", nil).Want(t, 200)
		// A byte every 50 ms would take well over the 2 s the body may take.
		answer := cutOff(t, c, []byte(" "), 50*time.Millisecond)
		if answer != "" && !strings.Contains(answer, " 400 ") {
			t.Fatalf("answer to a body that did not arrive in time: %q", answer)
		}
		s.Do(t, admin, "GET", "/api/v1/devices", nil).Want(t, 200)
	})

	t.Run("headers too large", func(t *testing.T) {
		r := s.Send(t, fleetdtest.Req{Method: "GET", Path: "/api/v1/devices", Creds: admin,
			Header: http.Header{"X-Big": {strings.Repeat("a", 100<<10)}}})
		if r.Status != http.StatusRequestHeaderFieldsTooLarge {
			t.Fatalf("status %d, want 431", r.Status)
		}
	})

	t.Run("slow but moving upload and download", func(t *testing.T) {
		// An upload that takes 3 s, longer than --http-read-timeout, is
		// accepted: for uploads the timeout bounds each pause.
		body, ct := fleetdtest.MultipartBody(t, "slow.tar.gz", fleetdtest.MakeBundle(t, "9.9.8", fleetdtest.Part{Name: "app", Version: "9.9.8", Body: "app"}))
		pr, pw := io.Pipe()
		go func() {
			chunk := max(len(body)/30, 1)
			for i := 0; i < len(body); i += chunk {
				pw.Write(body[i:min(i+chunk, len(body))])
				time.Sleep(100 * time.Millisecond)
			}
			pw.Close()
		}()
		hr, _ := http.NewRequest("POST", s.URL+"/api/v1/firmware-bundles", pr)
		hr.Header.Set("Content-Type", ct)
		hr.Header.Set("X-Service-Tenant", "default")
		hr.Header.Set("X-Service-Api-Key", s.Key)
		s.sendRaw(t, hr).Want(t, 201)

		// A download of 8 MiB (more than the sockets buffer) read over 3 s
		// likewise: the write timeout bounds each pause of the reader.
		random := make([]byte, 8<<20)
		rand.Read(random)
		archive := fleetdtest.MakeBundle(t, "9.9.9", fleetdtest.Part{Name: "app", Version: "9.9.9", Body: string(random)})
		created := s.MustUpload(t, admin, archive)
		hr, _ = http.NewRequest("GET", s.URL+"/api/v1/firmware-bundles/id/"+created.ID+"/artifact", nil)
		hr.Header.Set("X-Service-Tenant", "default")
		hr.Header.Set("X-Service-Api-Key", s.Key)
		resp, err := http.DefaultClient.Do(hr)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var got bytes.Buffer
		buf := make([]byte, len(archive)/120+1)
		for {
			n, err := io.ReadFull(resp.Body, buf)
			got.Write(buf[:n])
			if err != nil {
				break
			}
			time.Sleep(25 * time.Millisecond)
		}
		if resp.StatusCode != 200 || !bytes.Equal(got.Bytes(), archive) {
			t.Fatalf("download: %d, %d of %d bytes", resp.StatusCode, got.Len(), len(archive))
		}
	})
}

// sendRaw sends a prepared request and validates the answer like send.
func (s *testServer) sendRaw(t *testing.T, hr *http.Request) *fleetdtest.Response {
	t.Helper()
	resp, err := http.DefaultClient.Do(hr)
	if err != nil {
		t.Fatalf("%s %s: %v", hr.Method, hr.URL.Path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return &fleetdtest.Response{Status: resp.StatusCode, Header: resp.Header, Body: b, Req: hr.Method + " " + hr.URL.Path}
}

// TestMQTTAbuse: wrong passwords, other tenants' topics, oversized
// payloads, publish floods and piles of idle connections each get their
// client refused or disconnected, while a well-behaved device of the same
// tenant keeps reporting and receiving actions.
func TestMQTTAbuse(t *testing.T) {
	s := startServer(t, sqlstoretest.Backends()[0],
		"--mqtt-auth-failure-burst", "5", "--mqtt-auth-failure-rate", "0.001",
		"--mqtt-publish-rate", "0.001", "--mqtt-publish-burst", "20",
		"--mqtt-connect-timeout", "500ms", "--mqtt-max-pending-per-ip", "100000")
	admin := s.Admin()
	good := s.MustDevice(t, admin, "good", nil)
	bad := s.MustDevice(t, admin, "bad", nil)
	other := s.NewTenant(t, "other")
	s.MustDevice(t, other, "victim", nil)

	// The well-behaved device connects from an address of its own, as a
	// real one would: the throttle of failed CONNECTs is per address.
	dev := dialFrom(t, s.MQTTAddr, "127.0.0.2", "default", "good", good.Token)
	healthy := func(when string) {
		t.Helper()
		t.Logf("the well-behaved device works %s", when)
		dev.PublishStream(t, "env", []map[string]any{{"timestamp": time.Now().UnixMilli(), "t": 20}})
		id := s.Dispatch(t, admin, map[string]any{"action": "ping", "params": map[string]any{}, "search_type": "default", "device_ids": []string{"good"}})
		s.AwaitActionStatus(t, admin, "good", id, "Initiated")
	}
	healthy("at the start")

	t.Run("wrong passwords", func(t *testing.T) {
		for i := range 5 {
			if code := connectCode(t, s.MQTTAddr, "127.0.0.1", "default/bad", "fdt_guess"+strconv.Itoa(i)); code != 0x86 {
				t.Fatalf("guess %d: reason code %#x, want 0x86", i, code)
			}
		}
		// The right token from the guessing address waits its turn.
		if code := connectCode(t, s.MQTTAddr, "127.0.0.1", "default/bad", bad.Token); code != 0x9F {
			t.Fatalf("after the guesses: reason code %#x, want 0x9F", code)
		}
		healthy("after the guesses")
	})

	t.Run("other tenant's topic", func(t *testing.T) {
		c := dialFrom(t, s.MQTTAddr, "127.0.0.3", "default", "bad", bad.Token)
		// No PUBACK comes; the connection closes.
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		c.Publish(ctx, &paho.Publish{Topic: mqtt.ActionStatusTopic("other", "victim"), QoS: 1, Payload: []byte(`{"id":"1","state":"Completed"}`)})
		awaitClosed(t, c.Client)
		healthy("after the trespass")
	})

	t.Run("oversized payload", func(t *testing.T) {
		c := dialFrom(t, s.MQTTAddr, "127.0.0.3", "default", "bad", bad.Token)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		c.Publish(ctx, &paho.Publish{Topic: mqtt.StreamTopic("default", "bad", "env"), QoS: 1, Payload: bytes.Repeat([]byte("x"), 2<<20)})
		awaitClosed(t, c.Client)
		healthy("after the oversized payload")
	})

	t.Run("publish flood", func(t *testing.T) {
		c := dialFrom(t, s.MQTTAddr, "127.0.0.3", "default", "bad", bad.Token)
		for i := 0; ; i++ {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_, err := c.Publish(ctx, &paho.Publish{Topic: mqtt.StreamTopic("default", "bad", "env"), QoS: 1,
				Payload: []byte(fmt.Sprintf(`[{"timestamp": %d, "n": %d}]`, time.Now().UnixMilli(), i))})
			cancel()
			if err != nil {
				if i < 20 {
					t.Fatalf("disconnected after %d publishes, within the burst of 20", i)
				}
				break
			}
			if i > 100 {
				t.Fatal("a flood of 100 publishes was not stopped")
			}
		}
		awaitClosed(t, c.Client)
		healthy("after the flood")
	})

	t.Run("idle connections", func(t *testing.T) {
		var idle []net.Conn
		for range 2000 {
			c, err := net.Dial("tcp", s.MQTTAddr)
			if err != nil {
				t.Fatalf("dial: %v", err)
			}
			idle = append(idle, c)
		}
		healthy("among 2000 idle connections")
		for _, c := range idle {
			c.SetReadDeadline(time.Now().Add(fleetdtest.Bound))
			if _, err := c.Read(make([]byte, 1)); err == nil || isTimeout(err) {
				t.Fatalf("an idle connection was not closed: %v", err)
			}
			c.Close()
		}
		healthy("after the idle connections were cut")
	})
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// dialFrom connects an MQTT 5 device from a local address of its own.
func dialFrom(t *testing.T, addr, local, tenant, id, token string) *fleetdtest.StreamDevice {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
	conn, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial from %s: %v", local, err)
	}
	c := paho.NewClient(paho.ClientConfig{Conn: conn})
	ctx, cancel := context.WithTimeout(context.Background(), fleetdtest.Bound)
	defer cancel()
	ca, err := c.Connect(ctx, &paho.Connect{KeepAlive: 30, ClientID: id, CleanStart: true,
		Username: tenant + "/" + id, UsernameFlag: true, Password: []byte(token), PasswordFlag: true})
	if err != nil {
		conn.Close()
		t.Fatalf("connect %s: %v (%+v)", id, err, ca)
	}
	t.Cleanup(func() { c.Disconnect(&paho.Disconnect{}); <-c.Done() })
	sctx, scancel := context.WithTimeout(context.Background(), fleetdtest.Bound)
	defer scancel()
	if _, err := c.Subscribe(sctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: mqtt.ActionsTopic(tenant, id), QoS: 1}}}); err != nil {
		t.Fatalf("subscribe %s: %v", id, err)
	}
	return &fleetdtest.StreamDevice{Client: c, Tenant: tenant, ID: id}
}

// connectCode returns the CONNACK reason code fleetd answers a CONNECT
// from local with.
func connectCode(t *testing.T, addr, local, username, password string) byte {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
	conn, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c := paho.NewClient(paho.ClientConfig{Conn: conn})
	ctx, cancel := context.WithTimeout(context.Background(), fleetdtest.Bound)
	defer cancel()
	ca, err := c.Connect(ctx, &paho.Connect{KeepAlive: 30, ClientID: "x", CleanStart: true,
		Username: username, UsernameFlag: true, Password: []byte(password), PasswordFlag: true})
	if err == nil {
		c.Disconnect(&paho.Disconnect{})
		return 0
	}
	conn.Close()
	if ca == nil {
		t.Fatalf("connect: %v", err)
	}
	return ca.ReasonCode
}

// awaitClosed waits until the server closed the client's connection.
func awaitClosed(t *testing.T, c *paho.Client) {
	t.Helper()
	select {
	case <-c.Done():
	case <-time.After(fleetdtest.Bound):
		t.Fatal("the abusive client was not disconnected")
	}
}
