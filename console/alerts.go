package console

import (
	"net/http"

	"github.com/fleetd/fleet"
)

// alertsData is the alerts page's.
type alertsData struct {
	Rules  []*fleet.AlertRule
	RulesN int
	State  string // filter of the alerts: active, ended or both
	Alerts []*fleet.Alert
	Pager  pager
}

func (c *Console) handleAlerts(w http.ResponseWriter, r *http.Request, v *view) error {
	ctx, tenant := r.Context(), v.Actor.Tenant
	p, err := readPage(r)
	if err != nil {
		return err
	}
	d := alertsData{State: r.URL.Query().Get("state")}
	if d.State != "" && d.State != fleet.AlertActive && d.State != fleet.AlertEnded {
		return fleet.Errorf(fleet.EINVALID, "state must be active or ended")
	}
	if d.Rules, d.RulesN, err = c.Alerts.FindAlertRules(ctx, tenant, fleet.Page{Page: 1, Limit: 100}); err != nil {
		return err
	}
	alerts, n, err := c.Alerts.FindAlerts(ctx, tenant, fleet.AlertFilter{State: d.State, Page: p})
	if err != nil {
		return err
	}
	d.Alerts, d.Pager = alerts, newPager(r, p, n)
	v.Title, v.Nav, v.Data = "Alerts", "alerts", d
	c.render(w, r, http.StatusOK, "alerts", v)
	return nil
}

// handleDeleteAlertRule deletes a rule with its alerts and notification
// rules, as DELETE /api/v1/alert-rules/{id} does.
func (c *Console) handleDeleteAlertRule(w http.ResponseWriter, r *http.Request, v *view) error {
	if err := c.Alerts.DeleteAlertRule(r.Context(), v.Actor.Tenant, r.PathValue("id")); err != nil {
		return err
	}
	http.Redirect(w, r, "/console/alerts", http.StatusSeeOther)
	return nil
}
