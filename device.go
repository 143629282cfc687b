package fleet

import (
	"context"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// Device is one connected thing of a tenant. Its token is never part of it:
// it is shown once, when created or rotated, and stored hashed.
type Device struct {
	ID         string            `json:"id"`
	Metadata   map[string]string `json:"metadata"`
	Components map[string]string `json:"components"` // component name -> installed version
	CreatedAt  time.Time         `json:"created_at"`
	LastSeenAt *time.Time        `json:"last_seen_at"`
}

// DeviceToken is a device's id with its new token, as handed out once.
type DeviceToken struct {
	ID    string `json:"id"`
	Token string `json:"token"`
}

// NewDevice is a device to provision; an empty ID asks the store for one.
type NewDevice struct {
	ID       string
	Metadata map[string]string
}

// DeviceFilter selects devices. Search matches the id or any metadata value,
// case-insensitively; Metadata requires each key to equal its value;
// Shadow, ShadowInSync or ShadowOutOfSync, the state of the shadow;
// Group, the devices of that group now (a group that is not there is
// ENOTFOUND).
type DeviceFilter struct {
	Search   string
	Metadata map[string]string
	Shadow   string
	Group    string
	Page
}

// The values of DeviceFilter.Shadow. A device without a shadow is in sync.
const (
	ShadowInSync    = "in_sync"
	ShadowOutOfSync = "out_of_sync"
)

// Limits on device ids and metadata (docs/api.md#devices).
const (
	MaxDeviceIDLen    = 128
	MaxMetadataKeys   = 64
	MaxMetadataKeyLen = 64
	MaxMetadataValLen = 1024
	MaxBulkDevices    = 100_000
	DeviceTokenPrefix = "fdt_"
	APIKeyPrefix      = "fk_"
)

// ValidDeviceID reports whether s may name a device.
func ValidDeviceID(s string) bool { return validName(s, 128, "._:-") }

// validName reports whether s is 1 to max bytes, each an ASCII letter or
// digit or one of extra: the rule of device ids and the other names of
// resources. Device ids are checked on every status report and data point,
// where a regular expression cost a few percent of fleetd's CPU.
func validName(s string, max int, extra string) bool {
	if len(s) == 0 || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte(extra, c) >= 0) {
			return false
		}
	}
	return true
}

// DeviceIDRule says what a device id may be, for error messages.
const DeviceIDRule = "must be 1 to 128 characters from A-Z a-z 0-9 . _ : -"

// ValidateMetadata returns the problem with metadata m, or "". Null values are
// allowed only in patches, where they delete a key.
func ValidateMetadata(m map[string]string) string {
	if len(m) > MaxMetadataKeys {
		return fmt.Sprintf("must have at most %d keys", MaxMetadataKeys)
	}
	for k, v := range m {
		if !PlainText(k) || !PlainText(v) {
			// Stored as JSON, invalid bytes would become U+FFFD, and two
			// keys could become one; PostgreSQL's JSON holds no NUL.
			return fmt.Sprintf("key %q and its value %s", k, PlainTextRule)
		}
		if k == "" || utf8.RuneCountInString(k) > MaxMetadataKeyLen {
			return fmt.Sprintf("key %q must be 1 to %d characters", k, MaxMetadataKeyLen)
		}
		if utf8.RuneCountInString(v) > MaxMetadataValLen {
			return fmt.Sprintf("value of %q must be at most %d characters", k, MaxMetadataValLen)
		}
	}
	return ""
}

// DeviceService manages a tenant's device registry.
type DeviceService interface {
	// CreateDevices provisions devices atomically: all or none. Ids taken
	// already, or twice in the list, are ECONFLICT naming them.
	CreateDevices(ctx context.Context, tenant string, devs []NewDevice) ([]DeviceToken, error)
	FindDevice(ctx context.Context, tenant, id string) (*Device, error)
	FindDevices(ctx context.Context, tenant string, f DeviceFilter) ([]*Device, int, error)
	// UpdateDeviceMetadata merges patch into the metadata; a nil value deletes
	// its key.
	UpdateDeviceMetadata(ctx context.Context, tenant, id string, patch map[string]*string) (*Device, error)
	DeleteDevice(ctx context.Context, tenant, id string) error
	RotateDeviceToken(ctx context.Context, tenant, id string) (string, error)
	// AuthenticateDevice checks a device's token; any mismatch is
	// EUNAUTHENTICATED.
	AuthenticateDevice(ctx context.Context, tenant, id, token string) error
}
