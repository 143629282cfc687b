package action_test

import (
	"context"
	"sort"
	"testing"

	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// blindSender is a broker that cannot list connected devices, as a client
// of an external broker is: it only learns, when sending, who is there.
type blindSender struct{ *fakeSender }

func (blindSender) PresenceUnknown() bool { return true }

// TestDeliveryPresenceUnknown checks that with such a broker a dispatch is
// offered to every targeted device, not only to those that subscribed
// through this process: on a replica, most subscribed through another.
func TestDeliveryPresenceUnknown(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		f := newFakeSender("on-1", "on-2") // connected, via another replica
		svc, _ := setup(t, b, f, "on-1", "on-2", "off-1")
		svc.Sender = blindSender{f}
		if _, err := svc.DispatchAction(context.Background(), "acme", dispatch("reboot")); err != nil {
			t.Fatal(err)
		}
		got := f.collect(t, 2)
		f.none(t, svc)
		var devs []string
		for d := range got {
			devs = append(devs, d)
		}
		sort.Strings(devs)
		if len(devs) != 2 || devs[0] != "on-1" || devs[1] != "on-2" {
			t.Fatalf("sent to %v, want on-1 and on-2", devs)
		}
	})
}
