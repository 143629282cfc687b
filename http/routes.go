package fleethttp

import (
	"net/http"

	"github.com/fleetd/fleet"
)

// route is one endpoint: its pattern, the permission it needs, its handler
// and what the OpenAPI document says of it.
type route struct {
	pattern string
	perm    fleet.Permission
	handler handlerFunc
	op      op
}

// addRoutes lists the whole API. The OpenAPI document is generated from
// this table, so an endpoint cannot exist without being described.
func (s *Server) addRoutes() []route {
	getDDI, setDDI := s.ddiSettingsHandlers()
	getShadow, setShadow := s.shadowSettingsHandlers()
	getRemote, setRemote := s.remoteSettingsHandlers()
	return []route{
		{"GET /healthz", public, s.handleHealth, op{Tag: "operations", Summary: "Liveness: the process answers", Resp: statusBody{}}},
		{"GET /readyz", public, s.handleReady, op{Tag: "operations", Summary: "Readiness: the database (and broker) answer", Resp: statusBody{}}},
		{"GET /metrics", public, s.handleMetrics, op{Tag: "operations", Summary: "Prometheus metrics", Raw: "text/plain"}},
		{"GET /api/v1/openapi.json", public, s.handleOpenAPI, op{Tag: "operations", Summary: "This document", Raw: "application/json"}},

		{"POST /api/v1/devices", fleet.PermOperate, s.handleCreateDevice, op{Tag: "devices", Summary: "Provision a device", Body: deviceCreate{}, OK: http.StatusCreated, Resp: createdDevice{}}},
		{"POST /api/v1/devices/bulk", fleet.PermOperate, s.handleCreateDevices, op{Tag: "devices", Summary: "Provision up to 100,000 devices in one transaction", Body: bulkCreate{}, OK: http.StatusCreated, Resp: bulkCreated{}}},
		{"GET /api/v1/devices", fleet.PermRead, s.handleListDevices, op{Tag: "devices", Summary: "List devices", Query: append([]param{
			{Name: "search", Desc: "case-insensitive substring of the id or of any metadata value"},
			{Name: "metadata.{key}", Desc: "metadata value under key must equal this; repeatable with other keys"},
			{Name: "shadow", Desc: "in_sync: devices whose shadow's delta is empty (or that have none); out_of_sync: the others", Enum: []string{fleet.ShadowInSync, fleet.ShadowOutOfSync}},
			{Name: "group", Desc: "only the devices of this group now (404 when there is no such group)"},
		}, pageParams...), Resp: deviceList{}}},
		{"GET /api/v1/devices/{id}", fleet.PermRead, s.handleGetDevice, op{Tag: "devices", Summary: "Read a device", Resp: fleet.Device{}}},
		{"PATCH /api/v1/devices/{id}", fleet.PermOperate, s.handlePatchDevice, op{Tag: "devices", Summary: "Merge into a device's metadata (null deletes a key)", Body: devicePatch{}, OK: http.StatusNoContent, Resp: fleet.Device{}}},
		{"DELETE /api/v1/devices/{id}", fleet.PermOperate, s.handleDeleteDevice, op{Tag: "devices", Summary: "Delete a device and its records", OK: http.StatusNoContent}},
		{"POST /api/v1/devices/{id}/token", fleet.PermOperate, s.handleRotateToken, op{Tag: "devices", Summary: "Give a device a new token; the old one stops working", OK: http.StatusCreated, Resp: tokenBody{}}},

		{"PATCH /api/v1/shadows", fleet.PermOperate, s.handleFleetDesired, op{Tag: "devices",
			Summary: "Merge one patch into the desired state of every device a selection chooses (as a dispatch chooses its targets), at most 10,000, in one transaction; each change audited with the previous state. With a schedule, roll it out in phases as a desired_state action instead",
			Body:    fleetDesiredBody{}, Resp: fleet.FleetDesired{}}},
		{"GET /api/v1/devices/{id}/shadow", fleet.PermRead, s.handleGetShadow, op{Tag: "devices",
			Summary: "A device's shadow: the desired state, the reported state, and the delta (the desired keys whose values the reported state does not have, computed at each read)",
			Resp:    fleet.Shadow{}}},
		{"PATCH /api/v1/devices/{id}/shadow", fleet.PermOperate, s.handlePatchShadow, op{Tag: "devices",
			Summary: "Merge a patch into a device's desired state (RFC 7386); with a version, 409 unless the shadow is at it. Answers the shadow; a patch that changes nothing keeps the version",
			Body:    shadowPatch{}, Resp: fleet.Shadow{}}},
		{"POST /api/v1/devices/{id}/certificate", fleet.PermOperate, s.handleIssueCertificate, op{Tag: "devices",
			Summary: "Issue the device a client certificate for MQTT over TLS (mutual TLS, as the uplink agent connects: no username or password); its previous certificate stops working. The private key is shown this once",
			OK:      http.StatusCreated, Resp: fleet.DeviceCredentials{}}},
		{"POST /api/v1/devices/{id}/uplink-config", fleet.PermOperate, s.handleUplinkConfig, op{Tag: "devices",
			Summary: "Issue the device a client certificate as above, inside a complete uplink agent device file (uplink -a): project_id (the tenant), device_id, broker, port, authentication",
			OK:      http.StatusCreated, Resp: fleet.UplinkConfig{}}},

		{"POST /api/v1/devices/{id}/remote-sessions", fleet.PermRemote, s.handleCreateRemoteSession, op{Tag: "remote",
			Summary: "Open a remote session with the device through fleetd-agent: shell (target: a command, or none for a terminal), forward (target: a TCP port on the device), get or put (target: a path on the device). The device is asked with a remote_session action; then the operator and the device each connect a leg, GET /api/v1/remote-sessions/{id}/operator and /device with an Upgrade to fleetd-stream/1 (fleetctl, fleetd-agent) or to a WebSocket (the console, older clients) (docs/agent.md, The session's messages)",
			Body:    remoteCreate{}, OK: http.StatusCreated, Resp: fleet.RemoteSession{}}},
		{"GET /api/v1/devices/{id}/remote-sessions", fleet.PermRead, s.handleListRemoteSessions, op{Tag: "remote",
			Summary: "A device's remote sessions, newest first: who, what, when, bytes each way and why each ended",
			Query:   append([]param{openParam}, pageParams...), Resp: remoteSessionList{}}},
		{"GET /api/v1/remote-sessions", fleet.PermRead, s.handleListRemoteSessions, op{Tag: "remote",
			Summary: "The tenant's remote sessions, newest first, as a device's list answers them; device_id narrows it to one device",
			Query:   append([]param{{Name: "device_id", Desc: "only the sessions of this device"}, openParam}, pageParams...), Resp: remoteSessionList{}}},
		{"POST /api/v1/devices/{id}/remote-sessions/{sid}/end", fleet.PermRemote, s.handleEndRemoteSession, op{Tag: "remote",
			Summary: "End an open remote session, whichever replica relays it (audited, remote.session.stop): that replica tells the operator who ended it and records the end; one whose replica was lost (no heartbeat for --remote-replica-timeout) is ended at once, audited as remote.session.end. 202 with the session as it was; 409 once it has ended",
			Query:   []param{{Name: "sid", In: "path", Desc: "the session's id"}}, OK: http.StatusAccepted, Resp: fleet.RemoteSession{}}},
		{"GET /api/v1/devices/{id}/remote-sessions/{sid}/recording", fleet.PermRemote, s.handleRemoteRecording, op{Tag: "remote",
			Summary: "The output of a recorded shell session, an asciicast v2 file, once the session has ended (a tenant records its shell sessions with PUT /api/v1/tenants/{tenant_id}/remote-settings). What a terminal showed may hold secrets: the remote permission, as to open a session",
			Query:   []param{{Name: "sid", In: "path", Desc: "the session's id"}}, Raw: "application/x-asciicast"}},

		{"POST /api/v1/groups", fleet.PermOperate, s.handleCreateGroup, op{Tag: "groups",
			Summary: "Save a group: a selector over metadata and reported state whose devices are chosen at each read (a malformed selector is 400 naming the position)",
			Body:    groupCreate{}, OK: http.StatusCreated, Resp: fleet.Group{}}},
		{"GET /api/v1/groups", fleet.PermRead, s.handleListGroups, op{Tag: "groups", Summary: "List groups by name, each with the number of its devices now", Query: pageParams, Resp: groupList{}}},
		{"GET /api/v1/groups/{name}", fleet.PermRead, s.handleGetGroup, op{Tag: "groups", Summary: "Read a group, with the number of its devices now", Resp: fleet.Group{}}},
		{"PUT /api/v1/groups/{name}", fleet.PermOperate, s.handleUpdateGroup, op{Tag: "groups", Summary: "Replace a group's selector and description",
			Body: groupUpdate{}, OK: http.StatusNoContent, Resp: fleet.Group{}}},
		{"DELETE /api/v1/groups/{name}", fleet.PermOperate, s.handleDeleteGroup, op{Tag: "groups", Summary: "Delete a group (its devices are untouched)", OK: http.StatusNoContent}},
		{"GET /api/v1/groups/{name}/devices", fleet.PermRead, s.handleListGroupDevices, op{Tag: "groups", Summary: "The devices the group's selector chooses now, by id", Query: pageParams, Resp: deviceList{}}},

		{"POST /mock/api/v1/actions", fleet.PermOperate, s.handleMockDispatch, op{Tag: "actions",
			Summary: "S1: dispatch an action; the answer is empty, with the action's Location",
			Body:    dispatchBody{}, OK: http.StatusCreated, Resp: fleet.Action{}, Quiet: true}},
		{"POST /api/v1/actions", fleet.PermOperate, s.handleDispatch, op{Tag: "actions",
			Summary: "Dispatch an action to the devices it selects, atomically; connected devices receive it at once, the others when they next subscribe. With a schedule, a rollout: the targets are released phase by phase",
			Body:    rolloutDispatchBody{}, OK: http.StatusCreated, Resp: dispatched{}}},
		{"GET /api/v1/actions", fleet.PermRead, s.handleListActions, op{Tag: "actions", Summary: "List actions, newest first, with their device actions counted per status",
			Query: append([]param{
				{Name: "action", Desc: "only actions of this name"},
				{Name: "incomplete", Desc: "true: only actions with device actions not final (Scheduled, Queued, Initiated or Progress)", Enum: []string{"true", "false"}},
			}, pageParams...), Resp: actionList{}}},
		{"GET /api/v1/actions/{id}", fleet.PermRead, s.handleGetAction, op{Tag: "actions", Summary: "Read an action, with its device actions counted per status",
			Query: []param{actionIDParam}, Resp: fleet.Action{}}},
		{"GET /api/v1/actions/{id}/devices", fleet.PermRead, s.handleListActionDevices, op{Tag: "actions", Summary: "An action's device actions, by device id",
			Query: append([]param{actionIDParam}, actionStatusQuery...), Resp: deviceActionList{}}},
		{"POST /api/v1/actions/{id}/cancel", fleet.PermOperate, s.handleCancelAction, op{Tag: "actions",
			Summary: "Cancel every device action not yet final; devices that have the action are sent a cancel_action. Cancelling a finished action changes nothing",
			Query:   []param{actionIDParam}, OK: http.StatusNoContent, Resp: fleet.Action{}}},
		{"POST /api/v1/actions/{id}/retry", fleet.PermOperate, s.handleRetryAction, op{Tag: "actions",
			Summary: "Dispatch the action again, its params and timeout, to its devices whose device actions ended in the statuses given (Failed by default); the new action shows retry_of. 409 when the action has device actions not final, or none in those statuses",
			Query:   []param{actionIDParam}, Body: retryBody{}, BodyOptional: true, OK: http.StatusCreated, Resp: dispatched{}}},
		{"POST /api/v1/actions/{id}/pause", fleet.PermOperate, s.rolloutOperation(fleet.RolloutService.PauseRollout), op{Tag: "rollouts",
			Summary: "Pause a scheduled or running rollout: nothing more is released until it is resumed (409 otherwise)",
			Query:   []param{actionIDParam}, OK: http.StatusNoContent, Resp: fleet.Action{}}},
		{"POST /api/v1/actions/{id}/resume", fleet.PermOperate, s.rolloutOperation(fleet.RolloutService.ResumeRollout), op{Tag: "rollouts",
			Summary: "Resume a paused rollout; the gate that paused it is waived for the phase it held back (409 unless paused)",
			Query:   []param{actionIDParam}, OK: http.StatusNoContent, Resp: fleet.Action{}}},
		{"POST /api/v1/actions/{id}/abort", fleet.PermOperate, s.rolloutOperation(fleet.RolloutService.AbortRollout), op{Tag: "rollouts",
			Summary: "Abort a rollout: cancel every device action not final (devices that have it are sent a cancel_action) and release nothing more (409 once completed or aborted)",
			Query:   []param{actionIDParam}, OK: http.StatusNoContent, Resp: fleet.Action{}}},
		{"POST /api/v1/actions/{id}/trigger_next_phase", fleet.PermOperate, s.rolloutOperation(fleet.RolloutService.TriggerNextPhase), op{Tag: "rollouts",
			Summary: "Release the next phase now, whatever its trigger, if its gate holds; a gate that does not hold pauses the rollout (409 with the reason, as when the rollout is paused, ended or has no phase left)",
			Query:   []param{actionIDParam}, OK: http.StatusNoContent, Resp: fleet.Action{}}},
		{"POST /api/v1/actions/{id}/append_phase", fleet.PermOperate, s.handleAppendPhase, op{Tag: "rollouts",
			Summary: "Add a fixed_list phase to a rollout: its devices, not targets yet, become targets released when it triggers (409 once completed, aborted or ended)",
			Query:   []param{actionIDParam}, Body: fleet.Phase{}, OK: http.StatusNoContent, Resp: fleet.Action{}}},
		{"POST /api/v1/rollout-notification-rules", fleet.PermOperate, s.handleCreateRolloutRule, op{Tag: "rollouts",
			Summary: "Send the tenant's rollouts' changes of state (phase triggered, paused with its reason, resumed, completed, aborted) to a webhook, Slack or email",
			Body:    rolloutRuleCreate{}, OK: http.StatusCreated, Resp: fleet.RolloutNotificationRule{}}},
		{"GET /api/v1/rollout-notification-rules", fleet.PermRead, s.handleListRolloutRules, op{Tag: "rollouts",
			Summary: "List the rollout notification rules, oldest first; secrets are never shown", Query: pageParams, Resp: rolloutRuleList{}}},
		{"GET /api/v1/rollout-notification-rules/{id}", fleet.PermRead, s.handleGetRolloutRule, op{Tag: "rollouts",
			Summary: "Read a rollout notification rule", Query: uuidPathParams("id"), Resp: fleet.RolloutNotificationRule{}}},
		{"PUT /api/v1/rollout-notification-rules/{id}", fleet.PermOperate, s.handleUpdateRolloutRule, op{Tag: "rollouts",
			Summary: "Update channel_parameters, notification_template, timezone or events of a rollout notification rule",
			Query:   uuidPathParams("id"), Body: rolloutRuleUpdate{}, OK: http.StatusNoContent, Resp: fleet.RolloutNotificationRule{}}},
		{"DELETE /api/v1/rollout-notification-rules/{id}", fleet.PermOperate, s.handleDeleteRolloutRule, op{Tag: "rollouts",
			Summary: "Delete a rollout notification rule and its pending notifications", Query: uuidPathParams("id"), OK: http.StatusNoContent}},
		{"GET /api/v1/devices/{device_id}/actions", fleet.PermRead, s.handleDeviceActions, op{Tag: "actions", Summary: "S7: a device's actions",
			Query: append([]param{
				{Name: "sort_by", Desc: "sort field (errors: by the number of error messages); ties are broken by action_id", Enum: fleet.DeviceActionSorts},
				{Name: "sort_order", Desc: "desc (default) or asc", Enum: []string{"asc", "desc"}},
				{Name: "type", Desc: "only actions of this name"},
			}, actionStatusQuery...), Resp: deviceActionList{}}},
		{"POST /api/v1/devices/action/status", fleet.PermDeviceData, s.handleActionStatus, op{Tag: "actions",
			Summary: "S10: a device's status report on one action; answered once committed. Older, repeated and after-final reports are acknowledged and ignored",
			Body:    statusReportBody{}, OK: http.StatusNoContent, Resp: fleet.DeviceAction{}}},

		{"POST /api/v1/firmware-bundles", fleet.PermOperate, s.handleCreateBundle, op{Tag: "firmware", Summary: "Upload a bundle archive (multipart/form-data, part file; streamed, parsed and completed at once) or make a pending record to upload to (a JSON-like body)", Body: bundleCreate{}, Upload: true, OK: http.StatusCreated, Resp: fleet.Bundle{},
			AlsoOK: map[int]string{http.StatusOK: "The archive is byte for byte that of the bundle of its version, which exists already: that bundle (a different archive of the version is a 409)"}}},
		{"GET /api/v1/firmware-bundles", fleet.PermRead, s.handleListBundles, op{Tag: "firmware", Summary: "List firmware bundles, newest first", Query: append([]param{
			{Name: "upload_status", Desc: "only bundles in this upload state", Enum: []string{fleet.UploadPending, fleet.UploadCompleted, fleet.UploadFailed}},
		}, pageParams...), Resp: bundleList{}}},
		{"GET /api/v1/firmware-bundles/id/{id}", fleet.PermRead, s.handleGetBundle, op{Tag: "firmware", Summary: "Read a firmware bundle", Query: []param{{Name: "id", In: "path", Format: "uuid"}}, Resp: fleet.Bundle{}}},
		{"PUT /api/v1/firmware-bundles/id/{id}", fleet.PermOperate, s.handleDeclareBundle, op{Tag: "firmware", Summary: "S5: declare the uploaded archive's sizes and checksum; the server compares them with the archive (a mismatch fails the bundle: 409)", Query: []param{{Name: "id", In: "path", Format: "uuid"}}, Body: declaration{}, OK: http.StatusNoContent, Resp: fleet.Bundle{}}},
		{"DELETE /api/v1/firmware-bundles/id/{id}", fleet.PermOperate, s.handleDeleteBundle, op{Tag: "firmware", Summary: "Delete a firmware bundle and its archive; its component versions stay", Query: []param{{Name: "id", In: "path", Format: "uuid"}}, OK: http.StatusNoContent}},
		{"PUT /api/v1/firmware-bundles/id/{id}/file", fleet.PermOperate, s.handleUploadBundleFile, op{Tag: "firmware", Summary: "Upload the archive of a pending bundle (application/octet-stream, or multipart part file); streamed and parsed. The same bytes again to a completed bundle answer 200 with it; others are a 409", Query: []param{{Name: "id", In: "path", Format: "uuid"}}, Upload: true, Resp: fleet.Bundle{}}},
		{"GET /api/v1/firmware-bundles/id/{id}/artifact", public, s.handleArtifact, op{Tag: "firmware", Signed: true, Summary: "Download a completed bundle's archive with an API key (viewer) or a signed URL (tenant, expires, signature); Range (206, 416), ETag and If-None-Match (304) supported", Query: []param{
			{Name: "id", In: "path", Format: "uuid"},
			{Name: "tenant", Desc: "signed URL: the bundle's tenant"},
			{Name: "expires", Desc: "signed URL: expiry, Unix seconds"},
			{Name: "signature", Desc: "signed URL: its HMAC-SHA256 signature"},
		}, Raw: "application/octet-stream"}},
		{"GET /api/v1/firmware-bundles/version/{version}", fleet.PermRead, s.handleGetBundleByVersion, op{Tag: "firmware", Summary: "S6: read the bundle of a version, with its firmwares", Resp: fleet.Bundle{}}},
		{"PUT /api/v1/firmwares/component/{component_name}/{version_number}", fleet.PermOperate, s.handleUpdateFirmware, op{Tag: "firmware", Summary: "S8: activate or deactivate a component version; correct its uncompressed size or dependencies", Body: firmwareUpdate{}, OK: http.StatusNoContent, Resp: fleet.Firmware{}}},
		{"GET /api/v1/firmwares/component/{component_name}", fleet.PermRead, s.handleListFirmwares, op{Tag: "firmware", Summary: "List a component's versions, newest version first", Query: pageParams, Resp: firmwareList{}}},

		{"POST /api/v1/devices/{id}/streams/{stream}", fleet.PermDeviceData, s.handleIngest, op{Tag: "streams",
			Summary: "Ingest data points: an array of objects with timestamp (epoch ms), sequence and data fields. Usable points are kept when others are refused; all refused is 400",
			Body:    ingestBody{}, Resp: ingestResult{}}},
		{"GET /api/v1/devices/{id}/streams/{stream}/latest", fleet.PermRead, s.handleLatestPoint, op{Tag: "streams",
			Summary: "The stream's latest point, by timestamp then sequence", Resp: fleet.DataPoint{}}},
		{"GET /api/v1/devices/{id}/streams", fleet.PermRead, s.handleDeviceStreams, op{Tag: "streams",
			Summary: "The streams the device has points of within the retention, by name, with how many and the first and last timestamps", Resp: streamList{}}},
		{"GET /api/v1/devices/{id}/streams/{stream}/points", fleet.PermRead, s.handlePoints, op{Tag: "streams",
			Summary: "A page of the stream's points kept in history, by timestamp then sequence; next is an opaque cursor, stable while points arrive, and the Link header the next page's URL", Query: pointParams, Resp: pointPage{},
			Headers: nextLinkHeader}},
		{"GET /api/v1/devices/{id}/streams/{stream}/aggregate", fleet.PermRead, s.handleAggregate, op{Tag: "streams",
			Summary: "A numeric field of the stream aggregated in buckets aligned to UTC, over the whole buckets from and to touch (default: the last day); empty buckets are left out", Query: aggregateParams, Resp: aggregateResult{}}},
		{"GET /api/v1/devices/{id}/logs", fleet.PermRead, s.handleLogs, op{Tag: "streams",
			Summary: "The device's log lines (the points of its logs stream, as the uplink agent sends them), oldest first; follow=true streams them as server-sent events. A page's Link header is the next page's URL", Query: logParams, Resp: logList{},
			Headers: nextLinkHeader}},
		{"GET /api/v1/streams/{stream}/aggregate", fleet.PermRead, s.handleFleetAggregate, op{Tag: "streams",
			Summary: "A numeric field of a stream aggregated over the tenant's devices (those whose metadata matches, in the group given), as one series or one per device", Query: fleetAggregateParams, Resp: aggregateResult{}}},

		{"POST /api/v1/alert-rules", fleet.PermOperate, s.handleCreateAlertRule, op{Tag: "alerts", Summary: "Create an alert rule (S2)",
			Body: alertRuleCreate{}, OK: http.StatusCreated, Resp: fleet.AlertRule{}, Quiet: true}},
		{"GET /api/v1/alert-rules", fleet.PermRead, s.handleListAlertRules, op{Tag: "alerts", Summary: "List alert rules, oldest first",
			Query: pageParams, Resp: alertRuleList{}}},
		{"GET /api/v1/alert-rules/{id}", fleet.PermRead, s.handleGetAlertRule, op{Tag: "alerts", Summary: "Read an alert rule",
			Query: uuidPathParams("id"), Resp: fleet.AlertRule{}}},
		{"PUT /api/v1/alert-rules/{id}", fleet.PermOperate, s.handleUpdateAlertRule, op{Tag: "alerts",
			Summary: "Replace an alert rule's fields (those of S2; its stream cannot change). Devices keep their phases and open alerts, which their next points move by the new condition and thresholds",
			Query:   uuidPathParams("id"), Body: alertRuleCreate{}, OK: http.StatusNoContent, Resp: fleet.AlertRule{}}},
		{"DELETE /api/v1/alert-rules/{id}", fleet.PermOperate, s.handleDeleteAlertRule, op{Tag: "alerts",
			Summary: "Delete an alert rule with its notification rules, alerts and pending notifications", Query: uuidPathParams("id"), OK: http.StatusNoContent}},
		{"POST /api/v1/alert-rules/{id}/alert-notification-rules", fleet.PermOperate, s.handleCreateNotificationRule, op{Tag: "alerts",
			Summary: "Create a notification rule of an alert rule (S3)", Query: uuidPathParams("id"),
			Body: notificationRuleCreate{}, OK: http.StatusCreated, Resp: fleet.NotificationRule{}, Quiet: true}},
		{"GET /api/v1/alert-rules/{id}/alert-notification-rules", fleet.PermRead, s.handleListNotificationRules, op{Tag: "alerts",
			Summary: "List an alert rule's notification rules; secrets are never shown", Query: append(uuidPathParams("id"), pageParams...), Resp: notificationRuleList{}}},
		{"PUT /api/v1/alert-rules/{alert_id}/alert-notification-rules/{notification_id}", fleet.PermOperate, s.handleUpdateNotificationRule, op{Tag: "alerts",
			Summary: "Update channel_parameters, interval_seconds, notification_template or timezone (S4)", Query: uuidPathParams("alert_id", "notification_id"),
			Body: notificationRuleUpdate{}, OK: http.StatusNoContent, Resp: fleet.NotificationRule{}}},
		{"DELETE /api/v1/alert-rules/{alert_id}/alert-notification-rules/{notification_id}", fleet.PermOperate, s.handleDeleteNotificationRule, op{Tag: "alerts",
			Summary: "Delete a notification rule", Query: uuidPathParams("alert_id", "notification_id"), OK: http.StatusNoContent}},

		{"GET /api/v1/alerts", fleet.PermRead, s.handleListAlerts, op{Tag: "alerts", Summary: "Alert sessions, newest first", Query: append([]param{
			{Name: "state", Desc: "active or ended", Enum: []string{fleet.AlertActive, fleet.AlertEnded}},
			{Name: "rule_id", Format: "uuid", Desc: "only alerts of this rule"},
			{Name: "device_id", Desc: "only alerts of this device"},
		}, pageParams...), Resp: alertList{}}},
		{"GET /api/v1/alerts/{id}", fleet.PermRead, s.handleGetAlert, op{Tag: "alerts", Summary: "Read an alert session",
			Query: uuidPathParams("id"), Resp: fleet.Alert{}}},
		{"GET /api/v1/alerts/{id}/notifications", fleet.PermRead, s.handleListDeliveries, op{Tag: "alerts",
			Summary: "An alert's notifications and each attempt to deliver them", Query: append(uuidPathParams("id"), pageParams...), Resp: deliveryList{}}},

		{"POST /api/v1/apikeys", fleet.PermAdmin, s.handleCreateAPIKey, op{Tag: "apikeys", Summary: "Create an API key; its secret is shown once", Body: apiKeyCreate{}, OK: http.StatusCreated, Resp: fleet.APIKey{}}},
		{"GET /api/v1/apikeys", fleet.PermAdmin, s.handleListAPIKeys, op{Tag: "apikeys", Summary: "List API keys, without their secrets", Query: pageParams, Resp: apiKeyList{}}},
		{"DELETE /api/v1/apikeys/{name}", fleet.PermAdmin, s.handleDeleteAPIKey, op{Tag: "apikeys", Summary: "Delete an API key; it is refused from then on", OK: http.StatusNoContent}},

		{"PUT /api/v1/tenants/{tenant_id}/auth", fleet.PermAdmin, s.handleSetTenantAuth, op{Tag: "tenants", Summary: "S9: how the tenant's end users authenticate with bearer tokens", Body: tenantAuthBody{}, OK: http.StatusNoContent, Resp: fleet.TenantAuth{}}},
		{"GET /api/v1/tenants/{tenant_id}/auth", fleet.PermAdmin, s.handleGetTenantAuth, op{Tag: "tenants", Summary: "The tenant's end-user authentication", Resp: fleet.TenantAuth{}}},
		{"PUT /api/v1/tenants/{tenant_id}/stream-retention", fleet.PermAdmin, s.handleSetStreamRetention, op{Tag: "tenants", Summary: "How long the tenant's raw stream points are kept (rollups keep their own retention)", Body: streamRetentionBody{}, OK: http.StatusNoContent, Resp: streamRetention{}}},
		{"PUT /api/v1/tenants/{tenant_id}/ddi", fleet.PermAdmin, setDDI, op{Tag: "tenants", Summary: "The tenant's hawkBit DDI settings: whether devices confirm updates, whether gateways register unknown devices (both required; audited)", Body: fleet.DDISettings{}, OK: http.StatusNoContent, Resp: fleet.DDISettings{}}},
		{"GET /api/v1/tenants/{tenant_id}/ddi", fleet.PermRead, getDDI, op{Tag: "tenants", Summary: "The tenant's hawkBit DDI settings", Resp: fleet.DDISettings{}}},
		{"PUT /api/v1/tenants/{tenant_id}/shadow-settings", fleet.PermAdmin, setShadow, op{Tag: "tenants",
			Summary: "The tenant's choices about shadows: update_config true dispatches each desired change that leaves a device out of sync to it as an update_config action too (docs/twin.md)",
			Body:    fleet.ShadowSettings{}, OK: http.StatusNoContent, Resp: fleet.ShadowSettings{}}},
		{"PUT /api/v1/tenants/{tenant_id}/remote-settings", fleet.PermAdmin, setRemote, op{Tag: "tenants",
			Summary: "The tenant's choices about remote sessions: recording (required) records the output of shell sessions opened from now on, as asciicast v2 in the blob store (audited)",
			Body:    fleet.RemoteSettings{}, OK: http.StatusNoContent, Resp: fleet.RemoteSettings{}}},
		{"GET /api/v1/tenants/{tenant_id}/remote-settings", fleet.PermRead, getRemote, op{Tag: "tenants", Summary: "The tenant's choices about remote sessions", Resp: fleet.RemoteSettings{}}},
		{"GET /api/v1/tenants/{tenant_id}/shadow-settings", fleet.PermRead, getShadow, op{Tag: "tenants", Summary: "The tenant's choices about shadows", Resp: fleet.ShadowSettings{}}},
		{"GET /api/v1/tenants/{tenant_id}/stream-retention", fleet.PermRead, s.handleGetStreamRetention, op{Tag: "tenants", Summary: "How long the tenant's raw stream points are kept", Resp: streamRetention{}}},

		{"GET /api/v1/audit-logs", fleet.PermAdmin, s.handleListAuditLogs, op{Tag: "audit", Summary: "Every change made through the API, newest first", Query: append([]param{
			{Name: "actor", Desc: "only changes by this actor (API key name or user name)"},
			{Name: "action", Desc: "only this action (device.update), or every action of this kind (device)"},
			{Name: "since", Desc: "only changes at or after this RFC 3339 time", Format: "date-time"},
			{Name: "until", Desc: "only changes before this RFC 3339 time", Format: "date-time"},
		}, pageParams...), Resp: auditLogList{}}},

		// hawkBit DDI v1 for devices that run a hawkBit client (ddi.go,
		// docs/hawkbit.md). Authorization: TargetToken <device token> or
		// GatewayToken <API key with the device role>; the tenant is in the
		// path, not in x-service-tenant.
		{"GET " + ddiPrefix, public, s.handleDDIBase, op{Tag: "hawkbit", Summary: "DDI polling root: config.polling.sleep, and _links to the deployment, confirmation or cancellation the device should follow (and configData until the device sent its attributes)", Resp: ddiControllerBase{}}},
		{"GET " + ddiPrefix + "/deploymentBase/{actionId}", public, s.handleDDIDeployment, op{Tag: "hawkbit", Summary: "DDI deployment: an update_firmware action, one chunk per component of the bundle with its artifact (filename, size, sha1/md5/sha256, download links); reading it hands the action to the device (Initiated)",
			Query: []param{ddiActionIDParam, ddiResourceParam, ddiHistoryParam}, Resp: ddiDeploymentBase{}}},
		{"POST " + ddiPrefix + "/deploymentBase/{actionId}/feedback", public, s.ddiFeedback(fleet.ActionUpdateFirmware), op{Tag: "hawkbit", Summary: "DDI deployment feedback: closed+success is Completed (the versions recorded on the device), closed+failure Failed with the details as errors, anything else progress (cnt/of as the percentage); unknown fields ignored; 410 once the action is finished",
			Query: []param{ddiActionIDParam}, Body: ddiFeedback{}}},
		{"GET " + ddiPrefix + "/installedBase/{actionId}", public, s.handleDDIInstalled, op{Tag: "hawkbit", Summary: "DDI installed deployment: a Completed update_firmware action of the device, as deploymentBase showed it (to install it again); 404 for one not Completed",
			Query: []param{ddiActionIDParam, ddiHistoryParam}, Resp: ddiDeploymentBase{}}},
		{"GET " + ddiPrefix + "/softwaremodules/{moduleId}/artifacts", public, s.handleDDIModuleArtifacts, op{Tag: "hawkbit", Summary: "DDI artifacts of a software module (a component version): its file, as a deployment lists it; only for a device with an update_firmware action that installs it, or a gateway token",
			Query: []param{{Name: "moduleId", In: "path", Format: "uuid", Desc: "the firmware's id"}}, Resp: []ddiArtifact{}}},
		{"GET " + ddiPrefix + "/cancelAction/{actionId}", public, s.handleDDICancel, op{Tag: "hawkbit", Summary: "DDI cancellation of action actionId (id and stopId both name it): reading it hands the cancel_action to the device",
			Query: []param{ddiActionIDParam}, Resp: ddiCancel{}}},
		{"POST " + ddiPrefix + "/cancelAction/{actionId}/feedback", public, s.ddiFeedback(fleet.ActionCancel), op{Tag: "hawkbit", Summary: "DDI cancellation feedback on action actionId: closed or canceled completes the cancel_action and cancels the action; rejected or closed+failure fails it, and the action goes on",
			Query: []param{ddiActionIDParam}, Body: ddiFeedback{}}},
		{"GET " + ddiPrefix + "/confirmationBase", public, s.handleDDIConfirmationBase, op{Tag: "hawkbit", Summary: "DDI confirmation base: the device's automatic confirmation (autoConfirm), the link to switch it, and confirmationBase, the update waiting for the device's confirmation when the tenant requires one",
			Resp: ddiConfirmationBase{}}},
		{"GET " + ddiPrefix + "/confirmationBase/{actionId}", public, s.handleDDIConfirmationAction, op{Tag: "hawkbit", Summary: "DDI update waiting for the device's confirmation, as its deployment (under confirmation); 404 for one that does not wait, 410 once finished",
			Query: []param{ddiActionIDParam, ddiResourceParam, ddiHistoryParam}, Resp: ddiConfirmationBaseAction{}}},
		{"POST " + ddiPrefix + "/confirmationBase/{actionId}/feedback", public, s.handleDDIConfirmationFeedback, op{Tag: "hawkbit", Summary: "DDI confirmation feedback: confirmed hands the update over (the root then links to deploymentBase); denied keeps it waiting for a later confirmation; 404 for an update that does not wait, 410 once finished",
			Query: []param{ddiActionIDParam}, Body: ddiConfirmationFeedback{}}},
		{"POST " + ddiPrefix + "/confirmationBase/activateAutoConfirm", public, s.ddiAutoConfirm(true), op{Tag: "hawkbit", Summary: "DDI: the device confirms its updates from now on, those waiting included (initiator and remark optional); 409 when active already",
			Body: ddiActivateAutoConfirm{}, BodyOptional: true}},
		{"POST " + ddiPrefix + "/confirmationBase/deactivateAutoConfirm", public, s.ddiAutoConfirm(false), op{Tag: "hawkbit", Summary: "DDI: the device confirms each update itself again"}},
		{"PUT " + ddiPrefix + "/configData", public, s.handleDDIConfigData, op{Tag: "hawkbit", Summary: "DDI configData: the device's attributes, stored in its metadata (mode merge, replace or remove)", Body: ddiConfigData{}}},
		{"GET " + ddiPrefix + "/softwaremodules/{moduleId}/artifacts/{fileName}", public, s.handleDDIArtifact, op{Tag: "hawkbit", Summary: "DDI artifact download: a component's file, with Range (206, 416), ETag, If-None-Match and If-Match (its SHA-256 or SHA-1); {fileName}.MD5SUM is its MD5 line; only for a device with an update_firmware action that installs it, or a gateway token",
			Query: []param{{Name: "moduleId", In: "path", Format: "uuid", Desc: "the firmware's id"}}, Raw: "application/octet-stream"}},
	}
}

// ddiActionIDParam is the action id in a DDI path; ddiHistoryParam asks
// for the action's messages.
var (
	ddiActionIDParam = param{Name: "actionId", In: "path", Type: "integer", Desc: "the action's id"}
	ddiHistoryParam  = param{Name: "actionHistory", In: "query", Type: "integer", Desc: "how many of the action's messages to show in actionHistory: 0 (the default) none, below 0 all"}
	ddiResourceParam = param{Name: "c", In: "query", Type: "integer", Desc: "upstream's hash of the resource; accepted and not needed"}
)

// pageParams are the paging parameters of every list.
// openParam keeps the remote sessions not ended.
var openParam = param{Name: "open", Desc: "true: only the sessions not ended", Enum: []string{"true", "false"}}

var pageParams = []param{
	{Name: "page", Type: "integer", Desc: "page number, from 1 (default 1)"},
	{Name: "limit", Type: "integer", Desc: "items per page, 1 to 1000 (default 50)"},
}
