package fleethttp

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/remote"
)

// Remote sessions (docs/api.md, Remote sessions): POST makes one and asks
// the device for it; then two legs (WebSockets or streams) meet in the relay, the
// operator's and the device's. The WebSockets are outside the route table
// (an upgrade is not a JSON answer the document could describe); their
// paths are remoteOperatorPattern and remoteDevicePattern.
const (
	remoteOperatorPattern = "GET /api/v1/remote-sessions/{id}/operator"
	remoteDevicePattern   = "GET /api/v1/remote-sessions/{id}/device"
)

type remoteCreate struct {
	Kind   string `json:"kind"`
	Target string `json:"target"`
}

type remoteSessionList struct {
	RemoteSessions []*fleet.RemoteSession `json:"remote_sessions"`
	Count          int                    `json:"count"`
}

// maxRemoteTarget bounds a session's target: a command, a port or a path.
const maxRemoteTarget = 4096

func (s *Server) handleCreateRemoteSession(w http.ResponseWriter, r *http.Request) error {
	id, err := deviceID(r)
	if err != nil {
		return err
	}
	body, err := s.decode(w, r, s.Limits.Body, ordinaryElements)
	if err != nil {
		return err
	}
	f := fleet.NewFields(body)
	kind := f.String("kind", true)
	target := ""
	if f.Has("target") {
		target = f.String("target", false)
	}
	f.Unknown()
	switch kind {
	case fleet.RemoteShell:
	case fleet.RemoteForward:
		if p, err := strconv.Atoi(target); err != nil || p < 1 || p > 65535 || strconv.Itoa(p) != target {
			f.Fail("target", "must be the device's TCP port to forward to, 1 to 65535")
		}
	case fleet.RemoteGet, fleet.RemotePut:
		if target == "" {
			f.Fail("target", "must be the file's path on the device")
		}
	case "":
	default:
		f.Fail("kind", "must be shell, forward, get or put")
	}
	if len(target) > maxRemoteTarget || strings.ContainsRune(target, 0) {
		f.Fail("target", fmt.Sprintf("must be at most %d bytes, without NUL", maxRemoteTarget))
	}
	if err := f.Err(); err != nil {
		return err
	}
	if _, err := s.Devices.FindDevice(r.Context(), tenantOf(r), id); err != nil {
		return err
	}
	if s.Remote == nil {
		return fleet.Errorf(fleet.EUNAVAILABLE, "remote sessions are not served here")
	}
	sess, err := s.Remote.Open(r.Context(), fleet.ActorFromContext(r.Context()), id, kind, target)
	if err != nil {
		return err
	}
	location(w, r, "/api/v1/remote-sessions/", sess.ID, "/operator")
	s.respond(w, r, http.StatusCreated, &sess.RemoteSession)
	return nil
}

// handleListRemoteSessions lists the sessions of the device the path
// names, or the tenant's (GET /api/v1/remote-sessions, the console's
// sessions page), those of one device with ?device_id=; ?open=true keeps
// those not ended.
func (s *Server) handleListRemoteSessions(w http.ResponseWriter, r *http.Request) error {
	q := newQuery(r)
	var f fleet.RemoteSessionFilter
	if r.PathValue("id") != "" {
		var err error
		if f.DeviceID, err = deviceID(r); err != nil {
			return err
		}
	} else if f.DeviceID = q.String("device_id"); f.DeviceID != "" && !fleet.ValidDeviceID(f.DeviceID) {
		q.fail("device_id", fleet.DeviceIDRule)
	}
	f.Open = q.Enum("open", "false", "true", "false") == "true"
	f.Page = q.Page()
	if err := q.Err(); err != nil {
		return err
	}
	if r.PathValue("id") != "" {
		if _, err := s.Devices.FindDevice(r.Context(), tenantOf(r), f.DeviceID); err != nil {
			return err
		}
	}
	list, n, err := s.RemoteSessions.FindRemoteSessions(r.Context(), tenantOf(r), f)
	if err != nil {
		return err
	}
	s.respond(w, r, http.StatusOK, remoteSessionList{RemoteSessions: list, Count: n})
	return nil
}

// deviceRemoteSession is the device's session that the path names, and
// the device's id: ENOTFOUND for a session of another device or tenant.
func (s *Server) deviceRemoteSession(r *http.Request) (*fleet.RemoteSession, error) {
	id, err := deviceID(r)
	if err != nil {
		return nil, err
	}
	return s.RemoteSessions.FindRemoteSession(r.Context(), tenantOf(r), id, r.PathValue("sid"))
}

