package fleethttp

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"mime"
	"net/http"
	"net/url"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fleetd/fleet"
	"github.com/google/uuid"
)

// This file is the hawkBit Direct Device Integration API (DDI v1), which
// SWUpdate's suricatta, rauc-hawkbit-updater and Zephyr's client speak:
// a device polls its root, follows the links it finds to an
// update_firmware action (a deploymentBase, one chunk per component of the
// bundle) or a cancel_action (a cancelAction), downloads the artifacts and
// posts feedback, which drives the same lifecycle as MQTT and S10 reports.
// docs/hawkbit.md says how each resource maps onto fleetd.

// ddiPrefix is the path of a device's resources.
const ddiPrefix = ddiRoot + "/controller/v1/{controllerId}"

// ddiRoot begins DDI's patterns. They are served from a mux of their own:
// a tenant in the first segment would make them clash with every pattern
// that begins with a literal and has as many segments (/broker/, the
// console), which ServeMux refuses to choose between.
const ddiRoot = "/{tenant}"

// isDDIPath reports whether path is /{tenant}/controller/v1/… of a tenant
// name, as opposed to /api/, /mock/, /broker/ and the console.
func isDDIPath(path string) bool {
	parts := strings.SplitN(path, "/", 5)
	return len(parts) == 5 && parts[0] == "" && parts[2] == "controller" && parts[3] == "v1" &&
		parts[1] != "api" && parts[1] != "mock" && parts[1] != "broker" && parts[1] != "console"
}

// DDI's JSON, field for field as hawkBit writes it: clients are strict.
type (
	ddiLink struct {
		Href string `json:"href"`
	}
	ddiLinks map[string]ddiLink

	ddiPolling struct {
		Sleep string `json:"sleep" doc:"HH:MM:SS between polls"`
	}
	ddiConfig struct {
		Polling ddiPolling `json:"polling"`
	}
	ddiControllerBase struct {
		Config ddiConfig `json:"config"`
		Links  ddiLinks  `json:"_links,omitempty" doc:"deploymentBase, cancelAction, configData: what the device should follow"`
	}
	ddiHashes struct {
		SHA1   string `json:"sha1"`
		MD5    string `json:"md5"`
		SHA256 string `json:"sha256"`
	}
	ddiArtifact struct {
		Filename string    `json:"filename"`
		Hashes   ddiHashes `json:"hashes"`
		Size     int64     `json:"size"`
		Links    ddiLinks  `json:"_links" doc:"download, download-http, md5sum, md5sum-http"`
	}
	ddiChunk struct {
		Part      string        `json:"part" doc:"the component's name"`
		Version   string        `json:"version" doc:"the component's version number"`
		Name      string        `json:"name"`
		Artifacts []ddiArtifact `json:"artifacts"`
	}
	ddiDeployment struct {
		Download string     `json:"download" doc:"always forced"`
		Update   string     `json:"update" doc:"always forced"`
		Chunks   []ddiChunk `json:"chunks"`
	}
	ddiActionHistory struct {
		Status   string   `json:"status" doc:"SCHEDULED, RETRIEVED, RUNNING, FINISHED, ERROR, CANCELED, CANCELING or CANCEL_REJECTED"`
		Messages []string `json:"messages" doc:"the last status word, then the errors the device reported"`
	}
	ddiDeploymentBase struct {
		ID            string            `json:"id" doc:"the action id"`
		Deployment    ddiDeployment     `json:"deployment"`
		ActionHistory *ddiActionHistory `json:"actionHistory,omitempty" doc:"with ?actionHistory=N (not 0)"`
	}
	ddiCancelAction struct {
		StopID string `json:"stopId" doc:"the id of the action to stop"`
	}
	ddiCancel struct {
		ID           string          `json:"id" doc:"the id of the action to stop, as stopId"`
		CancelAction ddiCancelAction `json:"cancelAction"`
	}
	ddiAutoConfirmState struct {
		Active      bool   `json:"active"`
		Initiator   string `json:"initiator,omitempty" doc:"as the device sent it when it activated automatic confirmation"`
		Remark      string `json:"remark,omitempty" doc:"likewise"`
		ActivatedAt *int64 `json:"activatedAt,omitempty" doc:"when, in epoch milliseconds"`
	}
	ddiConfirmationBase struct {
		AutoConfirm ddiAutoConfirmState `json:"autoConfirm"`
		Links       ddiLinks            `json:"_links" doc:"activateAutoConfirm or deactivateAutoConfirm, and confirmationBase: the update waiting for the device's confirmation, if any"`
	}
	ddiConfirmationBaseAction struct {
		ID            string            `json:"id" doc:"the action id"`
		Confirmation  ddiDeployment     `json:"confirmation" doc:"the deployment the device is asked to confirm, as deploymentBase will show it"`
		ActionHistory *ddiActionHistory `json:"actionHistory,omitempty" doc:"with ?actionHistory=N (not 0)"`
	}
	// ddiConfirmationFeedback and ddiActivateAutoConfirm describe request
	// bodies, read field by field.
	ddiConfirmationFeedback struct {
		Confirmation string   `json:"confirmation" openapi:"required" doc:"confirmed or denied"`
		Code         *int64   `json:"code,omitempty" doc:"the device's own status code; logged"`
		Details      []string `json:"details,omitempty" doc:"the device's messages; logged"`
	}
	ddiActivateAutoConfirm struct {
		Initiator string `json:"initiator,omitempty" doc:"who activated it, in the device's words (at most 1,024 characters)"`
		Remark    string `json:"remark,omitempty" doc:"why (at most 1,024 characters)"`
	}
	// ddiFeedback and ddiConfigData describe the request bodies in the
	// OpenAPI document; they are read field by field (readFeedback).
	ddiProgress struct {
		Cnt int64 `json:"cnt"`
		Of  int64 `json:"of"`
	}
	ddiResult struct {
		Finished string       `json:"finished" doc:"success, failure or none"`
		Progress *ddiProgress `json:"progress,omitempty"`
	}
	ddiStatus struct {
		Execution string    `json:"execution" doc:"closed, proceeding, canceled, scheduled, rejected, resumed, downloaded or download"`
		Result    ddiResult `json:"result"`
		Details   []string  `json:"details,omitempty"`
	}
	ddiFeedback struct {
		Status ddiStatus `json:"status"`
	}
	ddiConfigData struct {
		Mode string            `json:"mode,omitempty" doc:"merge (default), replace or remove"`
		Data map[string]string `json:"data"`
	}
)

