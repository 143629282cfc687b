package fleethttp_test

import (
	"bytes"
	"crypto/md5"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	fwbundle "github.com/fleetd/fleet/firmware/bundle"
	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// These tests drive fleetd's hawkBit DDI API (docs/hawkbit.md): first with
// a plain HTTP client, for the JSON, the authentication and the mapping of
// feedback, then with Debian's SWUpdate (suricatta) as the device.

// ddiBundle builds a bundle of one component, rootfs, whose file is name
// with body.
func ddiBundle(t testing.TB, version, name string, body []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	src := []fwbundle.Source{{ComponentName: "rootfs", VersionNumber: version, FileName: name, Size: int64(len(body)), Body: bytes.NewReader(body)}}
	if err := fwbundle.Build(&buf, version, src, true); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// keys lists a JSON object's keys, sorted, for comparing shapes.
func keys(v any) string {
	m, _ := v.(map[string]any)
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return strings.Join(ks, " ")
}

func TestDDI(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b, "--ddi-poll-interval", "90s")
		admin := s.Admin()
		dev := s.MustDevice(t, admin, "ecu-1", nil)
		other := s.MustDevice(t, admin, "ecu-2", nil)
		target := "TargetToken " + dev.Token
		root := "/default/controller/v1/ecu-1"
		payload := bytes.Repeat([]byte("rootfs 2.0.0 "), 5000)
		s.MustUpload(t, admin, ddiBundle(t, "2.0.0", "images/rootfs.swu", payload))

		gateway := s.NewKey(t, admin, "gateway", "device")
		t.Run("Authentication", func(t *testing.T) {
			for name, auth := range map[string]string{
				"None":             "",
				"AnotherDevices":   "TargetToken " + other.Token,
				"Bearer":           "Bearer " + dev.Token,
				"Empty":            "TargetToken ",
				"AdminKeyAsTarget": "TargetToken " + admin.Key,
			} {
				if resp, body := s.DDI(t, "GET", root, auth, nil); resp.StatusCode != 401 {
					t.Errorf("%s: %d %s, want 401", name, resp.StatusCode, body)
				}
			}
			if resp, _ := s.DDI(t, "GET", "/beta/controller/v1/ecu-1", target, nil); resp.StatusCode != 401 {
				t.Errorf("another tenant's path: %d, want 401", resp.StatusCode)
			}
			gw := gateway
			if resp, body := s.DDI(t, "GET", root, "GatewayToken "+gw.Key, nil); resp.StatusCode != 200 {
				t.Errorf("gateway token with the device role: %d %s", resp.StatusCode, body)
			}
			if resp, _ := s.DDI(t, "GET", "/default/controller/v1/nobody", "GatewayToken "+gw.Key, nil); resp.StatusCode != 404 {
				t.Errorf("gateway token for an unknown device: %d, want 404", resp.StatusCode)
			}
			viewer := s.NewKey(t, admin, "watcher", "viewer")
			if resp, _ := s.DDI(t, "GET", root, "GatewayToken "+viewer.Key, nil); resp.StatusCode != 403 {
				t.Errorf("gateway token with the viewer role: %d, want 403", resp.StatusCode)
			}
			// hawkBit's clients often name the tenant in capitals.
			if resp, body := s.DDI(t, "GET", "/DEFAULT/controller/v1/ecu-1", target, nil); resp.StatusCode != 200 {
				t.Errorf("DEFAULT: %d %s", resp.StatusCode, body)
			}
		})

		var base map[string]any
		t.Run("PollWithoutAction", func(t *testing.T) {
			resp, body := s.DDI(t, "GET", root, target, nil)
			if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("%d %s %s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
			}
			json.Unmarshal(body, &base)
			// As hawkBit's example: config.polling.sleep as HH:MM:SS, and
			// links; a device with no metadata is asked for its attributes.
			if got := fmt.Sprint(base["config"]); got != "map[polling:map[sleep:00:01:30]]" {
				t.Fatalf("config = %s", got)
			}
			if keys(base["_links"]) != "configData" {
				t.Fatalf("_links = %v", base["_links"])
			}
		})

		id := s.Dispatch(t, admin, map[string]any{"action": "update_firmware", "params": map[string]any{"version": "2.0.0"},
			"search_type": "default", "device_ids": []string{"ecu-1"}, "timeout": 600})
		deployment := fmt.Sprintf("%s/deploymentBase/%d", root, id)
		var dep map[string]any
		t.Run("Deployment", func(t *testing.T) {
			_, body := s.DDI(t, "GET", root, target, nil)
			json.Unmarshal(body, &base)
			if got := base["_links"].(map[string]any)["deploymentBase"]; fmt.Sprint(got) != "map[href:"+s.URL+deployment+"]" {
				t.Fatalf("deploymentBase link = %v", got)
			}
			resp, body := s.DDI(t, "GET", deployment, target, nil)
			if resp.StatusCode != 200 {
				t.Fatalf("%d %s", resp.StatusCode, body)
			}
			if err := json.Unmarshal(body, &dep); err != nil {
				t.Fatal(err)
			}
			// The shape of the specification's example, key for key.
			d := dep["deployment"].(map[string]any)
			chunk := d["chunks"].([]any)[0].(map[string]any)
			art := chunk["artifacts"].([]any)[0].(map[string]any)
			for _, c := range []struct{ got, want string }{
				{keys(dep), "deployment id"},
				{keys(d), "chunks download update"},
				{keys(chunk), "artifacts name part version"},
				{keys(art), "_links filename hashes size"},
				{keys(art["hashes"]), "md5 sha1 sha256"},
				{keys(art["_links"]), "download download-http md5sum md5sum-http"},
				{fmt.Sprintf("%v %v %v %v %v %v %v", dep["id"], d["download"], d["update"], chunk["part"], chunk["version"], art["filename"], art["size"]),
					fmt.Sprintf("%d forced forced rootfs 2.0.0 rootfs.swu %d", id, len(payload))},
				{fmt.Sprint(art["hashes"]), fmt.Sprintf("map[md5:%x sha1:%x sha256:%x]", md5.Sum(payload), sha1.Sum(payload), sha256.Sum256(payload))},
			} {
				if c.got != c.want {
					t.Errorf("got %q, want %q", c.got, c.want)
				}
			}
			if _, ok := dep["id"].(string); !ok {
				t.Errorf("id is %T, want a string as hawkBit sends it", dep["id"])
			}
			// Reading the deployment hands the action to the device.
			fleetdtest.Eventually(t, "Initiated", func() bool { return s.DeviceAction(t, admin, "ecu-1", id).ActionStatus == "Initiated" })
		})

		t.Run("ArtifactWithRange", func(t *testing.T) {
			art := dep["deployment"].(map[string]any)["chunks"].([]any)[0].(map[string]any)["artifacts"].([]any)[0].(map[string]any)
			href := art["_links"].(map[string]any)["download-http"].(map[string]any)["href"].(string)
			path := strings.TrimPrefix(href, s.URL)
			// A download cut after 1000 bytes resumes where it stopped.
			resp, first := s.DDI(t, "GET", path, target, nil, "Range", "bytes=0-999")
			if resp.StatusCode != 206 || len(first) != 1000 {
				t.Fatalf("first part: %d, %d bytes", resp.StatusCode, len(first))
			}
			resp, rest := s.DDI(t, "GET", path, target, nil, "Range", "bytes=1000-", "If-Range", resp.Header.Get("ETag"))
			if resp.StatusCode != 206 || !bytes.Equal(append(first, rest...), payload) {
				t.Fatalf("resumed: %d, %d bytes; not the component's file", resp.StatusCode, len(first)+len(rest))
			}
			if resp, _ := s.DDI(t, "GET", path, target, nil, "Range", fmt.Sprintf("bytes=%d-", len(payload))); resp.StatusCode != 416 {
				t.Fatalf("a range past the end: %d, want 416", resp.StatusCode)
			}
			resp, sum := s.DDI(t, "GET", path+".MD5SUM", target, nil)
			if resp.StatusCode != 200 || string(sum) != fmt.Sprintf("%x  rootfs.swu\n", md5.Sum(payload)) {
				t.Fatalf("MD5SUM: %d %q", resp.StatusCode, sum)
			}
			if resp, _ := s.DDI(t, "GET", strings.Replace(path, "rootfs.swu", "other.swu", 1), target, nil); resp.StatusCode != 404 {
				t.Fatalf("another file name: %d, want 404", resp.StatusCode)
			}
			if resp, _ := s.DDI(t, "GET", path, "", nil); resp.StatusCode != 401 {
				t.Fatalf("without a token: %d, want 401", resp.StatusCode)
			}
		})

		t.Run("Feedback", func(t *testing.T) {
			feedback := deployment + "/feedback"
			for _, c := range []struct {
				body any
				want int
			}{
				{map[string]any{"status": map[string]any{"execution": "sleeping"}}, 400},
				{map[string]any{"status": map[string]any{"execution": "closed", "result": map[string]any{"finished": "maybe"}}}, 400},
				{map[string]any{}, 400},
			} {
				if resp, body := s.DDI(t, "POST", feedback, target, c.body); resp.StatusCode != c.want {
					t.Errorf("%v: %d %s, want %d", c.body, resp.StatusCode, body, c.want)
				}
			}
			// As SWUpdate sends it: id, the device's local time, cnt/of; and
			// fields fleetd does not know, which upstream ignores.
			proceeding := map[string]any{"id": id, "time": "20261125T101314", "status": map[string]any{"execution": "proceeding",
				"result": map[string]any{"finished": "none", "progress": map[string]any{"cnt": 1, "of": 4}}, "details": []string{"Installing"}, "code": 7},
				"extra": true}
			if resp, body := s.DDI(t, "POST", feedback, target, proceeding); resp.StatusCode != 200 {
				t.Fatalf("proceeding: %d %s", resp.StatusCode, body)
			}
			if da := s.DeviceAction(t, admin, "ecu-1", id); da.ActionStatus != "Progress" || da.Status != "proceeding" || da.Progress != 25 {
				t.Fatalf("after proceeding 1 of 4: %+v", da)
			}
			failure := map[string]any{"id": id, "status": map[string]any{"execution": "closed",
				"result": map[string]any{"finished": "failure"}, "details": []string{"ERROR : no space left on device"}}}
			if resp, body := s.DDI(t, "POST", feedback, target, failure); resp.StatusCode != 200 {
				t.Fatalf("failure: %d %s", resp.StatusCode, body)
			}
			da := s.DeviceAction(t, admin, "ecu-1", id)
			if da.ActionStatus != "Failed" || fmt.Sprint(da.Errors["Failed"]) != "[ERROR : no space left on device]" {
				t.Fatalf("after closed+failure: %+v", da)
			}
			// A final state never changes; as upstream, the device is told
			// the action is gone.
			success := map[string]any{"status": map[string]any{"execution": "closed", "result": map[string]any{"finished": "success"}}}
			if resp, body := s.DDI(t, "POST", feedback, target, success); resp.StatusCode != 410 {
				t.Fatalf("after the end: %d %s, want 410", resp.StatusCode, body)
			}
			if da := s.DeviceAction(t, admin, "ecu-1", id); da.ActionStatus != "Failed" {
				t.Fatalf("a report after the end changed %+v", da)
			}
			// The failed action offers nothing more.
			_, body := s.DDI(t, "GET", root, target, nil)
			if strings.Contains(string(body), "deploymentBase") {
				t.Fatalf("poll after the end: %s", body)
			}
			if resp, _ := s.DDI(t, "POST", fmt.Sprintf("%s/deploymentBase/%d/feedback", "/default/controller/v1/ecu-2", id), "TargetToken "+other.Token, success); resp.StatusCode != 404 {
				t.Fatalf("feedback of another device's action: %d, want 404", resp.StatusCode)
			}
		})

		// A cancellation as DDI's documentation has it: the cancelAction
		// resource's id is its stopId, the action it stops, and feedback is
		// posted under it; the device may reject it and finish the update.
		var installed int64 // an update ecu-1 completed
		t.Run("Cancel", func(t *testing.T) {
			for _, c := range []struct {
				answer      map[string]any
				cancel      string // the cancel_action's status after the answer
				update      string // the update's, after the answer
				thenClosed  string // the update's, after the device's closed+success
				recordedVer string
			}{
				{map[string]any{"execution": "closed", "result": map[string]any{"finished": "success"}}, "Completed", "Cancelled", "Cancelled", ""},
				{map[string]any{"execution": "rejected", "result": map[string]any{"finished": "none"}, "details": []string{"installing already"}},
					"Failed", "Initiated", "Completed", "2.0.0"},
			} {
				id := s.Dispatch(t, admin, map[string]any{"action": "update_firmware", "params": map[string]any{"version": "2.0.0"},
					"search_type": "default", "device_ids": []string{"ecu-1"}, "timeout": 600})
				dep := fmt.Sprintf("%s/deploymentBase/%d", root, id)
				if resp, body := s.DDI(t, "GET", dep, target, nil); resp.StatusCode != 200 {
					t.Fatalf("deploymentBase: %d %s", resp.StatusCode, body)
				}
				fleetdtest.Eventually(t, "Initiated", func() bool { return s.DeviceAction(t, admin, "ecu-1", id).ActionStatus == "Initiated" })
				s.Do(t, admin, "POST", fmt.Sprintf("/api/v1/actions/%d/cancel", id), nil).Want(t, 204)
				if da := s.DeviceAction(t, admin, "ecu-1", id); da.ActionStatus != "Initiated" || da.Status != "Cancelling" {
					t.Fatalf("the update before the device answers: %+v", da)
				}
				_, body := s.DDI(t, "GET", root, target, nil)
				json.Unmarshal(body, &base)
				href := fmt.Sprint(base["_links"].(map[string]any)["cancelAction"])
				want := fmt.Sprintf("map[href:%s%s/cancelAction/%d]", s.URL, root, id)
				if href != want {
					t.Fatalf("cancelAction link = %s, want %s", href, want)
				}
				resp, body := s.DDI(t, "GET", fmt.Sprintf("%s/cancelAction/%d", root, id), target, nil)
				var ca struct {
					ID           string
					CancelAction struct{ StopID string } `json:"cancelAction"`
				}
				json.Unmarshal(body, &ca)
				if resp.StatusCode != 200 || ca.ID != fmt.Sprint(id) || ca.CancelAction.StopID != fmt.Sprint(id) {
					t.Fatalf("cancelAction: %d %s; want id and stopId %d", resp.StatusCode, body, id)
				}
				resp, body = s.DDI(t, "POST", fmt.Sprintf("%s/cancelAction/%s/feedback", root, ca.ID), target, map[string]any{"id": ca.ID, "status": c.answer})
				if resp.StatusCode != 200 {
					t.Fatalf("cancelAction feedback: %d %s", resp.StatusCode, body)
				}
				var list struct {
					DeviceActions []fleetdtest.DeviceActionBody `json:"device_actions"`
				}
				s.Do(t, admin, "GET", "/api/v1/devices/ecu-1/actions?type=cancel_action&sort_by=action_id&limit=1", nil).Want(t, 200).Decode(t, &list)
				if len(list.DeviceActions) != 1 || list.DeviceActions[0].ActionStatus != c.cancel {
					t.Fatalf("the cancel_action after %v: %+v, want %s", c.answer, list.DeviceActions, c.cancel)
				}
				if da := s.DeviceAction(t, admin, "ecu-1", id); da.ActionStatus != c.update {
					t.Fatalf("the update after %v: %+v, want %s", c.answer, da, c.update)
				}
				// The device finishes what it was doing.
				closed := map[string]any{"status": map[string]any{"execution": "closed", "result": map[string]any{"finished": "success"}}}
				s.DDI(t, "POST", dep+"/feedback", target, closed)
				if da := s.DeviceAction(t, admin, "ecu-1", id); da.ActionStatus != c.thenClosed {
					t.Fatalf("the update after closed+success: %+v, want %s", da, c.thenClosed)
				}
				var d fleetdtest.Device
				s.Do(t, admin, "GET", "/api/v1/devices/ecu-1", nil).Want(t, 200).Decode(t, &d)
				if d.Components["rootfs"] != c.recordedVer {
					t.Fatalf("components = %v, want rootfs %q", d.Components, c.recordedVer)
				}
				if c.thenClosed == "Completed" {
					installed = id
				}
			}
		})

		// Upstream's resources and parameters that clients use.
		t.Run("Upstream", func(t *testing.T) {
			if installed == 0 {
				t.Skip("no completed update")
			}
			resp, body := s.DDI(t, "GET", fmt.Sprintf("%s/deploymentBase/%d?c=-2083934651&actionHistory=2", root, id), target, nil)
			var hist struct {
				ActionHistory struct {
					Status   string
					Messages []string
				} `json:"actionHistory"`
			}
			json.Unmarshal(body, &hist)
			if resp.StatusCode != 200 || hist.ActionHistory.Status != "ERROR" || len(hist.ActionHistory.Messages) != 2 ||
				hist.ActionHistory.Messages[1] != "Failed: ERROR : no space left on device" {
				t.Fatalf("deploymentBase with ?c= and ?actionHistory=2: %d %s", resp.StatusCode, body)
			}
			if resp, body := s.DDI(t, "GET", fmt.Sprintf("%s/deploymentBase/%d?actionHistory=x", root, id), target, nil); resp.StatusCode != 400 {
				t.Fatalf("?actionHistory=x: %d %s, want 400", resp.StatusCode, body)
			}
			resp, body = s.DDI(t, "GET", fmt.Sprintf("%s/installedBase/%d", root, installed), target, nil)
			var inst map[string]any
			json.Unmarshal(body, &inst)
			if resp.StatusCode != 200 || inst["id"] != fmt.Sprint(installed) || keys(inst) != "deployment id" {
				t.Fatalf("installedBase of the completed update: %d %s", resp.StatusCode, body)
			}
			if resp, _ := s.DDI(t, "GET", fmt.Sprintf("%s/installedBase/%d", root, id), target, nil); resp.StatusCode != 404 {
				t.Fatalf("installedBase of the failed update: %d, want 404", resp.StatusCode)
			}
			art := inst["deployment"].(map[string]any)["chunks"].([]any)[0].(map[string]any)["artifacts"].([]any)[0].(map[string]any)
			href := strings.TrimPrefix(art["_links"].(map[string]any)["download"].(map[string]any)["href"].(string), s.URL)
			module := strings.TrimSuffix(href, "/rootfs.swu")
			resp, body = s.DDI(t, "GET", module, target, nil)
			var list []map[string]any
			json.Unmarshal(body, &list)
			if resp.StatusCode != 200 || len(list) != 1 || list[0]["filename"] != "rootfs.swu" || fmt.Sprint(list[0]["hashes"]) != fmt.Sprint(art["hashes"]) {
				t.Fatalf("the module's artifacts: %d %s", resp.StatusCode, body)
			}
			// If-Match with the SHA-1 the deployment advertises.
			sha := art["hashes"].(map[string]any)["sha1"].(string)
			if resp, body := s.DDI(t, "GET", href, target, nil, "If-Match", `"`+sha+`"`); resp.StatusCode != 200 || !bytes.Equal(body, payload) {
				t.Fatalf("If-Match with the SHA-1: %d, %d bytes", resp.StatusCode, len(body))
			}
			if resp, _ := s.DDI(t, "GET", href, target, nil, "If-Match", `"0000"`); resp.StatusCode != 412 {
				t.Fatalf("If-Match with another hash: %d, want 412", resp.StatusCode)
			}
			// Another device, with no action that names it, gets neither the
			// list nor the file; a gateway may.
			ecu2 := "TargetToken " + other.Token
			for _, p := range []string{module, href} {
				p2 := strings.Replace(p, "/ecu-1/", "/ecu-2/", 1)
				if resp, _ := s.DDI(t, "GET", p2, ecu2, nil); resp.StatusCode != 404 {
					t.Errorf("%s by ecu-2: %d, want 404", p2, resp.StatusCode)
				}
				if resp, _ := s.DDI(t, "GET", p2, "GatewayToken "+gateway.Key, nil); resp.StatusCode != 200 {
					t.Errorf("%s by a gateway: %d, want 200", p2, resp.StatusCode)
				}
			}
		})

		t.Run("ConfigData", func(t *testing.T) {
			put := func(body any) int {
				resp, _ := s.DDI(t, "PUT", root+"/configData", target, body)
				return resp.StatusCode
			}
			if c := put(map[string]any{"id": "", "time": "20261125T101314", "status": map[string]any{"execution": "closed"}, "data": map[string]any{"hwRevision": "2", "VIN": "JH4"}}); c != 200 {
				t.Fatalf("merge: %d", c)
			}
			if c := put(map[string]any{"mode": "remove", "data": map[string]any{"VIN": ""}, "extra": 1}); c != 200 {
				t.Fatalf("remove: %d", c)
			}
			if c := put(map[string]any{"mode": "swap", "data": map[string]any{}}); c != 400 {
				t.Fatalf("unknown mode: %d, want 400", c)
			}
			var d fleetdtest.Device
			s.Do(t, admin, "GET", "/api/v1/devices/ecu-1", nil).Want(t, 200).Decode(t, &d)
			if fmt.Sprint(d.Metadata) != "map[hwRevision:2]" {
				t.Fatalf("metadata = %v", d.Metadata)
			}
			// Once it has told, the device is not asked again.
			if _, body := s.DDI(t, "GET", root, target, nil); strings.Contains(string(body), "configData") {
				t.Fatalf("poll after configData: %s", body)
			}
		})
	})
}

