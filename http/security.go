package fleethttp

import (
	"crypto/tls"
	"io"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/ratelimit"
)

// Security is what protects the API from the network: TLS, timeouts
// against slow clients, and rate limits per API key and end user. The
// zero value means the defaults (and no TLS).
type Security struct {
	// TLS, when set, makes the API HTTPS only (HTTP/2 included).
	TLS *tls.Config

	// ReadHeaderTimeout bounds how long a client may take to send a
	// request's headers: the defence against slowloris. Default 10s.
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds how long a client may take to send the body of an
	// ordinary request; for bulk provisioning and firmware uploads, which
	// may take long on a slow link, it bounds each pause instead. Default
	// 30s.
	ReadTimeout time.Duration
	// WriteTimeout bounds how long a response may take, from the end of the
	// headers; for artifact downloads, each pause of a client that does not
	// read. Default 2 minutes.
	WriteTimeout time.Duration
	// MaxHeaderBytes caps a request's headers. Default 64 KiB.
	MaxHeaderBytes int

	// Rate and Burst limit each API key and each end user of a tenant, per
	// replica, on every authenticated route except device data; beyond,
	// 429 with Retry-After. DeviceDataRate and DeviceDataBurst limit
	// status reports (S10) and stream ingest, where gateways of whole
	// fleets send a lot. A negative rate lifts a limit.
	Rate, DeviceDataRate   float64
	Burst, DeviceDataBurst int
	// DDIRegistrationRate and DDIRegistrationBurst limit the devices a
	// tenant's gateways may register by polling DDI for an unknown
	// controller (docs/hawkbit.md), per replica; beyond, 429.
	DDIRegistrationRate  float64
	DDIRegistrationBurst int

	// MaxConnections and MaxConnectionsPerAddr cap the connections open
	// at once, in total and from one source address; beyond, a new
	// connection is closed as soon as it is accepted. ≤ 0 lifts a cap.
	MaxConnections, MaxConnectionsPerAddr int

	// MetricsToken, when set, is the bearer token GET /metrics needs: the
	// series count every tenant's requests and devices.
	MetricsToken string
}

// Defaults of Security.
const (
	DefaultReadHeaderTimeout    = 10 * time.Second
	DefaultReadTimeout          = 30 * time.Second
	DefaultWriteTimeout         = 2 * time.Minute
	DefaultMaxHeaderBytes       = 64 << 10
	DefaultRate                 = 100
	DefaultBurst                = 200
	DefaultDeviceDataRate       = 20_000
	DefaultDeviceDataBurst      = 40_000
	DefaultDDIRegistrationRate  = 1
	DefaultDDIRegistrationBurst = 100
	DefaultMaxConnections       = 20_000
	DefaultMaxConnsPerAddr      = 1_000
)

