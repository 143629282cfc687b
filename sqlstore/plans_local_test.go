package sqlstore

import (
	"context"
	"math"
	"strings"
	"testing"

	"github.com/fleetd/fleet"
)

// TestActionWideStatementsReadTheAction checks SQLite's plans of the
// statements that read one status of an action's device actions: without
// statistics, SQLite's planner chose the covering device_actions_by_device
// on its tenant prefix for them, reading every device action the tenant
// ever had (of every action) for each dispatch's delivery and each cancel.
// Those of Queued device actions read the action's rows through the
// primary key, since device_actions_by_status leaves them out (migration
// 0045); the others read their status's range of it.
func TestActionWideStatementsReadTheAction(t *testing.T) {
	db := openLocal(t, math.MaxInt)
	const (
		byKey    = "USING INDEX " + primaryKey + " (tenant=? AND action_id=?)"
		byStatus = "device_actions_by_status (tenant=? AND action_id=? AND action_status=?)"
	)
	cancel := strings.Replace(sqlite.nothingToCancel(), "{from}", statusIndexed(moveNothingToCancel.from[:1]), 1)
	move := func(m move, i int) string {
		by := ""
		if m.from[i] == fleet.StatusQueued {
			by = sqlite.indexedBy(primaryKey)
		}
		return strings.Replace("UPDATE device_actions"+by+" SET "+m.set+" WHERE tenant = ? AND action_id = ? AND {from}", "{from}", statusIndexed(m.from[i:i+1]), 1)
	}
	for name, c := range map[string]struct{ q, want string }{
		"PendingDevices":    {sqlite.pendingOfAction(), byKey},
		"untoldOf":          {"SELECT id FROM devices WHERE tenant = ? AND " + sqlite.untoldOf("acme", 1).cond, byStatus},
		"nothingToCancel":   {cancel, byKey},
		"cancel, Queued":    {move(moveCancel, 1), byKey},
		"cancel, Scheduled": {move(moveCancel, 0), byStatus},
		"cancel, told":      {move(moveCancelTold, 0), byStatus},
	} {
		args := make([]any, strings.Count(c.q, "?"))
		for i := range args {
			args[i] = "x"
		}
		plan, err := db.explain(context.Background(), c.q, args...)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(plan, c.want) || strings.Contains(plan, "device_actions_by_device (tenant=?)") {
			t.Errorf("%s reads the tenant's device actions, not the action's (want %s):\n%s", name, c.want, plan)
		}
	}
}
