package server

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/internal/cli"
	"github.com/fleetd/fleet/sqlstore"
)

// Migrate is fleetd migrate.
func Migrate(ctx context.Context, args []string, e cli.Env) error {
	db, _, err := openAdmin(ctx, "migrate", "", "Applies the database migrations fleetd has and the database lacks, then exits.\nserve does this too; run it alone to upgrade before starting new replicas.", 0, args, e)
	if err != nil {
		return err
	}
	fmt.Fprintln(e.Stdout, "database is up to date")
	return db.Close()
}

// TenantCreate is fleetd tenant create.
func TenantCreate(ctx context.Context, args []string, e cli.Env) error {
	db, names, err := openAdmin(ctx, "tenant create", "NAME", "Creates a tenant with an admin API key named \"admin\" and prints the key alone\non the last line, so a script can capture it:\n  KEY=$(fleetd tenant create acme | tail -1)", 1, args, e)
	if err != nil {
		return err
	}
	defer db.Close()
	t, key, err := db.CreateTenant(ctx, names[0])
	if err != nil {
		return cliError(err)
	}
	fmt.Fprintf(e.Stdout, "created tenant %q with admin API key \"admin\" (shown only this once):\n%s\n", t.Name, key)
	return nil
}

// TenantList is fleetd tenant list.
func TenantList(ctx context.Context, args []string, e cli.Env) error {
	db, _, err := openAdmin(ctx, "tenant list", "", "Lists every tenant.", 0, args, e)
	if err != nil {
		return err
	}
	defer db.Close()
	ts, err := db.FindTenants(ctx)
	if err != nil {
		return cliError(err)
	}
	tw := tabwriter.NewWriter(e.Stdout, 2, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tCREATED")
	for _, t := range ts {
		fmt.Fprintf(tw, "%s\t%s\n", t.Name, t.CreatedAt.Format("2006-01-02T15:04:05.000Z"))
	}
	return tw.Flush()
}

// openAdmin reads the flags of an admin command that takes n positional
// arguments and no flags but the database's and the log's, and opens the
// database, migrated; it returns the positional arguments.
func openAdmin(ctx context.Context, name, positional, usage string, n int, args []string, e cli.Env) (*sqlstore.DB, []string, error) {
	var c Config
	fs := cli.NewFlagSet(name, positional, usage, e)
	c.adminFlags(fs)
	if err := fs.Parse(args, e.Getenv); err != nil {
		return nil, nil, err
	}
	if err := fs.Require(n, n); err != nil {
		return nil, nil, err
	}
	db, err := c.openAdminDB(ctx, e)
	return db, fs.Positional, err
}

// APIKeyCreate is fleetd apikey create.
func APIKeyCreate(ctx context.Context, args []string, e cli.Env) error {
	var c Config
	var tenant, name, role, email string
	fs := cli.NewFlagSet("apikey create", "", "Creates an API key and prints it alone on the last line.", e)
	fs.StringVar(&tenant, "tenant", "", "`TENANT` the key belongs to (required)")
	fs.StringVar(&name, "name", "", "`NAME` of the key, unique in the tenant (required)")
	fs.StringVar(&role, "role", "", "`ROLE`: viewer, device, operator or admin (required)")
	fs.StringVar(&email, "email", "", "`EMAIL` of whoever holds the key")
	c.adminFlags(fs)
	if err := fs.Parse(args, e.Getenv); err != nil {
		return err
	}
	if err := fs.Require(0, 0, "tenant", "name", "role"); err != nil {
		return err
	}
	// The API's rules: a key the API could not name (to delete it, say)
	// is not made here either.
	body := map[string]any{"name": name, "role": role}
	if email != "" {
		body["user_email"] = email
	}
	f := fleet.NewFields(body)
	k := fleet.ReadAPIKey(f)
	if err := f.Err(); err != nil {
		var fe *fleet.Error
		errors.As(err, &fe) // Fields.Err is always a *fleet.Error
		var problems []string
		for field, flag := range map[string]string{"name": "--name", "role": "--role", "user_email": "--email"} {
			if p := fe.Fields[field]; p != "" {
				problems = append(problems, flag+" "+p)
			}
		}
		sort.Strings(problems)
		return errors.New(strings.Join(problems, "; "))
	}
	db, err := c.openAdminDB(ctx, e)
	if err != nil {
		return err
	}
	defer db.Close()
	if err := db.CreateAPIKey(ctx, tenant, k); err != nil {
		return cliError(err)
	}
	fmt.Fprintf(e.Stdout, "created %s API key %q in tenant %q (shown only this once):\n%s\n", k.Role, k.Name, tenant, k.Key)
	return nil
}

// adminFlags are the flags of the commands that open the database and exit.
func (c *Config) adminFlags(fs *cli.FlagSet) {
	c.databaseFlags(fs)
	c.logFlags(fs)
}

// openAdminDB opens the database, migrated, for a command that logs to
// standard error.
func (c *Config) openAdminDB(ctx context.Context, e cli.Env) (*sqlstore.DB, error) {
	log, err := c.logger(e.Stderr)
	if err != nil {
		return nil, err
	}
	return c.openDB(ctx, log)
}

// cliError shows a fleet error's message, as a person at a terminal needs.
func cliError(err error) error {
	if fleet.ErrorCode(err) == fleet.EINTERNAL {
		return err
	}
	return fmt.Errorf("%s", fleet.ErrorMessage(err))
}
