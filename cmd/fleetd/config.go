package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/fleetd/fleet/sqlstore"
)

// config is everything fleetd can be told, from defaults, flags and the
// environment, in that order of weakness.
type config struct {
	database  string
	httpAddr  string
	mqttAddr  string
	dataDir   string
	logLevel  string
	logFormat string
	maxBody   int64
	maxBulk   int64
	maxUpload int64
}

func (c *config) databaseFlags(fs *flagSet) {
	fs.StringVar(&c.database, "database", "./fleetd.db", "`DB`: a SQLite file path, or a postgres:// URL")
}

func (c *config) logFlags(fs *flagSet) {
	fs.StringVar(&c.logLevel, "log-level", "info", "`LEVEL` of logs: debug, info, warn, error")
	fs.StringVar(&c.logFormat, "log-format", "text", "`FORMAT` of logs on standard error: text or json")
}

func (c *config) serveFlags(fs *flagSet) {
	c.databaseFlags(fs)
	fs.StringVar(&c.httpAddr, "http-addr", ":8080", "`ADDR` the HTTP API listens on")
	fs.StringVar(&c.mqttAddr, "mqtt-addr", ":1883", "`ADDR` the embedded MQTT broker listens on")
	fs.StringVar(&c.dataDir, "data-dir", "./fleetd-data", "`DIR` for firmware files")
	fs.Int64Var(&c.maxBody, "max-body-bytes", 1<<20, "largest request body in `BYTES`")
	fs.Int64Var(&c.maxBulk, "max-bulk-bytes", 64<<20, "largest bulk provisioning body in `BYTES`")
	fs.Int64Var(&c.maxUpload, "max-upload-bytes", 2<<30, "largest firmware upload in `BYTES`")
	c.logFlags(fs)
}

// logger builds the process logger on w.
func (c *config) logger(w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.logLevel)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", c.logLevel)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch strings.ToLower(c.logFormat) {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", c.logFormat)
}

// openDB opens the database and applies migrations, logging what it did.
func (c *config) openDB(ctx context.Context, log *slog.Logger) (*sqlstore.DB, error) {
	db, err := sqlstore.Open(ctx, c.database, sqlstore.Options{Logger: log})
	if err != nil {
		return nil, err
	}
	applied, err := db.Migrate(ctx)
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("migrate: %w", err)
	}
	for _, m := range applied {
		log.Info("applied migration", "migration", m)
	}
	return db, nil
}