func (c Security) withDefaults() Security {
	if c.ReadHeaderTimeout <= 0 {
		c.ReadHeaderTimeout = DefaultReadHeaderTimeout
	}
	if c.ReadTimeout <= 0 {
		c.ReadTimeout = DefaultReadTimeout
	}
	if c.WriteTimeout <= 0 {
		c.WriteTimeout = DefaultWriteTimeout
	}
	if c.MaxHeaderBytes <= 0 {
		c.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if c.Rate == 0 {
		c.Rate = DefaultRate
	}
	if c.Burst <= 0 {
		c.Burst = max(DefaultBurst, int(c.Rate))
	}
	if c.DeviceDataRate == 0 {
		c.DeviceDataRate = DefaultDeviceDataRate
	}
	if c.DeviceDataBurst <= 0 {
		c.DeviceDataBurst = max(DefaultDeviceDataBurst, int(c.DeviceDataRate))
	}
	if c.DDIRegistrationRate <= 0 {
		c.DDIRegistrationRate = DefaultDDIRegistrationRate
	}
	if c.DDIRegistrationBurst <= 0 {
		c.DDIRegistrationBurst = DefaultDDIRegistrationBurst
	}
	return c
}

// limiters are the rate limits of the routes, built by Open.
type limiters struct {
	api, deviceData *ratelimit.Limiter
	// ddiRegistration is per tenant.
	ddiRegistration *ratelimit.Limiter
}

// clientKey names the client an actor is, for its rate limits and its
// share of the decoding budget: an API key is its name in its tenant; an
// end user, who they are.
func clientKey(a *fleet.Actor) string {
	if a == nil {
		return ""
	}
	if a.KeyName != "" {
		return a.Tenant + "\x00k\x00" + a.KeyName
	}
	return a.Tenant + "\x00u\x00" + a.UserName + "\x00" + a.UserEmail
}

func newLimiters(c Security, now func() time.Time) limiters {
	return limiters{
		api:             &ratelimit.Limiter{Rate: c.Rate, Burst: c.Burst, Now: now},
		deviceData:      &ratelimit.Limiter{Rate: c.DeviceDataRate, Burst: c.DeviceDataBurst, Now: now},
		ddiRegistration: &ratelimit.Limiter{Rate: c.DDIRegistrationRate, Burst: c.DDIRegistrationBurst, Now: now},
	}
}

// limit spends one of the actor's tokens for the route, or answers
// ERATELIMITED with the Retry-After header set.
func (s *Server) limit(w http.ResponseWriter, rt route, a *fleet.Actor) error {
	return s.limitActor(w, rt.perm, a)
}

// limitActor is limit for handlers of public routes that authenticate by
// themselves (artifact downloads with an API key).
func (s *Server) limitActor(w http.ResponseWriter, perm fleet.Permission, a *fleet.Actor) error {
	l := s.limiters.api
	if perm == fleet.PermDeviceData {
		l = s.limiters.deviceData
	}
	if l == nil {
		return nil
	}
	ok, retry := l.Allow(clientKey(a))
	if ok {
		return nil
	}
	secs := int(math.Ceil(retry.Seconds()))
	w.Header().Set("Retry-After", strconv.Itoa(max(secs, 1)))
	who := "API key " + strconv.Quote(a.KeyName)
	if a.KeyName == "" {
		who = "user " + strconv.Quote(a.UserName)
	}
	return fleet.Errorf(fleet.ERATELIMITED, "%s has made more than %s requests a second of this kind lately; retry in %d s",
		who, strconv.FormatFloat(l.Rate, 'f', -1, 64), max(secs, 1))
}

// deadlines sets the connection's deadlines for one request: the whole
// body within ReadTimeout and the whole response within WriteTimeout, or
// for the routes that stream large bodies, a deadline that moves with each
// read or write. Every request sets both, since the server does not reset
// a deadline a previous request on the connection left behind.
func (s *Server) deadlines(w http.ResponseWriter, r *http.Request, rt *route) (http.ResponseWriter, *http.Request) {
	rc := http.NewResponseController(w)
	now := time.Now()
	sec := s.Security
	_ = rc.SetReadDeadline(now.Add(sec.ReadTimeout))
	if rt != nil && streamsBody(*rt) {
		r.Body = &movingReadDeadline{ReadCloser: r.Body, rc: rc, read: sec.ReadTimeout, write: sec.WriteTimeout}
	}
	if rt != nil && streamsResponse(*rt) {
		_ = rc.SetWriteDeadline(now.Add(sec.WriteTimeout))
		return &movingWriteDeadline{ResponseWriter: w, rc: rc, d: sec.WriteTimeout}, r
	}
	_ = rc.SetWriteDeadline(now.Add(sec.WriteTimeout))
	return w, r
}

// streamsBody reports whether a route takes bodies too large to arrive
// within one ReadTimeout on a slow link.
func streamsBody(rt route) bool {
	return rt.op.Upload || rt.pattern == "POST /api/v1/devices/bulk"
}

// streamsResponse reports whether a route sends files.
func streamsResponse(rt route) bool { return rt.op.Raw == "application/octet-stream" }

// movingReadDeadline gives each read of the body ReadTimeout, and the
// response WriteTimeout from the last read: the answer to a long upload
// comes after it.
type movingReadDeadline struct {
	io.ReadCloser
	rc          *http.ResponseController
	read, write time.Duration
}

func (m *movingReadDeadline) Read(p []byte) (int, error) {
	now := time.Now()
	_ = m.rc.SetReadDeadline(now.Add(m.read))
	_ = m.rc.SetWriteDeadline(now.Add(m.write))
	return m.ReadCloser.Read(p)
}

// movingWriteDeadline gives each write of the response WriteTimeout.
type movingWriteDeadline struct {
	http.ResponseWriter
	rc *http.ResponseController
	d  time.Duration
}

func (m *movingWriteDeadline) Write(p []byte) (int, error) {
	_ = m.rc.SetWriteDeadline(time.Now().Add(m.d))
	return m.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController reach the connection.
func (m *movingWriteDeadline) Unwrap() http.ResponseWriter { return m.ResponseWriter }

// ReadFrom keeps io.Copy from bypassing Write, which moves the deadline:
// http.ServeContent copies with io.CopyN.
func (m *movingWriteDeadline) ReadFrom(r io.Reader) (int64, error) {
	return io.Copy(struct{ io.Writer }{m}, r)
}
