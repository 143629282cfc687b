package console

import (
	"crypto/rand"
	"encoding/base64"
	"net/http"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/remote/relay"
)

// Remote sessions in the console (docs/console.md, Terminal): an operator
// opens a terminal on a device from its page; the terminal's page runs
// xterm.js (vendored under static/xterm) on a WebSocket to the relay,
// authenticated by the session cookie. Anyone who may read sees the
// sessions; operators may end one, whichever replica relays it.

type remoteSessionsData struct {
	Device   string // "" for the tenant's list
	Sessions []*fleet.RemoteSession
	Pager    pager
}

type terminalData struct {
	Session *fleet.RemoteSession
	Nonce   string // of the styles xterm.js adds to the page
}

// remoteHub fails when this fleetd serves no remote sessions.
func (c *Console) remoteHub() error {
	if c.Remote == nil {
		return fleet.Errorf(fleet.EUNAVAILABLE, "remote sessions are not served here")
	}
	return nil
}

// handleOpenTerminal opens a shell session on the device's pty for the
// signed-in person, tied to this console session (ending it ends the
// terminal), and goes to its page, which joins it.
func (c *Console) handleOpenTerminal(w http.ResponseWriter, r *http.Request, v *view) error {
	if err := c.remoteHub(); err != nil {
		return err
	}
	id := r.PathValue("id")
	if _, err := c.Devices.FindDevice(r.Context(), v.Actor.Tenant, id); err != nil {
		return err
	}
	a := *v.Actor
	a.ConsoleSession = v.Session
	s, err := c.Remote.Open(r.Context(), &a, id, fleet.RemoteShell, "")
	if err != nil {
		return err
	}
	http.Redirect(w, r, "/console/remote-sessions/"+s.ID+"/terminal", http.StatusSeeOther)
	return nil
}

// handleTerminal is a waiting session's terminal. xterm.js adds <style>
// elements to the page, so this page's policy allows styles that carry
// its nonce (terminal.js gives it to them); scripts stay the console's own.
func (c *Console) handleTerminal(w http.ResponseWriter, r *http.Request, v *view) error {
	if err := c.remoteHub(); err != nil {
		return err
	}
	// The session may be another replica's: its row says whose it is.
	rs, err := c.RemoteSessions.FindOpenRemoteSession(r.Context(), v.Actor.Tenant, r.PathValue("id"))
	if err != nil && fleet.ErrorCode(err) != fleet.ENOTFOUND {
		return err
	}
	if err != nil || !relay.OpenedBy(rs, v.Actor) {
		return fleet.Errorf(fleet.ENOTFOUND, "no terminal of yours waits here: open one from the device's page")
	}
	b := make([]byte, 18)
	rand.Read(b)
	nonce := base64.RawURLEncoding.EncodeToString(b)
	w.Header().Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self' 'nonce-"+nonce+"'; img-src 'self' data:; "+
		"object-src 'none'; base-uri 'none'; frame-ancestors 'none'")
	v.Title, v.Nav, v.Data = "Terminal on "+rs.DeviceID, "devices", terminalData{Session: rs, Nonce: nonce}
	c.render(w, r, http.StatusOK, "terminal", v)
	return nil
}

// handleTerminalSocket is the terminal's WebSocket: the operator's leg.
// The upgrade refuses another site's page (its Origin), so only the
// console's own page joins with the cookie.
func (c *Console) handleTerminalSocket(w http.ResponseWriter, r *http.Request, v *view) error {
	if err := c.remoteHub(); err != nil {
		return err
	}
	if c.Remote.Proxy(w, r, v.Actor.Tenant, r.PathValue("id")) {
		return nil // relayed by another replica, which authenticated it
	}
	return c.Remote.JoinOperator(w, r, v.Actor, r.PathValue("id"))
}

// handleRemoteSessions lists a device's remote sessions, or the tenant's.
func (c *Console) handleRemoteSessions(w http.ResponseWriter, r *http.Request, v *view) error {
	p, err := readPage(r)
	if err != nil {
		return err
	}
	d := remoteSessionsData{Device: r.PathValue("id")}
	if d.Device != "" {
		if _, err := c.Devices.FindDevice(r.Context(), v.Actor.Tenant, d.Device); err != nil {
			return err
		}
	}
	var n int
	if d.Sessions, n, err = c.RemoteSessions.FindRemoteSessions(r.Context(), v.Actor.Tenant, fleet.RemoteSessionFilter{DeviceID: d.Device, Page: p}); err != nil {
		return err
	}
	d.Pager = newPager(r, p, n)
	v.Title, v.Nav, v.Data = "Remote sessions", "sessions", d
	if d.Device != "" {
		v.Title, v.Nav = "Remote sessions of "+d.Device, "devices"
	}
	c.render(w, r, http.StatusOK, "remotesessions", v)
	return nil
}

// handleStopRemoteSession ends an open session on whichever replica
// relays it, and comes back to the list it was ended from.
func (c *Console) handleStopRemoteSession(w http.ResponseWriter, r *http.Request, v *view) error {
	stop := c.RemoteSessions.StopRemoteSession
	if c.Remote != nil {
		stop = c.Remote.Stop // a session of a lost replica ends here
	}
	if err := stop(r.Context(), v.Actor.Tenant, r.PathValue("id"), v.Actor.UserName); err != nil {
		return err
	}
	back := "/console/remote-sessions"
	if d := r.PostForm.Get("device"); d != "" {
		back = "/console/devices/" + d + "/remote-sessions"
	}
	http.Redirect(w, r, back, http.StatusSeeOther)
	return nil
}

// handleRemoteRecording sends a recorded session's output, an asciicast
// v2 file, as the API does: to those who may open sessions.
func (c *Console) handleRemoteRecording(w http.ResponseWriter, r *http.Request, v *view) error {
	if err := c.remoteHub(); err != nil {
		return err
	}
	return c.Remote.ServeRecording(w, r, v.Actor.Tenant, r.PathValue("id"), r.PathValue("sid"))
}

// remoteSettings is the page of the tenant's choice to record shell
// sessions.
func (c *Console) remoteSettings() checkboxSettings[fleet.RemoteSettings] {
	return checkboxSettings[fleet.RemoteSettings]{path: "/console/settings/remote", title: "Remote sessions", template: "remotesettings",
		flash: "Saved. Shell sessions opened from now on follow it.",
		read:  c.RemoteSessions.RemoteSettings,
		write: c.RemoteSessions.SetRemoteSettings,
		form: func(ticked func(string) bool) fleet.RemoteSettings {
			return fleet.RemoteSettings{Recording: ticked("recording")}
		}}
}
