package mqtt

// Channel is the device channel as fleetd runs it: the embedded broker
// (broker.Server), or a client of an external broker (bridge.Client). Both
// serve a Handler.
type Channel interface {
	Open() error
	Close() error
	// SendAction hands an action to a device; see the SendAction of
	// broker.Server and bridge.Client for what true means for each.
	// actionID is the action's id, which payload carries too.
	SendAction(tenant, device string, actionID int64, payload []byte) bool
	// SendDelta sends the device the delta of its shadow, a JSON object,
	// or says that it is now empty (delta empty): see the SendDelta of
	// broker.Server and bridge.Client.
	SendDelta(tenant, device string, delta []byte) bool
	// Online reports whether the device may be reached now.
	Online(tenant, device string) bool
	// CredentialsChanged ends the device's connection, if this channel
	// holds it and it was made with credentials that no longer admit the
	// device.
	CredentialsChanged(tenant, device string)
	Stats() Stats
}
