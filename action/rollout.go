package action

import (
	"context"
	"strings"
	"time"

	"github.com/fleetd/fleet"
)

// RolloutStore is what rollouts need of the database: the state and the
// steps of each rollout, decided and applied there in one transaction
// (fleet.Rollout decides; see sqlstore/action_rollout.go).
type RolloutStore interface {
	// ActiveRollouts lists the rollouts that may still change.
	ActiveRollouts(ctx context.Context) ([]fleet.RolloutRef, error)
	// AdvanceRollout takes the step the rollout decides at now, if any.
	// A rollout another transaction holds (another replica's driver) is
	// skipped, as a wait, unless wait: then the step is decided once that
	// transaction has committed.
	AdvanceRollout(ctx context.Context, tenant string, id int64, now time.Time, wait bool) (*fleet.RolloutChange, error)
	PauseRollout(ctx context.Context, tenant string, id int64, now time.Time) (*fleet.RolloutChange, error)
	ResumeRollout(ctx context.Context, tenant string, id int64, now time.Time) (*fleet.RolloutChange, error)
	AbortRollout(ctx context.Context, tenant string, id int64, tell *fleet.Dispatch, now time.Time) (*fleet.RolloutChange, error)
	TriggerNextPhase(ctx context.Context, tenant string, id int64, now time.Time) (*fleet.RolloutChange, error)
	// ReleaseDesired releases the next chunk of a desired rollout's
	// released devices, returning the shadows it changed and whether more
	// wait (fleet.RolloutChange.MoreDesired).
	ReleaseDesired(ctx context.Context, tenant string, id int64, now time.Time) (map[string]*fleet.Shadow, bool, error)
	AppendPhase(ctx context.Context, tenant string, id int64, p fleet.Phase, check func(map[string]string) string, now time.Time) (*fleet.RolloutChange, error)
	// RolloutWait reads what the rollout waits for at now; nil for an
	// action without a schedule, or one paused or done.
	RolloutWait(ctx context.Context, tenant string, id int64, now time.Time) (*fleet.RolloutWait, error)
	fleet.RolloutNotificationService
}

var (
	_ fleet.RolloutService             = (*Service)(nil)
	_ fleet.RolloutNotificationService = (*Service)(nil)
)

// checkSchedule checks what a schedule names beyond its shape: an end that
// has not passed, alert rules of the tenant.
func (s *Service) checkSchedule(ctx context.Context, tenant string, sch *fleet.Schedule) error {
	if err := sch.CheckAt(s.Now()); err != nil {
		return err
	}
	var unknown []string
	for _, id := range sch.AlertRuleIDs() {
		_, err := s.Store.FindAlertRule(ctx, tenant, id)
		if fleet.ErrorCode(err) == fleet.ENOTFOUND {
			unknown = append(unknown, id)
		} else if err != nil {
			return err
		}
	}
	if len(unknown) > 0 {
		return fleet.FieldErrors(map[string]string{"schedule.phases": "gates name unknown alert rules: " + strings.Join(unknown, ", ")})
	}
	return nil
}

// RunRollouts advances the rollouts of every tenant each interval until
// ctx ends. Any number of replicas may run it: a step is claimed through
// the database, so it happens once.
func (s *Service) RunRollouts(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.AdvanceRollouts(ctx)
	}
}

// AdvanceRollouts takes every step that is due now, in every rollout.
// A rollout that waits for a time is not looked at again before it.
func (s *Service) AdvanceRollouts(ctx context.Context) {
	refs, err := s.Store.ActiveRollouts(ctx)
	if err != nil {
		if ctx.Err() == nil {
			s.Logger.Error("rollouts: list the active ones", "err", err)
		}
		return
	}
	now := s.Now()
	for _, r := range refs {
		if ctx.Err() != nil {
			return
		}
		s.rolloutMu.Lock()
		until := s.rolloutUntil[r]
		s.rolloutMu.Unlock()
		if now.Before(until) {
			continue
		}
		s.advance(ctx, r.Tenant, r.ActionID, false)
	}
}

