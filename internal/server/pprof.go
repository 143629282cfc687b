package server

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"runtime/debug"
	"time"

	"github.com/fleetd/fleet/internal/cli"
)

// pprofFlags registers --pprof-addr, which serves Go's profiles for
// cmd/fleetbench --profile. It is hidden from --help: it is for measuring
// fleetd, and anyone who can reach it can read the process's memory
// layout, so it is never on by default.
func (c *Config) pprofFlags(fs *cli.FlagSet) {
	fs.StringVar(&c.pprofAddr, "pprof-addr", "", "`ADDR` to serve Go's runtime profiles on (/debug/pprof/); off when empty")
	fs.Hide("pprof-addr")
}

// servePprof serves /debug/pprof/ on addr; the returned function stops it
// and waits. An empty addr serves nothing.
func servePprof(addr string, log *slog.Logger) (func(), error) {
	if addr == "" {
		return func() {}, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--pprof-addr: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	// For measuring what memory stays in use (TestIdleConnectionMemory):
	// collections, and what they freed given back to the system, so that
	// the resident size is what is live rather than the collector's slack.
	// Two: the first only moves what sync.Pools hold to their victim caches.
	mux.HandleFunc("POST /debug/freeosmemory", func(w http.ResponseWriter, r *http.Request) {
		debug.FreeOSMemory()
		debug.FreeOSMemory()
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			log.Error("pprof server", "err", err)
		}
	}()
	log.Warn("serving runtime profiles; do not expose this address", "pprof_addr", ln.Addr().String())
	return func() { srv.Close(); <-done }, nil
}