// swupdateTools finds SWUpdate and openssl (which signs its images), or
// skips; under CI they must be there (.ci/run installs them).
func swupdateTools(t *testing.T) (swupdate, openssl string) {
	t.Helper()
	var missing []string
	for _, name := range []string{"swupdate", "openssl"} {
		p, err := exec.LookPath(name)
		if err != nil {
			missing = append(missing, name)
		}
		if name == "swupdate" {
			swupdate = p
		} else {
			openssl = p
		}
	}
	if len(missing) > 0 {
		msg := fmt.Sprintf("%s not installed (apt-get install swupdate openssl)", strings.Join(missing, " and "))
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg + "; CI=true makes this a failure")
	}
	return swupdate, openssl
}

// swuSigner signs SWUpdate images as Debian's SWUpdate requires (CMS, a
// certificate for email protection).
type swuSigner struct {
	openssl, dir string
}

func newSWUSigner(t *testing.T, openssl string) *swuSigner {
	t.Helper()
	s := &swuSigner{openssl: openssl, dir: t.TempDir()}
	s.run(t, nil, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", s.key(), "-out", s.cert(), "-days", "2",
		"-subj", "/CN=fleetd test signer", "-addext", "extendedKeyUsage=emailProtection")
	return s
}

func (s *swuSigner) cert() string { return filepath.Join(s.dir, "cert.pem") }
func (s *swuSigner) key() string  { return filepath.Join(s.dir, "key.pem") }