// ddiDevice authenticates a DDI request: "Authorization: TargetToken
// <device token>" for the device in the path, or "GatewayToken <API key>"
// of the tenant with the device role (or any role that may report device
// data) for any of its devices. Tenant names are lower case; hawkBit's
// clients often send DEFAULT.
func (s *Server) ddiDevice(w http.ResponseWriter, r *http.Request) (tenant, device string, err error) {
	return s.ddiAuth(w, r, false)
}

// ddiAuth is ddiDevice; with register, a gateway's request for an unknown
// device registers it when the tenant allows it (ddiRegister).
func (s *Server) ddiAuth(w http.ResponseWriter, r *http.Request, register bool) (tenant, device string, err error) {
	tenant, device = strings.ToLower(r.PathValue("tenant")), r.PathValue("controllerId")
	scheme, token, _ := strings.Cut(r.Header.Get("Authorization"), " ")
	token = strings.TrimSpace(token)
	switch {
	case strings.EqualFold(scheme, "TargetToken") && token != "":
		if !fleet.ValidDeviceID(device) {
			return "", "", fleet.Errorf(fleet.EUNAUTHENTICATED, "the device id, tenant or token is not valid")
		}
		if err := s.Devices.AuthenticateDevice(r.Context(), tenant, device, token); err != nil {
			return "", "", err
		}
		if err := s.limitActor(w, fleet.PermDeviceData, &fleet.Actor{Tenant: tenant, KeyName: "device " + device}); err != nil {
			return "", "", err
		}
	case strings.EqualFold(scheme, "GatewayToken") && token != "":
		a, err := s.Tenants.AuthenticateAPIKey(r.Context(), tenant, token)
		if err != nil {
			return "", "", err
		}
		if !a.Role.Can(fleet.PermDeviceData) {
			return "", "", fleet.Errorf(fleet.EFORBIDDEN, "the %s role may not %s", a.Role, permissionNames[fleet.PermDeviceData])
		}
		// The key's rate limit first: a key over it registers nothing.
		if err := s.limitActor(w, fleet.PermDeviceData, a); err != nil {
			return "", "", err
		}
		if _, err := s.Devices.FindDevice(r.Context(), tenant, device); fleet.ErrorCode(err) == fleet.ENOTFOUND && register {
			if err := s.ddiRegister(w, r, a, device, err); err != nil {
				return "", "", err
			}
		} else if err != nil {
			return "", "", err
		}
	default:
		return "", "", fleet.Errorf(fleet.EUNAUTHENTICATED, "send Authorization: TargetToken <the device's token>, or GatewayToken <an API key with the device role>")
	}
	s.Delivery.DeviceSeen(tenant, device)
	return tenant, device, nil
}

// ddiRegister creates the unknown device a gateway polls for, if the
// tenant's DDI settings allow it (else notFound, the lookup's 404 as
// before), within the tenant's registration rate
// (--ddi-registration-rate-limit). The device is created as the gateway's
// key, audited as device.create, with no metadata (the root then asks it
// for its attributes) and a token nobody is shown: a gateway speaks for
// it, or an operator gives it a new one.
func (s *Server) ddiRegister(w http.ResponseWriter, r *http.Request, gateway *fleet.Actor, device string, notFound error) error {
	set, err := s.DDI.DDISettings(r.Context(), gateway.Tenant)
	if err != nil || !set.GatewayRegistration {
		return cmp.Or(err, notFound)
	}
	if !fleet.ValidDeviceID(device) {
		return fleet.FieldErrors(map[string]string{"controllerId": fleet.DeviceIDRule})
	}
	if ok, retry := s.limiters.ddiRegistration.Allow(gateway.Tenant); !ok {
		s.metrics.ddiRegistrations.WithLabelValues("rate_limited").Inc()
		secs := max(int(math.Ceil(retry.Seconds())), 1)
		w.Header().Set("Retry-After", strconv.Itoa(secs))
		return fleet.Errorf(fleet.ERATELIMITED, "tenant %s's gateways registered more than %s devices a second lately; retry in %d s",
			gateway.Tenant, strconv.FormatFloat(s.limiters.ddiRegistration.Rate, 'f', -1, 64), secs)
	}
	ctx := fleet.NewContextWithActor(r.Context(), gateway)
	_, err = s.Devices.CreateDevices(ctx, gateway.Tenant, []fleet.NewDevice{{ID: device}})
	if fleet.ErrorCode(err) == fleet.ECONFLICT {
		// Another poll registered it first.
		_, err = s.Devices.FindDevice(r.Context(), gateway.Tenant, device)
		return err
	} else if err != nil {
		return err
	}
	s.metrics.ddiRegistrations.WithLabelValues("created").Inc()
	s.Logger.Info("ddi gateway registered a device", "tenant", gateway.Tenant, "device", device, "key", gateway.KeyName)
	return nil
}

// ddiURL is the absolute URL of a device's resource, on the host and
// scheme the device used.
func ddiURL(r *http.Request, tenant, device string, elems ...string) string {
	p := "/" + url.PathEscape(tenant) + "/controller/v1/" + url.PathEscape(device)
	for _, e := range elems {
		p += "/" + url.PathEscape(e)
	}
	return fleet.BaseURLFromContext(r.Context()) + p
}

