package console

import (
	"errors"
	"io"
	"mime/multipart"
	"net/http"
	"time"

	"github.com/fleetd/fleet"
	"github.com/google/uuid"
)

// firmwareData is the firmware list's.
type firmwareData struct {
	Bundles []*fleet.Bundle
	Pager   pager
}

func (c *Console) handleFirmware(w http.ResponseWriter, r *http.Request, v *view) error {
	p, err := readPage(r)
	if err != nil {
		return err
	}
	bs, n, err := c.Firmware.FindBundles(r.Context(), v.Actor.Tenant, fleet.BundleFilter{Page: p})
	if err != nil {
		return err
	}
	v.Title, v.Nav, v.Data = "Firmware", "firmware", firmwareData{Bundles: bs, Pager: newPager(r, p, n)}
	c.render(w, r, http.StatusOK, "firmware", v)
	return nil
}

// handleUpload streams a bundle archive to the firmware service. The form
// is multipart: its first part must be the csrf field, checked before a
// byte of the file is read; the second, the file.
func (c *Console) handleUpload(w http.ResponseWriter, r *http.Request, v *view) error {
	// An archive of gigabytes on a slow link takes longer than any
	// request's read deadline: each read gets one of its own instead.
	r.Body = &idleDeadline{ReadCloser: r.Body, rc: http.NewResponseController(w)}
	r.Body = http.MaxBytesReader(w, r.Body, c.UploadLimit)
	mr, err := r.MultipartReader()
	if err != nil {
		return fleet.Errorf(fleet.EINVALID, "upload the archive with the form's file field")
	}
	part, err := mr.NextPart()
	if err != nil || part.FormName() != "csrf" {
		return fleet.Errorf(fleet.EFORBIDDEN, "this form is out of date or was not sent by the console; reload the page and try again")
	}
	tok, _ := io.ReadAll(io.LimitReader(part, 256))
	if !tokensEqual(string(tok), v.CSRF) {
		return fleet.Errorf(fleet.EFORBIDDEN, "this form is out of date or was not sent by the console; reload the page and try again")
	}
	part, err = nextFile(mr)
	if err != nil {
		return err
	}
	b, _, err := c.Firmware.UploadBundle(r.Context(), v.Actor.Tenant, part.FileName(), part)
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return fleet.Errorf(fleet.ETOOLARGE, "the archive is larger than the %d bytes fleetd accepts", c.UploadLimit)
	} else if err != nil {
		return err
	}
	http.Redirect(w, r, "/console/firmware/"+b.ID.String(), http.StatusSeeOther)
	return nil
}

// uploadIdle is how long an upload may pause.
const uploadIdle = 30 * time.Second

// idleDeadline moves the connection's read deadline with each read.
type idleDeadline struct {
	io.ReadCloser
	rc *http.ResponseController
}

func (d *idleDeadline) Read(p []byte) (int, error) {
	_ = d.rc.SetReadDeadline(time.Now().Add(uploadIdle))
	return d.ReadCloser.Read(p)
}

// nextFile returns the form's file part.
func nextFile(mr *multipart.Reader) (*multipart.Part, error) {
	part, err := mr.NextPart()
	if err != nil || part.FormName() != "file" || part.FileName() == "" {
		return nil, fleet.FieldErrors(map[string]string{"file": "choose a bundle archive (a .tar or .tar.gz with manifest.json)"})
	}
	return part, nil
}

// bundleData is a bundle page's.
type bundleData struct {
	Bundle *fleet.Bundle
}

func (c *Console) handleBundle(w http.ResponseWriter, r *http.Request, v *view) error {
	id, err := uuid.Parse(r.PathValue("id"))
	if err != nil {
		return fleet.Errorf(fleet.ENOTFOUND, "there is no firmware bundle %q", r.PathValue("id"))
	}
	b, err := c.Firmware.FindBundle(r.Context(), v.Actor.Tenant, id)
	if err != nil {
		return err
	}
	v.Title, v.Nav, v.Data = "Firmware "+b.Version, "firmware", bundleData{Bundle: b}
	c.render(w, r, http.StatusOK, "bundle", v)
	return nil
}

// handleFirmwareActive activates or deactivates a component version (S8's
// is_deactivated), then shows the bundle it came from.
func (c *Console) handleFirmwareActive(w http.ResponseWriter, r *http.Request, v *view) error {
	component, version := r.PathValue("component"), r.PathValue("version")
	if !fleet.ValidVersion(version) {
		return fleet.Errorf(fleet.ENOTFOUND, "there is no version %q of %q", version, component)
	}
	var off bool
	switch r.PostForm.Get("state") {
	case "deactivated":
		off = true
	case "active":
	default:
		return fleet.FieldErrors(map[string]string{"state": "must be active or deactivated"})
	}
	if _, err := c.Firmware.UpdateFirmware(r.Context(), v.Actor.Tenant, component, version, fleet.FirmwareUpdate{IsDeactivated: &off}); err != nil {
		return err
	}
	back := "/console/firmware"
	if id, err := uuid.Parse(r.PostForm.Get("bundle")); err == nil {
		back += "/" + id.String()
	}
	http.Redirect(w, r, back, http.StatusSeeOther)
	return nil
}