func (s *swuSigner) run(t *testing.T, stdin []byte, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(s.openssl, args...)
	cmd.Stdin = bytes.NewReader(stdin)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("openssl %s: %v\n%s", args[0], err, stderr.Bytes())
	}
	return out
}

// swu builds a signed image that installs payload at path with SWUpdate's
// rawfile handler. A wrong sha256 makes the installation fail.
func (s *swuSigner) swu(t *testing.T, version, path string, payload []byte, sha string) []byte {
	t.Helper()
	if sha == "" {
		sha = fmt.Sprintf("%x", sha256.Sum256(payload))
	}
	desc := fmt.Sprintf(`software = {
  version = %q;
  hardware-compatibility: [ "1.0" ];
  files: ( { filename = "payload"; path = %q; sha256 = %q; } );
}
`, version, path, sha)
	sig := s.run(t, []byte(desc), "cms", "-sign", "-signer", s.cert(), "-inkey", s.key(), "-outform", "DER", "-nosmimecap", "-binary")
	return cpioNewc([][2]string{{"sw-description", desc}, {"sw-description.sig", string(sig)}, {"payload", string(payload)}})
}

// cpioNewc writes the cpio "newc" archive an .swu image is.
func cpioNewc(files [][2]string) []byte {
	var b bytes.Buffer
	pad := func() {
		for b.Len()%4 != 0 {
			b.WriteByte(0)
		}
	}
	entry := func(ino int, name, data string) {
		fmt.Fprintf(&b, "070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X", ino, 0o100644, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(name)+1, 0)
		b.WriteString(name + "\x00")
		pad()
		b.WriteString(data)
		pad()
	}
	for i, f := range files {
		entry(i+1, f[0], f[1])
	}
	entry(0, "TRAILER!!!", "")
	return b.Bytes()
}