// ddiJSON writes v as JSON: DDI is JSON only, whatever Accept says.
func ddiJSON(w http.ResponseWriter, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(http.StatusOK)
	w.Write(b)
	return nil
}

// sleepText is d as DDI's HH:MM:SS.
func sleepText(d time.Duration) string {
	sec := int64(d.Round(time.Second) / time.Second)
	return fmt.Sprintf("%02d:%02d:%02d", sec/3600, sec/60%60, sec%60)
}

// ddiOpenAction is the action a polling device should follow: a
// cancel_action before an update_firmware (a cancellation stops an update
// the device holds), and of each the first it holds (Initiated or
// Progress), else the first one queued for it whose rollout window is
// open. Other actions have no DDI form and wait. The id of a cancel_action
// is that of the action it stops, as DDI's cancelAction resource is named
// (ddiCancelOf).
func (s *Server) ddiOpenAction(r *http.Request, tenant, device string) (name string, id int64, err error) {
	held := func(typ string) (*fleet.DeviceAction, error) {
		for _, st := range []fleet.ActionStatus{fleet.StatusProgress, fleet.StatusInitiated} {
			das, _, err := s.Actions.FindDeviceActions(r.Context(), tenant, fleet.DeviceActionFilter{
				DeviceID: device, ActionStatus: st, Type: typ, SortBy: "action_id", Ascending: true, Page: fleet.Page{Page: 1, Limit: 1}})
			if err != nil || len(das) > 0 {
				return firstOf(das), err
			}
		}
		return nil, nil
	}
	if da, err := held(fleet.ActionCancel); err != nil || da != nil {
		if err != nil {
			return "", 0, err
		}
		stop, _ := fleet.CancelledActionID([]byte(da.Params))
		return fleet.ActionCancel, stop, nil
	}
	var after, update int64
	for range 10 { // a device with more than 1,000 other actions queued waits for them
		msgs, err := s.Delivery.PendingMessages(r.Context(), tenant, device, after, 100)
		if err != nil {
			return "", 0, err
		}
		for _, m := range msgs {
			var msg struct{ Name, Payload string }
			json.Unmarshal(m.Payload, &msg) // made by action.NewMessage
			switch {
			case msg.Name == fleet.ActionCancel:
				stop, _ := fleet.CancelledActionID([]byte(msg.Payload))
				return msg.Name, stop, nil
			case msg.Name == fleet.ActionUpdateFirmware && update == 0:
				update = m.ActionID
			}
			after = m.ActionID
		}
		if len(msgs) < 100 {
			break
		}
	}
	if da, err := held(fleet.ActionUpdateFirmware); err != nil || da != nil {
		if err != nil {
			return "", 0, err
		}
		return fleet.ActionUpdateFirmware, da.ActionID, nil
	}
	if update != 0 {
		return fleet.ActionUpdateFirmware, update, nil
	}
	return "", 0, nil
}

// firstOf is the first of das, or nil.
func firstOf(das []*fleet.DeviceAction) *fleet.DeviceAction {
	if len(das) == 0 {
		return nil
	}
	return das[0]
}

// handleDDIBase is the polling root.
func (s *Server) handleDDIBase(w http.ResponseWriter, r *http.Request) error {
	tenant, device, err := s.ddiAuth(w, r, true)
	if err != nil {
		return err
	}
	base := ddiControllerBase{Config: ddiConfig{Polling: ddiPolling{Sleep: sleepText(s.DDIPollInterval)}}, Links: ddiLinks{}}
	name, id, err := s.ddiOpenAction(r, tenant, device)
	if err != nil {
		return err
	}
	switch name {
	case fleet.ActionUpdateFirmware:
		resource := "deploymentBase"
		if wait, err := s.ddiAwaits(r, tenant, device, id); err != nil {
			return err
		} else if wait {
			resource = "confirmationBase"
		}
		base.Links[resource] = ddiLink{ddiURL(r, tenant, device, resource, strconv.FormatInt(id, 10))}
	case fleet.ActionCancel:
		base.Links["cancelAction"] = ddiLink{ddiURL(r, tenant, device, "cancelAction", strconv.FormatInt(id, 10))}
	}
	// A device that has told nothing of itself is asked to, once.
	if d, err := s.Devices.FindDevice(r.Context(), tenant, device); err != nil {
		return err
	} else if len(d.Metadata) == 0 {
		base.Links["configData"] = ddiLink{ddiURL(r, tenant, device, "configData")}
	}
	return ddiJSON(w, base)
}

// ddiAction reads the device action of the path's id, which must be of
// type typ and sent to the device.
func (s *Server) ddiAction(r *http.Request, tenant, device, typ string) (*fleet.DeviceAction, error) {
	id, ok := fleet.ParseActionID(r.PathValue("actionId"))
	if !ok {
		return nil, fleet.FieldErrors(map[string]string{"actionId": fleet.ActionIDRule})
	}
	da, err := s.Actions.FindDeviceAction(r.Context(), tenant, id, device)
	if err != nil {
		return nil, err
	}
	if da.Type != typ || !da.ActionStatus.Sent() {
		return nil, fleet.Errorf(fleet.ENOTFOUND, "device %s has no %s action %d", device, typ, id)
	}
	return da, nil
}

// handleDDIDeployment is deploymentBase/{actionId}: an update_firmware
// action as a deployment, one chunk per component. Reading it hands the
// action to the device (Queued → Initiated), as an MQTT PUBACK does.
func (s *Server) handleDDIDeployment(w http.ResponseWriter, r *http.Request) error {
	return s.ddiDeploymentResource(w, r, false)
}

// handleDDIInstalled is installedBase/{actionId}: a Completed
// update_firmware action of the device, as deploymentBase showed it, for a
// device that must install it again.
func (s *Server) handleDDIInstalled(w http.ResponseWriter, r *http.Request) error {
	return s.ddiDeploymentResource(w, r, true)
}