// advance takes the steps a rollout has now, one after another. With
// wait, what another transaction is doing to the rollout (the driver's
// step, on any replica) is waited for rather than skipped: an answer that
// says what is due has been released (a dispatch's first phase, an
// operator's operation) must not come before it.
func (s *Service) advance(ctx context.Context, tenant string, id int64, wait bool) {
	for range 2 * fleet.MaxPhases { // a bound: each step changes the rollout
		c, err := s.Store.AdvanceRollout(ctx, tenant, id, s.Now(), wait)
		if err != nil {
			if ctx.Err() == nil {
				s.Logger.Error("rollouts: advance", "tenant", tenant, "action_id", id, "err", err)
			}
			return
		}
		if c.Step.Kind == fleet.StepWait {
			s.rolloutMu.Lock()
			s.rolloutUntil[fleet.RolloutRef{Tenant: tenant, ActionID: id}] = c.Step.Until
			s.rolloutMu.Unlock()
			s.releaseDesired(ctx, tenant, id, c)
			return
		}
		s.changed(tenant, c)
		s.releaseDesired(ctx, tenant, id, c)
	}
}

// releaseDesired releases, a chunk a transaction, the devices of a
// desired rollout whose change c left waiting, telling each chunk's
// devices as it commits: no transaction, and no list of changed shadows,
// grows with the phase (docs/twin.md). One that fails is taken up again
// at the driver's next pass.
func (s *Service) releaseDesired(ctx context.Context, tenant string, id int64, c *fleet.RolloutChange) {
	for more := c.MoreDesired; more && ctx.Err() == nil; {
		var shadows map[string]*fleet.Shadow
		var err error
		if shadows, more, err = s.Store.ReleaseDesired(ctx, tenant, id, s.Now()); err != nil {
			if ctx.Err() == nil {
				s.Logger.Error("rollouts: release a desired rollout's devices; the next pass goes on", "tenant", tenant, "action_id", id, "err", err)
			}
			s.forgetRollout(tenant, id)
			return
		}
		if len(shadows) > 0 && s.Shadows != nil {
			s.Shadows.DesiredReleased(tenant, shadows)
		}
	}
}

// changed does what a rollout's change asks of the device channel.
func (s *Service) changed(tenant string, c *fleet.RolloutChange) {
	if c.Event != nil {
		s.stats.rolloutEvents.Add(1)
		if s.Notified != nil {
			s.Notified()
		}
		s.Logger.Info("rollout "+strings.ReplaceAll(c.Event.Event, "_", " "), "tenant", tenant, "action_id", c.Event.ActionID,
			"status", c.Event.Status, "phase", c.Event.Phase, "released", c.Event.Released, "reason", c.Event.Reason)
	}
	if len(c.Shadows) > 0 && s.Shadows != nil {
		s.Shadows.DesiredReleased(tenant, c.Shadows)
	}
	if c.Deliver && c.Action != nil {
		a := *c.Action
		a.Targeted = c.Targeted
		s.send(tenant, &a)
	}
	s.send(tenant, c.Sent)
}

// forgetRollout makes the driver look at a rollout at its next pass: an
// operator changed it.
func (s *Service) forgetRollout(tenant string, id int64) {
	s.rolloutMu.Lock()
	delete(s.rolloutUntil, fleet.RolloutRef{Tenant: tenant, ActionID: id})
	s.rolloutMu.Unlock()
}

// waitingReason says what the rollout of a waits for, with the online
// state of the devices it names as this replica's device channel knows it.
func (s *Service) waitingReason(ctx context.Context, tenant string, a *fleet.Action) error {
	if a.Schedule == nil || a.Status.Done() || a.Status == fleet.RolloutPaused {
		return nil
	}
	now := s.Now()
	w, err := s.Store.RolloutWait(ctx, tenant, a.ID, now)
	if err != nil || w == nil {
		return err
	}
	if s.Sender != nil && !s.presenceUnknown() {
		for i := range w.Devices {
			online := s.Sender.Online(tenant, w.Devices[i].ID)
			w.Devices[i].Online = &online
		}
	}
	a.WaitingReason = w.Reason(now)
	return nil
}

// PauseRollout pauses a scheduled or running rollout.
func (s *Service) PauseRollout(ctx context.Context, tenant string, id int64) error {
	c, err := s.Store.PauseRollout(ctx, tenant, id, s.Now())
	return s.operated(ctx, tenant, id, c, err)
}

// ResumeRollout resumes a paused rollout, waiving the gate that paused it,
// and takes at once the steps that are due.
func (s *Service) ResumeRollout(ctx context.Context, tenant string, id int64) error {
	c, err := s.Store.ResumeRollout(ctx, tenant, id, s.Now())
	return s.operated(ctx, tenant, id, c, err)
}

// AbortRollout cancels what is not final and releases nothing more.
// Devices that have the action are sent a cancel_action.
func (s *Service) AbortRollout(ctx context.Context, tenant string, id int64) error {
	a, err := s.Store.FindAction(ctx, tenant, id)
	if err != nil {
		return err
	}
	c, err := s.Store.AbortRollout(ctx, tenant, id, cancelDispatch(ctx, a), s.Now())
	return s.operated(ctx, tenant, id, c, err)
}

