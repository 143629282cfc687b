package fleet

// StreamSnapshot is what the store holds of one device stream for alert
// evaluation, read at one moment: the latest point (nil before the first),
// the states of the device's rules on the stream that are away from the
// normal phase, and the stream's version, which every commit of the stream
// advances. Replicas evaluate a device's stream in turn, whichever receives
// its data: one that commits from an older version gets ErrStale, reads a
// snapshot and evaluates again (docs/operations.md#many-replicas, alert
// evaluation).
type StreamSnapshot struct {
	Latest  *DataPoint
	States  []*AlertState
	Version int64
}

// ErrStale refuses a commit made from a version of the data that another
// replica has changed since.
var ErrStale = &Error{Code: ECONFLICT, Message: "changed meanwhile by another replica; read it again"}
