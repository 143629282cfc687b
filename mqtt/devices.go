package mqtt

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/codec"
)

// Devices is the Handler that connects the device channel to fleetd's
// services: tokens are checked by the device registry, status reports go
// to the action service, data points to the stream service. It knows
// nothing of the broker, so an external-broker client can serve it too.
type Devices struct {
	Registry fleet.DeviceService
	// Certificates admits devices by client certificate on the TLS
	// listener; nil admits none that way.
	Certificates fleet.DeviceCertificateService
	Actions      fleet.ActionService
	Delivery     fleet.ActionDelivery
	// Streams takes data points in; while nil, they are acknowledged and
	// dropped.
	Streams fleet.StreamService
	// LastSeen records each connection as the device's last_seen_at; nil
	// records nothing.
	LastSeen DeviceToucher
	// Twin takes the devices' reported state and sends them their
	// shadow's delta; while nil, reported state is acknowledged and
	// dropped.
	Twin Twin
	// MaxDecoding bounds the bytes of device payloads being decoded at
	// once, across every device and channel; default DefaultMaxDecoding.
	// Decoding JSON into values costs up to ~35 times the payload's size
	// (an array of empty objects), so a hundred devices publishing their
	// largest payloads together would otherwise hold gigabytes. A payload
	// waits its turn, and its device's connection reads nothing meanwhile;
	// one that waits past the handler's deadline is not acknowledged, and
	// the device publishes it again.
	MaxDecoding int64
	// MaxInflated bounds what a compressed payload may inflate to; default
	// DefaultMaxInflated. Set it to the packet limit: a device may send
	// that much uncompressed. A compressed payload holds this much of
	// MaxDecoding while it is inflated and decoded.
	MaxInflated int
	Logger      *slog.Logger
	Now         func() time.Time

	decodingOnce sync.Once
	decoding     *codec.Budget
}

// DefaultMaxDecoding is Devices.MaxDecoding's default: 4 MiB, some 150 MB
// of decoded values at most, which sixteen of the largest payloads
// (256 KiB) fill, or thousands of ordinary ones.
const DefaultMaxDecoding = 4 << 20

// DefaultMaxInflated is Devices.MaxInflated's default: 256 KiB, the
// embedded broker's default packet limit.
const DefaultMaxInflated = 256 << 10

// decode decodes a JSON payload, compressed as compression says, into
// canonical values with read, which makes the typed values kept, within
// MaxDecoding.
func (h *Devices) decode(ctx context.Context, payload []byte, compression Compression, read func(v any)) error {
	h.decodingOnce.Do(func() {
		if h.MaxDecoding <= 0 {
			h.MaxDecoding = DefaultMaxDecoding
		}
		if h.MaxInflated <= 0 {
			h.MaxInflated = DefaultMaxInflated
		}
		h.decoding = codec.NewBudget(h.MaxDecoding)
	})
	size := int64(len(payload))
	if compression == CompressionLZ4 {
		size = int64(h.MaxInflated)
	}
	n, err := h.decoding.Acquire(ctx, size, 0)
	if err != nil {
		return fleet.Errorf(fleet.EUNAVAILABLE, "fleetd is decoding as many device payloads as it may; publish again")
	}
	defer h.decoding.Release(n)
	if compression == CompressionLZ4 {
		if payload, err = codec.InflateLZ4(payload, h.MaxInflated); err != nil {
			return err
		}
	}
	v, err := codec.Decode(codec.JSON, payload)
	if err != nil {
		return err
	}
	read(v)
	return nil
}

// Twin is what the device channel needs of the device shadows
// (docs/twin.md); twin.Service is one.
type Twin interface {
	UpdateReported(ctx context.Context, tenant, device string, patch map[string]any) (*fleet.Shadow, error)
	// DeltaSubscribed sends the device its shadow's delta, if not empty.
	DeltaSubscribed(tenant, device string)
}

// DeviceToucher records when a device was last seen; *sqlstore.DB is one.
type DeviceToucher interface {
	TouchDevice(ctx context.Context, tenant, id string, t time.Time) error
}

var (
	_ Handler                  = (*Devices)(nil)
	_ CertificateAuthenticator = (*Devices)(nil)
)

func (h *Devices) logger() *slog.Logger {
	if h.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return h.Logger
}

