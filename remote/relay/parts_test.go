package relay

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetd/fleet/blob"
	"github.com/fleetd/fleet/sqlstore/sqlstoretest"
)

// TestOldPartsGoTogether: the retention removes a session's recording
// parts once the newest of them is old, all together; while a newer part
// is being stored (the session is open, and longer than the retention),
// the old ones stay, since they are the start of the recording its parts
// would be served as were its replica lost.
func TestOldPartsGoTogether(t *testing.T) {
	sqlstoretest.Run(t, func(t *testing.T, b sqlstoretest.Backend) {
		ctx := context.Background()
		db := sqlstoretest.MustOpen(t, b, sqlstoretest.Options{})
		root := t.TempDir()
		store, err := blob.OpenDir(root)
		if err != nil {
			t.Fatal(err)
		}
		h := NewHub(db, nil, store, t.TempDir(), Limits{RecordingRetention: time.Hour}, nil, nil)
		first, second := partKey("default", "s1", 0), partKey("default", "s1", 7)
		for _, key := range []string{first, second} {
			if err := h.put(ctx, key, strings.NewReader("[0.1, \"o\", \"x\"]\n")); err != nil {
				t.Fatal(err)
			}
		}
		age := func(key string) {
			t.Helper()
			long := time.Now().Add(-2 * time.Hour)
			if err := os.Chtimes(filepath.Join(append([]string{root}, strings.Split(key, "/")...)...), long, long); err != nil {
				t.Fatal(err)
			}
		}
		kept := func() int {
			t.Helper()
			keys, err := h.partKeys(ctx, "default", "s1")
			if err != nil {
				t.Fatal(err)
			}
			return len(keys)
		}
		age(first)
		if _, err := h.RemoveOldRecordings(ctx); err != nil {
			t.Fatal(err)
		}
		if n := kept(); n != 2 {
			t.Fatalf("%d of the open session's 2 parts kept: its first is gone while its second is new", n)
		}
		age(second)
		if n, err := h.RemoveOldRecordings(ctx); err != nil || n != 1 {
			t.Fatalf("removed %d recordings (%v), want 1", n, err)
		}
		if n := kept(); n != 0 {
			t.Fatalf("%d parts kept once all were old", n)
		}
	})
}
