package sqlstore

import (
	"context"
	"database/sql/driver"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
)

// connectWait bounds how long a new PostgreSQL connection waits for the
// server to have room for it (tooManyClients): the request that needed the
// connection then fails with 503 (classify). A burst of other clients, the
// other replicas' or tools', holds the server's last slots for moments,
// not for seconds; a server whose max_connections is below what its
// clients keep open (docs/operations.md: 20 per replica) refuses for good,
// and waiting longer would only hold the request.
const connectWait = 5 * time.Second

// pgConnector opens the pool's PostgreSQL connections. A connection the
// server refuses because it has max_connections clients already is tried
// again, after pauses that grow, for up to wait (or until ctx ends): were
// the refusal the request's answer, every request that needed one more
// connection at that moment (sixteen remote session opens at once, say)
// would be answered 503, as if fleetd were down.
type pgConnector struct {
	driver.Connector
	wait time.Duration
}

// newPGConnector returns the connector of dsn's pool.
func newPGConnector(dsn string) (driver.Connector, error) {
	c, err := stdlib.GetDefaultDriver().(driver.DriverContext).OpenConnector(dsn)
	if err != nil {
		return nil, err
	}
	return pgConnector{Connector: c, wait: connectWait}, nil
}

func (c pgConnector) Connect(ctx context.Context) (driver.Conn, error) {
	deadline := time.Now().Add(c.wait)
	pause := 5 * time.Millisecond
	for {
		conn, err := c.Connector.Connect(ctx)
		if err == nil || !tooManyClients(err) || time.Until(deadline) < pause {
			return conn, err
		}
		t := time.NewTimer(pause/2 + rand.N(pause))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, err
		}
		pause = min(2*pause, 250*time.Millisecond)
	}
}

// tooManyClients reports whether err is PostgreSQL's refusal of a
// connection because it has max_connections clients (53300).
func tooManyClients(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "53300"
}
