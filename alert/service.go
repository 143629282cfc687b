package alert

import (
	"context"
	"log/slog"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/codec"
)

// ServiceStore is the store behind Service; sqlstore.DB implements it.
type ServiceStore interface {
	fleet.AlertService
	FindLatestPoint(ctx context.Context, tenant, device, stream string) (*fleet.DataPoint, error)
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

// StreamHandler receives stream payloads from the device channel (MQTT
// events/{stream}/jsonarray). Unlike HTTP, where the client learns of each
// bad point, a device cannot be answered: bad points are counted and logged,
// and the good ones of the batch are ingested.
type StreamHandler struct {
	Streams fleet.StreamService
	Logger  *slog.Logger
	Now     func() time.Time

	Points    atomic.Uint64 // points ingested
	BadPoints atomic.Uint64 // points refused
}

// HandleStream decodes a JSON array of points and ingests the usable ones.
// An error is returned only when nothing could be stored for a reason the
// device may retry (the store is unavailable); a payload that is not JSON
// is logged and dropped, since sending it again would not help.
func (h *StreamHandler) HandleStream(ctx context.Context, tenant, device, stream string, payload []byte) error {
	log := h.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if !fleet.ValidStreamName(stream) {
		h.BadPoints.Add(1)
		log.Warn("stream data refused: bad stream name", "tenant", tenant, "device", device, "stream", stream)
		return nil
	}
	v, err := codec.Decode(codec.JSON, payload)
	if err != nil {
		h.BadPoints.Add(1)
		log.Warn("stream data refused: not JSON", "tenant", tenant, "device", device, "stream", stream, "err", fleet.ErrorMessage(err))
		return nil
	}
	now := time.Now
	if h.Now != nil {
		now = h.Now
	}
	pts, problems := fleet.ReadDataPoints(v, device, stream, now().UTC().Truncate(time.Millisecond))
	if len(problems) > 0 {
		h.BadPoints.Add(uint64(len(problems)))
		log.Warn("stream data: bad points dropped", "tenant", tenant, "device", device, "stream", stream,
			"bad", len(problems), "good", len(pts), "problems", describeProblems(problems))
	}
	if len(pts) == 0 {
		return nil
	}
	if err := h.Streams.IngestPoints(ctx, tenant, device, stream, pts); err != nil {
		if fleet.ErrorCode(err) == fleet.EUNAVAILABLE {
			return err
		}
		log.Warn("stream data not ingested", "tenant", tenant, "device", device, "stream", stream, "err", err)
		return err
	}
	h.Points.Add(uint64(len(pts)))
	return nil
}

// describeProblems lists a few problems for a log line.
func describeProblems(p map[string]string) string {
	keys := make([]string, 0, len(p))
	for k := range p {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	if len(keys) > 5 {
		keys = keys[:5]
	}
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(k + " " + p[k])
	}
	return b.String()
}