func (h *Devices) now() time.Time {
	if h.Now == nil {
		return time.Now()
	}
	return h.Now()
}

// AuthenticateDevice checks the device's token.
func (h *Devices) AuthenticateDevice(ctx context.Context, tenant, device, token string) error {
	return h.Registry.AuthenticateDevice(ctx, tenant, device, token)
}

// AuthenticateDeviceCertificate checks that serial is the device's
// current certificate.
func (h *Devices) AuthenticateDeviceCertificate(ctx context.Context, tenant, device, serial string) error {
	if h.Certificates == nil {
		return fleet.Errorf(fleet.EUNAUTHENTICATED, "devices cannot authenticate by certificate on this server")
	}
	return h.Certificates.AuthenticateDeviceCertificate(ctx, tenant, device, serial)
}

// DeviceConnected records the connection as the device's last sighting.
func (h *Devices) DeviceConnected(tenant, device string) {
	if h.LastSeen == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := h.LastSeen.TouchDevice(ctx, tenant, device, h.now()); err != nil {
		h.logger().Warn("mqtt: record last_seen_at", "tenant", tenant, "device", device, "err", err)
	}
}

// DeviceSubscribed tells the action service the device can be sent
// dispatches.
func (h *Devices) DeviceSubscribed(tenant, device string) {
	h.Delivery.DeviceSubscribed(tenant, device)
}

// PendingActions reads the device's backlog from the action service.
func (h *Devices) PendingActions(ctx context.Context, tenant, device string, after int64, limit int) ([]fleet.ActionMessage, error) {
	return h.Delivery.PendingMessages(ctx, tenant, device, after, limit)
}

// ActionDelivered passes on the device's acknowledgement of an action.
func (h *Devices) ActionDelivered(tenant, device string, actionID int64) {
	h.Delivery.ActionDelivered(tenant, device, actionID)
}

// ActionFailed records the device action as Failed, with reason as its
// error: as if the device had reported so, which is what a refusal in its
// PUBACK is.
func (h *Devices) ActionFailed(tenant, device string, actionID int64, reason string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r := fleet.StatusReport{DeviceID: device, ActionID: actionID, State: string(fleet.StatusFailed), Errors: []string{reason}}
	errs, err := h.Actions.ReportStatus(ctx, tenant, []fleet.StatusReport{r})
	if err == nil && len(errs) == 1 {
		err = errs[0]
	}
	if err != nil {
		h.logger().Warn("mqtt: record an action the device cannot take as failed; it is offered again when the device next subscribes",
			"tenant", tenant, "device", device, "action_id", actionID, "reason", reason, "err", err)
	}
}

// statusFields are the fields of a status report sent over MQTT. Others
// are ignored rather than refused: a device's agent may add its own, and
// refusing the report would not make it send another.
var statusFields = map[string]bool{"action_id": true, "id": true, "state": true, "progress": true, "errors": true, "timestamp": true, "sequence": true}

// HandleStatus applies a status payload, a JSON array of reports or one
// report, in one transaction and returns once it committed. Invalid
// reports, and reports on actions the device does not have, are skipped;
// the error returned names them (for the log) after the others were
// applied.
func (h *Devices) HandleStatus(ctx context.Context, tenant, device string, payload []byte) error {
	// One report of the plain shape, what devices send, is read without
	// making canonical values, so without the decoding budget; any other
	// payload the full way, which words every problem.
	if r, ok := fleet.QuickStatusReport(payload, false); ok {
		r.DeviceID = device
		return h.applyStatus(ctx, tenant, []fleet.StatusReport{r}, []int{0}, nil, 1)
	}
	var problems map[string]string
	var reports []fleet.StatusReport
	var index []int // of each report in the payload
	var count int
	err := h.decode(ctx, payload, CompressionNone, func(v any) {
		items, ok := v.([]any)
		if !ok {
			items = []any{v}
		}
		count = len(items)
		reports, index, problems = readReports(items, device)
	})
	if err != nil {
		return err
	}
	return h.applyStatus(ctx, tenant, reports, index, problems, count)
}

