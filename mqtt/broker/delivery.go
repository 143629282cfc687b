package broker

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/mqtt"
)

// What a connection sends its device: actions, each at most once per
// connection, oldest (lowest id) first, as fast as the device's in-flight
// window allows.
//
// The store keeps every action Queued for the device until its PUBACK; the
// connection keeps only what is in flight and a short waiting line, and
// reads the rest from the store (Handler.PendingActions) as room appears:
//
//   - inflight: sent at QoS 1, awaiting PUBACK; at most inflightMax.
//   - queue: waiting for room in the window, in action id order; at most
//     queueCap, beyond which a live dispatch is left to the store.
//   - cursor and more: the store was read up to action id cursor; more says
//     it may hold actions above it (the device just subscribed, a fetch came
//     back full, or a dispatch was left to the store).
//
// A queued action above cursor waits while more is set: older ones may
// still be in the store, and a fetch brings them in front of it. So a
// dispatch made while the window is full waits its turn behind the backlog
// rather than overtaking it, and a freed slot always takes the oldest
// action there is.
//
// A fetch first has the Handler record the acknowledgements it was given
// (see fleet.ActionDelivery.PendingMessages), so the store no longer lists
// actions the device acknowledged; those acknowledged (or refused) while the
// fetch ran are remembered until it returns, and those being failed until
// their failure is recorded, so that none is sent twice.

// queueCap bounds the actions a connection holds waiting for room in the
// device's window; the store holds the rest.
const queueCap = 64

// inflight is an action message awaiting the device's PUBACK.
type inflight struct {
	action int64
	sent   time.Time
}

// errUnacknowledged ends a connection whose device left an action
// unacknowledged for WriteTimeout.
var errUnacknowledged = &protocolError{codeUnspecified, "an action left unacknowledged for the write timeout"}

// has reports whether the connection has action id in flight, waiting, or
// being settled; wmu is held.
func (d *device) has(id int64) bool {
	for _, f := range d.inflight {
		if f.action == id {
			return true
		}
	}
	for _, m := range d.queue {
		if m.ActionID == id {
			return true
		}
	}
	return slices.Contains(d.settled, id) || slices.Contains(d.failing, id)
}

// offer takes a live dispatch for the device: it is sent now, or waits in
// the queue, or (the queue full) is left to the store, which is then read
// again; false says so. wmu is not held.
func (d *device) offer(m fleet.ActionMessage) bool {
	d.wmu.Lock()
	if d.closed.Load() || !d.subscribed.Load() {
		d.wmu.Unlock()
		return false
	}
	if d.has(m.ActionID) {
		d.wmu.Unlock()
		return true
	}
	taken := len(d.queue) < queueCap
	if taken {
		d.enqueue(m)
	} else {
		d.leaveToStore(m.ActionID)
	}
	out := d.drainLocked()
	d.wmu.Unlock()
	d.settle(out)
	return taken
}

// leaveToStore notes that action id, refused for want of room, is to be
// read from the store; wmu is held. An id at or below the cursor (a
// dispatch that committed after a later one was read) moves the cursor
// back: reading again what is in flight or queued sends nothing twice.
func (d *device) leaveToStore(id int64) {
	d.more = true
	if d.fetching {
		if d.missed == 0 || id < d.missed {
			d.missed = id
		}
		return
	}
	if id <= d.cursor {
		d.cursor = id - 1
	}
}

// enqueue puts m in the queue in action id order; wmu is held.
func (d *device) enqueue(m fleet.ActionMessage) {
	i, _ := slices.BinarySearchFunc(d.queue, m.ActionID, func(q fleet.ActionMessage, id int64) int {
		return cmpInt64(q.ActionID, id)
	})
	d.queue = slices.Insert(d.queue, i, m)
}

func cmpInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// outcome is what a drain leaves to do once wmu is released: Handler calls
// that may block.
type outcome struct {
	delivered []int64   // written at QoS 0: delivered as far as fleetd can tell
	failed    []failure // cannot be sent to the device
	fetch     bool      // read the store: start a fetch
	after     int64
	limit     int
}

// failure is an action the device will not get, and why.
type failure struct {
	action int64
	reason string
}

