package fleet

// Redelivery is a device that arrived at an external MQTT broker and is owed
// the actions queued for it
// (docs/operations.md#actions-through-an-external-broker). fleetd cannot see
// who connects to a broker it does not run; it learns of an arrival when the
// broker asks it to authenticate the device or to authorise its
// subscription, records the arrival in the database, and any replica claims
// it, under a lease, and sends the device what is queued. A replica that
// dies with a claim leaves it to the others when the lease runs out.
type Redelivery struct {
	Tenant   string
	DeviceID string
	// Version tells the arrival that was claimed from a later one of the
	// same device: completing a claim removes the record only if no
	// arrival came since, so a device that reconnected meanwhile is served
	// again.
	Version int64
}
