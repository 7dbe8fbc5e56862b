package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/bandplane/bandplane/schema/chdb"
	"github.com/bandplane/bandplane/schema/pricing"
	"github.com/bandplane/bandplane/schema/tlog"
)

// stackFlags are the connection flags every command that talks to the stack shares.
// Defaults match deploy/local (`make up`); BANDPLANE_* environment variables override
// the defaults, flags override both.
type stackFlags struct {
	kafka    string
	topic    string
	dlqTopic string
	origin   string
	ch       chdb.Config
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func (s *stackFlags) register(fs *flag.FlagSet) {
	def := chdb.DefaultConfig()
	fs.StringVar(&s.kafka, "kafka", envOr("BANDPLANE_KAFKA", "127.0.0.1:19092"), "Kafka bootstrap brokers, comma-separated (env BANDPLANE_KAFKA)")
	fs.StringVar(&s.topic, "topic", envOr("BANDPLANE_TOPIC", "bandplane.events"), "events topic")
	fs.StringVar(&s.dlqTopic, "dlq-topic", "", "dead-letter topic (default: <topic>.dlq)")
	fs.StringVar(&s.origin, "audit-origin", envOr("BANDPLANE_AUDIT_ORIGIN", ""), "the deployment's name in its audit log: the origin prefix of every organization's checkpoints and the audit key's note key name, bound into retention cuts (no space or '+'; default bandplane/<clickhouse-db>) (env BANDPLANE_AUDIT_ORIGIN)")
	fs.StringVar(&s.ch.Addr, "clickhouse", envOr("BANDPLANE_CLICKHOUSE", def.Addr), "ClickHouse native address host:port, or several comma-separated (servers of a cluster: the first that answers takes the connections, the next when it is down; give every process the same order) (env BANDPLANE_CLICKHOUSE)")
	fs.StringVar(&s.ch.Database, "clickhouse-db", envOr("BANDPLANE_CLICKHOUSE_DB", def.Database), "ClickHouse database (env BANDPLANE_CLICKHOUSE_DB)")
	fs.StringVar(&s.ch.User, "clickhouse-user", envOr("BANDPLANE_CLICKHOUSE_USER", def.User), "ClickHouse user")
	s.ch.Password = os.Getenv("BANDPLANE_CLICKHOUSE_PASSWORD")
	fs.DurationVar(&s.ch.ReadTimeout, "clickhouse-timeout", def.ReadTimeout, "ClickHouse read timeout")
	fs.StringVar(&s.ch.Cluster, "cluster", envOr("BANDPLANE_CLICKHOUSE_CLUSTER", ""), "ClickHouse cluster the schema is on (migrate --cluster makes it there: replicated local tables, Distributed tables over them); empty: one server (env BANDPLANE_CLICKHOUSE_CLUSTER)")
	fs.IntVar(&s.ch.InsertQuorum, "insert-quorum", 2, "with --cluster: replicas of a shard that must hold an insert into the audit trail (and the other tables of record) before it returns (insert_quorum; 2 loses nothing acknowledged when one replica dies; 0 or 1: one)")
	s.ch.DialTimeout, s.ch.MaxOpenConns = def.DialTimeout, def.MaxOpenConns
}

func (s *stackFlags) brokers() []string { return splitBrokers(s.kafka) }

// splitBrokers reads a comma-separated broker list, ignoring blanks.
func splitBrokers(list string) []string {
	var out []string
	for _, b := range strings.Split(list, ",") {
		if b = strings.TrimSpace(b); b != "" {
			out = append(out, b)
		}
	}
	return out
}

func (s *stackFlags) dlq() string {
	if s.dlqTopic != "" {
		return s.dlqTopic
	}
	return s.topic + ".dlq"
}

// storedTopic is the topic ingest notes each stored event row on, for the sealer.
func (s *stackFlags) storedTopic() string { return s.topic + ".stored" }

// checkpointTopic is the compacted topic of every organization's newest checkpoint.
func (s *stackFlags) checkpointTopic() string { return s.topic + ".checkpoints" }

// prefix is the deployment's origin prefix.
func (s *stackFlags) prefix() (string, error) {
	if s.origin == "" {
		return tlog.DefaultPrefix(s.ch.Database), nil
	}
	if err := tlog.CheckPrefix(s.origin); err != nil {
		return "", fmt.Errorf("--audit-origin: %w", err)
	}
	return s.origin, nil
}

// newFlagSet returns a flag set that reports errors and usage on e.stderr (and
// records it in e.flagSets, for config-reference).
func newFlagSet(e *env, name, args string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	fs.Usage = func() {
		fmt.Fprintf(e.stderr, "usage: bandplane %s %s\n\nflags:\n", name, args)
		fs.PrintDefaults()
	}
	if e.flagSets != nil {
		e.flagSets.add(name, args, fs)
	}
	return fs
}

// parse parses flags; -h prints usage and exits 0, a bad flag exits 2.
func parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitError{code: 0}
		}
		return exitError{code: 2}
	}
	return nil
}

// openDB connects to ClickHouse and refuses a schema older than this build needs.
func (s *stackFlags) openDB(ctx context.Context) (driver.Conn, error) {
	conn, err := chdb.Open(ctx, s.ch)
	if err != nil {
		return nil, err
	}
	if err := chdb.CheckVersion(ctx, conn, s.ch.Database); err != nil {
		conn.Close()
		return nil, err
	}
	return conn, nil
}

func loadCatalog(path string) (*pricing.Catalog, error) {
	if path == "" {
		return pricing.Default(), nil
	}
	return pricing.Load(path)
}
