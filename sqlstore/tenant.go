package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"time"

	"github.com/fleetd/fleet"
)

var _ fleet.TenantService = (*DB)(nil)

// millis is how times are stored: epoch milliseconds, UTC.
func millis(t time.Time) int64 { return t.UnixMilli() }

func fromMillis(ms int64) time.Time { return time.UnixMilli(ms).UTC() }

// CreateTenant makes a tenant with an admin key named "admin".
func (db *DB) CreateTenant(ctx context.Context, name string) (*fleet.Tenant, string, error) {
	if !fleet.ValidTenantName(name) {
		return nil, "", fleet.FieldErrors(map[string]string{"name": "must be 1 to 63 characters from a-z 0-9 -"})
	}
	t := &fleet.Tenant{Name: name}
	key := &fleet.APIKey{Name: "admin", Role: fleet.RoleAdmin}
	err := db.update(ctx, func(ctx context.Context, tx *Tx) error {
		t.CreatedAt = tx.now.Truncate(time.Millisecond)
		if _, err := tx.exec(ctx, "INSERT INTO tenants (name, created_at) VALUES (?, ?)", name, millis(t.CreatedAt)); err != nil {
			if isUniqueViolation(err) {
				return fleet.Errorf(fleet.ECONFLICT, "tenant %q exists already", name)
			}
			return err
		}
		if err := tx.createAPIKey(ctx, name, key); err != nil {
			return err
		}
		return tx.audit(ctx, name, "tenant.create", "tenants/"+name, nil)
	})
	if err != nil {
		return nil, "", err
	}
	return t, key.Key, nil
}

// FindTenants lists every tenant by name.
func (db *DB) FindTenants(ctx context.Context) ([]*fleet.Tenant, error) {
	rows, err := db.query(ctx, "SELECT name, created_at FROM tenants ORDER BY name")
	if err != nil {
		return nil, db.classify(err)
	}
	defer rows.Close()
	var ts []*fleet.Tenant
	for rows.Next() {
		var t fleet.Tenant
		var created int64
		if err := rows.Scan(&t.Name, &created); err != nil {
			return nil, err
		}
		t.CreatedAt = fromMillis(created)
		ts = append(ts, &t)
	}
	return ts, rows.Err()
}

// CreateAPIKey stores a new key, hashed, and returns it once in k.Key.
func (db *DB) CreateAPIKey(ctx context.Context, tenant string, k *fleet.APIKey) error {
	return db.update(ctx, func(ctx context.Context, tx *Tx) error {
		if err := tx.tenantExists(ctx, tenant); err != nil {
			return err
		}
		if err := tx.createAPIKey(ctx, tenant, k); err != nil {
			return err
		}
		details := map[string]any{"role": k.Role}
		if k.UserEmail != "" {
			details["user_email"] = k.UserEmail
		}
		return tx.audit(ctx, tenant, "apikey.create", "apikeys/"+k.Name, details)
	})
}

func (tx *Tx) createAPIKey(ctx context.Context, tenant string, k *fleet.APIKey) error {
	k.Key = fleet.NewSecret(fleet.APIKeyPrefix)
	k.CreatedAt = tx.now.Truncate(time.Millisecond)
	_, err := tx.exec(ctx, "INSERT INTO api_keys (tenant, name, role, user_email, key_hash, created_at) VALUES (?, ?, ?, ?, ?, ?)",
		tenant, k.Name, string(k.Role), k.UserEmail, fleet.HashSecret(k.Key), millis(k.CreatedAt))
	if isUniqueViolation(err) {
		return fleet.Errorf(fleet.ECONFLICT, "an API key named %q exists already", k.Name)
	}
	return err
}

// tenantExists is ENOTFOUND for a tenant that does not exist, which only
// the command line can ask about: HTTP callers are authenticated in theirs.
func (tx *Tx) tenantExists(ctx context.Context, tenant string) error {
	var n int
	err := tx.queryRow(ctx, "SELECT 1 FROM tenants WHERE name = ?", tenant).Scan(&n)
	if errors.Is(err, sql.ErrNoRows) {
		return fleet.Errorf(fleet.ENOTFOUND, "tenant %q does not exist", tenant)
	}
	return err
}

// FindAPIKeys lists a tenant's keys by name, without their secrets.
func (db *DB) FindAPIKeys(ctx context.Context, tenant string, p fleet.Page) ([]*fleet.APIKey, int, error) {
	return findPage(ctx, db, "SELECT count(*) FROM api_keys WHERE tenant = ?",
		"SELECT name, role, user_email, created_at FROM api_keys WHERE tenant = ? ORDER BY name", []any{tenant}, p,
		func(s scanner) (*fleet.APIKey, error) {
			var k fleet.APIKey
			var created int64
			if err := s.Scan(&k.Name, &k.Role, &k.UserEmail, &created); err != nil {
				return nil, err
			}
			k.CreatedAt = fromMillis(created)
			return &k, nil
		})
}