// drainLocked sends what the window has room for, oldest first, and says
// whether the store must be read; wmu is held.
func (d *device) drainLocked() outcome {
	var out outcome
	if d.closed.Load() || !d.subscribed.Load() {
		return out
	}
	qos := byte(d.qos.Load())
	topic := mqtt.ActionsTopic(d.tenant, d.id)
	blocked := false // by older actions that may be in the store
	for len(d.queue) > 0 {
		if qos > 0 && len(d.inflight) >= d.inflightMax {
			break
		}
		m := d.queue[0]
		if d.more && m.ActionID > d.cursor {
			blocked = true
			break
		}
		d.queue = slices.Delete(d.queue, 0, 1)
		size := publishSize(d.version, topic, qos, m.Payload)
		if d.maxPacketSize > 0 && size > d.maxPacketSize {
			d.failing = append(d.failing, m.ActionID)
			out.failed = append(out.failed, failure{m.ActionID, fmt.Sprintf(
				"the action's message is %s bytes as an MQTT packet, more than the device's Maximum Packet Size of %s: it cannot be sent to this device",
				thousands(size), thousands(d.maxPacketSize))})
			continue
		}
		var pid uint16
		if qos > 0 {
			pid = d.packetID()
		}
		if d.writeLocked(appendPublish(make([]byte, 0, size), d.version, topic, qos, pid, m.Payload)) != nil {
			return out // the connection is closed; the store keeps the rest
		}
		d.s.stats.messagesOut.Add(1)
		if qos == 0 {
			// A device that subscribed at QoS 0 acknowledges nothing:
			// written is delivered.
			out.delivered = append(out.delivered, m.ActionID)
			if d.fetching {
				d.settled = append(d.settled, m.ActionID)
			}
			continue
		}
		if d.inflight == nil {
			d.inflight = make(map[uint16]inflight)
		}
		now := time.Now()
		if len(d.inflight) == 0 {
			d.watchAcks(d.s.cfg.WriteTimeout)
		}
		d.inflight[pid] = inflight{m.ActionID, now}
	}
	if len(d.queue) == 0 {
		d.queue = nil // nor an empty line's array
	}
	room := queueCap - len(d.queue)
	if qos > 0 {
		room += d.inflightMax - len(d.inflight)
	}
	if d.more && !d.fetching && room > 0 && (blocked || len(d.queue) < queueCap/2) {
		d.fetching = true
		out.fetch, out.after, out.limit = true, d.cursor, room
	}
	return out
}

// settle makes the Handler calls a drain left, without wmu: deliveries at
// QoS 0 at once, failures and fetches on goroutines of their own, which
// Close waits for.
func (d *device) settle(out outcome) {
	s := d.s
	for _, id := range out.delivered {
		s.stats.delivered.Add(1)
		s.h.ActionDelivered(d.tenant, d.id, id)
	}
	if len(out.failed) > 0 {
		failed := out.failed
		if !s.goTask(func() { d.fail(failed) }) {
			d.forget(failed)
		}
	}
	if out.fetch && !s.goTask(func() { d.fetch(out.after, out.limit) }) {
		d.wmu.Lock()
		d.fetching = false
		d.wmu.Unlock()
	}
}

// fail records that the device will not get these actions.
func (d *device) fail(failed []failure) {
	s := d.s
	defer d.forget(failed)
	for _, f := range failed {
		s.stats.actionsFailed.Add(1)
		s.log.Info("mqtt: action failed: "+f.reason, "tenant", d.tenant, "device", d.id, "action_id", f.action)
		s.h.ActionFailed(d.tenant, d.id, f.action, f.reason)
	}
}

// forget drops failed actions from the list of those being failed, once
// their failure is recorded (or could not be).
func (d *device) forget(failed []failure) {
	d.wmu.Lock()
	defer d.wmu.Unlock()
	d.failing = slices.DeleteFunc(d.failing, func(id int64) bool {
		return slices.ContainsFunc(failed, func(f failure) bool { return f.action == id })
	})
	if len(d.failing) == 0 {
		d.failing = nil
	}
}

