package alert

import (
	"context"

	"github.com/fleetd/fleet"
)

// ServiceStore is the store behind Service; sqlstore.DB implements it.
type ServiceStore interface {
	fleet.AlertStore
	FindLatestPoint(ctx context.Context, tenant, device, stream string) (*fleet.DataPoint, error)
	FindDeviceStreams(ctx context.Context, tenant, device string, p fleet.Page) ([]*fleet.DataPoint, int, error)
}

// Service is fleet.AlertService and fleet.StreamService: the store for
// records, the engine for evaluation. Rules saved or deleted here reach the
// engine at once.
type Service struct {
	ServiceStore
	Engine *Engine
	// EmailEnabled says whether the server can send email (--smtp-addr);
	// email notification rules are refused without it.
	EmailEnabled bool
}

var (
	_ fleet.AlertService  = (*Service)(nil)
	_ fleet.StreamService = (*Service)(nil)
)

// CreateAlertRule compiles, stores and starts evaluating a rule.
func (s *Service) CreateAlertRule(ctx context.Context, tenant string, r *fleet.AlertRule) error {
	if r.Compiled == nil {
		if errs := CompileRule(r); errs != nil {
			return fleet.FieldErrors(errs)
		}
	}
	if err := s.ServiceStore.CreateAlertRule(ctx, tenant, r); err != nil {
		return err
	}
	return s.Engine.AddRule(ctx, r)
}

// CompileRule is CompileRule, for the readers of a rule (fleet.ReadRule)
// that know the service and not its compiler.
func (s *Service) CompileRule(r *fleet.AlertRule) map[string]string { return CompileRule(r) }

// UpdateAlertRule compiles and stores an edited rule and evaluates it from
// now on.
func (s *Service) UpdateAlertRule(ctx context.Context, tenant, id string, r *fleet.AlertRule) error {
	if r.Compiled == nil {
		if errs := CompileRule(r); errs != nil {
			return fleet.FieldErrors(errs)
		}
	}
	if err := s.ServiceStore.UpdateAlertRule(ctx, tenant, id, r); err != nil {
		return err
	}
	return s.Engine.ReplaceRule(ctx, r)
}

// DeleteAlertRule deletes a rule and stops evaluating it.
func (s *Service) DeleteAlertRule(ctx context.Context, tenant, id string) error {
	if err := s.ServiceStore.DeleteAlertRule(ctx, tenant, id); err != nil {
		return err
	}
	s.Engine.RemoveRule(tenant, id)
	return nil
}

// CreateNotificationRule stores a notification rule the server can send.
func (s *Service) CreateNotificationRule(ctx context.Context, tenant string, n *fleet.NotificationRule) error {
	if err := s.canSend(n.ChannelParameters.Type); err != nil {
		return err
	}
	return s.ServiceStore.CreateNotificationRule(ctx, tenant, n)
}

// UpdateNotificationRule applies a partial update the server can send.
func (s *Service) UpdateNotificationRule(ctx context.Context, tenant, ruleID, id string, u fleet.NotificationRuleUpdate) (*fleet.NotificationRule, error) {
	if u.ChannelParameters != nil {
		if err := s.canSend(u.ChannelParameters.Type); err != nil {
			return nil, err
		}
	}
	return s.ServiceStore.UpdateNotificationRule(ctx, tenant, ruleID, id, u)
}

func (s *Service) canSend(channel string) error {
	if channel == fleet.ChannelEmail && !s.EmailEnabled {
		return fleet.FieldErrors(map[string]string{"channel_parameters.type": "email is not configured on this server: its operator must set --smtp-addr and --smtp-from"})
	}
	return nil
}

// IngestPoints evaluates and stores a batch of points.
func (s *Service) IngestPoints(ctx context.Context, tenant, device, stream string, pts []fleet.DataPoint) error {
	return s.Engine.IngestPoints(ctx, tenant, device, stream, pts)
}

// Devices is a fleet.DeviceService that tells the engine of metadata changes
// and deleted devices, so metadata_filters see them at once on this replica.
type Devices struct {
	fleet.DeviceService
	Engine *Engine
}

// UpdateDeviceMetadata updates and forgets the cached metadata.
func (d *Devices) UpdateDeviceMetadata(ctx context.Context, tenant, id string, patch map[string]*string) (*fleet.Device, error) {
	dev, err := d.DeviceService.UpdateDeviceMetadata(ctx, tenant, id, patch)
	if err == nil {
		d.Engine.InvalidateMetadata(tenant, id)
	}
	return dev, err
}

// DeleteDevice deletes and forgets the device's evaluation state.
func (d *Devices) DeleteDevice(ctx context.Context, tenant, id string) error {
	err := d.DeviceService.DeleteDevice(ctx, tenant, id)
	if err == nil {
		d.Engine.ForgetDevice(tenant, id)
	}
	return err
}