// applyStatus applies the reports read from a payload of count items, and
// returns an error naming the items skipped: problems (by index, nil if
// none) and those the action service refused.
func (h *Devices) applyStatus(ctx context.Context, tenant string, reports []fleet.StatusReport, index []int, problems map[string]string, count int) error {
	if len(reports) > 0 {
		errs, err := h.Actions.ReportStatus(ctx, tenant, reports)
		if err != nil {
			return err
		}
		for j, err := range errs {
			if err != nil {
				if problems == nil {
					problems = map[string]string{}
				}
				problems[fmt.Sprintf("[%d]", index[j])] = fleet.ErrorMessage(err)
			}
		}
	}
	if len(problems) > 0 {
		e := fleet.FieldErrors(problems)
		e.Message = fmt.Sprintf("%d of %d status reports skipped", len(problems), count)
		return e
	}
	return nil
}

// readReports reads the status reports of a payload's items, and the
// problems of those that are not.
func readReports(items []any, device string) (reports []fleet.StatusReport, index []int, problems map[string]string) {
	problems = map[string]string{}
	reports = make([]fleet.StatusReport, 0, len(items))
	index = make([]int, 0, len(items))
	for i, item := range items {
		m, ok := item.(map[string]any)
		if !ok {
			problems[fmt.Sprintf("[%d]", i)] = "must be an object, not " + fleet.Describe(item)
			continue
		}
		for k := range m {
			if !statusFields[k] {
				delete(m, k)
			}
		}
		f := fleet.NewFields(m)
		r := fleet.ReadStatusReport(f, false)
		if err := f.Err(); err != nil {
			problems[fmt.Sprintf("[%d]", i)] = fleet.ErrorMessage(err) + fieldDetails(err)
			continue
		}
		r.DeviceID = device
		reports = append(reports, r)
		index = append(index, i)
	}
	return reports, index, problems
}

// fieldDetails lists an invalid report's problems for the log.
func fieldDetails(err error) string {
	fe, ok := err.(*fleet.Error)
	if !ok || len(fe.Fields) == 0 {
		return ""
	}
	return fmt.Sprintf(" %v", fe.Fields)
}

// HandleStream ingests a batch of data points. Unusable points are
// skipped and named in the error; the others are kept (the error is then
// Partly's: the publish counts as taken).
func (h *Devices) HandleStream(ctx context.Context, tenant, device, stream string, compression Compression, payload []byte) error {
	if h.Delivery != nil {
		h.Delivery.DeviceSeen(tenant, device)
	}
	if h.Streams == nil {
		h.logger().Debug("mqtt: no stream service; data points dropped", "tenant", tenant, "device", device, "stream", stream)
		return nil
	}
	var pts []fleet.DataPoint
	var problems map[string]string
	err := h.decode(ctx, payload, compression, func(v any) { pts, problems = fleet.ReadDataPoints(v, device, stream, h.now()) })
	if err != nil {
		return err
	}
	if len(pts) > 0 {
		if err := h.Streams.IngestPoints(ctx, tenant, device, stream, pts); err != nil {
			return err
		}
	}
	if len(problems) > 0 {
		e := fleet.FieldErrors(problems)
		e.Message = fmt.Sprintf("%d data points skipped", len(problems))
		if len(pts) > 0 {
			return Partly(e)
		}
		return e
	}
	return nil
}

// HandleReported merges a device's reported state, a JSON object, into its
// shadow.
func (h *Devices) HandleReported(ctx context.Context, tenant, device string, payload []byte) error {
	if h.Delivery != nil {
		h.Delivery.DeviceSeen(tenant, device)
	}
	if h.Twin == nil {
		return nil
	}
	var patch map[string]any
	var problem string
	err := h.decode(ctx, payload, CompressionNone, func(v any) {
		var ok bool
		if patch, ok = v.(map[string]any); !ok {
			problem = "a reported state must be a JSON object, not " + fleet.Describe(v)
		}
	})
	if err != nil {
		return err
	}
	if problem != "" {
		return fleet.Errorf(fleet.EINVALID, "%s", problem)
	}
	_, err = h.Twin.UpdateReported(ctx, tenant, device, patch)
	return err
}

// DeltaSubscribed sends the device its delta, if it has one.
func (h *Devices) DeltaSubscribed(tenant, device string) {
	if h.Twin != nil {
		h.Twin.DeltaSubscribed(tenant, device)
	}
}
