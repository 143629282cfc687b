// Package fleethttp is fleetd's HTTP API: the route table, authentication,
// body decoding in four encodings, the one error writer, metrics and the
// OpenAPI document that describes it all. Import it as fleethttp.
package fleethttp

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/codec"
	"github.com/fleetd/fleet/remote/relay"
	"github.com/prometheus/client_golang/prometheus"
)

// Limits bound request bodies (docs/api.md#request-bodies).
type Limits struct {
	Body   int64 // any JSON-like body; 1 MiB
	Bulk   int64 // bulk provisioning; 64 MiB
	Upload int64 // firmware archives; 2 GiB
	// Decoding bounds the bytes of bodies being decoded at once, over all
	// requests; 4 MiB. Decoding costs up to ~35 times a body, so this
	// bounds what decoding holds however many bodies arrive together; a
	// body waits its turn (decodingWait at most, then 503).
	Decoding int64
	// Held bounds the bytes of request bodies held in memory while they
	// arrive, over all requests; 128 MiB, at least twice Bulk (a body may
	// need twice its size while its buffer grows, body.go). A body that
	// finds no room waits (bodyWait at most, then 503).
	Held int64
}

// DefaultLimits are the documented defaults.
var DefaultLimits = Limits{Body: 1 << 20, Bulk: 64 << 20, Upload: 2 << 30, Decoding: 4 << 20, Held: 128 << 20}

// withDefaults fills in each limit left zero.
func (l Limits) withDefaults() Limits {
	d := DefaultLimits
	for _, f := range []struct{ v, def *int64 }{{&l.Body, &d.Body}, {&l.Bulk, &d.Bulk}, {&l.Upload, &d.Upload}, {&l.Decoding, &d.Decoding}, {&l.Held, &d.Held}} {
		if *f.v <= 0 {
			*f.v = *f.def
		}
	}
	return l
}

// Pinger reports whether a dependency is ready to serve.
type Pinger interface {
	Ping(ctx context.Context) error
}

// Server is fleetd's HTTP API. Fill in the services, then Open.
type Server struct {
	Addr     string
	Logger   *slog.Logger
	Now      func() time.Time
	Limits   Limits
	Registry *prometheus.Registry // metrics are registered here; nil keeps them private

	Tenants    fleet.TenantService
	Devices    fleet.DeviceService
	Shadows    fleet.ShadowService
	Groups     fleet.GroupService
	Audit      fleet.AuditService
	TenantAuth fleet.TenantAuthService  // S9 configuration
	Tokens     fleet.TokenAuthenticator // end users' bearer tokens; nil: API keys only
	Ready      []Pinger                 // all must answer for /readyz

	// Alerts serves alert rules, notification rules and alerts; Streams
	// takes device data in and serves each stream's latest point.
	Alerts  fleet.AlertService
	Streams fleet.StreamService
	// History reads the points streams kept and sets their retention.
	History fleet.HistoryService
	// Templates bounds the sample render of a notification template when a
	// rule is saved; zero is fleet.DefaultTemplateLimits.
	Templates fleet.TemplateLimits

	// Firmware serves bundles, firmwares and artifact downloads.
	Firmware fleet.FirmwareService

	// Actions dispatches actions and follows the devices' progress;
	// Delivery hands them to devices that poll (hawkBit DDI, ddi.go).
	Actions  fleet.ActionService
	Delivery fleet.ActionDelivery
	// DDI keeps the tenants' DDI settings and the devices' confirmations.
	DDI fleet.DDIService
	// DDIPollInterval is the sleep DDI devices are told between polls.
	DDIPollInterval time.Duration
	// RolloutNotifications keeps the rules that send rollouts' changes of
	// state to the tenants' channels.
	RolloutNotifications fleet.RolloutNotificationService

	// Security: TLS, timeouts against slow clients, rate limits
	// (security.go).
	Security Security
	// Follows caps the log follows a tenant holds open at once, shared
	// with the console's Logs tab; nil: DefaultFollowsPerTenant.
	Follows *Follows
	// DeviceCerts issues devices their client certificates for MQTT over
	// TLS; nil while fleetd has no MQTT TLS listener. UplinkBroker is where
	// devices reach that listener (devicecert.go).
	DeviceCerts  fleet.DeviceCertificateService
	UplinkBroker UplinkBroker

	// BrokerAuth, when set, answers an external MQTT broker's calls to
	// authenticate and authorise devices, under /broker/ (bridge.BrokerAuth).
	// They are not part of the API nor of its document.
	BrokerAuth http.Handler

	// Remote, when set, opens and relays remote sessions with devices
	// (remote.go); RemoteSessions lists them.
	Remote         *relay.Hub
	RemoteSessions fleet.RemoteSessionService

	// Console, when set, is served under /console/, and / leads to it.
	Console Console

	ln         net.Listener
	srv        *http.Server
	mux        *http.ServeMux
	ddiMux     *http.ServeMux // hawkBit DDI's paths (ddi.go)
	routes     []route
	metrics    *metrics
	openAPIDoc []byte
	limiters   limiters
	decoding   *codec.Budget // of Limits.Decoding
	// pointsAhead reads the next page of a client paging through points.
	pointsAhead *readAhead
	bodies      *bodies // of Limits.Held
	// decodingShares: what one client may hold of decoding at once.
	decodingShares *codec.Shares
}

