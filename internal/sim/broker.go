package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"time"

	pahov3 "github.com/eclipse/paho.mqtt.golang"

	"github.com/fleetd/fleet/mqtt"
)

// A broker that is not fleetd's (a Mosquitto already on port 1883) takes
// the simulated devices' connections and reports, and fleetd shows their
// actions Queued forever. So sim says which broker its first device
// connected to, and checks that it is fleetd's: with an API key by asking
// fleetd whether it saw the device connect (its last_seen_at moved), which
// also holds when fleetd uses an external broker; without one by the
// SUBACK of a QoS 2 subscription, which fleetd's broker grants at QoS 1
// (docs/device-protocol.md) and other brokers grant as asked.

// brokerProbe is the check of the first device's broker.
type brokerProbe struct {
	device string
	byAPI  bool   // ask fleetd; else look at the SUBACK
	before string // the device's last_seen_at before it connected
}

// newBrokerProbe reads what fleetd knows of the device before it connects;
// nil when fleetd cannot be asked and the SUBACK must tell.
func (s *sim) newBrokerProbe(ctx context.Context, device string) *brokerProbe {
	p := &brokerProbe{device: device, byAPI: s.cfg.apiKey != ""}
	if !p.byAPI {
		return p
	}
	before, err := s.cfg.lastSeen(ctx, device)
	if err != nil {
		fmt.Fprintf(s.out, "sim: cannot ask fleetd at %s about %s (%v); the broker is checked by its SUBACK instead\n", s.cfg.apiURL, device, err)
		p.byAPI = false
	}
	p.before = before
	return p
}

// connected reports the broker and, with an API key, waits for fleetd to
// see the device.
func (s *sim) brokerConnected(ctx context.Context, p *brokerProbe) {
	fmt.Fprintf(s.out, "sim: %s connected to the MQTT broker at %s\n", p.device, s.broker)
	if !p.byAPI {
		return
	}
	deadline := time.NewTimer(s.cfg.checkTimeout)
	defer deadline.Stop()
	// The API is polled: fleetd offers no event a client could wait on.
	poll := time.NewTicker(100 * time.Millisecond)
	defer poll.Stop()
	for {
		seen, err := s.cfg.lastSeen(ctx, p.device)
		if err == nil && seen != p.before {
			fmt.Fprintf(s.out, "sim: fleetd at %s saw %s connect: the broker is fleetd's\n", s.cfg.apiURL, p.device)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-deadline.C:
			s.warnNotFleetd(fmt.Sprintf("fleetd at %s has not seen %s connect in %s", s.cfg.apiURL, p.device, s.cfg.checkTimeout))
			return
		case <-poll.C:
		}
	}
}

// subscribeProbe subscribes the first device to its actions at QoS 2 and
// warns when the broker grants that.
func (s *sim) subscribeProbe(cl pahov3.Client, d *simDevice) {
	tok := cl.Subscribe(mqtt.ActionsTopic(s.cfg.tenant, d.id), 2, d.onAction)
	go func() {
		if !tok.WaitTimeout(s.cfg.checkTimeout) || tok.Error() != nil {
			return // the connection's own errors are counted elsewhere
		}
		st, ok := tok.(*pahov3.SubscribeToken)
		if !ok {
			return
		}
		for _, qos := range st.Result() {
			switch qos {
			case 1:
				fmt.Fprintf(s.out, "sim: the broker granted %s's subscription at QoS 1, as fleetd's does\n", d.id)
			case 2:
				s.warnNotFleetd("it granted a QoS 2 subscription, which fleetd's broker never does (give --api-key to ask fleetd instead)")
			}
		}
	}()
}

func (s *sim) warnNotFleetd(why string) {
	port := "1883"
	if u, err := url.Parse(s.broker); err == nil && u.Port() != "" {
		port = u.Port()
	}
	fmt.Fprintf(s.out, "sim: WARNING: the broker at %s is probably not fleetd's: %s. "+
		"Is another broker (a Mosquitto) listening on port %s? Start fleetd with --mqtt-addr :1884 and give sim --mqtt-addr localhost:1884. "+
		"(If fleetd uses this broker as --mqtt-broker, check its broker-auth configuration.)\n", s.broker, why, port)
}

// lastSeen is the device's last_seen_at as fleetd's API shows it.
func (c *simConfig) lastSeen(ctx context.Context, device string) (string, error) {
	status, b, err := c.apiDo(ctx, "GET", "/api/v1/devices/"+url.PathEscape(device), nil)
	if err != nil {
		return "", err
	}
	if status != 200 {
		return "", fmt.Errorf("GET device: %d %s", status, b)
	}
	var d struct {
		LastSeenAt json.RawMessage `json:"last_seen_at"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		return "", err
	}
	return string(d.LastSeenAt), nil
}