// swupdateRun is SWUpdate running as a suricatta daemon, polling fleetd.
type swupdateRun struct {
	cmd  *exec.Cmd
	out  *fleetdtest.LockedBuffer
	done chan struct{}
}

// runSWUpdate starts SWUpdate for device; suricatta holds its options
// (confirm, "-c 2", after an installation, as a device does after its
// reboot). Its sockets go in a directory of its own (TMPDIR).
func runSWUpdate(t *testing.T, bin string, server string, signer *swuSigner, device, token string, suricatta ...string) *swupdateRun {
	t.Helper()
	opts := append([]string{"-t", "default", "-u", server, "-i", device, "-k", token, "-p", "1", "-r", "5", "-w", "1"}, suricatta...)
	cmd := exec.Command(bin, "-v", "-k", signer.cert(), "-H", "fleetdev:1.0", "-u", strings.Join(opts, " "))
	cmd.Env = append(os.Environ(), "TMPDIR="+t.TempDir())
	r := &swupdateRun{cmd: cmd, out: &fleetdtest.LockedBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = r.out, r.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { cmd.Wait(); close(r.done) }()
	t.Cleanup(r.stop)
	return r
}

// stop ends SWUpdate as a reboot would.
func (r *swupdateRun) stop() {
	select {
	case <-r.done:
		return
	default:
	}
	r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.done:
	case <-time.After(10 * time.Second):
		r.cmd.Process.Kill()
		<-r.done
	}
}

