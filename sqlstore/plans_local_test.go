package sqlstore

import (
	"context"
	"math"
	"strings"
	"testing"
)

// TestActionWideStatementsReadTheAction checks SQLite's plans of the
// statements that read one status of an action's device actions: without
// statistics, SQLite's planner chose the covering device_actions_by_device
// on its tenant prefix for them, reading every device action the tenant
// ever had (of every action) for each dispatch's delivery and each cancel.
func TestActionWideStatementsReadTheAction(t *testing.T) {
	db := openLocal(t, math.MaxInt)
	cancel := strings.Replace(sqlite.nothingToCancel(), "{from}", statusIn(moveNothingToCancel.from[:1]), 1)
	for name, q := range map[string]string{
		"PendingDevices":  sqlite.pendingOfAction(),
		"untoldOf":        "SELECT id FROM devices WHERE tenant = ? AND " + sqlite.untoldOf("acme", 1).cond,
		"nothingToCancel": cancel,
	} {
		args := make([]any, strings.Count(q, "?"))
		for i := range args {
			args[i] = "x"
		}
		plan, err := db.explain(context.Background(), q, args...)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(plan, "device_actions_by_status (tenant=? AND action_id=? AND action_status=?)") ||
			strings.Contains(plan, "device_actions_by_device (tenant=?)") {
			t.Errorf("%s reads the tenant's device actions, not the action's:\n%s", name, plan)
		}
	}
}
