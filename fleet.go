// Package fleet is fleetd's domain: devices, actions, firmware, alerts and the
// tenants that own them, the errors every layer speaks, and the services the
// adapters implement. It imports no technology; sqlstore, http, mqtt and codec
// adapt it to the world, and internal/server wires them together.
package fleet

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"regexp"
	"time"
)

// Role is what a caller may do inside its tenant.
type Role string

// The four roles (docs/api.md#roles).
const (
	RoleViewer   Role = "viewer"
	RoleDevice   Role = "device"
	RoleOperator Role = "operator"
	RoleAdmin    Role = "admin"
)

// Permission is a class of request; each route requires one.
type Permission int

// Permissions, from least to most powerful. A role grants a set of them.
const (
	PermRead       Permission = iota // every GET of fleet data
	PermDeviceData                   // status reports and stream ingest
	PermOperate                      // change devices, actions, firmware, alert rules
	PermAdmin                        // API keys, tenant auth, audit logs
	PermRemote                       // remote sessions with devices: operators and admins, never viewers or devices
)

// Valid reports whether r is one of the four roles.
func (r Role) Valid() bool {
	switch r {
	case RoleViewer, RoleDevice, RoleOperator, RoleAdmin:
		return true
	}
	return false
}

// Can reports whether the role grants p. Operators may report device data
// too: they act for devices when testing a fleet by hand.
func (r Role) Can(p Permission) bool {
	switch r {
	case RoleAdmin:
		return true
	case RoleOperator:
		return p != PermAdmin
	case RoleViewer:
		return p == PermRead
	case RoleDevice:
		return p == PermDeviceData
	}
	return false
}

// Tenant is an isolated customer of the service. Its name is its id.
type Tenant struct {
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
}

var tenantName = regexp.MustCompile(`^[a-z0-9-]{1,63}$`)

// ValidTenantName reports whether s may name a tenant: 1–63 of [a-z0-9-].
func ValidTenantName(s string) bool { return tenantName.MatchString(s) }

// Actor is who makes a request: an API key or a tenant's end user.
type Actor struct {
	Tenant    string
	Role      Role
	KeyName   string // the API key's name; empty for end users
	UserName  string // who the actor says it is; the key name for API keys
	UserEmail string
	// KeyHash is the SHA-256 of the API key the actor authenticated with
	// ("" for end users): its deletion announces it (ChangeAPIKey), and
	// what the actor opened that outlives a request (a remote session)
	// ends then.
	KeyHash string
	// ConsoleSession is the id of the console session the actor acts
	// through, if any: its end announces it (ChangeConsoleSession).
	ConsoleSession string
}

type actorKey struct{}

// NewContextWithActor returns ctx carrying a.
func NewContextWithActor(ctx context.Context, a *Actor) context.Context {
	return context.WithValue(ctx, actorKey{}, a)
}

// ActorFromContext returns the actor of the request, or nil.
func ActorFromContext(ctx context.Context) *Actor {
	a, _ := ctx.Value(actorKey{}).(*Actor)
	return a
}

// NewSecret returns a new random credential with a readable prefix, such as
// "fk_…" for API keys. It carries 256 bits of randomness.
func NewSecret(prefix string) string {
	b := make([]byte, 32)
	rand.Read(b) // never fails (crypto/rand)
	return prefix + base64.RawURLEncoding.EncodeToString(b)
}

// HashSecret returns the SHA-256 of a credential as hex, as stored at rest.
func HashSecret(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

// SecretMatches compares a presented credential with a stored hash in
// constant time.
func SecretMatches(secret, hash string) bool {
	h := HashSecret(secret)
	return subtle.ConstantTimeCompare([]byte(h), []byte(hash)) == 1
}

// Page selects one page of a list: Page counts from 1.
type Page struct {
	Page  int
	Limit int
}

// Offset is the number of items before the page.
func (p Page) Offset() int { return (p.Page - 1) * p.Limit }

// Default and largest page sizes of every list (docs/api.md#lists).
const (
	DefaultLimit = 50
	MaxLimit     = 1000
)
