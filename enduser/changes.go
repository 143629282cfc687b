package enduser

import "github.com/fleetd/fleet"

// ApplyChange drops what the Authenticator caches of a change another
// replica made (sqlstore.DB.Listen): a tenant's S9 configuration is read
// again on its next token, instead of after ConfigTTL. The webhook answers
// cached under the old configuration go too, as on this replica's own
// SetTenantAuth.
func (a *Authenticator) ApplyChange(c fleet.Change) {
	switch c.Kind {
	case fleet.ChangeTenantAuth:
		a.mu.Lock()
		delete(a.configs, c.Tenant)
		a.webhooks = nil
		a.mu.Unlock()
	case fleet.ChangeAll:
		a.mu.Lock()
		a.configs = nil
		a.webhooks = nil
		a.mu.Unlock()
	}
}