// awaitStatus waits for the device action to reach status, showing what
// SWUpdate said if it does not.
func (r *swupdateRun) awaitStatus(t *testing.T, s *fleetdtest.Server, device string, id int64, status string) fleetdtest.DeviceActionBody {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		da := s.DeviceAction(t, s.Admin(), device, id)
		if da.ActionStatus == status {
			return da
		}
		if time.Now().After(deadline) {
			t.Fatalf("action %d on %s is %+v, not %s; SWUpdate said:\n%s", id, device, da, status, r.out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestSWUpdate updates a device running Debian's SWUpdate through fleetd:
// an installation that succeeds (confirmed after the device's "reboot"),
// one that fails with SWUpdate's message, and a cancellation.
func TestSWUpdate(t *testing.T) {
	t.Parallel()
	bin, openssl := swupdateTools(t)
	signer := newSWUSigner(t, openssl)
	s := fleetdtest.Start(t, sqlstoretest.Backends()[0], "--ddi-poll-interval", "1s")
	admin := s.Admin()
	dev := s.MustDevice(t, admin, "gw-1", map[string]string{"site": "lab"})
	installed := filepath.Join(t.TempDir(), "installed.txt")
	update := func(version string, swu []byte) int64 {
		t.Helper()
		s.MustUpload(t, admin, ddiBundle(t, version, "rootfs.swu", swu))
		return s.Dispatch(t, admin, map[string]any{"action": "update_firmware", "params": map[string]any{"version": version},
			"search_type": "default", "device_ids": []string{"gw-1"}, "timeout": 600})
	}

	t.Run("Success", func(t *testing.T) {
		id := update("2.0.0", signer.swu(t, "2.0.0", installed, []byte("rootfs 2.0.0\n"), ""))
		sw := runSWUpdate(t, bin, s.URL, signer, "gw-1", dev.Token)
		// Installed, awaiting the device's test after its reboot.
		fleetdtest.Eventually(t, "the installed file", func() bool {
			b, _ := os.ReadFile(installed)
			return string(b) == "rootfs 2.0.0\n"
		})
		da := sw.awaitStatus(t, s, "gw-1", id, "Progress")
		fleetdtest.Eventually(t, "the installation reported", func() bool {
			da = s.DeviceAction(t, admin, "gw-1", id)
			return da.Progress == 100
		})
		sw.stop()
		// After the reboot the device confirms: closed, success.
		sw = runSWUpdate(t, bin, s.URL, signer, "gw-1", dev.Token, "-c", "2")
		da = sw.awaitStatus(t, s, "gw-1", id, "Completed")
		sw.stop()
		var d fleetdtest.Device
		s.Do(t, admin, "GET", "/api/v1/devices/gw-1", nil).Want(t, 200).Decode(t, &d)
		if d.Components["rootfs"] != "2.0.0" {
			t.Fatalf("the device's components after the update: %v (action %+v)", d.Components, da)
		}
	})

	t.Run("Failure", func(t *testing.T) {
		bad := strings.Repeat("1", 64)
		id := update("3.0.0", signer.swu(t, "3.0.0", installed, []byte("rootfs 3.0.0\n"), bad))
		sw := runSWUpdate(t, bin, s.URL, signer, "gw-1", dev.Token)
		da := sw.awaitStatus(t, s, "gw-1", id, "Failed")
		sw.stop()
		var all []string
		for state, errs := range da.Errors {
			all = append(all, state+": "+strings.Join(errs, " | "))
		}
		msgs := strings.Join(all, "\n")
		if len(da.Errors["Failed"]) == 0 || !strings.Contains(msgs, "HASH mismatch") {
			t.Fatalf("the failure's errors do not carry SWUpdate's message about the hash: %q\nSWUpdate said:\n%s", msgs, sw.out)
		}
		if b, _ := os.ReadFile(installed); string(b) != "rootfs 2.0.0\n" {
			t.Fatalf("the failed image was installed: %q", b)
		}
	})

	t.Run("Cancel", func(t *testing.T) {
		id := update("4.0.0", signer.swu(t, "4.0.0", installed, []byte("rootfs 4.0.0\n"), ""))
		// The device has read the deployment (it is downloading, say)
		// when the operator cancels: it must be told.
		if resp, body := s.DDI(t, "GET", fmt.Sprintf("/default/controller/v1/gw-1/deploymentBase/%d", id), "TargetToken "+dev.Token, nil); resp.StatusCode != 200 {
			t.Fatalf("deploymentBase: %d %s", resp.StatusCode, body)
		}
		fleetdtest.Eventually(t, "Initiated", func() bool { return s.DeviceAction(t, admin, "gw-1", id).ActionStatus == "Initiated" })
		s.Do(t, admin, "POST", fmt.Sprintf("/api/v1/actions/%d/cancel", id), nil).Want(t, 204)
		var list struct {
			DeviceActions []fleetdtest.DeviceActionBody `json:"device_actions"`
		}
		s.Do(t, admin, "GET", "/api/v1/devices/gw-1/actions?type=cancel_action", nil).Want(t, 200).Decode(t, &list)
		if len(list.DeviceActions) != 1 {
			t.Fatalf("cancel_actions: %+v", list.DeviceActions)
		}
		sw := runSWUpdate(t, bin, s.URL, signer, "gw-1", dev.Token)
		sw.awaitStatus(t, s, "gw-1", list.DeviceActions[0].ActionID, "Completed")
		sw.stop()
		if da := s.DeviceAction(t, admin, "gw-1", id); da.ActionStatus != "Cancelled" {
			t.Fatalf("the cancelled update: %+v", da)
		}
		if b, _ := os.ReadFile(installed); string(b) != "rootfs 2.0.0\n" {
			t.Fatalf("the cancelled image was installed: %q", b)
		}
	})

	t.Run("DownloadCutAndRetried", func(t *testing.T) {
		// A 1 MiB image through a proxy that cuts the first download of it
		// after 300 KiB, as a bad link would: SWUpdate fetches it again
		// and installs the whole image, not the part it had. (SWUpdate
		// 2022.12 starts over rather than asking for the rest with Range;
		// TestDDI checks that a client that resumes gets the rest.)
		payload := make([]byte, 1<<20)
		for i := range payload {
			payload[i] = byte(i * 7 % 251)
		}
		id := update("5.0.0", signer.swu(t, "5.0.0", installed, payload, ""))
		p := newCuttingProxy(t, s.URL, "/artifacts/rootfs.swu", 300<<10)
		sw := runSWUpdate(t, bin, p.URL, signer, "gw-1", dev.Token)
		fleetdtest.Eventually(t, "the image installed whole", func() bool {
			b, _ := os.ReadFile(installed)
			return bytes.Equal(b, payload)
		})
		sw.awaitStatus(t, s, "gw-1", id, "Progress")
		sw.stop()
		ranges := p.ranges()
		if len(ranges) == 0 {
			t.Fatalf("the artifact was not fetched again after the cut; SWUpdate said:\n%s", sw.out)
		}
		t.Logf("after the cut SWUpdate fetched the artifact %d more times, with Range %q", len(ranges), ranges)
		sw = runSWUpdate(t, bin, s.URL, signer, "gw-1", dev.Token, "-c", "2")
		sw.awaitStatus(t, s, "gw-1", id, "Completed")
		sw.stop()
	})

	// SWUpdate 2022.12 knows no confirmationBase: in a tenant that requires
	// confirmations its update waits while it polls, and goes through once
	// a gateway activates the device's automatic confirmation.
	t.Run("ConfirmationRequired", func(t *testing.T) {
		ddiSettings(t, s, admin, true, false)
		t.Cleanup(func() { ddiSettings(t, s, admin, false, false) })
		id := update("7.0.0", signer.swu(t, "7.0.0", installed, []byte("rootfs 7.0.0\n"), ""))
		polls := func() int {
			r := s.Do(t, fleetdtest.Creds{}, "GET", "/metrics", nil).Want(t, 200)
			for _, line := range strings.Split(string(r.Body), "\n") {
				if strings.HasPrefix(line, `fleetd_http_requests_total{code="200",route="GET /{tenant}/controller/v1/{controllerId}"} `) {
					var n int
					fmt.Sscan(line[strings.LastIndex(line, " ")+1:], &n)
					return n
				}
			}
			return 0
		}
		before := polls()
		sw := runSWUpdate(t, bin, s.URL, signer, "gw-1", dev.Token)
		fleetdtest.Eventually(t, "three polls by SWUpdate", func() bool { return polls() >= before+3 })
		if da := s.DeviceAction(t, admin, "gw-1", id); da.ActionStatus != "Queued" {
			t.Fatalf("an update waiting for a confirmation was handed over: %+v", da)
		}
		if b, _ := os.ReadFile(installed); string(b) == "rootfs 7.0.0\n" {
			t.Fatal("the waiting image was installed")
		}
		gateway := s.NewKey(t, admin, "swupdate-gateway", "device")
		ddiAs(t, s, "GatewayToken "+gateway.Key, "POST", "/default/controller/v1/gw-1/confirmationBase/activateAutoConfirm",
			map[string]any{"initiator": "gateway", "remark": "SWUpdate cannot confirm"}).Want(t, 200)
		fleetdtest.Eventually(t, "the confirmed image installed", func() bool {
			b, _ := os.ReadFile(installed)
			return string(b) == "rootfs 7.0.0\n"
		})
		sw.awaitStatus(t, s, "gw-1", id, "Progress")
		sw.stop()
	})
}

// cuttingProxy forwards to fleetd, and cuts the first response whose path
// contains cut after n bytes of its body; it records the Range header of
// the requests for that path that follow it.
type cuttingProxy struct {
	URL string
	mu  sync.Mutex
	cut bool
	rng []string
}

func newCuttingProxy(t *testing.T, target, cut string, n int64) *cuttingProxy {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	p := &cuttingProxy{}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.ModifyResponse = func(resp *http.Response) error {
		if !strings.Contains(resp.Request.URL.Path, cut) || resp.StatusCode >= 300 {
			return nil
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		if !p.cut {
			p.cut = true
			resp.Body = struct {
				io.Reader
				io.Closer
			}{io.MultiReader(io.LimitReader(resp.Body, n), errReader{errors.New("cut")}), resp.Body}
		}
		return nil
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.URL.Path, cut) {
			p.mu.Lock()
			if p.cut {
				p.rng = append(p.rng, r.Header.Get("Range"))
			}
			p.mu.Unlock()
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	p.URL = srv.URL
	return p
}

func (p *cuttingProxy) ranges() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.rng...)
}

// errReader fails every read with err.
type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// ddiAs sends a DDI request with the Authorization header auth, its answer
// checked against the OpenAPI document.
func ddiAs(t *testing.T, s *fleetdtest.Server, auth, method, path string, body any) *fleetdtest.Response {
	t.Helper()
	return s.Send(t, fleetdtest.Req{Method: method, Path: path, Body: body, Header: http.Header{"Authorization": {auth}}})
}

// ddiLinks polls a device's root and returns its links by name.
func ddiLinks(t *testing.T, s *fleetdtest.Server, auth, root string) map[string]string {
	t.Helper()
	var base struct {
		Links map[string]struct{ Href string } `json:"_links"`
	}
	ddiAs(t, s, auth, "GET", root, nil).Want(t, 200).Decode(t, &base)
	out := map[string]string{}
	for k, l := range base.Links {
		out[k] = strings.TrimPrefix(l.Href, s.URL)
	}
	return out
}

// TestDDISettings covers the tenant's DDI settings: defaults, the admin
// role to change them, the audit log, bad input and another tenant.
func TestDDISettings(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b)
		admin := s.Admin()
		beta := s.NewTenant(t, "beta")
		var set struct {
			RequireConfirmation bool `json:"require_confirmation"`
			GatewayRegistration bool `json:"gateway_registration"`
		}
		path := "/api/v1/tenants/default/ddi"
		s.Do(t, admin, "GET", path, nil).Want(t, 200).Decode(t, &set)
		if set.RequireConfirmation || set.GatewayRegistration {
			t.Fatalf("a new tenant's settings: %+v, want both off", set)
		}
		operator := s.NewKey(t, admin, "ops", "operator")
		s.Do(t, operator, "PUT", path, map[string]any{"require_confirmation": true, "gateway_registration": true}).Want(t, 403)
		for _, c := range []struct {
			body  any
			field string
		}{
			{map[string]any{"require_confirmation": true}, "gateway_registration"},
			{map[string]any{"require_confirmation": "yes", "gateway_registration": false}, "require_confirmation"},
			{map[string]any{"require_confirmation": true, "gateway_registration": false, "extra": 1}, "extra"},
		} {
			r := s.Do(t, admin, "PUT", path, c.body).Want(t, 400)
			if !strings.Contains(string(r.Body), c.field) {
				t.Errorf("%v: %s does not name %s", c.body, r.Body, c.field)
			}
		}
		s.Do(t, admin, "GET", path, nil).Want(t, 200).Decode(t, &set)
		if set.RequireConfirmation || set.GatewayRegistration {
			t.Fatalf("a refused change changed the settings: %+v", set)
		}
		s.Send(t, fleetdtest.Req{Method: "PUT", Path: path, Creds: admin, Body: map[string]any{"require_confirmation": true, "gateway_registration": false},
			Header: http.Header{"Prefer": {"return=representation"}}}).Want(t, 200).Decode(t, &set)
		if !set.RequireConfirmation || set.GatewayRegistration {
			t.Fatalf("after the change: %+v", set)
		}
		var logs struct {
			AuditLogs []struct {
				Actor   string
				Target  string
				Details map[string]any
			} `json:"audit_logs"`
		}
		s.Do(t, admin, "GET", "/api/v1/audit-logs?action=tenant.ddi", nil).Want(t, 200).Decode(t, &logs)
		if len(logs.AuditLogs) != 1 || logs.AuditLogs[0].Target != "tenants/default/ddi" ||
			!strings.Contains(fmt.Sprint(logs.AuditLogs[0].Details), "previous:map[gateway_registration:false require_confirmation:false] settings:map[gateway_registration:false require_confirmation:true]") {
			t.Fatalf("audit: %+v", logs.AuditLogs)
		}
		// Another tenant's settings are its own, and not reachable.
		s.Do(t, beta, "GET", "/api/v1/tenants/beta/ddi", nil).Want(t, 200).Decode(t, &set)
		if set.RequireConfirmation {
			t.Fatalf("beta's settings follow default's: %+v", set)
		}
		s.Do(t, beta, "PUT", path, map[string]any{"require_confirmation": false, "gateway_registration": false}).Want(t, 404)
		s.Do(t, admin, "GET", path, nil).Want(t, 200).Decode(t, &set)
		if !set.RequireConfirmation {
			t.Fatal("beta changed default's settings")
		}
	})
}

