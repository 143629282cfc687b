package fleethttp

import (
	"net/http"
	"net/url"
	"time"

	"github.com/fleetd/fleet"
)

// deviceCreate is the body that provisions one device.
type deviceCreate struct {
	ID       string            `json:"id,omitempty" doc:"1-128 characters from A-Z a-z 0-9 . _ : -; generated when absent"`
	Metadata map[string]string `json:"metadata,omitempty" doc:"string values; at most 64 keys of up to 64 characters, values up to 1024"`
}

// createdDevice answers a provisioning: the token is shown this once.
type createdDevice struct {
	ID        string            `json:"id"`
	Token     string            `json:"token"`
	Metadata  map[string]string `json:"metadata"`
	CreatedAt time.Time         `json:"created_at"`
}

type bulkCreate struct {
	Devices []deviceCreate `json:"devices" openapi:"required"`
}

type bulkCreated struct {
	Devices []fleet.DeviceToken `json:"devices"`
}

type deviceList struct {
	Devices []*fleet.Device `json:"devices"`
	Count   int             `json:"count"`
}

type devicePatch struct {
	Metadata map[string]*string `json:"metadata" openapi:"required" doc:"keys to set; a null value deletes the key"`
}

type tokenBody struct {
	Token string `json:"token"`
}

// readNewDevice is the typed decode of one device to provision.
func readNewDevice(f *fleet.Fields) fleet.NewDevice {
	var d fleet.NewDevice
	if f.Has("id") {
		if d.ID = f.String("id", false); !fleet.ValidDeviceID(d.ID) {
			f.Fail("id", fleet.DeviceIDRule)
		}
	}
	d.Metadata = f.StringMap("metadata", false)
	if problem := fleet.ValidateMetadata(d.Metadata); problem != "" {
		f.Fail("metadata", problem)
	}
	return d
}

func (s *Server) handleCreateDevice(w http.ResponseWriter, r *http.Request) error {
	body, err := s.decode(w, r, s.Limits.Body, ordinaryElements)
	if err != nil {
		return err
	}
	f := fleet.NewFields(body)
	d := readNewDevice(f)
	if err := f.Err(); err != nil {
		return err
	}
	toks, err := s.Devices.CreateDevices(r.Context(), tenantOf(r), []fleet.NewDevice{d})
	if err != nil {
		return err
	}
	dev, err := s.Devices.FindDevice(r.Context(), tenantOf(r), toks[0].ID)
	if err != nil {
		return err
	}
	location(w, r, "/api/v1/devices/", url.PathEscape(dev.ID))
	s.respond(w, r, http.StatusCreated, createdDevice{ID: dev.ID, Token: toks[0].Token, Metadata: dev.Metadata, CreatedAt: dev.CreatedAt})
	return nil
}

func (s *Server) handleCreateDevices(w http.ResponseWriter, r *http.Request) error {
	body, err := s.decode(w, r, s.Limits.Bulk, bulkElements)
	if err != nil {
		return err
	}
	f := fleet.NewFields(body)
	items := f.Array("devices", true)
	if len(items) == 0 && f.Has("devices") {
		f.Fail("devices", "must list at least one device")
	} else if len(items) > fleet.MaxBulkDevices {
		f.Fail("devices", "must list at most 100000 devices")
		items = nil
	}
	devs := make([]fleet.NewDevice, 0, len(items))
	for i, item := range items {
		if df := f.Element("devices", i, item); df != nil {
			devs = append(devs, readNewDevice(df))
			df.Unknown()
		}
	}
	if err := f.Err(); err != nil {
		return err
	}
	toks, err := s.Devices.CreateDevices(r.Context(), tenantOf(r), devs)
	if err != nil {
		return err
	}
	location(w, r, "/api/v1/devices")
	s.respond(w, r, http.StatusCreated, bulkCreated{Devices: toks})
	return nil
}

func (s *Server) handleListDevices(w http.ResponseWriter, r *http.Request) error {
	q := newQuery(r)
	filter := fleet.DeviceFilter{Search: q.String("search"), Metadata: q.Prefixed("metadata."),
		Shadow: q.Enum("shadow", "", fleet.ShadowInSync, fleet.ShadowOutOfSync), Group: q.String("group"), Page: q.Page()}
	if err := q.Err(); err != nil {
		return err
	}
	devs, n, err := s.Devices.FindDevices(r.Context(), tenantOf(r), filter)
	if err != nil {
		return err
	}
	s.respond(w, r, http.StatusOK, deviceList{Devices: devs, Count: n})
	return nil
}

// deviceID returns the {id} of the path, which must be a valid device id.
func deviceID(r *http.Request) (string, error) {
	return pathValue(r, "id", "device id", fleet.ValidDeviceID, fleet.DeviceIDRule)
}

func (s *Server) handleGetDevice(w http.ResponseWriter, r *http.Request) error {
	return getOne(s, w, r, deviceID, s.Devices.FindDevice)
}

func (s *Server) handlePatchDevice(w http.ResponseWriter, r *http.Request) error {
	id, err := deviceID(r)
	if err != nil {
		return err
	}
	body, err := s.decode(w, r, s.Limits.Body, ordinaryElements)
	if err != nil {
		return err
	}
	f := fleet.NewFields(body)
	patch := map[string]*string{}
	for k, v := range f.Object("metadata", true) {
		switch v := v.(type) {
		case nil:
			patch[k] = nil
		case string:
			patch[k] = &v
		default:
			f.Fail("metadata."+k, "must be a string, or null to delete the key; not "+fleet.Describe(v))
		}
	}
	if err := f.Err(); err != nil {
		return err
	}
	dev, err := s.Devices.UpdateDeviceMetadata(r.Context(), tenantOf(r), id, patch)
	if err != nil {
		return err
	}
	return s.quiet(w, r, http.StatusNoContent, func() (any, error) { return dev, nil })
}

func (s *Server) handleDeleteDevice(w http.ResponseWriter, r *http.Request) error {
	id, err := deviceID(r)
	if err != nil {
		return err
	}
	if err := s.Devices.DeleteDevice(r.Context(), tenantOf(r), id); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) handleRotateToken(w http.ResponseWriter, r *http.Request) error {
	id, err := deviceID(r)
	if err != nil {
		return err
	}
	tok, err := s.Devices.RotateDeviceToken(r.Context(), tenantOf(r), id)
	if err != nil {
		return err
	}
	location(w, r, "/api/v1/devices/", url.PathEscape(id))
	s.respond(w, r, http.StatusCreated, tokenBody{Token: tok})
	return nil
}