// fetch reads up to limit actions above after from the store, merges them
// into the queue and sends what the window has room for.
func (d *device) fetch(after int64, limit int) {
	s := d.s
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.HandlerTimeout)
	defer cancel()
	msgs, err := s.h.PendingActions(ctx, d.tenant, d.id, after, limit)

	d.wmu.Lock()
	d.fetching = false
	if err != nil {
		d.settled, d.missed = nil, 0
		// The actions stay in the store; the read is tried again, sooner
		// if the device acknowledges or is sent a dispatch.
		d.retryIn = min(max(2*d.retryIn, time.Second), 30*time.Second)
		retry := d.retryIn
		d.wmu.Unlock()
		if !d.isClosed() && s.ctx.Err() == nil {
			s.log.Warn("mqtt: cannot read the actions queued for a device now", "tenant", d.tenant, "device", d.id, "retry_in", retry, "err", err)
			time.AfterFunc(retry, d.kick)
		}
		return
	}
	d.retryIn = 0
	for _, m := range msgs {
		if m.ActionID > after && !d.has(m.ActionID) {
			d.enqueue(m)
		}
	}
	if len(msgs) > 0 {
		d.cursor = max(d.cursor, msgs[len(msgs)-1].ActionID)
	}
	d.more = len(msgs) >= limit
	if d.missed != 0 {
		d.more = true
		d.cursor = min(d.cursor, d.missed-1)
	}
	d.settled, d.missed = nil, 0
	out := d.drainLocked()
	d.wmu.Unlock()
	d.settle(out)
}

// acknowledged handles the device's PUBACK of packet pid: code is its
// reason code (MQTT 5; 0 before), reason its Reason String.
func (d *device) acknowledged(pid uint16, code byte, reason string) {
	s := d.s
	d.wmu.Lock()
	f, ok := d.inflight[pid]
	delete(d.inflight, pid)
	if len(d.inflight) == 0 {
		d.inflight = nil // an idle device keeps no empty table (park.go)
	}
	if ok && d.fetching {
		d.settled = append(d.settled, f.action)
	}
	var out outcome
	if ok && code >= 0x80 {
		d.failing = append(d.failing, f.action)
		out.failed = []failure{{f.action, refusal(code, reason)}}
	}
	drained := d.drainLocked()
	out.delivered, out.fetch, out.after, out.limit = drained.delivered, drained.fetch, drained.after, drained.limit
	out.failed = append(out.failed, drained.failed...)
	d.wmu.Unlock()
	if ok && code < 0x80 {
		s.stats.delivered.Add(1)
		s.h.ActionDelivered(d.tenant, d.id, f.action)
	}
	d.settle(out)
}

// refusal says why a device refused an action in its PUBACK.
func refusal(code byte, reason string) string {
	msg := fmt.Sprintf("the device refused the action message: PUBACK reason code 0x%02X (%s)", code, pubackReasonName(code))
	if reason != "" {
		msg += ": " + mqtt.Truncate(reason, 1000)
	}
	return msg
}

// pubackReasonName is the MQTT 5 name of a PUBACK reason code.
func pubackReasonName(code byte) string {
	switch code {
	case 0x80:
		return "Unspecified error"
	case 0x83:
		return "Implementation specific error"
	case 0x87:
		return "Not authorized"
	case 0x90:
		return "Topic Name invalid"
	case 0x91:
		return "Packet Identifier in use"
	case 0x97:
		return "Quota exceeded"
	case 0x99:
		return "Payload format invalid"
	}
	return "not a PUBACK reason code"
}

// watchAcks arms the timer that ends the connection of a device that
// leaves an action unacknowledged for WriteTimeout: a device that is gone
// is otherwise found only by its keepalive, and its actions wait. wmu is
// held.
func (d *device) watchAcks(after time.Duration) {
	if d.ackTimer == nil {
		d.ackTimer = time.AfterFunc(after, d.checkAcks)
		return
	}
	d.ackTimer.Reset(after)
}

// checkAcks runs when the oldest action in flight may have waited
// WriteTimeout for its PUBACK.
func (d *device) checkAcks() {
	d.wmu.Lock()
	if d.closed.Load() || len(d.inflight) == 0 {
		d.wmu.Unlock()
		return
	}
	var oldest time.Time
	for _, f := range d.inflight {
		if oldest.IsZero() || f.sent.Before(oldest) {
			oldest = f.sent
		}
	}
	left := d.s.cfg.WriteTimeout - time.Since(oldest)
	if left > 0 {
		d.watchAcks(left)
		d.wmu.Unlock()
		return
	}
	d.wmu.Unlock()
	d.s.stats.unacknowledgedActions.Add(1)
	d.s.log.Warn("mqtt: device disconnected: it left an action unacknowledged for the write timeout; its actions wait for its next connection",
		"tenant", d.tenant, "device", d.id, "write_timeout", d.s.cfg.WriteTimeout, "remote", d.remote())
	d.close(errUnacknowledged.code, errUnacknowledged)
}

// thousands writes n with thousands separators, as the API's messages do.
func thousands(n int) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