// TestDDIConfirmation drives hawkBit's confirmation flow as DDI's
// documentation has it: with the tenant requiring confirmations, the root
// links to confirmationBase instead of deploymentBase; denied keeps the
// update waiting, confirmed hands it over; automatic confirmation lets
// updates through until the device switches it off.
func TestDDIConfirmation(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b)
		admin := s.Admin()
		dev := s.MustDevice(t, admin, "ecu-1", nil)
		other := s.MustDevice(t, admin, "ecu-2", nil)
		target, root := "TargetToken "+dev.Token, "/default/controller/v1/ecu-1"
		s.MustUpload(t, admin, ddiBundle(t, "2.0.0", "images/rootfs.swu", []byte("rootfs 2.0.0")))
		update := func() int64 {
			return s.Dispatch(t, admin, map[string]any{"action": "update_firmware", "params": map[string]any{"version": "2.0.0"},
				"search_type": "default", "device_ids": []string{"ecu-1"}, "timeout": 600})
		}
		ddiSettings(t, s, admin, true, false)

		id := update()
		confirmation := fmt.Sprintf("%s/confirmationBase/%d", root, id)
		deployment := fmt.Sprintf("%s/deploymentBase/%d", root, id)
		t.Run("Waiting", func(t *testing.T) {
			links := ddiLinks(t, s, target, root)
			if links["confirmationBase"] != confirmation || links["deploymentBase"] != "" {
				t.Fatalf("root's links: %v; want confirmationBase/%d only", links, id)
			}
			r := ddiAs(t, s, target, "GET", deployment, nil).Want(t, 404)
			if !strings.Contains(string(r.Body), "confirm") {
				t.Errorf("deploymentBase of a waiting update: %s; it should say it waits for a confirmation", r.Body)
			}
			ddiAs(t, s, target, "POST", deployment+"/feedback", map[string]any{"status": map[string]any{
				"execution": "closed", "result": map[string]any{"finished": "success"}}}).Want(t, 404)
			var base struct {
				AutoConfirm map[string]any                   `json:"autoConfirm"`
				Links       map[string]struct{ Href string } `json:"_links"`
			}
			ddiAs(t, s, target, "GET", root+"/confirmationBase", nil).Want(t, 200).Decode(t, &base)
			if fmt.Sprint(base.AutoConfirm) != "map[active:false]" || keys(toAny(base.Links)) != "activateAutoConfirm confirmationBase" ||
				base.Links["confirmationBase"].Href != s.URL+confirmation {
				t.Fatalf("confirmationBase: %+v", base)
			}
			var action struct {
				ID            string
				Confirmation  map[string]any
				ActionHistory struct{ Status string } `json:"actionHistory"`
			}
			ddiAs(t, s, target, "GET", confirmation+"?actionHistory=1", nil).Want(t, 200).Decode(t, &action)
			chunks, _ := action.Confirmation["chunks"].([]any)
			if action.ID != fmt.Sprint(id) || len(chunks) != 1 || action.ActionHistory.Status != "WAIT_FOR_CONFIRMATION" {
				t.Fatalf("confirmationBase/%d: %+v", id, action)
			}
			if da := s.DeviceAction(t, admin, "ecu-1", id); da.ActionStatus != "Queued" {
				t.Fatalf("reading the confirmation handed the update over: %+v", da)
			}
		})

		t.Run("BadFeedback", func(t *testing.T) {
			for _, c := range []struct {
				body  any
				field string
			}{
				{map[string]any{"confirmation": "maybe"}, "confirmation"},
				{map[string]any{}, "confirmation"},
				{map[string]any{"confirmation": "confirmed", "code": "x"}, "code"},
				{map[string]any{"confirmation": "confirmed", "details": "x"}, "details"},
			} {
				r := ddiAs(t, s, target, "POST", confirmation+"/feedback", c.body).Want(t, 400)
				if !strings.Contains(string(r.Body), c.field) {
					t.Errorf("%v: %s does not name %s", c.body, r.Body, c.field)
				}
			}
			// Another device confirms nothing of ecu-1's.
			ddiAs(t, s, "TargetToken "+other.Token, "POST", confirmation+"/feedback", map[string]any{"confirmation": "confirmed"}).Want(t, 401)
			ddiAs(t, s, "TargetToken "+other.Token, "POST", fmt.Sprintf("/default/controller/v1/ecu-2/confirmationBase/%d/feedback", id),
				map[string]any{"confirmation": "confirmed"}).Want(t, 404)
			if da := s.DeviceAction(t, admin, "ecu-1", id); da.ActionStatus != "Queued" || da.Status != "Queued" {
				t.Fatalf("refused feedback changed the update: %+v", da)
			}
		})

		t.Run("DeniedThenConfirmed", func(t *testing.T) {
			// Unknown fields are ignored, as upstream does.
			ddiAs(t, s, target, "POST", confirmation+"/feedback", map[string]any{"confirmation": "denied", "code": 12,
				"details": []string{"the user said later"}, "timestamp": 1}).Want(t, 200)
			if da := s.DeviceAction(t, admin, "ecu-1", id); da.ActionStatus != "Queued" || da.Status != "ConfirmationDenied" {
				t.Fatalf("after denied: %+v", da)
			}
			if links := ddiLinks(t, s, target, root); links["confirmationBase"] != confirmation {
				t.Fatalf("a denied update no longer waits: %v", links)
			}
			ddiAs(t, s, target, "POST", confirmation+"/feedback", map[string]any{"confirmation": "confirmed"}).Want(t, 200)
			if da := s.DeviceAction(t, admin, "ecu-1", id); da.ActionStatus != "Queued" || da.Status != "Confirmed" {
				t.Fatalf("after confirmed: %+v", da)
			}
			if links := ddiLinks(t, s, target, root); links["deploymentBase"] != deployment || links["confirmationBase"] != "" {
				t.Fatalf("root after the confirmation: %v", links)
			}
			ddiAs(t, s, target, "GET", confirmation, nil).Want(t, 404)
			ddiAs(t, s, target, "POST", confirmation+"/feedback", map[string]any{"confirmation": "confirmed"}).Want(t, 404)
			ddiAs(t, s, target, "GET", deployment, nil).Want(t, 200)
			s.AwaitActionStatus(t, admin, "ecu-1", id, "Initiated")
			ddiAs(t, s, target, "POST", deployment+"/feedback", map[string]any{"status": map[string]any{
				"execution": "closed", "result": map[string]any{"finished": "success"}}}).Want(t, 200)
			ddiAs(t, s, target, "POST", confirmation+"/feedback", map[string]any{"confirmation": "denied"}).Want(t, 410)
		})

		t.Run("CancelWhileWaiting", func(t *testing.T) {
			id := update()
			s.Do(t, admin, "POST", fmt.Sprintf("/api/v1/actions/%d/cancel", id), nil).Want(t, 204)
			if da := s.DeviceAction(t, admin, "ecu-1", id); da.ActionStatus != "Cancelled" {
				t.Fatalf("a cancelled waiting update: %+v", da)
			}
			if links := ddiLinks(t, s, target, root); links["confirmationBase"] != "" || links["cancelAction"] != "" {
				t.Fatalf("root after the cancel of an update the device never had: %v", links)
			}
			ddiAs(t, s, target, "GET", fmt.Sprintf("%s/confirmationBase/%d", root, id), nil).Want(t, 410)
		})

		t.Run("AutoConfirm", func(t *testing.T) {
			ddiAs(t, s, target, "POST", root+"/confirmationBase/activateAutoConfirm", map[string]any{"initiator": "ops", "remark": "night\x00"}).Want(t, 400)
			ddiAs(t, s, target, "POST", root+"/confirmationBase/activateAutoConfirm", map[string]any{"initiator": strings.Repeat("x", 1025)}).Want(t, 400)
			ddiAs(t, s, target, "POST", root+"/confirmationBase/activateAutoConfirm", map[string]any{"initiator": "ops", "remark": "night shift"}).Want(t, 200)
			ddiAs(t, s, target, "POST", root+"/confirmationBase/activateAutoConfirm", nil).Want(t, 409)
			var base struct {
				AutoConfirm struct {
					Active      bool
					Initiator   string
					Remark      string
					ActivatedAt int64 `json:"activatedAt"`
				} `json:"autoConfirm"`
				Links map[string]any `json:"_links"`
			}
			ddiAs(t, s, target, "GET", root+"/confirmationBase", nil).Want(t, 200).Decode(t, &base)
			if a := base.AutoConfirm; !a.Active || a.Initiator != "ops" || a.Remark != "night shift" || a.ActivatedAt == 0 || keys(base.Links) != "deactivateAutoConfirm" {
				t.Fatalf("confirmationBase with autoConfirm: %+v", base)
			}
			// ecu-2 has its own: its updates still wait.
			ddiAs(t, s, "TargetToken "+other.Token, "GET", "/default/controller/v1/ecu-2/confirmationBase", nil).Want(t, 200).Decode(t, &base)
			if base.AutoConfirm.Active {
				t.Fatal("ecu-1's automatic confirmation is ecu-2's")
			}
			id := update()
			if links := ddiLinks(t, s, target, root); links["deploymentBase"] != fmt.Sprintf("%s/deploymentBase/%d", root, id) {
				t.Fatalf("an update with autoConfirm active: %v", links)
			}
			ddiAs(t, s, target, "POST", root+"/confirmationBase/deactivateAutoConfirm", nil).Want(t, 200)
			ddiAs(t, s, target, "POST", root+"/confirmationBase/deactivateAutoConfirm", nil).Want(t, 200)
			if links := ddiLinks(t, s, target, root); links["confirmationBase"] != fmt.Sprintf("%s/confirmationBase/%d", root, id) {
				t.Fatalf("after deactivateAutoConfirm: %v", links)
			}
		})

		t.Run("DeviceMadeAgain", func(t *testing.T) {
			// A device deleted and made again does not inherit its
			// predecessor's automatic confirmation.
			ddiAs(t, s, "TargetToken "+other.Token, "POST", "/default/controller/v1/ecu-2/confirmationBase/activateAutoConfirm", nil).Want(t, 200)
			s.Do(t, admin, "DELETE", "/api/v1/devices/ecu-2", nil).Want(t, 204)
			again := s.MustDevice(t, admin, "ecu-2", nil)
			var base struct {
				AutoConfirm struct{ Active bool } `json:"autoConfirm"`
			}
			ddiAs(t, s, "TargetToken "+again.Token, "GET", "/default/controller/v1/ecu-2/confirmationBase", nil).Want(t, 200).Decode(t, &base)
			if base.AutoConfirm.Active {
				t.Fatal("the device made again confirms by itself")
			}
		})

		t.Run("OffAgain", func(t *testing.T) {
			// Without the setting, waiting updates are handed over, and
			// confirmationBase names nothing to confirm.
			ddiSettings(t, s, admin, false, false)
			links := ddiLinks(t, s, target, root)
			if !strings.Contains(links["deploymentBase"], "/deploymentBase/") {
				t.Fatalf("root with the setting off: %v", links)
			}
			id := strings.TrimPrefix(links["deploymentBase"], root+"/deploymentBase/")
			r := ddiAs(t, s, target, "POST", root+"/confirmationBase/"+id+"/feedback", map[string]any{"confirmation": "confirmed"}).Want(t, 404)
			if !strings.Contains(string(r.Body), "does not require") {
				t.Errorf("confirmation in a tenant without the setting: %s", r.Body)
			}
		})
	})
}