// DeleteAPIKey removes a key and ends its console sessions; its holder is
// refused from the next request.
func (db *DB) DeleteAPIKey(ctx context.Context, tenant, name string) error {
	var hash string
	err := db.update(ctx, func(ctx context.Context, tx *Tx) error {
		// Deletions in one tenant take turns on its row: two at once on
		// PostgreSQL would each count the other's admin key and both
		// succeed, leaving the tenant with none.
		var locked string
		err := tx.queryRow(ctx, "SELECT name FROM tenants WHERE name = ?"+tx.db.dialect.forUpdate(), tenant).Scan(&locked)
		if errors.Is(err, sql.ErrNoRows) {
			return fleet.Errorf(fleet.ENOTFOUND, "no API key named %q", name)
		} else if err != nil {
			return err
		}
		var role string
		err = tx.queryRow(ctx, "SELECT role, key_hash FROM api_keys WHERE tenant = ? AND name = ?", tenant, name).Scan(&role, &hash)
		if errors.Is(err, sql.ErrNoRows) {
			return fleet.Errorf(fleet.ENOTFOUND, "no API key named %q", name)
		} else if err != nil {
			return err
		}
		if fleet.Role(role) == fleet.RoleAdmin {
			var admins int
			if err := tx.queryRow(ctx, "SELECT count(*) FROM api_keys WHERE tenant = ? AND role = ?", tenant, role).Scan(&admins); err != nil {
				return err
			}
			if admins == 1 {
				return fleet.Errorf(fleet.ECONFLICT, "%q is the tenant's last admin key; create another admin key before deleting it", name)
			}
		}
		if _, err := tx.exec(ctx, "DELETE FROM api_keys WHERE tenant = ? AND name = ?", tenant, name); err != nil {
			return err
		}
		if _, err := tx.exec(ctx, "DELETE FROM console_sessions WHERE tenant = ? AND key_name = ?", tenant, name); err != nil {
			return err
		}
		if err := tx.changed(ctx, fleet.Change{Kind: fleet.ChangeAPIKey, Tenant: tenant, Key: hash}); err != nil {
			return err
		}
		return tx.audit(ctx, tenant, "apikey.delete", "apikeys/"+name, nil)
	})
	if err == nil {
		db.authCache.forget(hash)
	}
	return err
}

// AuthenticateAPIKey returns the actor a key stands for in tenant. Answers
// are cached briefly, so the hot paths do not query per request; a deleted
// key is forgotten at once on this replica, on others when they hear of it
// (Listen), and within authCacheTTL at worst.
func (db *DB) AuthenticateAPIKey(ctx context.Context, tenant, key string) (*fleet.Actor, error) {
	refused := fleet.Errorf(fleet.EUNAUTHENTICATED, "missing or invalid API key or tenant")
	if key == "" || tenant == "" {
		return nil, refused
	}
	hash := fleet.HashSecret(key)
	a0, gen, ok := db.authCache.get(hash, db.now())
	if ok {
		if a0.Tenant != tenant {
			return nil, refused
		}
		return a0, nil
	}
	var a fleet.Actor
	var storedHash string
	err := db.queryRow(ctx, "SELECT tenant, name, role, user_email, key_hash FROM api_keys WHERE key_hash = ?", hash).
		Scan(&a.Tenant, &a.KeyName, &a.Role, &a.UserEmail, &storedHash)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, refused
	} else if err != nil {
		return nil, db.classify(err)
	}
	if !fleet.SecretMatches(key, storedHash) {
		return nil, refused
	}
	a.UserName, a.KeyHash = a.KeyName, hash
	db.authCache.put(hash, &a, db.now(), gen)
	if a.Tenant != tenant {
		return nil, refused
	}
	return &a, nil
}

// authCacheTTL bounds how long another replica may accept a deleted key.
const authCacheTTL = 10 * time.Second

// authCache remembers authenticated keys by hash. Its generation counts
// the keys forgotten: a lookup that began before a key was deleted must not
// put it back once the delete has forgotten it, so put takes the generation
// get saw and keeps nothing if a forget came in between.
type authCache struct {
	mu  sync.Mutex
	m   map[string]authEntry
	gen uint64
}

type authEntry struct {
	actor   *fleet.Actor
	expires time.Time
}

// get returns the cached actor of hash, or the generation to pass to put
// after reading the key from the database.
func (c *authCache) get(hash string, now time.Time) (*fleet.Actor, uint64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[hash]
	if !ok || now.After(e.expires) {
		return nil, c.gen, false
	}
	return e.actor, c.gen, true
}

// put caches a, read from the database after get returned gen.
func (c *authCache) put(hash string, a *fleet.Actor, now time.Time, gen uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if gen != c.gen {
		return
	}
	if c.m == nil || len(c.m) > 100_000 {
		c.m = map[string]authEntry{}
	}
	c.m[hash] = authEntry{actor: a, expires: now.Add(authCacheTTL)}
}

func (c *authCache) forget(hash string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	delete(c.m, hash)
}
