// Package twin is the device shadow service (docs/twin.md): it keeps the
// shadows in the store and tells each device the delta of its shadow
// whenever the delta changes, and when the device subscribes to it.
package twin

import (
	"context"
	"log/slog"
	"time"

	"github.com/fleetd/fleet"
)

// Sender sends a device the delta of its shadow; mqtt.Channel is one. An
// empty delta says that the device is in sync: the embedded broker sends
// nothing then, the external broker's client clears the retained delta.
type Sender interface {
	SendDelta(tenant, device string, delta []byte) bool
}

// Dispatcher hands a dispatched action to the devices; action.Service is
// one.
type Dispatcher interface {
	Dispatched(tenant string, a *fleet.Action)
}

// Rollouts dispatches desired rollouts and takes the status reports that
// complete their device actions; action.Service is one.
type Rollouts interface {
	DispatchAction(ctx context.Context, tenant string, d *fleet.Dispatch) (*fleet.Action, error)
	ReportStatus(ctx context.Context, tenant string, reports []fleet.StatusReport) ([]error, error)
}

// Waiting finds a device's desired rollouts that wait for its reported
// state; sqlstore.DB is one.
type Waiting interface {
	DesiredWaiting(ctx context.Context, tenant, device string) ([]fleet.DesiredWait, error)
}

// Service is a fleet.ShadowService that sends deltas, and the
// update_config actions a desired change dispatched.
type Service struct {
	Store fleet.ShadowService
	// Sender is set before devices connect; nil sends nothing.
	Sender Sender
	// Actions delivers update_config actions (ShadowSettings); nil leaves
	// them for the devices to read when they next subscribe.
	Actions Dispatcher
	// Rollouts and Waiting roll a fleet-wide desired change out in phases
	// (fleet.ActionDesired); nil refuses a change with a schedule.
	Rollouts Rollouts
	Waiting  Waiting
	Logger   *slog.Logger
}

var _ fleet.ShadowService = (*Service)(nil)

// FindShadow reads a device's shadow.
func (s *Service) FindShadow(ctx context.Context, tenant, device string) (*fleet.Shadow, error) {
	return s.Store.FindShadow(ctx, tenant, device)
}

// UpdateDesired changes the desired state, and sends the device its delta
// if that changed.
func (s *Service) UpdateDesired(ctx context.Context, tenant, device string, patch map[string]any, version *int64) (*fleet.Shadow, error) {
	sh, err := s.Store.UpdateDesired(ctx, tenant, device, patch, version)
	if err == nil {
		s.desiredChanged(tenant, device, sh)
	}
	return sh, err
}

// UpdateDesiredMany changes the desired state of many devices, and tells
// each changed device as UpdateDesired does. With a schedule it
// dispatches a desired_state rollout instead, whose phases change their
// devices as they release them.
func (s *Service) UpdateDesiredMany(ctx context.Context, tenant string, sel *fleet.Dispatch, patch map[string]any) (*fleet.FleetDesired, error) {
	if sel.Schedule != nil {
		return s.rollOut(ctx, tenant, sel, patch)
	}
	fd, err := s.Store.UpdateDesiredMany(ctx, tenant, sel, patch)
	if err != nil {
		return nil, err
	}
	for device, sh := range fd.Shadows {
		s.desiredChanged(tenant, device, sh)
	}
	return fd, nil
}

// rollOut dispatches the change as a desired_state action with sel's
// selection and schedule.
func (s *Service) rollOut(ctx context.Context, tenant string, sel *fleet.Dispatch, patch map[string]any) (*fleet.FleetDesired, error) {
	if s.Rollouts == nil {
		return nil, fleet.Errorf(fleet.EUNAVAILABLE, "this fleetd does not roll desired changes out")
	}
	params, err := fleet.MarshalCanonical(map[string]any{fleet.ShadowDesired: patch})
	if err != nil {
		return nil, err
	}
	d := *sel
	d.Action, d.Params = fleet.ActionDesired, params
	if d.Timeout == 0 {
		d.Timeout = fleet.DefaultActionTimeout
	}
	a, err := s.Rollouts.DispatchAction(ctx, tenant, &d)
	if err != nil {
		return nil, err
	}
	return &fleet.FleetDesired{Matched: a.Targeted, ActionID: a.ID}, nil
}

// PrepareDispatch checks a desired_state dispatch (fleet.ActionDesired):
// it is a rollout, and its params.desired is a patch within a section's
// limits. Devices never receive it, so it needs no device params.
func (s *Service) PrepareDispatch(ctx context.Context, tenant string, d *fleet.Dispatch) error {
	if d.Schedule == nil {
		return fleet.FieldErrors(map[string]string{"schedule": "a desired_state action is a rollout of a desired change: give it a schedule, or change the desired state at once with PATCH /api/v1/shadows"})
	}
	patch, err := fleet.DesiredPatch(d.Params)
	if err != nil {
		return fleet.FieldErrors(map[string]string{"params.desired": "must be an object: the merge patch of the devices' desired state"})
	}
	return fleet.CheckShadowSection(fleet.ShadowDesired, patch)
}

