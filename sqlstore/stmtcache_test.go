package sqlstore

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
)

// TestReadTxNeverWaitsToPrepare holds every connection of the read pool in
// a read transaction and runs in each a query not yet prepared. Preparing
// it on the pool would wait for a free connection, which none of them will
// ever give back: the streams benchmark hung so (one run in five), its
// devices' publishes waiting out their deadline behind FindStreamSnapshot.
func TestReadTxNeverWaitsToPrepare(t *testing.T) {
	ctx := context.Background()
	db := openLocal(t, 0)
	conns := db.read.Stats().MaxOpenConnections
	if conns == 0 {
		t.Fatal("the read pool is unbounded; this test needs its bound")
	}
	txs := make([]readTx, conns)
	for i := range txs {
		tx, err := db.readTx(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		txs[i] = tx
	}
	// A deadline never reached when nothing waits: on the old code every
	// query below waited it out and then failed.
	qctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, conns)
	for i, tx := range txs {
		wg.Go(func() {
			var n int
			errs[i] = tx.queryRow(qctx, fmt.Sprintf("SELECT %d + count(*) FROM sqlite_master", i)).Scan(&n)
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("transaction %d of %d: %v", i, conns, err)
		}
	}
}
