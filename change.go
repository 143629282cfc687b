package fleet

// Change says that something a replica may cache changed in the database,
// so that every replica drops its copy at once rather than when a TTL runs
// out (docs/operations.md#many-replicas, "Caches"). The store announces
// changes in the transaction that makes them (PostgreSQL NOTIFY, delivered
// on commit); on SQLite there is one process, which drops its own caches as
// it changes them.
type Change struct {
	Kind   string // one of the Change* kinds
	Tenant string
	Key    string // what changed within the tenant: an id, or a key's hash
}

// The kinds of Change.
const (
	ChangeAPIKey       = "apikey"        // Key: the SHA-256 hash of the deleted key
	ChangeTenantAuth   = "tenant_auth"   // the tenant's S9 configuration
	ChangeAlertRule    = "alert_rule"    // Key: the rule's id, created or deleted
	ChangeDevice       = "device"        // Key: the device id; its metadata changed
	ChangeDeviceDelete = "device_delete" // Key: the device id
	// ChangeDeviceCredentials: the device's token or certificate was
	// replaced, so a connection made with the old one must end. Key: the
	// device id.
	ChangeDeviceCredentials = "device_credentials"
	// ChangeConsoleSession: a console session ended (signed out, ended by
	// an admin). Key: the session's id.
	ChangeConsoleSession = "console_session"
	// ChangeRemoteSessionStop: someone asked for an open remote session
	// to end. Key: the session's id, a space, and who asked.
	ChangeRemoteSessionStop = "remote_session_stop"
	// ChangeAll means changes may have been missed (the listening
	// connection was lost): drop every cache.
	ChangeAll = "all"
)