// DesiredReleased tells the devices whose shadows a desired rollout's
// phase changed.
func (s *Service) DesiredReleased(tenant string, shadows map[string]*fleet.Shadow) {
	for device, sh := range shadows {
		s.desiredChanged(tenant, device, sh)
	}
}

// reportedChanged sends the device its delta, if that changed, and
// completes the desired rollouts whose patches the device now reports. A
// rollout's keys that the device takes leave the delta, so a report that
// leaves the delta as it was completes none.
func (s *Service) reportedChanged(ctx context.Context, tenant, device string, sh *fleet.Shadow) {
	if !sh.DeltaChanged {
		return
	}
	s.send(tenant, device, sh)
	if s.Waiting == nil || s.Rollouts == nil {
		return
	}
	ws, err := s.Waiting.DesiredWaiting(ctx, tenant, device)
	if err != nil {
		s.logger().Error("twin: read the device's desired rollouts; they complete at its next report", "tenant", tenant, "device", device, "err", err)
		return
	}
	var done []fleet.StatusReport
	for _, w := range ws {
		if fleet.DesiredMet(w.Patch, sh.Reported) {
			done = append(done, fleet.StatusReport{DeviceID: device, ActionID: w.ActionID, State: string(fleet.StatusCompleted)})
		}
	}
	if len(done) == 0 {
		return
	}
	if _, err := s.Rollouts.ReportStatus(ctx, tenant, done); err != nil {
		s.logger().Error("twin: complete the device's desired rollouts; they complete at its next report", "tenant", tenant, "device", device, "err", err)
	}
}

// desiredChanged sends the device its delta, if that changed, and the
// update_config action the change dispatched, if any.
func (s *Service) desiredChanged(tenant, device string, sh *fleet.Shadow) {
	if sh.DeltaChanged {
		s.send(tenant, device, sh)
	}
	if sh.Dispatched != nil && s.Actions != nil {
		s.Actions.Dispatched(tenant, sh.Dispatched)
	}
}

// ShadowSettings reads the tenant's choices about shadows.
func (s *Service) ShadowSettings(ctx context.Context, tenant string) (fleet.ShadowSettings, error) {
	return s.Store.ShadowSettings(ctx, tenant)
}

// SetShadowSettings replaces the tenant's choices about shadows.
func (s *Service) SetShadowSettings(ctx context.Context, tenant string, set fleet.ShadowSettings) error {
	return s.Store.SetShadowSettings(ctx, tenant, set)
}

// UpdateReported changes the reported state, and sends the device its
// delta if that changed.
func (s *Service) UpdateReported(ctx context.Context, tenant, device string, patch map[string]any) (*fleet.Shadow, error) {
	sh, err := s.Store.UpdateReported(ctx, tenant, device, patch)
	if err == nil {
		s.reportedChanged(ctx, tenant, device, sh)
	}
	return sh, err
}

// ReportPoint changes the reported state with a point of the device's
// state stream unless a newer one was kept, and sends the device its
// delta if that changed.
func (s *Service) ReportPoint(ctx context.Context, tenant, device, stream string, p *fleet.DataPoint) (*fleet.Shadow, error) {
	sh, err := s.Store.ReportPoint(ctx, tenant, device, stream, p)
	if err == nil {
		s.reportedChanged(ctx, tenant, device, sh)
	}
	return sh, err
}

// DeltaSubscribed sends a device that subscribed to its delta the delta,
// if it is not empty.
func (s *Service) DeltaSubscribed(tenant, device string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sh, err := s.Store.FindShadow(ctx, tenant, device)
	if err != nil {
		s.logger().Warn("twin: read a shadow to send its delta; the device gets it at its next change or subscription",
			"tenant", tenant, "device", device, "err", err)
		return
	}
	if !sh.InSync {
		s.send(tenant, device, sh)
	}
}

func (s *Service) send(tenant, device string, sh *fleet.Shadow) {
	if s.Sender == nil {
		return
	}
	var delta []byte
	if !sh.InSync {
		b, err := fleet.MarshalCanonical(sh.Delta)
		if err != nil {
			s.logger().Error("twin: encode a delta", "tenant", tenant, "device", device, "err", err)
			return
		}
		delta = b
	}
	s.Sender.SendDelta(tenant, device, delta)
}

func (s *Service) logger() *slog.Logger {
	if s.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return s.Logger
}