func (s *Server) ddiDeploymentResource(w http.ResponseWriter, r *http.Request, installed bool) error {
	tenant, device, err := s.ddiDevice(w, r)
	if err != nil {
		return err
	}
	history, err := ddiHistoryCount(r)
	if err != nil {
		return err
	}
	da, err := s.ddiAction(r, tenant, device, fleet.ActionUpdateFirmware)
	if err != nil {
		return err
	}
	if installed != (da.ActionStatus == fleet.StatusCompleted) {
		if installed {
			return fleet.Errorf(fleet.ENOTFOUND, "action %d is %s on device %s, not installed", da.ActionID, da.ActionStatus, device)
		}
		// As upstream: a finished deployment is installedBase's.
		return fleet.Errorf(fleet.ENOTFOUND, "action %d was installed on device %s: it is at installedBase/%d", da.ActionID, device, da.ActionID)
	}
	if err := s.ddiNotAwaiting(r, tenant, da); err != nil {
		return err
	}
	deployment, err := s.ddiDeploymentOf(r, tenant, da)
	if err != nil {
		return err
	}
	dep := ddiDeploymentBase{ID: strconv.FormatInt(da.ActionID, 10), Deployment: deployment, ActionHistory: ddiHistoryOf(da, history)}
	if da.ActionStatus == fleet.StatusQueued {
		s.Delivery.ActionDelivered(tenant, device, da.ActionID)
	}
	return ddiJSON(w, dep)
}

// ddiDeploymentOf is an update_firmware device action as DDI's
// deployment: one chunk per component of its bundle.
func (s *Server) ddiDeploymentOf(r *http.Request, tenant string, da *fleet.DeviceAction) (ddiDeployment, error) {
	dep := ddiDeployment{Download: "forced", Update: "forced", Chunks: []ddiChunk{}}
	b, err := s.ddiBundleOf(r, tenant, da)
	if err != nil {
		return dep, err
	}
	for _, fw := range b.Firmwares {
		art, err := ddiArtifactOf(r, tenant, da.DeviceID, fw)
		if err != nil {
			return dep, err
		}
		dep.Chunks = append(dep.Chunks, ddiChunk{Part: fw.ComponentName, Version: fw.VersionNumber, Name: fw.ComponentName,
			Artifacts: []ddiArtifact{art}})
	}
	return dep, nil
}

// ddiBundleOf is the firmware bundle of an update_firmware device action.
func (s *Server) ddiBundleOf(r *http.Request, tenant string, da *fleet.DeviceAction) (*fleet.Bundle, error) {
	var params struct{ Version string }
	if err := json.Unmarshal([]byte(da.Params), &params); err != nil {
		return nil, fmt.Errorf("params of device action %d: %w", da.ActionID, err)
	}
	b, err := s.Firmware.FindBundleByVersion(r.Context(), tenant, params.Version)
	if fleet.ErrorCode(err) == fleet.ENOTFOUND {
		return nil, fleet.Errorf(fleet.ENOTFOUND, "firmware bundle %s of action %d was deleted", params.Version, da.ActionID)
	}
	return b, err
}

// ddiArtifactOf is a component's file as DDI lists it, with its links.
func ddiArtifactOf(r *http.Request, tenant, device string, fw *fleet.Firmware) (ddiArtifact, error) {
	if fw.SHA1 == "" {
		return ddiArtifact{}, fleet.Errorf(fleet.ECONFLICT, "component %s %s was uploaded before fleetd kept files per component; upload a bundle carrying it again", fw.ComponentName, fw.VersionNumber)
	}
	file := path.Base(fw.FileName)
	href := ddiURL(r, tenant, device, "softwaremodules", fw.ID.String(), "artifacts", file)
	return ddiArtifact{Filename: file, Hashes: ddiHashes{SHA1: fw.SHA1, MD5: fw.MD5, SHA256: fw.Checksum}, Size: fw.ContentLength,
		Links: ddiLinks{"download": {href}, "download-http": {href}, "md5sum": {href + ".MD5SUM"}, "md5sum-http": {href + ".MD5SUM"}}}, nil
}

// ddiHistoryCount reads deploymentBase's actionHistory parameter: how many
// of the action's messages to show; 0 (the default) none, below 0 all.
// Its c parameter, upstream's hash of the resource, is not needed: fleetd
// has no soft deployments whose form changes.
func ddiHistoryCount(r *http.Request) (int, error) {
	v := r.URL.Query().Get("actionHistory")
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, fleet.FieldErrors(map[string]string{"actionHistory": "must be an integer: how many of the action's messages to show (below 0: all)"})
	}
	return n, nil
}

// ddiStatuses are hawkBit's words for the statuses of an action.
var ddiStatuses = map[fleet.ActionStatus]string{
	fleet.StatusScheduled: "SCHEDULED", fleet.StatusQueued: "SCHEDULED", fleet.StatusInitiated: "RETRIEVED",
	fleet.StatusProgress: "RUNNING", fleet.StatusCompleted: "FINISHED", fleet.StatusFailed: "ERROR", fleet.StatusCancelled: "CANCELED",
}

// ddiHistoryOf is the device action's history as DDI shows it: its
// status and up to n messages (below 0: all), its last status word first,
// then the errors the device reported, state by state. nil when n is 0.
func ddiHistoryOf(da *fleet.DeviceAction, n int) *ddiActionHistory {
	if n == 0 {
		return nil
	}
	h := &ddiActionHistory{Status: ddiStatuses[da.ActionStatus], Messages: []string{da.Status}}
	switch da.Status {
	case fleet.StateCancelling:
		h.Status = "CANCELING"
	case fleet.StateCancelRejected:
		h.Status = "CANCEL_REJECTED"
	}
	states := slices.Sorted(maps.Keys(da.Errors))
	for _, st := range states {
		for _, e := range da.Errors[st] {
			h.Messages = append(h.Messages, st+": "+e)
		}
	}
	if n > 0 && len(h.Messages) > n {
		h.Messages = h.Messages[:n]
	}
	return h
}