// Open builds the routes and starts serving on Addr. A port in use is an
// error that names the flag to change.
func (s *Server) Open() error {
	if s.Logger == nil {
		s.Logger = slog.New(slog.DiscardHandler)
	}
	if s.Now == nil {
		s.Now = time.Now
	}
	s.build()
	ln, err := net.Listen("tcp", s.Addr)
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return fmt.Errorf("listen on %s: address already in use; choose another with --http-addr", s.Addr)
		}
		return fmt.Errorf("listen on %s: %w (see --http-addr)", s.Addr, err)
	}
	s.ln = &connLimit{Listener: ln, max: s.Security.MaxConnections, perAddr: s.Security.MaxConnectionsPerAddr, byAddr: map[netip.Addr]int{}}
	ln = s.ln
	s.srv = &http.Server{
		Handler:           s,
		ReadHeaderTimeout: s.Security.ReadHeaderTimeout,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    s.Security.MaxHeaderBytes,
		TLSConfig:         s.Security.TLS,
		ErrorLog:          slog.NewLogLogger(s.Logger.Handler(), slog.LevelWarn),
	}
	if s.Security.TLS != nil {
		go s.srv.ServeTLS(ln, "", "") // the certificate comes from TLSConfig
		return nil
	}
	go s.srv.Serve(ln)
	return nil
}

// build makes the mux and metrics; tests of the handler alone call it
// through Handler.
func (s *Server) build() {
	if s.mux != nil {
		return
	}
	s.Security = s.Security.withDefaults()
	if s.Follows == nil {
		s.Follows = &Follows{PerTenant: DefaultFollowsPerTenant}
	}
	s.Limits = s.Limits.withDefaults()
	s.decoding = codec.NewBudget(s.Limits.Decoding)
	s.decodingShares = codec.NewShares(max(s.Limits.Decoding/4, 1))
	s.limiters = newLimiters(s.Security, s.Now)
	s.metrics = newMetrics(s.Registry)
	s.bodies = newBodies(s.Limits.Held, s.Limits.Body, s.metrics.registry)
	s.pointsAhead = newReadAhead(s.Now, s.metrics.registry)
	s.mux, s.ddiMux = http.NewServeMux(), http.NewServeMux()
	s.routes = s.addRoutes()
	for _, rt := range s.routes {
		if _, path, _ := strings.Cut(rt.pattern, " "); strings.HasPrefix(path, ddiRoot) {
			s.ddiMux.Handle(rt.pattern, s.wrap(rt))
			continue
		}
		s.mux.Handle(rt.pattern, s.wrap(rt))
	}
	if s.BrokerAuth != nil {
		s.mux.Handle(brokerAuthPattern, s.internal(brokerAuthPattern, s.BrokerAuth))
	}
	s.addRemote()
	s.addConsole()
	s.openAPIDoc, _ = json.MarshalIndent(s.openAPI(), "", "  ") // plain maps always encode
}

