package sqlstore

import (
	"runtime"
	"unsafe"

	"modernc.org/libc"
	sqlite3 "modernc.org/sqlite/lib"
)

// MemoryStats is what the store's connections hold, for /metrics: where
// an idle fleetd's resident memory goes (docs/benchmarks-notebook.md,
// "Idle connections from a restart").
type MemoryStats struct {
	// Connections of the read pool open now (SQLite's query-only pool;
	// on PostgreSQL the one pool). Each SQLite connection holds its own
	// schema, lookaside buffer, page cache and prepared statements in
	// modernc's C heap, which keeps what SQLite frees: a connection
	// opened once costs its memory for the life of the process.
	ReadConns int
	// SQLite's page caches, every connection's together, but for the
	// first 20 pages of each (allocated with the connection): SQLite's
	// SQLITE_STATUS_PAGECACHE_OVERFLOW. 0 on PostgreSQL.
	SQLitePageCache int64
}

// Memory reports MemoryStats now.
func (db *DB) Memory() MemoryStats {
	m := MemoryStats{ReadConns: db.read.Stats().OpenConnections}
	if db.dialect == sqlite {
		m.SQLitePageCache = sqliteStatus(sqlite3.SQLITE_STATUS_PAGECACHE_OVERFLOW)
	}
	return m
}

// sqliteStatus is sqlite3_status64(op)'s current value: process-wide,
// whichever connection allocated it. (SQLITE_STATUS_MEMORY_USED reads 0:
// modernc's SQLite is built without memory statistics.)
func sqliteStatus(op int32) int64 {
	tls := libc.NewTLS()
	defer tls.Close()
	v := new([2]int64) // current, highwater; pinned while SQLite writes them
	var pin runtime.Pinner
	pin.Pin(v)
	defer pin.Unpin()
	p := uintptr(unsafe.Pointer(v))
	if sqlite3.Xsqlite3_status64(tls, op, p, p+8, 0) != sqlite3.SQLITE_OK {
		return 0
	}
	return v[0]
}
