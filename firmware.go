package fleet

import (
	"context"
	"fmt"
	"io"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
)

// Upload states of a bundle (docs/firmware.md#uploading). A bundle made from
// a multipart upload is completed at once; one made from a JSON record is
// pending until both its archive and its declaration (S5) are in, then
// completed when they agree and failed when they do not. Completed and
// failed never change.
const (
	UploadPending   = "pending"
	UploadCompleted = "completed"
	UploadFailed    = "failed"
)

// Dependency says that a component needs another component at MinVersion
// or later.
type Dependency struct {
	ComponentName string `json:"component_name"`
	MinVersion    string `json:"min_version"`
}

// Firmware is one version of one component: a file inside one or more
// bundles. A component version is stored once per tenant; bundles that carry
// the same file (same checksum) share it.
type Firmware struct {
	ID            uuid.UUID `json:"id"`
	ComponentName string    `json:"component_name"`
	VersionNumber string    `json:"version_number"`
	FileName      string    `json:"file_name" doc:"the file's path inside the bundle archive"`
	Checksum      string    `json:"checksum" doc:"SHA-256 (hex) of the file as stored in the archive"`
	ContentLength int64     `json:"content_length" doc:"bytes of the file as stored in the archive"`
	// UncompressedSize is the inflated size of a .gz file, else
	// ContentLength; S8 may correct it.
	UncompressedSize int64        `json:"uncompressed_size" doc:"inflated size of a .gz file, else content_length"`
	Dependencies     []Dependency `json:"dependencies"`
	IsDeactivated    bool         `json:"is_deactivated" doc:"deactivated firmware cannot be dispatched"`
	// MD5 and SHA1 (hex) of the file, for hawkBit clients; not part of
	// S6's shape.
	MD5       string    `json:"-"`
	SHA1      string    `json:"-"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// Declaration is what a client declares of the archive it uploads (S5);
// the server compares it with what it computed.
type Declaration struct {
	UncompressedSize int64  `json:"uncompressed_size"`
	Checksum         string `json:"checksum"`
	ContentLength    int64  `json:"content_length"`
}

// Bundle is a firmware release: an archive with a manifest and the files of
// its component versions. Sizes and checksum are computed by the server
// from the archive; they are null until it has been uploaded.
type Bundle struct {
	ID               uuid.UUID    `json:"id"`
	Version          string       `json:"version"`
	FileName         string       `json:"file_name"`
	UploadStatus     string       `json:"upload_status" doc:"pending, completed or failed"`
	UploadError      string       `json:"upload_error,omitempty" doc:"why the upload failed, naming the field that differs"`
	ContentLength    *int64       `json:"content_length" doc:"bytes of the archive"`
	UncompressedSize *int64       `json:"uncompressed_size" doc:"bytes of the tar stream (the archive itself when not gzipped)"`
	Checksum         *string      `json:"checksum" doc:"SHA-256 (hex) of the archive"`
	Declared         *Declaration `json:"declared" doc:"what S5 declared, if it has"`
	Firmwares        []*Firmware  `json:"firmwares" doc:"the component versions; listed once the bundle is completed"`
	CreatedAt        time.Time    `json:"created_at"`
	UpdatedAt        time.Time    `json:"updated_at"`

	// BlobKey names the stored archive; empty when there is none.
	BlobKey string `json:"-"`
}

// Manifest is a bundle's manifest.json, with each component's computed
// checksum and sizes filled in by the parser.
type Manifest struct {
	Version    string
	Components []*Firmware
}

// BundleFile is an uploaded, parsed and stored archive.
type BundleFile struct {
	BlobKey          string
	ContentLength    int64
	UncompressedSize int64
	Checksum         string
	Gzipped          bool
	Manifest         Manifest
}

// BundleFilter selects bundles; an empty UploadStatus selects all.
type BundleFilter struct {
	UploadStatus string
	Page
}

// FirmwareUpdate changes one component version (S8); nil fields stay.
type FirmwareUpdate struct {
	IsDeactivated    *bool
	UncompressedSize *int64
	Dependencies     *[]Dependency
}

// Artifact is a stored archive opened for reading; Seek makes ranges cheap.
type Artifact interface {
	io.ReadSeeker
	io.Closer
}

// RedirectArtifact is an Artifact better fetched where it is stored: a
// presigned URL of the S3 bucket, valid for a while (--blob-store's
// presign). Downloads are redirected there rather than streamed.
type RedirectArtifact interface {
	Artifact
	RedirectURL() string
}

// FirmwareStore keeps bundles and component versions. Its writes decide
// upload states atomically: a bundle that fails verification is stored as
// failed (and returned so), not refused.
type FirmwareStore interface {
	// CreateBundle stores a completed bundle with its component versions,
	// atomically. A version taken already, or a component version stored
	// with another checksum, is ECONFLICT and stores nothing.
	CreateBundle(ctx context.Context, tenant string, b *Bundle, f *BundleFile) error
	// CreatePendingBundle stores a bundle record that awaits its archive
	// and declaration.
	CreatePendingBundle(ctx context.Context, tenant string, b *Bundle) error
	// AttachBundleFile gives a pending bundle without an archive its
	// archive. When the declaration is in, the bundle is completed or
	// failed. ECONFLICT when the bundle has an archive already, is not
	// pending, or a component version conflicts; then nothing changes.
	//
	// A bundle that fails here or in DeclareBundle no longer references
	// its archive; the returned Bundle's BlobKey still names it, so that
	// the caller deletes it.
	AttachBundleFile(ctx context.Context, tenant string, id uuid.UUID, f *BundleFile) (*Bundle, error)
	// DeclareBundle records a declaration (S5). On a pending bundle it
	// replaces any earlier one and, when the archive is in, completes or
	// fails the bundle. On a completed or failed bundle nothing changes.
	DeclareBundle(ctx context.Context, tenant string, id uuid.UUID, d Declaration) (*Bundle, error)
	// DeleteBundle removes a bundle record and returns it, so its archive
	// can be deleted. Its component versions stay.
	DeleteBundle(ctx context.Context, tenant string, id uuid.UUID) (*Bundle, error)

	FindBundle(ctx context.Context, tenant string, id uuid.UUID) (*Bundle, error)
	// FindFirmwareByID returns one component version.
	FindFirmwareByID(ctx context.Context, tenant string, id uuid.UUID) (*Firmware, error)
	// FindBundleByVersion returns the live (pending or completed) bundle of
	// a version, else the latest failed one.
	FindBundleByVersion(ctx context.Context, tenant, version string) (*Bundle, error)
	FindBundles(ctx context.Context, tenant string, f BundleFilter) ([]*Bundle, int, error)
	// FindFirmwares lists the versions of a component, newest version
	// first; ENOTFOUND when it has none.
	FindFirmwares(ctx context.Context, tenant, component string, p Page) ([]*Firmware, int, error)
	UpdateFirmware(ctx context.Context, tenant, component, version string, u FirmwareUpdate) (*Firmware, error)
	// FindDependentFirmwares lists every component version of the tenant
	// that has dependencies.
	FindDependentFirmwares(ctx context.Context, tenant string) ([]*Firmware, error)

	// ServerSecret returns the server-wide secret of that name, made on
	// first use and shared by every replica.
	ServerSecret(ctx context.Context, name string) ([]byte, error)
}

// FirmwareService is what the API does with firmware: uploads that are
// streamed, verified and parsed, reads, S8 updates and artifact downloads.
type FirmwareService interface {
	// UploadBundle stores and parses an archive (multipart upload) and
	// makes a completed bundle of it (created). fileName may be empty. An
	// archive byte for byte that of its version's completed bundle is that
	// bundle, not created again, so that a re-run upload passes; another
	// archive of a version that exists is ECONFLICT.
	UploadBundle(ctx context.Context, tenant, fileName string, archive io.Reader) (b *Bundle, created bool, err error)
	// CreatePendingBundle makes a record that awaits its archive and its
	// declaration.
	CreatePendingBundle(ctx context.Context, tenant, version, fileName string) (*Bundle, error)
	// UploadBundleFile stores and parses the archive of a pending record.
	// A mismatch with the declaration fails the bundle and is ECONFLICT.
	// The archive of a completed bundle sent again, byte for byte, is that
	// bundle; other bytes are ECONFLICT.
	UploadBundleFile(ctx context.Context, tenant string, id uuid.UUID, archive io.Reader) (*Bundle, error)
	// DeclareBundle is S5; a mismatch with the archive fails the bundle
	// and is ECONFLICT.
	DeclareBundle(ctx context.Context, tenant string, id uuid.UUID, d Declaration) (*Bundle, error)
	DeleteBundle(ctx context.Context, tenant string, id uuid.UUID) error

	FindBundle(ctx context.Context, tenant string, id uuid.UUID) (*Bundle, error)
	FindBundleByVersion(ctx context.Context, tenant, version string) (*Bundle, error)
	FindBundles(ctx context.Context, tenant string, f BundleFilter) ([]*Bundle, int, error)
	FindFirmwares(ctx context.Context, tenant, component string, p Page) ([]*Firmware, int, error)
	UpdateFirmware(ctx context.Context, tenant, component, version string, u FirmwareUpdate) (*Firmware, error)

	// OpenArtifact opens the archive of a completed bundle.
	OpenArtifact(ctx context.Context, tenant string, id uuid.UUID) (*Bundle, Artifact, error)
	// OpenComponent opens the file of a component version on its own.
	OpenComponent(ctx context.Context, tenant string, id uuid.UUID) (*Firmware, Artifact, error)
	// VerifyArtifactURL checks the query of a signed download URL for a
	// bundle of tenant: a wrong signature or a past expiry is
	// EUNAUTHENTICATED.
	VerifyArtifactURL(ctx context.Context, tenant string, id uuid.UUID, expires, signature string) error
}

// Limits of bundles and their manifests.
const (
	MaxVersionLen    = 64
	MaxComponentLen  = 128
	MaxFileNameLen   = 255
	MaxComponents    = 1000
	MaxDependencies  = 100
	MaxArchiveFiles  = 10_000
	ChecksumHexLen   = 64
	VersionRule      = "must be numbers separated by dots, such as 2.3.0 (at most 64 characters)"
	ComponentRule    = "must be 1 to 128 characters from A-Z a-z 0-9 . _ -"
	FileNameRule     = "must be a file name of 1 to 255 characters without / \\ or control characters"
	ChecksumRule     = "must be a SHA-256 as 64 hexadecimal digits"
	UploadStatusRule = "must be one of pending, completed, failed"
)

var (
	versionPattern  = regexp.MustCompile(`^[0-9]+(\.[0-9]+)*$`)
	checksumPattern = regexp.MustCompile(`^[0-9a-fA-F]{64}$`)
)

// ValidVersion reports whether s is a version: numbers separated by dots.
func ValidVersion(s string) bool {
	return len(s) <= MaxVersionLen && versionPattern.MatchString(s)
}

// ValidComponentName reports whether s may name a component.
func ValidComponentName(s string) bool { return validName(s, 128, "._-") }

// ValidChecksum reports whether s is a SHA-256 in hex, either case.
func ValidChecksum(s string) bool { return checksumPattern.MatchString(s) }

// ValidFileName reports whether s may name a bundle's file as devices
// store it: one path element, no control characters.
func ValidFileName(s string) bool {
	if s == "" || len(s) > MaxFileNameLen || s == "." || s == ".." || !utf8.ValidString(s) {
		return false
	}
	for _, c := range s {
		if c < 0x20 || c == 0x7f || c == '/' || c == '\\' {
			return false
		}
	}
	return true
}

// CompareVersions orders two valid versions numerically part by part,
// missing parts counting as 0: "1.10.0" > "1.9.9", "1.0" == "1.0.0". It
// returns -1, 0 or +1. Parts of any length compare correctly.
func CompareVersions(a, b string) int {
	pa, pb := strings.Split(a, "."), strings.Split(b, ".")
	for i := range max(len(pa), len(pb)) {
		x, y := "0", "0"
		if i < len(pa) {
			x = pa[i]
		}
		if i < len(pb) {
			y = pb[i]
		}
		if c := compareDecimal(x, y); c != 0 {
			return c
		}
	}
	return 0
}

// compareDecimal orders two strings of digits by their value.
func compareDecimal(x, y string) int {
	x, y = strings.TrimLeft(x, "0"), strings.TrimLeft(y, "0")
	if len(x) != len(y) {
		if len(x) < len(y) {
			return -1
		}
		return 1
	}
	return strings.Compare(x, y)
}

// BrokenDependency finds the first dependency of the bundle's components
// that installed versions break, after the bundle's own versions replace
// the installed ones. installed maps component names to versions (a
// device's recorded components, or nil to check the bundle against
// itself). Dependencies on components that neither the bundle nor
// installed know are not checked. It returns "" when all hold.
func BrokenDependency(installed map[string]string, components []*Firmware) string {
	inBundle := make(map[string]string, len(components))
	for _, c := range components {
		inBundle[c.ComponentName] = c.VersionNumber
	}
	for _, c := range components {
		for _, d := range c.Dependencies {
			have, where := inBundle[d.ComponentName], "the bundle contains"
			if have == "" {
				have, where = installed[d.ComponentName], "the device has"
			}
			if have == "" || !ValidVersion(have) {
				continue
			}
			if CompareVersions(have, d.MinVersion) < 0 {
				return fmt.Sprintf("%s %s requires %s >= %s, but %s %s %s",
					c.ComponentName, c.VersionNumber, d.ComponentName, d.MinVersion, where, d.ComponentName, have)
			}
		}
	}
	return ""
}

// ValidateDependencies returns the problem with a component's dependency
// list, or "": each names a valid component other than its own, once, with
// a valid min_version.
func ValidateDependencies(component string, deps []Dependency) (field, problem string) {
	if len(deps) > MaxDependencies {
		return "", fmt.Sprintf("must list at most %d dependencies", MaxDependencies)
	}
	seen := map[string]bool{}
	for i, d := range deps {
		at := fmt.Sprintf("[%d]", i)
		switch {
		case !ValidComponentName(d.ComponentName):
			return at + ".component_name", ComponentRule
		case d.ComponentName == component:
			return at + ".component_name", "a component cannot depend on itself"
		case seen[d.ComponentName]:
			return at + ".component_name", fmt.Sprintf("%s is listed twice", d.ComponentName)
		case !ValidVersion(d.MinVersion):
			return at + ".min_version", VersionRule
		}
		seen[d.ComponentName] = true
	}
	return "", ""
}

type baseURLKey struct{}

// NewContextWithBaseURL returns ctx carrying the scheme and host a client
// used to reach the API ("https://fleet.example.com"), from which URLs
// handed to devices are made when no public URL is configured.
func NewContextWithBaseURL(ctx context.Context, base string) context.Context {
	return context.WithValue(ctx, baseURLKey{}, base)
}

// BaseURLFromContext returns the base URL of the request, or "".
func BaseURLFromContext(ctx context.Context) string {
	s, _ := ctx.Value(baseURLKey{}).(string)
	return s
}

// Mismatch compares a declaration with what the server computed of the
// archive and describes, by field name, each field that differs.
func (d Declaration) Mismatch(contentLength, uncompressedSize int64, checksum string) map[string]string {
	m := map[string]string{}
	if !strings.EqualFold(d.Checksum, checksum) {
		m["checksum"] = fmt.Sprintf("declared %s, but the uploaded archive's is %s", d.Checksum, checksum)
	}
	if d.ContentLength != contentLength {
		m["content_length"] = fmt.Sprintf("declared %d, but the uploaded archive has %d bytes", d.ContentLength, contentLength)
	}
	if d.UncompressedSize != uncompressedSize {
		m["uncompressed_size"] = fmt.Sprintf("declared %d, but the uploaded archive's tar stream has %d bytes", d.UncompressedSize, uncompressedSize)
	}
	return m
}

// MismatchMessage is the upload_error of a failed verification: every
// differing field, in a stable order.
func MismatchMessage(m map[string]string) string {
	var parts []string
	for _, k := range []string{"checksum", "content_length", "uncompressed_size"} {
		if v, ok := m[k]; ok {
			parts = append(parts, k+": "+v)
		}
	}
	return "the declaration does not match the uploaded archive: " + strings.Join(parts, "; ")
}

// SameArchive reports whether b is completed with an archive of this
// SHA-256 (hex) and length: an upload of the same bytes again.
func (b *Bundle) SameArchive(checksum string, contentLength int64) bool {
	return b.UploadStatus == UploadCompleted && b.Checksum != nil && b.ContentLength != nil &&
		strings.EqualFold(*b.Checksum, checksum) && *b.ContentLength == contentLength
}

// AwaitsArchive returns nil when b is pending without its archive, and
// otherwise the ECONFLICT that an archive sent to it is.
func (b *Bundle) AwaitsArchive() error {
	switch {
	case b.UploadStatus == UploadCompleted:
		return Errorf(ECONFLICT, "firmware bundle %s is completed; its archive cannot change (upload a new version instead)", b.ID)
	case b.UploadStatus == UploadFailed:
		return Errorf(ECONFLICT, "firmware bundle %s failed (%s); create a new record to upload again", b.ID, b.UploadError)
	case b.ContentLength != nil:
		return Errorf(ECONFLICT, "firmware bundle %s has its archive already", b.ID)
	}
	return nil
}
