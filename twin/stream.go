package twin

import (
	"context"
	"log/slog"

	"github.com/fleetd/fleet"
)

// UplinkShadowStream is the stream on which the uplink agent publishes its
// device's state every ten seconds.
const UplinkShadowStream = "device_shadow"

// Streams is a fleet.StreamService that also fills the reported state of
// devices that run the uplink agent: the fields of their device_shadow
// stream's points, but sequence and timestamp, are merged into the
// reported state after the points are stored. Each of uplink's points is
// a whole snapshot of the device's state, so of a batch only the latest
// point (by timestamp, then sequence) is merged, and only if no newer
// point was kept before it: a batch that arrives late does not take the
// reported state back.
//
// The points are the data and the reported state is made from them: a
// point the reported state cannot take (beyond its size or depth,
// docs/twin.md) is kept, the ingest accepted and the reported state left
// as it was, with a warning. Refusing the ingest once the points are
// stored would answer an error for data kept, and a device that retries
// would store it again.
type Streams struct {
	fleet.StreamService
	Twin   fleet.ShadowService
	Logger *slog.Logger
}

// IngestPoints stores the points, then merges the latest of device_shadow
// into the device's reported state.
func (s *Streams) IngestPoints(ctx context.Context, tenant, device, stream string, pts []fleet.DataPoint) error {
	if err := s.StreamService.IngestPoints(ctx, tenant, device, stream, pts); err != nil || stream != UplinkShadowStream || len(pts) == 0 {
		return err
	}
	latest := &pts[0]
	for i := range pts {
		if pts[i].After(latest) {
			latest = &pts[i]
		}
	}
	_, err := s.Twin.ReportPoint(ctx, tenant, device, stream, latest)
	if code := fleet.ErrorCode(err); code == fleet.EINVALID || code == fleet.ETOOLARGE {
		if s.Logger != nil {
			s.Logger.Warn("twin: a device_shadow point is beyond the reported state's limits; the point is kept, the reported state is not changed",
				"tenant", tenant, "device", device, "err", err)
		}
		return nil
	}
	return err
}