// TriggerNextPhase releases the next phase now, if the rollout may and
// the phase's gate holds. A gate that does not hold pauses the rollout,
// and the answer is ECONFLICT with its reason.
func (s *Service) TriggerNextPhase(ctx context.Context, tenant string, id int64) error {
	c, err := s.Store.TriggerNextPhase(ctx, tenant, id, s.Now())
	return s.operated(ctx, tenant, id, c, err)
}

// operated follows an operator's operation on a rollout: the driver looks
// at it again, the device channel sends what it released, and the steps
// now due are taken. A gate that paused the rollout instead of letting the
// operation through is ECONFLICT, with its reason.
func (s *Service) operated(ctx context.Context, tenant string, id int64, c *fleet.RolloutChange, err error) error {
	if err != nil {
		return err
	}
	s.forgetRollout(tenant, id)
	s.changed(tenant, c)
	s.releaseDesired(ctx, tenant, id, c)
	if c.Step.Kind == fleet.StepPause {
		return fleet.Errorf(fleet.ECONFLICT, "%s; the rollout is paused: resume it to waive the gate", c.Step.Reason)
	}
	s.advance(ctx, tenant, id, true)
	return nil
}

// AppendPhase adds a fixed_list phase of new targets to a rollout. A
// special action's preparer checks the new devices as at dispatch.
func (s *Service) AppendPhase(ctx context.Context, tenant string, id int64, p fleet.Phase) error {
	a, err := s.Store.FindAction(ctx, tenant, id)
	if err != nil {
		return err
	}
	var check func(map[string]string) string
	if prep, ok := s.Preparers[a.Action]; ok && a.Action != fleet.ActionCancel {
		d := &fleet.Dispatch{Action: a.Action, Params: a.Params, SearchType: fleet.SearchDefault, DeviceIDs: p.Info.DeviceIDs, Timeout: a.Timeout}
		if err := prep.PrepareDispatch(ctx, tenant, d); err != nil {
			return fleet.Errorf(fleet.ECONFLICT, "the action can no longer be prepared for new devices: %v", err)
		}
		check = d.CheckDevice
	}
	c, err := s.Store.AppendPhase(ctx, tenant, id, p, check, s.Now())
	return s.operated(ctx, tenant, id, c, err)
}

// CreateRolloutNotificationRule stores a rule the server can send.
func (s *Service) CreateRolloutNotificationRule(ctx context.Context, tenant string, n *fleet.RolloutNotificationRule) error {
	if err := s.canSend(n.ChannelParameters.Type); err != nil {
		return err
	}
	return s.Store.CreateRolloutNotificationRule(ctx, tenant, n)
}

// UpdateRolloutNotificationRule applies a partial update the server can
// send.
func (s *Service) UpdateRolloutNotificationRule(ctx context.Context, tenant, id string, u fleet.RolloutNotificationRuleUpdate) (*fleet.RolloutNotificationRule, error) {
	if u.ChannelParameters != nil {
		if err := s.canSend(u.ChannelParameters.Type); err != nil {
			return nil, err
		}
	}
	return s.Store.UpdateRolloutNotificationRule(ctx, tenant, id, u)
}

// FindRolloutNotificationRule reads a rule.
func (s *Service) FindRolloutNotificationRule(ctx context.Context, tenant, id string) (*fleet.RolloutNotificationRule, error) {
	return s.Store.FindRolloutNotificationRule(ctx, tenant, id)
}

// FindRolloutNotificationRules lists a tenant's rules.
func (s *Service) FindRolloutNotificationRules(ctx context.Context, tenant string, p fleet.Page) ([]*fleet.RolloutNotificationRule, int, error) {
	return s.Store.FindRolloutNotificationRules(ctx, tenant, p)
}

// DeleteRolloutNotificationRule deletes a rule and what it has pending.
func (s *Service) DeleteRolloutNotificationRule(ctx context.Context, tenant, id string) error {
	return s.Store.DeleteRolloutNotificationRule(ctx, tenant, id)
}

func (s *Service) canSend(channel string) error {
	if channel == fleet.ChannelEmail && !s.EmailEnabled {
		return fleet.FieldErrors(map[string]string{"channel_parameters.type": "email is not configured on this server: its operator must set --smtp-addr and --smtp-from"})
	}
	return nil
}
