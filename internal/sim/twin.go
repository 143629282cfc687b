package sim

import (
	pahov3 "github.com/eclipse/paho.mqtt.golang"
	"github.com/fleetd/fleet/mqtt"
)

// subscribeDelta subscribes a simulated device to its shadow's delta,
// which it takes at once: it reports each delta back as its reported
// state, so that a desired change converges (docs/twin.md).
func (d *simDevice) subscribeDelta(cl pahov3.Client) {
	tenant := d.sim.cfg.tenant
	cl.Subscribe(mqtt.ShadowDeltaTopic(tenant, d.id), 1, func(cl pahov3.Client, msg pahov3.Message) {
		// An empty payload clears the retained delta of an external
		// broker: there is nothing to take.
		if len(msg.Payload()) == 0 {
			return
		}
		// On paho's goroutine: publish, and do not wait.
		cl.Publish(mqtt.ShadowReportedTopic(tenant, d.id), 1, false, msg.Payload())
	})
}
