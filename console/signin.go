package console

import (
	"net/http"
	"strings"
	"time"

	"github.com/fleetd/fleet"
)

// signinTTL bounds how long a sign-in form (or an OIDC round trip) may
// take.
const signinTTL = 15 * time.Minute

// signinData is the sign-in page's.
type signinData struct {
	Tenant string
	Next   string
	OIDC   bool // offer single sign-on
}

// handleSigninForm shows the sign-in form and gives the browser the token
// the form must send back: a sign-in cannot be forged from another site
// (login CSRF).
func (c *Console) handleSigninForm(w http.ResponseWriter, r *http.Request) error {
	v, err := c.signinView(w, r)
	if err != nil {
		return err
	}
	v.Data = signinData{Tenant: r.URL.Query().Get("tenant"), Next: localNext(r.URL.Query().Get("next")), OIDC: c.OIDC != nil}
	c.render(w, r, http.StatusOK, "signin", v)
	return nil
}

// signinView starts a sign-in: a new sign-in cookie and its token.
func (c *Console) signinView(w http.ResponseWriter, r *http.Request) (*view, error) {
	st := signin{CSRF: randomToken(), Expires: c.Now().Add(signinTTL).Unix()}
	val, err := c.seal.seal(r.Context(), signinCookie, st)
	if err != nil {
		return nil, err
	}
	c.setCookie(w, r, signinCookie, val, signinTTL)
	return &view{Title: "Sign in", CSRF: st.CSRF}, nil
}

// readSignin opens the sign-in cookie; a missing or stale one is an
// EFORBIDDEN that tells the person to reload.
func (c *Console) readSignin(r *http.Request) (*signin, error) {
	stale := fleet.Errorf(fleet.EFORBIDDEN, "this sign-in form is out of date; reload the page and try again")
	ck, err := r.Cookie(signinCookie)
	if err != nil {
		return nil, stale
	}
	var st signin
	if err := c.seal.open(r.Context(), signinCookie, ck.Value, &st); err != nil {
		return nil, stale
	}
	if c.Now().Unix() >= st.Expires {
		return nil, stale
	}
	return &st, nil
}

// handleSignin signs in with a tenant's name and an API key. A wrong
// tenant or key is one answer, as in the API.
func (c *Console) handleSignin(w http.ResponseWriter, r *http.Request) error {
	if !sameOrigin(r) {
		return fleet.Errorf(fleet.EFORBIDDEN, "this form was sent from another site")
	}
	st, err := c.readSignin(r)
	if err != nil {
		return err
	}
	if err := c.parseForm(w, r); err != nil {
		return err
	}
	if !tokensEqual(r.PostForm.Get("csrf"), st.CSRF) {
		return fleet.Errorf(fleet.EFORBIDDEN, "this sign-in form is out of date; reload the page and try again")
	}
	tenant := strings.TrimSpace(r.PostForm.Get("tenant"))
	key := strings.TrimSpace(r.PostForm.Get("key"))
	next := localNext(r.PostForm.Get("next"))
	again := func(status int, msg string) error { return c.signinAgainNext(w, r, status, tenant, next, msg) }
	a, err := c.Tenants.AuthenticateAPIKey(r.Context(), tenant, key)
	if fleet.ErrorCode(err) == fleet.EUNAUTHENTICATED {
		return again(http.StatusUnauthorized, "That tenant and API key do not match. Check both and try again.")
	} else if err != nil {
		return err
	}
	if !a.Role.Can(fleet.PermRead) {
		return again(http.StatusForbidden, "A key of the "+string(a.Role)+" role is for devices and gateways: it cannot sign in to the console.")
	}
	if err := c.startSession(w, r, &session{Tenant: tenant, Key: key}, a); err != nil {
		return err
	}
	http.Redirect(w, r, next, http.StatusSeeOther)
	return nil
}

// signinAgain shows the sign-in page again with a message.
func (c *Console) signinAgain(w http.ResponseWriter, r *http.Request, status int, tenant, msg string) error {
	return c.signinAgainNext(w, r, status, tenant, Prefix, msg)
}

func (c *Console) signinAgainNext(w http.ResponseWriter, r *http.Request, status int, tenant, next, msg string) error {
	v, err := c.signinView(w, r)
	if err != nil {
		return err
	}
	v.Error, v.Data = msg, signinData{Tenant: tenant, Next: next, OIDC: c.OIDC != nil}
	c.render(w, r, status, "signin", v)
	return nil
}

// handleSignout ends the session on the server, so a copy of the cookie
// is refused too, and deletes the cookie.
func (c *Console) handleSignout(w http.ResponseWriter, r *http.Request, v *view) error {
	if _, err := c.Sessions.EndConsoleSession(r.Context(), v.Actor.Tenant, v.Session, false); err != nil && fleet.ErrorCode(err) != fleet.ENOTFOUND {
		return err
	}
	c.setCookie(w, r, sessionCookie, "", 0)
	http.Redirect(w, r, "/console/signin", http.StatusSeeOther)
	return nil
}

// localNext is where to go after signing in: a console page, never another
// site.
func localNext(next string) string {
	if !strings.HasPrefix(next, Prefix) || strings.ContainsAny(next, "\\\r\n") || strings.HasPrefix(next, "//") {
		return Prefix
	}
	return next
}
