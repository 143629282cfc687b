package console_test

import (
	"fmt"
	"html"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/fleetd/fleet/internal/fleetdtest"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestConsoleRollouts: the rollout builder builds what the API can (any
// number of phases, every gate), counts each phase before anything is
// sent; abort and cancel say what they will do before they do it; phases
// are numbered as the API numbers them; an aborted rollout does not look
// finished; the actions list tells versions apart and keeps the
// cancel_actions aborts send on their action's page.
func TestConsoleRollouts(t *testing.T) {
	t.Parallel()
	sqlstoretest.Run(t, func(t *testing.T, be sqlstoretest.Backend) {
		s := fleetdtest.Start(t, be)
		admin := s.Admin()
		operator := s.NewKey(t, admin, "olivia", "operator")
		for i := 1; i <= 4; i++ {
			s.Do(t, admin, "POST", "/api/v1/devices", map[string]any{"id": fmt.Sprintf("r-%d", i)}).Want(t, 201)
		}
		rule := s.MustAlertRule(t, admin, map[string]any{"name": "too hot", "stream": "telemetry",
			"condition": map[string]any{"field": "temperature", "operator": ">", "value": 80}})
		s.MustUpload(t, admin, fleetdtest.MakeBundle(t, "2.3.0", fleetdtest.Bootloader, fleetdtest.App230))
		b := fleetdtest.NewBrowser(t, s.URL)
		b.SignIn("default", operator.Key)

		// form is the builder's form: three phases, each kind, each gate.
		form := func(tok string) url.Values {
			return url.Values{"csrf": {tok}, "action": {"update_firmware"}, "params": {`{"version": "2.3.0"}`}, "search_type": {"all"},
				"rollout": {"on"}, "phases": {"3"}, "release_notes": {"fixes the <b>watchdog</b>"},
				"phase0_name": {"lab"}, "phase0_kind": {"fixed_list"}, "phase0_value": {"r-2"}, "phase0_trigger": {"now"},
				"phase1_name": {"canary"}, "phase1_kind": {"percentage"}, "phase1_value": {"50"}, "phase1_trigger": {"manual"},
				"phase1_gate_rules": {rule.ID}, "phase1_gate_watch": {"60"},
				"phase2_name": {"everyone"}, "phase2_kind": {"percentage"}, "phase2_value": {"100"}, "phase2_trigger": {"after_previous"},
				"phase2_gate_rate": {"25"}, "phase2_gate_min": {"2"}}
		}

		t.Run("RollOutThisBundle", func(t *testing.T) {
			res := b.Get("/console/firmware").Want(t, 200)
			link := regexp.MustCompile(`href="(/console/actions/new\?action=update_firmware&amp;version=2\.3\.0&amp;rollout=1)">Roll out this bundle<`)
			bundlePage := regexp.MustCompile(`href="(/console/firmware/[0-9a-f-]{36})"`).FindStringSubmatch(res.Body)
			if bundlePage == nil {
				t.Fatalf("no bundle link:\n%s", res.Body)
			}
			m := link.FindStringSubmatch(b.Get(bundlePage[1]).Want(t, 200).Body)
			if m == nil {
				t.Fatal("the bundle's page has no \"Roll out this bundle\"")
			}
			res = b.Get(html.UnescapeString(m[1])).Want(t, 200)
			fleetdtest.WantContains(t, "the builder from a bundle", res.Body, `id="rollout" name="rollout" checked`, `{&#34;version&#34;: &#34;2.3.0&#34;}</textarea>`,
				`name="phase0_name" value="canary"`, `name="phase1_name" value="everyone"`, `<option value="`+rule.ID+`">too hot</option>`)
		})
		t.Run("AddAndRemovePhases", func(t *testing.T) {
			tok := b.Get("/console/actions/new").Want(t, 200).CSRF(t)
			f := form(tok)
			f.Set("add_phase", "1")
			res := b.Do("POST", "/console/actions/new", f).Want(t, 200)
			fleetdtest.WantContains(t, "a fourth row", res.Body, `name="phases" value="4"`, `aria-label="phase 3 name"`, `name="phase2_name" value="everyone"`)
			f = form(tok)
			f.Set("remove_phase", "1")
			res = b.Do("POST", "/console/actions/new", f).Want(t, 200)
			fleetdtest.WantContains(t, "a row less", res.Body, `name="phases" value="2"`, `name="phase1_name" value="everyone"`)
			if strings.Contains(res.Body, `value="canary"`) {
				t.Fatal("the removed row is still there")
			}
		})
		t.Run("CountEachPhase", func(t *testing.T) {
			tok := b.Get("/console/actions/new").CSRF(t)
			f := form(tok)
			f.Set("preview", "1")
			res := b.Do("POST", "/console/actions/new", f).Want(t, 200)
			// Four targets: the listed one, then 50% cumulative (2) less
			// the one taken, then the rest.
			for i, want := range []int{1, 1, 2} {
				fleetdtest.WantContains(t, "phase counts", res.Body, fmt.Sprintf(`<td data-phase-count="%d">%d</td>`, i, want))
			}
		})
		var id int64
		t.Run("DispatchEveryGate", func(t *testing.T) {
			tok := b.Get("/console/actions/new").CSRF(t)
			f := form(tok)
			f.Set("dispatch", "1")
			res := b.Do("POST", "/console/actions/new", f).Want(t, 303)
			fmt.Sscanf(res.Header.Get("Location"), "/console/actions/%d", &id)
			var a struct {
				Schedule struct {
					Phases []struct {
						Gate *struct {
							MaxFailureRate *float64 `json:"max_failure_rate"`
							MinFinished    int      `json:"min_finished"`
							AlertRules     []string `json:"alert_rules"`
							WatchSeconds   int      `json:"watch_seconds"`
						}
					}
				}
			}
			s.Do(t, admin, "GET", fmt.Sprintf("/api/v1/actions/%d", id), nil).Want(t, 200).Decode(t, &a)
			ph := a.Schedule.Phases
			if len(ph) != 3 || ph[0].Gate != nil || ph[1].Gate == nil || len(ph[1].Gate.AlertRules) != 1 || ph[1].Gate.AlertRules[0] != rule.ID ||
				ph[1].Gate.WatchSeconds != 60 || ph[2].Gate == nil || *ph[2].Gate.MaxFailureRate != 0.25 || ph[2].Gate.MinFinished != 2 {
				t.Fatalf("schedule %+v", a.Schedule)
			}
		})
		t.Run("MetadataPhaseAndFinishedRatio", func(t *testing.T) {
			tok := b.Get("/console/actions/new").CSRF(t)
			f := url.Values{"csrf": {tok}, "action": {"reboot"}, "params": {`{}`}, "search_type": {"all"}, "rollout": {"on"}, "phases": {"2"},
				"phase0_name": {"lab"}, "phase0_kind": {"metadata"}, "phase0_value": {"ring=lab, site=berlin"}, "phase0_trigger": {"manual"},
				"phase1_name": {"rest"}, "phase1_kind": {"percentage"}, "phase1_value": {"100"}, "phase1_trigger": {"after_previous"},
				"phase1_ratio": {"90"}}
			f.Set("preview", "1")
			res := b.Do("POST", "/console/actions/new", f).Want(t, 200)
			fleetdtest.WantContains(t, "a metadata phase's count, known when it triggers", res.Body, `<td data-phase-count="0">—</td>`, `<td data-phase-count="1">4</td>`)
			f.Del("preview")
			f.Set("phase0_value", "ring")
			fleetdtest.WantContains(t, "a pair without =", b.Do("POST", "/console/actions/new", f).Want(t, 400).Body, "must be KEY=VALUE pairs")
			f.Set("phase0_value", "ring=lab, site=berlin")
			f.Set("dispatch", "1")
			res = b.Do("POST", "/console/actions/new", f).Want(t, 303)
			var mid int64
			fmt.Sscanf(res.Header.Get("Location"), "/console/actions/%d", &mid)
			var a struct {
				Schedule struct {
					Phases []struct {
						TriggerOn struct {
							FinishedRatio float64 `json:"finished_ratio"`
						} `json:"trigger_on"`
						Info struct {
							Type     string            `json:"type"`
							Metadata map[string]string `json:"metadata"`
						}
					}
				}
			}
			s.Do(t, admin, "GET", fmt.Sprintf("/api/v1/actions/%d", mid), nil).Want(t, 200).Decode(t, &a)
			ph := a.Schedule.Phases
			if len(ph) != 2 || ph[0].Info.Type != "metadata" || ph[0].Info.Metadata["ring"] != "lab" || ph[0].Info.Metadata["site"] != "berlin" ||
				ph[1].TriggerOn.FinishedRatio != 0.9 {
				t.Fatalf("schedule %+v", a.Schedule)
			}
			s.Do(t, admin, "POST", fmt.Sprintf("/api/v1/actions/%d/cancel", mid), nil)
		})
		t.Run("AbortSaysWhatItDoes", func(t *testing.T) {
			fleetdtest.Eventually(t, "the first phase to release", func() bool { return s.Action(t, admin, id).Statuses["Queued"] == 1 })
			s.Report(t, "r-2", id, "Downloading")
			res := b.Get(fmt.Sprintf("/console/actions/%d", id)).Want(t, 200)
			fleetdtest.WantContains(t, "the action page", res.Body,
				`data-confirm="Abort rollout #`+fmt.Sprint(id)+` (update_firmware)? No further phase is released, and this cancels the 4 device actions not finished: 3 not yet on their device are cancelled at once, and the 1 device that has it (mid-download, for an update) is sent a cancel_action and asked to stop. It cannot be undone."`,
				`<td>0 lab</td>`, `<td>1 canary</td>`, `<td>2 everyone</td>`, "no alert of 1 rule within 60 s of completing",
				"at most 25% of finished failed, judged from 2 finished")
			b.Do("POST", fmt.Sprintf("/console/actions/%d/abort", id), url.Values{"csrf": {res.CSRF(t)}}).Want(t, 303)
			res = b.Get(fmt.Sprintf("/console/actions/%d", id)).Want(t, 200)
			fleetdtest.WantContains(t, "an aborted rollout", res.Body, `class="stopped"`, `<span data-finished-line hidden>`,
				`<span data-aborted-line>aborted: <span data-count="Completed">0</span> of 4 completed, <span data-count="Cancelled">3</span> cancelled</span>`)
		})
		t.Run("ActionsList", func(t *testing.T) {
			res := b.Get("/console/actions").Want(t, 200)
			fleetdtest.WantContains(t, "the list", res.Body, "version=2.3.0", "fixes the &lt;b&gt;watchdog&lt;/b&gt;", `href="/console/actions?action=cancel_action"`)
			if strings.Contains(res.Body, " cancel_action</a>") {
				t.Fatalf("the abort's cancel_action is listed as an action of its own:\n%s", res.Body)
			}
			fleetdtest.WantContains(t, "cancel_actions by name", b.Get("/console/actions?action=cancel_action").Want(t, 200).Body, " cancel_action</a>", "action_id=")
		})
		t.Run("DeleteSaysWhatItDoes", func(t *testing.T) {
			fleetdtest.WantContains(t, "the rule's page", b.Get("/console/alerts/rules/"+rule.ID).Want(t, 200).Body,
				`data-confirm="Delete rule too hot? Its 0 notification rules, its 0 alerts and their pending notifications are deleted with it. It cannot be undone."`)
		})
		t.Run("CancelSaysWhatItDoes", func(t *testing.T) {
			other := s.Dispatch(t, admin, map[string]any{"action": "reboot", "params": map[string]any{}, "search_type": "all"})
			res := b.Get(fmt.Sprintf("/console/actions/%d", other)).Want(t, 200)
			fleetdtest.WantContains(t, "cancel", res.Body, fmt.Sprintf(`data-confirm="Cancel action #%d (reboot)? This cancels the 4 device actions not finished: 4 not yet on their device are cancelled at once, and the 0 devices`, other))
		})
	})
}