// Handler returns the API as an http.Handler without listening, for tests
// and fuzzing that drive it in process.
func (s *Server) Handler() http.Handler {
	if s.Logger == nil {
		s.Logger = slog.New(slog.DiscardHandler)
	}
	if s.Now == nil {
		s.Now = time.Now
	}
	s.build()
	return s
}

// Addr returns the address the server listens on, once open.
func (s *Server) ListenAddr() net.Addr { return s.ln.Addr() }

// Shutdown stops accepting requests and waits for those in flight, then
// ends the remote sessions it relays.
func (s *Server) Shutdown(ctx context.Context) error {
	if s.srv == nil {
		return nil
	}
	err := s.srv.Shutdown(ctx)
	ahead := make(chan struct{})
	go func() { s.pointsAhead.wait(); close(ahead) }()
	select {
	case <-ahead:
	case <-ctx.Done():
		err = cmp.Or(err, ctx.Err())
	}
	if s.Remote != nil {
		// Remote sessions' connections were taken from the server
		// (hijacked): its Shutdown does not wait for them.
		s.Remote.Close()
	}
	return err
}

// ServeHTTP gives every request an id, recovers panics and turns the mux's
// own 404 and 405 answers into fleetd's error body.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id := r.Header.Get("X-Request-Id")
	if !validRequestID(id) {
		// Unique, not secret: a request id need not cost a system call
		// for randomness on every request.
		id = requestID(rand.Uint64())
	}
	w.Header().Set("X-Request-Id", id)
	ctx := fleet.NewContextWithRequestID(r.Context(), id)
	ctx = fleet.NewContextWithBaseURL(ctx, baseURL(r))
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		ctx = fleet.NewContextWithSource(ctx, host)
	}
	r = r.WithContext(ctx)

	mux := s.mux
	if isDDIPath(r.URL.Path) {
		mux = s.ddiMux
	}
	h, pattern := mux.Handler(r)
	if pattern != "" {
		mux.ServeHTTP(w, r) // only ServeHTTP fills in the path values
		return
	}
	// No route matched: learn from the mux whether the path exists with
	// another method (405, with its Allow header) or not at all.
	w, r = s.deadlines(w, r, nil)
	probe := &statusProbe{header: http.Header{}}
	h.ServeHTTP(probe, r)
	if probe.status == http.StatusMethodNotAllowed {
		w.Header().Set("Allow", probe.header.Get("Allow"))
		s.Error(w, r, fleet.Errorf(fleet.EMETHODNOTALLOWED, "%s is not allowed on %s; allowed: %s", r.Method, r.URL.Path, probe.header.Get("Allow")))
		return
	}
	s.Error(w, r, fleet.Errorf(fleet.ENOTFOUND, "no such endpoint: %s %s", r.Method, r.URL.Path))
}

// statusProbe records what the mux would answer, without writing it.
type statusProbe struct {
	header http.Header
	status int
}

func (p *statusProbe) Header() http.Header         { return p.header }
func (p *statusProbe) Write(b []byte) (int, error) { return len(b), nil }
func (p *statusProbe) WriteHeader(code int)        { p.status = code }

// requestID formats n as 16 hexadecimal digits, as %016x does, in one
// allocation where fmt.Sprintf made two.
func requestID(n uint64) string {
	const hex = "0123456789abcdef"
	var b [16]byte
	for i := len(b) - 1; i >= 0; i-- {
		b[i] = hex[n&0xf]
		n >>= 4
	}
	return string(b[:])
}

