package main

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/fleetd/fleet"
	"github.com/fleetd/fleet/sqlstore"
)

func runMigrate(ctx context.Context, args []string, e env) error {
	var c config
	fs := newFlagSet("migrate", "", "Applies the database migrations fleetd has and the database lacks, then exits.\nserve does this too; run it alone to upgrade before starting new replicas.", e)
	c.adminFlags(fs)
	if err := fs.parse(args, e.getenv); err != nil {
		return err
	}
	if err := fs.require(0, 0); err != nil {
		return err
	}
	db, err := c.openAdminDB(ctx, e)
	if err != nil {
		return err
	}
	fmt.Fprintln(e.stdout, "database is up to date")
	return db.Close()
}

func runTenantCreate(ctx context.Context, args []string, e env) error {
	var c config
	fs := newFlagSet("tenant create", "NAME", "Creates a tenant with an admin API key named \"admin\" and prints the key alone\non the last line, so a script can capture it:\n  KEY=$(fleetd tenant create acme | tail -1)", e)
	c.adminFlags(fs)
	if err := fs.parse(args, e.getenv); err != nil {
		return err
	}
	if err := fs.require(1, 1); err != nil {
		return err
	}
	db, err := c.openAdminDB(ctx, e)
	if err != nil {
		return err
	}
	defer db.Close()
	t, key, err := db.CreateTenant(ctx, fs.positional[0])
	if err != nil {
		return cliError(err)
	}
	fmt.Fprintf(e.stdout, "created tenant %q with admin API key \"admin\" (shown only this once):\n%s\n", t.Name, key)
	return nil
}

func runTenantList(ctx context.Context, args []string, e env) error {
	var c config
	fs := newFlagSet("tenant list", "", "Lists every tenant.", e)
	c.adminFlags(fs)
	if err := fs.parse(args, e.getenv); err != nil {
		return err
	}
	if err := fs.require(0, 0); err != nil {
		return err
	}
	db, err := c.openAdminDB(ctx, e)
	if err != nil {
		return err
	}
	defer db.Close()
	ts, err := db.FindTenants(ctx)
	if err != nil {
		return cliError(err)
	}
	tw := tabwriter.NewWriter(e.stdout, 2, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tCREATED")
	for _, t := range ts {
		fmt.Fprintf(tw, "%s\t%s\n", t.Name, t.CreatedAt.Format("2006-01-02T15:04:05.000Z"))
	}
	return tw.Flush()
}

func runAPIKeyCreate(ctx context.Context, args []string, e env) error {
	var c config
	var tenant, name, role, email string
	fs := newFlagSet("apikey create", "", "Creates an API key and prints it alone on the last line.", e)
	fs.StringVar(&tenant, "tenant", "", "`TENANT` the key belongs to (required)")
	fs.StringVar(&name, "name", "", "`NAME` of the key, unique in the tenant (required)")
	fs.StringVar(&role, "role", "", "`ROLE`: viewer, device, operator or admin (required)")
	fs.StringVar(&email, "email", "", "`EMAIL` of whoever holds the key")
	c.adminFlags(fs)
	if err := fs.parse(args, e.getenv); err != nil {
		return err
	}
	if err := fs.require(0, 0, "tenant", "name", "role"); err != nil {
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
	fmt.Fprintf(e.stdout, "created %s API key %q in tenant %q (shown only this once):\n%s\n", k.Role, k.Name, tenant, k.Key)
	return nil
}

// adminFlags are the flags of the commands that open the database and exit.
func (c *config) adminFlags(fs *flagSet) {
	c.databaseFlags(fs)
	c.logFlags(fs)
}

// openAdminDB opens the database, migrated, for a command that logs to
// standard error.
func (c *config) openAdminDB(ctx context.Context, e env) (*sqlstore.DB, error) {
	log, err := c.logger(e.stderr)
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

func runVersion(ctx context.Context, args []string, e env) error {
	fs := newFlagSet("version", "", "Prints fleetd's version and the commit it was built from.", e)
	if err := fs.parse(args, e.getenv); err != nil {
		return err
	}
	if err := fs.require(0, 0); err != nil {
		return err
	}
	fmt.Fprintln(e.stdout, "fleetd", version())
	return nil
}

// version is the module version, or the VCS revision of a development build.
func version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	v := bi.Main.Version
	var rev, modified string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				modified = "+dirty"
			}
		}
	}
	if rev != "" {
		if len(rev) > 12 {
			rev = rev[:12]
		}
		return fmt.Sprintf("%s (%s%s, %s)", v, rev, modified, bi.GoVersion)
	}
	return fmt.Sprintf("%s (%s)", v, bi.GoVersion)
}