// toAny is m as a JSON object, for keys.
func toAny[V any](m map[string]V) any {
	out := map[string]any{}
	for k, v := range m {
		out[k] = v
	}
	return out
}

// TestDDIGatewayRegistration: with the tenant's gateway_registration on,
// a gateway's poll for an unknown controller creates the device, audited,
// counted and within the tenant's registration rate; off, 404 as before.
func TestDDIGatewayRegistration(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		s := fleetdtest.Start(t, b, "--ddi-registration-rate-burst", "3", "--ddi-registration-rate-limit", "0.001")
		admin := s.Admin()
		beta := s.NewTenant(t, "beta")
		gateway := "GatewayToken " + s.NewKey(t, admin, "gateway", "device").Key
		betaGateway := "GatewayToken " + s.NewKey(t, beta, "gateway", "device").Key
		exists := func(c fleetdtest.Creds, id string) bool {
			return s.Do(t, c, "GET", "/api/v1/devices/"+id, nil).Status == 200
		}
		registered := func(outcome string) string {
			r := s.Do(t, fleetdtest.Creds{}, "GET", "/metrics", nil).Want(t, 200)
			for _, line := range strings.Split(string(r.Body), "\n") {
				if v, ok := strings.CutPrefix(line, `fleetd_ddi_gateway_registrations_total{outcome="`+outcome+`"} `); ok {
					return v
				}
			}
			return "0"
		}

		ddiAs(t, s, gateway, "GET", "/default/controller/v1/gw-1", nil).Want(t, 404)
		if exists(admin, "gw-1") {
			t.Fatal("a poll registered a device with the setting off")
		}
		ddiSettings(t, s, admin, false, true)

		// Only a gateway registers, only on the root, only in its tenant.
		ddiAs(t, s, "TargetToken fdt_nothing", "GET", "/default/controller/v1/gw-1", nil).Want(t, 401)
		ddiAs(t, s, "GatewayToken "+s.NewKey(t, admin, "watcher", "viewer").Key, "GET", "/default/controller/v1/gw-1", nil).Want(t, 403)
		ddiAs(t, s, gateway, "GET", "/default/controller/v1/gw-1/confirmationBase", nil).Want(t, 404)
		ddiAs(t, s, gateway, "PUT", "/default/controller/v1/gw-1/configData", map[string]any{"data": map[string]any{"a": "b"}}).Want(t, 404)
		ddiAs(t, s, gateway, "GET", "/beta/controller/v1/gw-1", nil).Want(t, 401)
		ddiAs(t, s, betaGateway, "GET", "/beta/controller/v1/gw-1", nil).Want(t, 404)
		if exists(admin, "gw-1") || exists(beta, "gw-1") {
			t.Fatal("a refused poll registered a device")
		}
		r := ddiAs(t, s, gateway, "GET", "/default/controller/v1/a*b", nil).Want(t, 400)
		if !strings.Contains(string(r.Body), "controllerId") {
			t.Errorf("an invalid controllerId: %s", r.Body)
		}

		links := ddiLinks(t, s, gateway, "/default/controller/v1/gw-1")
		if !exists(admin, "gw-1") || links["configData"] == "" {
			t.Fatalf("after the gateway's poll: exists %v, links %v; want the device, asked for its attributes", exists(admin, "gw-1"), links)
		}
		if exists(beta, "gw-1") {
			t.Fatal("default's gateway registered a device in beta")
		}
		ddiAs(t, s, gateway, "GET", "/default/controller/v1/gw-1", nil).Want(t, 200)
		var logs struct {
			AuditLogs []struct{ Actor, Target string } `json:"audit_logs"`
		}
		s.Do(t, admin, "GET", "/api/v1/audit-logs?action=device.create", nil).Want(t, 200).Decode(t, &logs)
		if len(logs.AuditLogs) != 1 || logs.AuditLogs[0].Actor != "gateway" || logs.AuditLogs[0].Target != "devices/gw-1" {
			t.Fatalf("audit: %+v; want one device.create by the gateway's key", logs.AuditLogs)
		}

		// The bound: bursts of 3 here, then one a second per tenant.
		ddiAs(t, s, gateway, "GET", "/default/controller/v1/gw-2", nil).Want(t, 200)
		ddiAs(t, s, gateway, "GET", "/default/controller/v1/gw-3", nil).Want(t, 200)
		r = ddiAs(t, s, gateway, "GET", "/default/controller/v1/gw-4", nil).Want(t, 429)
		if r.Header.Get("Retry-After") == "" || exists(admin, "gw-4") {
			t.Fatalf("beyond the burst: Retry-After %q, device made %v", r.Header.Get("Retry-After"), exists(admin, "gw-4"))
		}
		ddiAs(t, s, gateway, "GET", "/default/controller/v1/gw-1", nil).Want(t, 200) // known devices poll on
		if c, l := registered("created"), registered("rate_limited"); c != "3" || l != "1" {
			t.Fatalf("metrics: created %s, rate_limited %s; want 3 and 1", c, l)
		}
		// beta's bucket is its own.
		ddiSettings(t, s, beta, false, true)
		ddiAs(t, s, betaGateway, "GET", "/beta/controller/v1/gw-1", nil).Want(t, 200)
	})
}