func validRequestID(id string) bool {
	if id == "" || len(id) > 64 {
		return false
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

// logger returns the request's logger, which carries its id. It is made
// when something is logged, not for every request: a logger with an
// attribute costs an allocation and the attribute's formatting.
func (s *Server) logger(r *http.Request) *slog.Logger {
	if id := fleet.RequestIDFromContext(r.Context()); id != "" {
		return s.Logger.With(slog.String("request_id", id))
	}
	return s.Logger
}

// handlerFunc is a handler that returns its error for the one error writer.
type handlerFunc func(w http.ResponseWriter, r *http.Request) error

// wrap runs a route: metrics, the access log, panic recovery,
// authentication and the role check, then the handler.
func (s *Server) wrap(rt route) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		w, r = s.deadlines(w, r, &rt)
		rec := &recorder{ResponseWriter: w, status: http.StatusOK}
		defer func() {
			if p := recover(); p != nil {
				if p == http.ErrAbortHandler {
					panic(p)
				}
				s.logger(r).Error("panic", slog.Any("panic", p), slog.String("stack", string(debug.Stack())))
				if !rec.wrote {
					s.Error(rec, r, errors.New("panic"))
				}
			}
			elapsed := time.Since(start)
			s.metrics.observe(rt.pattern, rec.status, elapsed)
			level := slog.LevelInfo
			if rec.status >= 500 {
				level = slog.LevelError
			}
			if !s.Logger.Enabled(r.Context(), level) {
				return
			}
			attrs := []any{
				slog.String("request_id", fleet.RequestIDFromContext(r.Context())),
				slog.String("method", r.Method), slog.String("route", rt.pattern), slog.String("path", r.URL.Path),
				slog.Int("status", rec.status), slog.Duration("duration", elapsed),
			}
			if a := fleet.ActorFromContext(r.Context()); a != nil {
				attrs = append(attrs, slog.String("tenant", a.Tenant), slog.String("actor", a.UserName))
			}
			s.Logger.Log(r.Context(), level, "request", attrs...)
		}()
		if rt.perm != public {
			a, err := s.authenticate(r, rt.perm)
			if err != nil {
				if fleet.ErrorCode(err) == fleet.ERATELIMITED {
					rec.Header().Set("Retry-After", "1") // S9 webhook calls, refilled by the second
				}
				s.Error(rec, r, err)
				return
			}
			// The deferred log line sees this r too: closures share it.
			r = r.WithContext(fleet.NewContextWithActor(r.Context(), a))
			if err := s.limit(rec, rt, a); err != nil {
				s.Error(rec, r, err)
				return
			}
		}
		if !rt.op.takesQuery() && r.URL.RawQuery != "" {
			// Routes that read no query refuse any; the others check
			// theirs as they read them (query.go).
			if err := newQuery(r).Err(); err != nil {
				s.Error(rec, r, err)
				return
			}
		}
		if err := rt.handler(rec, r); err != nil {
			s.Error(rec, r, err)
		}
	})
}

// recorder remembers the status for logs and metrics.
type recorder struct {
	http.ResponseWriter
	status int
	wrote  bool
}

func (r *recorder) WriteHeader(code int) {
	if !r.wrote {
		r.status = code
		r.wrote = true
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *recorder) Write(b []byte) (int, error) {
	r.wrote = true
	return r.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection (flushes,
// deadlines for large downloads).
func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// baseURL is the scheme and host a client used, for Location headers.
func baseURL(r *http.Request) string {
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + r.Host
}

// location sets the Location header of a created resource.
func location(w http.ResponseWriter, r *http.Request, path ...string) {
	w.Header().Set("Location", baseURL(r)+strings.Join(path, ""))
}

// nextLink sets the Link header of a page of a cursor-paged read (RFC
// 8288, as GitHub's API pages): the request's URL with cursor set to next,
// its other parameters as they were. A client can ask for the next page as
// soon as it has this page's headers, and read this page's body meanwhile
// (docs/api.md#lists). After the last page (next is "") there is none.
func nextLink(w http.ResponseWriter, r *http.Request, next string) {
	if next == "" {
		return
	}
	q := r.URL.Query()
	q.Set("cursor", next)
	w.Header().Set("Link", "<"+baseURL(r)+r.URL.EscapedPath()+"?"+q.Encode()+`>; rel="next"`)
}
