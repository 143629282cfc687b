package firmware

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/fleetd/fleet"
)

var _ fleet.ActionPreparer = (*Service)(nil)

// urlGrace is how much longer than the action's timeout a signed URL
// lives: the timeout counts from when a device takes the action, which an
// offline device does only when it next connects.
const urlGrace = 24 * time.Hour

// deviceParams are the params an update_firmware sends to each device.
// The uplink agent's downloader reads url, content-length, checksum and
// version, the last as an alias of its file_name: serde refuses a field
// given under both names, so the archive's own name travels as
// bundle_file_name, which uplink ignores (docs/firmware.md).
type deviceParams struct {
	Version          string            `json:"version"`
	URL              string            `json:"url"`
	Checksum         string            `json:"checksum"`
	ContentLength    int64             `json:"content-length"`
	UncompressedSize int64             `json:"uncompressed-size"`
	BundleFileName   string            `json:"bundle_file_name"`
	Components       []deviceComponent `json:"components"`
}

type deviceComponent struct {
	ComponentName    string `json:"component_name"`
	VersionNumber    string `json:"version_number"`
	FileName         string `json:"file_name"`
	Checksum         string `json:"checksum"`
	ContentLength    int64  `json:"content_length"`
	UncompressedSize int64  `json:"uncompressed_size"`
}

// PrepareDispatch prepares an update_firmware
// (docs/firmware.md#update_firmware): params.version must name a completed
// bundle none of whose component versions is deactivated and whose
// dependencies hold among themselves, else the dispatch is refused
// (EINVALID). Devices receive the bundle's signed download URL with its
// checksum and sizes instead of the params sent, and a device whose recorded
// component versions break a dependency of the bundle is failed at once,
// with the dependency as the reason.
func (s *Service) PrepareDispatch(ctx context.Context, tenant string, d *fleet.Dispatch) error {
	var p map[string]any
	if err := json.Unmarshal(d.Params, &p); err != nil {
		return fleet.FieldErrors(map[string]string{"params": "must be an object"})
	}
	version, _ := p["version"].(string)
	problems := map[string]string{}
	if !fleet.ValidVersion(version) {
		problems["params.version"] = "must name a firmware bundle by its version, such as 2.3.0"
	}
	var unknown []string
	for k := range p {
		if k != "version" {
			unknown = append(unknown, k)
		}
	}
	sort.Strings(unknown)
	for _, k := range unknown {
		problems["params."+k] = "is not a known field of update_firmware's params (only version)"
	}
	if len(problems) > 0 {
		return fleet.FieldErrors(problems)
	}
	b, err := s.Store.FindBundleByVersion(ctx, tenant, version)
	if fleet.ErrorCode(err) == fleet.ENOTFOUND {
		return refuse("no firmware bundle has version %s", version)
	} else if err != nil {
		return err
	}
	if b.UploadStatus != fleet.UploadCompleted {
		return refuse("firmware bundle %s is %s; only a completed bundle can be dispatched", version, b.UploadStatus)
	}
	var off []string
	for _, f := range b.Firmwares {
		if f.IsDeactivated {
			off = append(off, f.ComponentName+" "+f.VersionNumber)
		}
	}
	if len(off) > 0 {
		return refuse("firmware bundle %s contains deactivated firmware: %s", version, strings.Join(off, ", "))
	}
	// S8 may have changed dependencies since the upload checked them.
	if broken := fleet.BrokenDependency(nil, b.Firmwares); broken != "" {
		return refuse("firmware bundle %s contradicts itself: %s", version, broken)
	}

	url, err := s.SignArtifactURL(ctx, tenant, b.ID, s.now().Add(time.Duration(d.Timeout)*time.Second+urlGrace))
	if err != nil {
		return err
	}
	dp := deviceParams{Version: b.Version, URL: url, Checksum: *b.Checksum, ContentLength: *b.ContentLength,
		UncompressedSize: *b.UncompressedSize, BundleFileName: b.FileName, Components: []deviceComponent{}}
	for _, f := range b.Firmwares {
		dp.Components = append(dp.Components, deviceComponent{f.ComponentName, f.VersionNumber, f.FileName, f.Checksum, f.ContentLength, f.UncompressedSize})
	}
	// Without HTML escaping the URL reads as it is ("&", not "\u0026") in
	// S7's params.
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(dp); err != nil {
		return err
	}
	d.DeviceParams = bytes.TrimSpace(buf.Bytes())
	dependents, err := s.Store.FindDependentFirmwares(ctx, tenant)
	if err != nil {
		return err
	}
	d.CheckDevice = deviceCheck(b.Firmwares, dependents)
	return nil
}

// deviceCheck returns the check of one device's recorded versions against
// an update to components, both ways: the bundle's dependencies must hold
// with what the device keeps, and what the device keeps must still have
// what it depends on once the bundle's versions replace the device's (a
// downgrade must not pull a component from under another).
func deviceCheck(components, dependents []*fleet.Firmware) func(map[string]string) string {
	installs := make(map[string]string, len(components))
	for _, c := range components {
		installs[c.ComponentName] = c.VersionNumber
	}
	// needs[name][version] are the dependencies of that component version
	// on what the bundle installs.
	needs := map[string]map[string][]fleet.Dependency{}
	for _, f := range dependents {
		for _, dep := range f.Dependencies {
			if _, ok := installs[dep.ComponentName]; !ok {
				continue
			}
			if needs[f.ComponentName] == nil {
				needs[f.ComponentName] = map[string][]fleet.Dependency{}
			}
			needs[f.ComponentName][f.VersionNumber] = append(needs[f.ComponentName][f.VersionNumber], dep)
		}
	}
	return func(installed map[string]string) string {
		if broken := fleet.BrokenDependency(installed, components); broken != "" {
			return broken
		}
		names := make([]string, 0, len(installed))
		for name := range installed {
			names = append(names, name)
		}
		sort.Strings(names)
		for _, name := range names {
			if _, replaced := installs[name]; replaced {
				continue
			}
			for _, dep := range needs[name][installed[name]] {
				if v := installs[dep.ComponentName]; fleet.CompareVersions(v, dep.MinVersion) < 0 {
					return fmt.Sprintf("%s %s on the device requires %s >= %s, but the bundle installs %s %s",
						name, installed[name], dep.ComponentName, dep.MinVersion, dep.ComponentName, v)
				}
			}
		}
		return ""
	}
}

func refuse(format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	return &fleet.Error{Code: fleet.EINVALID, Message: msg, Fields: map[string]string{"params.version": msg}}
}