// handleDDIModuleArtifacts is softwaremodules/{moduleId}/artifacts: the
// component's file, as a deployment lists it.
func (s *Server) handleDDIModuleArtifacts(w http.ResponseWriter, r *http.Request) error {
	tenant, device, fw, art, err := s.ddiOpenModule(w, r)
	if err != nil {
		return err
	}
	art.Close()
	a, err := ddiArtifactOf(r, tenant, device, fw)
	if err != nil {
		return err
	}
	return ddiJSON(w, []ddiArtifact{a})
}

// ddiOpenModule authenticates a request for a software module (ddiModule)
// and opens its component's file, which the caller closes.
func (s *Server) ddiOpenModule(w http.ResponseWriter, r *http.Request) (tenant, device string, fw *fleet.Firmware, art fleet.Artifact, err error) {
	if tenant, device, err = s.ddiDevice(w, r); err != nil {
		return
	}
	id, err := s.ddiModule(r, tenant, device)
	if err != nil {
		return
	}
	fw, art, err = s.Firmware.OpenComponent(r.Context(), tenant, id)
	return
}

// ddiModule reads the path's firmware id (a software module), which a
// device may read only if one of its update_firmware actions installs it;
// a gateway may read any of the tenant's.
func (s *Server) ddiModule(r *http.Request, tenant, device string) (uuid.UUID, error) {
	id, err := uuid.Parse(r.PathValue("moduleId"))
	if err != nil {
		return id, fleet.FieldErrors(map[string]string{"moduleId": "must be a firmware id (a UUID), as deploymentBase links to it"})
	}
	if ddiGateway(r) {
		return id, nil
	}
	const limit = 100 // the device's latest update_firmware actions
	das, _, err := s.Actions.FindDeviceActions(r.Context(), tenant, fleet.DeviceActionFilter{
		DeviceID: device, Type: fleet.ActionUpdateFirmware, SortBy: "action_id", Page: fleet.Page{Page: 1, Limit: limit}})
	if err != nil {
		return id, err
	}
	looked := map[string]bool{}
	for _, da := range das {
		if !da.ActionStatus.Sent() || looked[da.Params] {
			continue
		}
		looked[da.Params] = true
		b, err := s.ddiBundleOf(r, tenant, da)
		if fleet.ErrorCode(err) == fleet.ENOTFOUND {
			continue
		} else if err != nil {
			return id, err
		}
		for _, fw := range b.Firmwares {
			if fw.ID == id {
				return id, nil
			}
		}
	}
	return id, fleet.Errorf(fleet.ENOTFOUND, "no update_firmware action of device %s installs firmware %s", device, id)
}

// ddiGateway reports whether the request authenticated with a gateway
// token (ddiDevice checked it), which speaks for every device.
func ddiGateway(r *http.Request) bool {
	scheme, _, _ := strings.Cut(r.Header.Get("Authorization"), " ")
	return strings.EqualFold(scheme, "GatewayToken")
}

// ddiCancelOf is the cancel_action sent to the device that stops the
// action the path's id names. hawkBit cancels an action in place, so a
// cancelAction resource, its id and its feedback are named by the action
// stopped; fleetd's cancel_action has an id of its own (docs/actions.md),
// found here among the device's latest cancel_actions.
func (s *Server) ddiCancelOf(r *http.Request, tenant, device string) (*fleet.DeviceAction, error) {
	stop, ok := fleet.ParseActionID(r.PathValue("actionId"))
	if !ok {
		return nil, fleet.FieldErrors(map[string]string{"actionId": fleet.ActionIDRule})
	}
	const pages, limit = 10, 100 // the device's 1,000 latest cancel_actions
	for page := 1; page <= pages; page++ {
		das, _, err := s.Actions.FindDeviceActions(r.Context(), tenant, fleet.DeviceActionFilter{
			DeviceID: device, Type: fleet.ActionCancel, SortBy: "action_id", Page: fleet.Page{Page: page, Limit: limit}})
		if err != nil {
			return nil, err
		}
		for _, da := range das {
			if id, _ := fleet.CancelledActionID([]byte(da.Params)); id == stop && da.ActionStatus.Sent() {
				return da, nil
			}
		}
		if len(das) < limit {
			break
		}
	}
	return nil, fleet.Errorf(fleet.ENOTFOUND, "device %s has no cancellation of action %d", device, stop)
}

// handleDDICancel is cancelAction/{actionId}: the cancellation of action
// actionId, which is both its id and its stopId, as upstream guarantees.
func (s *Server) handleDDICancel(w http.ResponseWriter, r *http.Request) error {
	tenant, device, err := s.ddiDevice(w, r)
	if err != nil {
		return err
	}
	da, err := s.ddiCancelOf(r, tenant, device)
	if err != nil {
		return err
	}
	if da.ActionStatus == fleet.StatusQueued {
		s.Delivery.ActionDelivered(tenant, device, da.ActionID)
	}
	stop := r.PathValue("actionId")
	return ddiJSON(w, ddiCancel{ID: stop, CancelAction: ddiCancelAction{StopID: stop}})
}

// The values DDI allows in feedback.
var (
	ddiExecutions = []string{"closed", "proceeding", "canceled", "scheduled", "rejected", "resumed", "downloaded", "download"}
	ddiFinished   = []string{"success", "failure", "none"}
)