// handleEndRemoteSession ends an open session on whichever replica relays
// it, as the console's End button does: the relaying replica hears of it
// (fleet.ChangeRemoteSessionStop), tells the operator why and records the
// end; one whose replica was lost is ended at once (relay.Hub.Stop). The
// answer is the session as it was asked to end.
func (s *Server) handleEndRemoteSession(w http.ResponseWriter, r *http.Request) error {
	rs, err := s.deviceRemoteSession(r)
	if err != nil {
		return err
	}
	if rs.EndedAt != nil {
		return fleet.Errorf(fleet.ECONFLICT, "remote session %s has ended already (%s)", rs.ID, rs.EndReason)
	}
	stop := s.RemoteSessions.StopRemoteSession
	if s.Remote != nil {
		stop = s.Remote.Stop // a session of a lost replica ends here
	}
	if err := stop(r.Context(), tenantOf(r), rs.ID, fleet.ActorFromContext(r.Context()).UserName); err != nil {
		return err
	}
	s.respond(w, r, http.StatusAccepted, rs)
	return nil
}

// handleRemoteRecording sends a session's recording, an asciicast v2 file.
func (s *Server) handleRemoteRecording(w http.ResponseWriter, r *http.Request) error {
	id, err := deviceID(r)
	if err != nil {
		return err
	}
	if s.Remote == nil {
		return fleet.Errorf(fleet.EUNAVAILABLE, "remote sessions are not served here")
	}
	return s.Remote.ServeRecording(w, r, tenantOf(r), id, r.PathValue("sid"))
}

// remoteSettingsHandlers serve a tenant's remote-session settings.
func (s *Server) remoteSettingsHandlers() (read, write func(http.ResponseWriter, *http.Request) error) {
	get := func(ctx context.Context, tenant string) (fleet.RemoteSettings, error) {
		return s.RemoteSessions.RemoteSettings(ctx, tenant)
	}
	set := func(ctx context.Context, tenant string, v fleet.RemoteSettings) error {
		return s.RemoteSessions.SetRemoteSettings(ctx, tenant, v)
	}
	return settingsHandlers(s, get, func(f *fleet.Fields) fleet.RemoteSettings {
		v := fleet.RemoteSettings{Recording: f.Bool("recording", true)}
		f.Unknown()
		return v
	}, set)
}

// handleRemoteOperator is the operator's leg: the person who made the
// session, with the remote permission still, joins it.
func (s *Server) handleRemoteOperator(w http.ResponseWriter, r *http.Request) error {
	if s.Remote.Proxy(w, r, r.Header.Get("X-Service-Tenant"), r.PathValue("id")) {
		return nil // relayed by another replica, which authenticated it
	}
	a, err := s.authenticate(r, fleet.PermRemote)
	if err != nil {
		return err
	}
	return s.Remote.JoinOperator(w, r, a, r.PathValue("id"))
}

// handleRemoteDevice is the device's leg: the session's device, with its
// token, dials back (docs/agent.md).
func (s *Server) handleRemoteDevice(w http.ResponseWriter, r *http.Request) error {
	if s.Remote.Proxy(w, r, r.Header.Get("X-Service-Tenant"), r.PathValue("id")) {
		return nil // relayed by another replica, which authenticated it
	}
	sess, ok := s.Remote.Waiting(r.PathValue("id"))
	tenant := r.Header.Get("X-Service-Tenant")
	scheme, token, _ := strings.Cut(r.Header.Get("Authorization"), " ")
	if !strings.EqualFold(scheme, "TargetToken") || token == "" {
		return fleet.Errorf(fleet.EUNAUTHENTICATED, "send X-Service-Tenant and Authorization: TargetToken <the device's token>")
	}
	if !ok || sess.Tenant != tenant {
		return fleet.Errorf(fleet.ENOTFOUND, "no remote session %q waits for a device", r.PathValue("id"))
	}
	if err := s.Devices.AuthenticateDevice(r.Context(), tenant, sess.DeviceID, token); err != nil {
		return err
	}
	if !remote.IsUpgrade(r) {
		return fleet.Errorf(fleet.EINVALID, "this is a WebSocket or a stream: connect with an Upgrade request")
	}
	c, err := remote.Upgrade(w, r)
	if err != nil {
		return nil // Upgrade answered
	}
	if !s.Remote.Join(sess, c) {
		c.Send(remote.Control{Type: remote.TypeError, Message: "the session ended before the device joined it"})
		c.Close()
		return nil
	}
	// The relay owns the connection now: the request ends, and with it
	// what the HTTP server kept for it.
	return nil
}

// addRemote serves the two legs, when remote sessions are on.
func (s *Server) addRemote() {
	if s.Remote == nil {
		return
	}
	for pattern, h := range map[string]handlerFunc{remoteOperatorPattern: s.handleRemoteOperator, remoteDevicePattern: s.handleRemoteDevice} {
		s.mux.Handle(pattern, s.wrap(route{pattern: pattern, perm: public, handler: h}))
	}
}
