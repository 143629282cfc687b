package sqlstore

import (
	"context"
	"database/sql/driver"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// refusingConnector refuses its first refusals connections as a full
// PostgreSQL does, then opens them.
type refusingConnector struct {
	refusals, calls int
}

func (c *refusingConnector) Connect(context.Context) (driver.Conn, error) {
	c.calls++
	if c.calls <= c.refusals {
		return nil, &pgconn.ConnectError{Config: &pgconn.Config{}}
	}
	return nil, nil
}

func (c *refusingConnector) Driver() driver.Driver { return nil }

// full is the error a connection to a PostgreSQL at max_connections gets.
var full = &pgconn.PgError{Severity: "FATAL", Code: "53300", Message: "sorry, too many clients already"}

// fullConnector refuses as refusingConnector does, with PostgreSQL's 53300.
type fullConnector struct{ refusingConnector }

func (c *fullConnector) Connect(ctx context.Context) (driver.Conn, error) {
	if _, err := c.refusingConnector.Connect(ctx); err != nil {
		return nil, errors.Join(errors.New("failed to connect"), full)
	}
	return nil, nil
}

// TestPGConnectorWaitsForRoom: a connection PostgreSQL refuses for having
// max_connections clients is tried again until the server has room, within
// the connector's wait; any other refusal is the caller's at once, and a
// server that stays full is, once the wait has passed.
func TestPGConnectorWaitsForRoom(t *testing.T) {
	ctx := context.Background()
	c := &fullConnector{refusingConnector{refusals: 3}}
	if _, err := (pgConnector{Connector: c, wait: time.Minute}).Connect(ctx); err != nil || c.calls != 4 {
		t.Fatalf("err %v after %d tries, want a connection at the 4th", err, c.calls)
	}

	other := &refusingConnector{refusals: 3}
	if _, err := (pgConnector{Connector: other, wait: time.Minute}).Connect(ctx); err == nil || other.calls != 1 {
		t.Fatalf("err %v after %d tries, want the refusal at once", err, other.calls)
	}

	stays := &fullConnector{refusingConnector{refusals: 1 << 30}}
	if _, err := (pgConnector{Connector: stays, wait: 50 * time.Millisecond}).Connect(ctx); !tooManyClients(err) || stays.calls < 2 {
		t.Fatalf("err %v after %d tries, want 53300 after more than one", err, stays.calls)
	}

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	gone := &fullConnector{refusingConnector{refusals: 1 << 30}}
	if _, err := (pgConnector{Connector: gone, wait: time.Minute}).Connect(cancelled); !tooManyClients(err) || gone.calls != 1 {
		t.Fatalf("err %v after %d tries, want 53300 at once for a request gone", err, gone.calls)
	}
}
