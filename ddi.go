package fleet

import (
	"context"
	"time"
)

// DDISettings are a tenant's settings of the hawkBit DDI API
// (docs/hawkbit.md). Both are off for a new tenant.
type DDISettings struct {
	RequireConfirmation bool `json:"require_confirmation" openapi:"required" doc:"a DDI device confirms an update before it is handed over: the polling root links to confirmationBase instead of deploymentBase until the device posts confirmed (or has autoConfirm active)"`
	GatewayRegistration bool `json:"gateway_registration" openapi:"required" doc:"a poll with a gateway token for an unknown controllerId creates the device (audited; at most DDIRegistrationBurst at once, then one a second per tenant), instead of 404"`
}

// The limits of gateway registration: a tenant's gateways may create
// DDIRegistrationBurst devices at once, then DDIRegistrationRate a second.
const (
	DDIRegistrationBurst = 100
	DDIRegistrationRate  = 1.0
)

// The status words of an update_firmware device action still Queued that
// its device confirmed, or denied, on DDI's confirmationBase.
const (
	StateConfirmed          = "Confirmed"
	StateConfirmationDenied = "ConfirmationDenied"
)

// AutoConfirm is a device's automatic confirmation of its updates, which
// a DDI device switches on and off itself (confirmationBase's
// activateAutoConfirm and deactivateAutoConfirm). Initiator and Remark
// are the device's words, kept as it sent them.
type AutoConfirm struct {
	Active      bool
	Initiator   string
	Remark      string
	ActivatedAt time.Time
}

// Limits of an activation's words.
const MaxAutoConfirmText = 1024

// DDIService keeps the tenant's DDI settings and each device's
// confirmations.
type DDIService interface {
	// DDISettings returns the tenant's settings; ENOTFOUND for an unknown
	// tenant.
	DDISettings(ctx context.Context, tenant string) (DDISettings, error)
	// SetDDISettings replaces them, audited as tenant.ddi.update.
	SetDDISettings(ctx context.Context, tenant string, s DDISettings) error
	// AutoConfirm returns the device's automatic confirmation (inactive
	// when it never activated it).
	AutoConfirm(ctx context.Context, tenant, device string) (AutoConfirm, error)
	// SetAutoConfirm activates (a with Active) or deactivates the
	// device's automatic confirmation; activating it again is ECONFLICT.
	SetAutoConfirm(ctx context.Context, tenant, device string, a AutoConfirm) error
	// ConfirmDeviceAction records the device's answer to an update
	// waiting for its confirmation: confirmed (EventConfirmed) or denied
	// (EventDenied). EGONE when the device action is finished, ENOTFOUND
	// when it is not Queued (there is nothing to confirm).
	ConfirmDeviceAction(ctx context.Context, tenant, device string, actionID int64, confirmed bool) error
}