// readFeedback reads a feedback body into a status report for the device
// action: closed with success (or none) is Completed, closed with failure
// Failed with the details as its errors, canceled Completed for a
// cancel_action (the device stopped) and Failed for a deployment (the
// device gave up), rejected Failed for a cancel_action (the device goes
// on with the action); any other execution is a state word of progress, with
// cnt/of as the percentage and its details that start with ERROR as its
// errors.
func (s *Server) readFeedback(w http.ResponseWriter, r *http.Request, da *fleet.DeviceAction) (fleet.StatusReport, error) {
	v, err := s.decode(w, r, s.Limits.Body, ordinaryElements)
	if err != nil {
		return fleet.StatusReport{}, err
	}
	f := fleet.NewFields(v)
	ddiIgnored(f)
	st := f.Nested("status", true)
	rep := fleet.StatusReport{DeviceID: da.DeviceID, ActionID: da.ActionID}
	if st != nil {
		exec := st.String("execution", true)
		if st.Has("execution") && !oneOf(exec, ddiExecutions) {
			st.Fail("execution", "must be one of "+strings.Join(ddiExecutions, ", "))
		}
		var finished string
		var progress *int
		if res := st.Nested("result", false); res != nil {
			finished = res.String("finished", false)
			if res.Has("finished") && !oneOf(finished, ddiFinished) {
				res.Fail("finished", "must be one of "+strings.Join(ddiFinished, ", "))
			}
			if p := res.Nested("progress", false); p != nil {
				cnt, of := p.Int("cnt", false, 0, 1<<31), p.Int("of", false, 0, 1<<31)
				if of > 0 {
					pc := int(min(100, cnt*100/of))
					progress = &pc
				}
			}
		}
		details := st.Strings("details", false)
		if len(details) > fleet.MaxReportErrors {
			details = details[:fleet.MaxReportErrors]
		}
		switch {
		case exec == "rejected" && da.Type == fleet.ActionCancel:
			// The device goes on with the action (docs/actions.md, Cancel).
			rep.State = string(fleet.StatusFailed)
			rep.Errors = append([]string{"the device rejected the cancellation"}, details...)
		case exec == "closed" && finished == "failure", exec == "canceled" && da.Type == fleet.ActionUpdateFirmware:
			rep.State = string(fleet.StatusFailed)
			rep.Errors = details
			if len(rep.Errors) == 0 {
				rep.Errors = []string{"the device reported " + exec + " with " + finished}
			}
		case exec == "closed", exec == "canceled":
			rep.State = string(fleet.StatusCompleted)
			hundred := 100
			rep.Progress = &hundred
		default:
			rep.State, rep.Progress = exec, progress
			// Clients log to the server with progress feedback, and
			// SWUpdate and rauc-hawkbit-updater start their errors with
			// ERROR: those are the report's errors (an installation's
			// cause of failure is often there, not in the final word).
			for _, d := range details {
				if strings.HasPrefix(strings.ToUpper(strings.TrimSpace(d)), "ERROR") {
					rep.Errors = append(rep.Errors, d)
				}
			}
		}
	}
	if err := f.Err(); err != nil {
		return fleet.StatusReport{}, err
	}
	return rep, nil
}

func (ddiFeedback) openBody()             {}
func (ddiConfigData) openBody()           {}
func (ddiConfirmationFeedback) openBody() {}
func (ddiActivateAutoConfirm) openBody()  {}

// ddiIgnored lets pass the fields of a feedback or configData body fleetd
// does not read, as hawkBit does: the id the path names already, the
// device's clock (time in DDI 1.0's local "20140511T121314", timestamp in
// later versions), which is not fleetd's to order reports by, and whatever
// a newer client adds.
func ddiIgnored(f *fleet.Fields) { f.IgnoreUnknown() }

func oneOf(v string, allowed []string) bool {
	for _, a := range allowed {
		if v == a {
			return true
		}
	}
	return false
}

// ddiFeedback handles the feedback of a deployment or a cancellation.
func (s *Server) ddiFeedback(typ string) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		tenant, device, err := s.ddiDevice(w, r)
		if err != nil {
			return err
		}
		var da *fleet.DeviceAction
		if typ == fleet.ActionCancel {
			da, err = s.ddiCancelOf(r, tenant, device)
		} else {
			da, err = s.ddiAction(r, tenant, device, typ)
		}
		if err != nil {
			return err
		}
		if typ == fleet.ActionUpdateFirmware {
			if err := s.ddiNotAwaiting(r, tenant, da); err != nil {
				return err
			}
		}
		if da.ActionStatus.Final() {
			// As upstream: the device stops reporting on it.
			return fleet.Errorf(fleet.EGONE, "action %d is finished on device %s (%s); it takes no more feedback", da.ActionID, device, da.ActionStatus)
		}
		rep, err := s.readFeedback(w, r, da)
		if err != nil {
			return err
		}
		errs, err := s.Actions.ReportStatus(r.Context(), tenant, []fleet.StatusReport{rep})
		if err != nil {
			return err
		}
		if errs[0] != nil {
			return errs[0]
		}
		w.WriteHeader(http.StatusOK)
		return nil
	}
}

