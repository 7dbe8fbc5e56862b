package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/kafka"
	"github.com/bandplane/bandplane/schema/keys"
)

func init() {
	registerGroup("keys", "create, list and revoke API keys (create, list, revoke ID)", keysUsage,
		map[string]runFunc{"create": keysCreate, "list": keysList, "revoke": keysRevoke})
}

const keysUsage = `usage: bandplane keys <create|list|revoke> [flags]

  create --org ORG --role ROLE [--name NAME]   print {"id","token","org","role","name"}; the token is shown once
  list [--table]                               every key, revoked ones included, newest first (never a token)
  revoke ID                                    revoke a key; serve stops accepting it within its refresh (5 s)

Run 'bandplane keys <command> -h' for its flags.
`

// keysFlags are the flags create and revoke share.
type keysFlags struct {
	stack      stackFlags
	by         string
	partitions int
}

func (k *keysFlags) register(fs *flag.FlagSet) {
	k.stack.register(fs)
	fs.StringVar(&k.by, "by", defaultBy(), "who does it, recorded in the key and its audit event (default $USER@hostname)")
	fs.IntVar(&k.partitions, "partitions", 4, "partitions of the events topic when it has to be created")
}

func defaultBy() string {
	u := os.Getenv("USER")
	if u == "" {
		u = "unknown"
	}
	h, err := os.Hostname()
	if err != nil || h == "" {
		h = "localhost"
	}
	return u + "@" + h
}

// badFlag reports a wrong flag value like a bad flag: on stderr, exit status 2.
func badFlag(e *env, cmd, format string, args ...any) error {
	fmt.Fprintf(e.stderr, "bandplane keys %s: %s\n", cmd, fmt.Sprintf(format, args...))
	return exitError{code: 2}
}

// parseInterspersed parses flags that may come after the positional arguments too
// (`keys revoke ID --by me`); it returns the positional ones.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := parse(fs, args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// openKeys opens the key store; withProducer also connects its audit producer (create
// and revoke write events, list does not).
func (k *keysFlags) open(ctx context.Context, withProducer bool) (*keys.Store, func(), error) {
	conn, err := k.stack.openDB(ctx)
	if err != nil {
		return nil, nil, err
	}
	if !withProducer {
		return keys.NewStore(conn, k.stack.ch.Database, nil), func() { conn.Close() }, nil
	}
	brokers := k.stack.brokers()
	// A fresh stack may have no events topic yet (make run creates keys before serve).
	if err := kafka.EnsureTopic(ctx, brokers, k.stack.topic, k.partitions); err != nil {
		conn.Close()
		return nil, nil, err
	}
	p, err := kafka.NewProducer(kafka.ProducerConfig{Brokers: brokers, Topic: k.stack.topic, BatchSize: 1, WriteTimeout: 15 * time.Second})
	if err != nil {
		conn.Close()
		return nil, nil, err
	}
	return keys.NewStore(conn, k.stack.ch.Database, p), func() { _ = p.Close(); _ = conn.Close() }, nil
}

// createdKey is what `keys create` prints: the only place the token ever appears.
type createdKey struct {
	ID    string    `json:"id"`
	Token string    `json:"token"`
	Org   string    `json:"org"`
	Role  keys.Role `json:"role"`
	Name  string    `json:"name"`
}

func keysCreate(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "keys create", "--org ORG --role ROLE [--name NAME] [flags]")
	var kf keysFlags
	kf.register(fs)
	org := fs.String("org", "", "organization the key acts for, or '*' for a platform key (the routing core's); required")
	roleName := fs.String("role", "", "role: "+roleNames()+"; required")
	name := fs.String("name", "", "what the key is for (shown by list)")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return badFlag(e, "create", "unexpected argument %q", pos[0])
	}
	if *org == "" {
		return badFlag(e, "create", "--org is required (an organization id, or '*' for a platform key)")
	}
	if err := keys.ValidateOrg(*org); err != nil {
		return badFlag(e, "create", "--org: %v", err)
	}
	if *roleName == "" {
		return badFlag(e, "create", "--role is required (%s)", roleNames())
	}
	role, err := keys.ParseRole(*roleName)
	if err != nil {
		return badFlag(e, "create", "--role: %v", err)
	}
	store, closeStore, err := kf.open(ctx, true)
	if err != nil {
		return err
	}
	defer closeStore()
	k, token, err := store.Create(ctx, *org, role, *name, kf.by)
	if err != nil {
		return err
	}
	return printJSON(e.stdout, createdKey{ID: k.ID, Token: token, Org: k.Org, Role: k.Role, Name: k.Name})
}

func keysList(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "keys list", "[--table] [flags]")
	var kf keysFlags
	kf.stack.register(fs)
	table := fs.Bool("table", false, "print a table instead of one JSON line per key")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return badFlag(e, "list", "unexpected argument %q", pos[0])
	}
	store, closeStore, err := kf.open(ctx, false)
	if err != nil {
		return err
	}
	defer closeStore()
	list, err := store.List(ctx)
	if err != nil {
		return err
	}
	if !*table {
		for _, k := range list {
			if err := printJSON(e.stdout, k); err != nil {
				return err
			}
		}
		return nil
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tORG\tROLE\tNAME\tCREATED\tCREATED BY\tREVOKED\tREVOKED BY")
	for _, k := range list {
		revoked := "-"
		if !k.Active() {
			revoked = k.RevokedAt.Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", k.ID, k.Org, k.Role, dash(k.Name),
			k.CreatedAt.Format(time.RFC3339), dash(k.CreatedBy), revoked, dash(k.RevokedBy))
	}
	return tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func keysRevoke(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "keys revoke", "ID [flags]")
	var kf keysFlags
	kf.register(fs)
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return badFlag(e, "revoke", "want exactly one key id, got %d arguments", len(pos))
	}
	store, closeStore, err := kf.open(ctx, true)
	if err != nil {
		return err
	}
	defer closeStore()
	k, err := store.Revoke(ctx, pos[0], kf.by)
	if errors.Is(err, schema.ErrNotFound) {
		return fmt.Errorf("%w (see `bandplane keys list`)", err)
	}
	if err != nil {
		return err
	}
	return printJSON(e.stdout, k)
}

func roleNames() string {
	s := ""
	for i, r := range keys.Roles {
		if i > 0 {
			s += ", "
		}
		s += string(r)
	}
	return s
}