// handleDDIConfigData stores what the device says of itself (its
// "attributes") in its metadata: merged (the default), replacing it, or
// removing the keys named.
func (s *Server) handleDDIConfigData(w http.ResponseWriter, r *http.Request) error {
	tenant, device, err := s.ddiDevice(w, r)
	if err != nil {
		return err
	}
	v, err := s.decode(w, r, s.Limits.Body, ordinaryElements)
	if err != nil {
		return err
	}
	f := fleet.NewFields(v)
	ddiIgnored(f) // SWUpdate sends a status beside its data
	data := f.StringMap("data", true)
	mode := f.String("mode", false)
	if mode == "" {
		mode = "merge"
	}
	if mode != "merge" && mode != "replace" && mode != "remove" {
		f.Fail("mode", "must be merge, replace or remove")
	}
	if err := f.Err(); err != nil {
		return err
	}
	patch := map[string]*string{}
	if mode == "replace" {
		d, err := s.Devices.FindDevice(r.Context(), tenant, device)
		if err != nil {
			return err
		}
		for k := range d.Metadata {
			patch[k] = nil
		}
	}
	for k, v := range data {
		if mode == "remove" {
			patch[k] = nil
		} else {
			patch[k] = &v
		}
	}
	if problem := fleet.ValidateMetadata(data); problem != "" {
		return fleet.FieldErrors(map[string]string{"data": problem})
	}
	if _, err := s.Devices.UpdateDeviceMetadata(r.Context(), tenant, device, patch); err != nil {
		return err
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

// handleDDIArtifact downloads a component's file, with Range and ETag, or
// its MD5SUM line (the file name with .MD5SUM appended).
func (s *Server) handleDDIArtifact(w http.ResponseWriter, r *http.Request) error {
	_, _, fw, art, err := s.ddiOpenModule(w, r)
	if err != nil {
		return err
	}
	defer art.Close()
	file, name := path.Base(fw.FileName), r.PathValue("fileName")
	// hawkBit's ETag is the SHA-1 its deployment advertises; fleetd's is
	// the SHA-256 (the checksum). A client's If-Match may name either.
	if m := strings.Trim(r.Header.Get("If-Match"), `"`); m != "" && strings.EqualFold(m, fw.SHA1) {
		r.Header.Set("If-Match", `"`+fw.Checksum+`"`)
	}
	if ra, ok := art.(fleet.RedirectArtifact); ok && name == file {
		http.Redirect(w, r, ra.RedirectURL(), http.StatusTemporaryRedirect)
		return nil
	}
	if name == file+".MD5SUM" {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintf(w, "%s  %s\n", fw.MD5, file)
		return nil
	}
	if name != file {
		return fleet.Errorf(fleet.ENOTFOUND, "component %s %s has no file %s (its file is %s)", fw.ComponentName, fw.VersionNumber, name, file)
	}
	h := w.Header()
	h.Set("ETag", `"`+fw.Checksum+`"`)
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": file}))
	h.Set("Cache-Control", "private, no-cache")
	http.ServeContent(&rangeErrorWriter{ResponseWriter: w, s: s, r: r, size: fw.ContentLength}, r, "", time.Time{}, art)
	return nil
}

// Confirmation (docs/hawkbit.md): in a tenant that requires it, an
// update_firmware Queued for a DDI device waits for the device's
// confirmation before deploymentBase offers it. The root links to
// confirmationBase/{actionId} instead, and the device confirms or denies
// it with feedback there (fleet.EventConfirmed, fleet.EventDenied), or
// confirms all its updates by activating autoConfirm.

// ddiAwaits reports whether the device's update_firmware action id waits
// for its confirmation.
func (s *Server) ddiAwaits(r *http.Request, tenant, device string, id int64) (bool, error) {
	set, err := s.DDI.DDISettings(r.Context(), tenant)
	if err != nil || !set.RequireConfirmation {
		return false, err
	}
	da, err := s.Actions.FindDeviceAction(r.Context(), tenant, id, device)
	if err != nil {
		return false, err
	}
	return s.ddiAwaitsAction(r, tenant, da, set)
}

// ddiAwaitsAction reports whether da waits for its device's confirmation:
// the tenant requires one (set), da is Queued and not confirmed, and the
// device's automatic confirmation is off. A denied update waits still.
func (s *Server) ddiAwaitsAction(r *http.Request, tenant string, da *fleet.DeviceAction, set fleet.DDISettings) (bool, error) {
	if !set.RequireConfirmation || da.ActionStatus != fleet.StatusQueued || da.Status == fleet.StateConfirmed {
		return false, nil
	}
	auto, err := s.DDI.AutoConfirm(r.Context(), tenant, da.DeviceID)
	return !auto.Active, err
}

// ddiNotAwaiting is a 404 for the deployment of an update that waits for
// its device's confirmation, as upstream answers, naming where to confirm.
func (s *Server) ddiNotAwaiting(r *http.Request, tenant string, da *fleet.DeviceAction) error {
	if da.ActionStatus != fleet.StatusQueued {
		return nil
	}
	set, err := s.DDI.DDISettings(r.Context(), tenant)
	if err != nil {
		return err
	}
	if wait, err := s.ddiAwaitsAction(r, tenant, da, set); err != nil || !wait {
		return err
	}
	return fleet.Errorf(fleet.ENOTFOUND, "action %d waits for device %s to confirm it at confirmationBase/%d", da.ActionID, da.DeviceID, da.ActionID)
}

// handleDDIConfirmationBase is confirmationBase: the device's automatic
// confirmation, the link to switch it, and the link to the update that
// waits for its confirmation, if one does.
func (s *Server) handleDDIConfirmationBase(w http.ResponseWriter, r *http.Request) error {
	tenant, device, err := s.ddiDevice(w, r)
	if err != nil {
		return err
	}
	auto, err := s.DDI.AutoConfirm(r.Context(), tenant, device)
	if err != nil {
		return err
	}
	base := ddiConfirmationBase{AutoConfirm: ddiAutoConfirmState{Active: auto.Active, Initiator: auto.Initiator, Remark: auto.Remark}, Links: ddiLinks{}}
	if auto.Active {
		at := auto.ActivatedAt.UnixMilli()
		base.AutoConfirm.ActivatedAt = &at
		base.Links["deactivateAutoConfirm"] = ddiLink{ddiURL(r, tenant, device, "confirmationBase", "deactivateAutoConfirm")}
	} else {
		base.Links["activateAutoConfirm"] = ddiLink{ddiURL(r, tenant, device, "confirmationBase", "activateAutoConfirm")}
	}
	name, id, err := s.ddiOpenAction(r, tenant, device)
	if err != nil {
		return err
	}
	if name == fleet.ActionUpdateFirmware {
		if wait, err := s.ddiAwaits(r, tenant, device, id); err != nil {
			return err
		} else if wait {
			base.Links["confirmationBase"] = ddiLink{ddiURL(r, tenant, device, "confirmationBase", strconv.FormatInt(id, 10))}
		}
	}
	return ddiJSON(w, base)
}

// ddiAwaiting reads the path's update_firmware action of the device,
// which must wait for the device's confirmation: 410 once it is finished,
// 404 when it does not wait (any more).
func (s *Server) ddiAwaiting(r *http.Request, tenant, device string) (*fleet.DeviceAction, error) {
	da, err := s.ddiAction(r, tenant, device, fleet.ActionUpdateFirmware)
	if err != nil {
		return nil, err
	}
	if da.ActionStatus.Final() {
		return nil, fleet.Errorf(fleet.EGONE, "action %d is finished on device %s (%s); it takes no confirmation", da.ActionID, device, da.ActionStatus)
	}
	set, err := s.DDI.DDISettings(r.Context(), tenant)
	if err != nil {
		return nil, err
	}
	wait, err := s.ddiAwaitsAction(r, tenant, da, set)
	switch {
	case err != nil:
		return nil, err
	case !set.RequireConfirmation:
		return nil, fleet.Errorf(fleet.ENOTFOUND, "action %d does not wait for a confirmation: tenant %s does not require one; follow deploymentBase/%d", da.ActionID, tenant, da.ActionID)
	case !wait:
		return nil, fleet.Errorf(fleet.ENOTFOUND, "action %d does not wait for a confirmation: it is %s (%s) on device %s; follow deploymentBase/%d", da.ActionID, da.ActionStatus, da.Status, device, da.ActionID)
	}
	return da, nil
}

// handleDDIConfirmationAction is confirmationBase/{actionId}: the update
// the device is asked to confirm, as its deployment.
func (s *Server) handleDDIConfirmationAction(w http.ResponseWriter, r *http.Request) error {
	tenant, device, err := s.ddiDevice(w, r)
	if err != nil {
		return err
	}
	history, err := ddiHistoryCount(r)
	if err != nil {
		return err
	}
	da, err := s.ddiAwaiting(r, tenant, device)
	if err != nil {
		return err
	}
	dep, err := s.ddiDeploymentOf(r, tenant, da)
	if err != nil {
		return err
	}
	h := ddiHistoryOf(da, history)
	if h != nil {
		h.Status = "WAIT_FOR_CONFIRMATION"
	}
	return ddiJSON(w, ddiConfirmationBaseAction{ID: strconv.FormatInt(da.ActionID, 10), Confirmation: dep, ActionHistory: h})
}

// handleDDIConfirmationFeedback is the device's answer: confirmed hands
// the update over at the next poll, denied keeps it waiting.
func (s *Server) handleDDIConfirmationFeedback(w http.ResponseWriter, r *http.Request) error {
	tenant, device, err := s.ddiDevice(w, r)
	if err != nil {
		return err
	}
	v, err := s.decode(w, r, s.Limits.Body, ordinaryElements)
	if err != nil {
		return err
	}
	f := fleet.NewFields(v)
	ddiIgnored(f)
	answer := f.String("confirmation", true)
	if f.Has("confirmation") && answer != "confirmed" && answer != "denied" {
		f.Fail("confirmation", "must be confirmed or denied")
	}
	code := f.Int("code", false, -1<<31, 1<<31)
	details := f.Strings("details", false)
	if err := f.Err(); err != nil {
		return err
	}
	da, err := s.ddiAwaiting(r, tenant, device)
	if err != nil {
		return err
	}
	if err := s.DDI.ConfirmDeviceAction(r.Context(), tenant, device, da.ActionID, answer == "confirmed"); err != nil {
		return err
	}
	if len(details) > fleet.MaxReportErrors {
		details = details[:fleet.MaxReportErrors]
	}
	s.Logger.Info("ddi confirmation", "tenant", tenant, "device", device, "action_id", da.ActionID, "confirmation", answer, "code", code, "details", details)
	w.WriteHeader(http.StatusOK)
	return nil
}

// ddiAutoConfirm switches the device's automatic confirmation on
// (activateAutoConfirm, with an optional initiator and remark) or off
// (deactivateAutoConfirm).
func (s *Server) ddiAutoConfirm(active bool) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		tenant, device, err := s.ddiDevice(w, r)
		if err != nil {
			return err
		}
		a := fleet.AutoConfirm{Active: active}
		if active && (r.ContentLength != 0 || r.Header.Get("Content-Type") != "") { // a body, if only an empty one
			v, err := s.decode(w, r, s.Limits.Body, ordinaryElements)
			if err != nil {
				return err
			}
			f := fleet.NewFields(v)
			ddiIgnored(f)
			a.Initiator, a.Remark = ddiText(f, "initiator"), ddiText(f, "remark")
			if err := f.Err(); err != nil {
				return err
			}
		}
		if err := s.DDI.SetAutoConfirm(r.Context(), tenant, device, a); err != nil {
			return err
		}
		s.Logger.Info("ddi automatic confirmation", "tenant", tenant, "device", device, "active", active,
			"initiator", a.Initiator, "remark", a.Remark, "by_gateway", ddiGateway(r))
		w.WriteHeader(http.StatusOK)
		return nil
	}
}

// ddiText reads an optional text field of at most fleet.MaxAutoConfirmText
// characters; null is none, as upstream allows.
func ddiText(f *fleet.Fields, field string) string {
	if v, _ := f.Value(field, false); v == nil {
		return ""
	}
	t := f.String(field, false)
	switch {
	case !fleet.PlainText(t):
		f.Fail(field, fleet.PlainTextRule)
	case len([]rune(t)) > fleet.MaxAutoConfirmText:
		f.Fail(field, fmt.Sprintf("must be at most %d characters", fleet.MaxAutoConfirmText))
	}
	return t
}
