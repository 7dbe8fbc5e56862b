package loadbench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	kafkago "github.com/segmentio/kafka-go"

	"github.com/bandplane/bandplane/schema/chdb"
	"github.com/bandplane/bandplane/schema/kafka"
	"github.com/bandplane/bandplane/schema/keys"
)

// names are one run's database, topic and consumer groups: fresh, so that a run never
// reads another's data, and recognizable, so that what a killed run left behind can
// be found (bench_load_* databases, bench-load-* topics).
type names struct {
	db    string // bench_load_<stamp>: ClickHouse wants a plain identifier
	topic string // bench-load-<stamp>, also the ingest group
}

func newNames(now time.Time) names {
	var b [3]byte
	_, _ = rand.Read(b[:])
	stamp := now.UTC().Format("20060102_150405") + "_" + hex.EncodeToString(b[:])
	return names{db: "bench_load_" + stamp, topic: "bench-load-" + strings.ReplaceAll(stamp, "_", "-")}
}

// topics are every topic serve makes for the run's topic.
func (n names) topics() []string {
	return []string{n.topic, n.topic + ".dlq", n.topic + ".stored", n.topic + ".checkpoints"}
}

// groups are serve's consumer groups of the run: ingest's and the policy replica's.
func (n names) groups() []string { return []string{n.topic, n.topic + "-policy"} }

// tokens are the run's API keys.
type tokens struct {
	platformIngest string // the directory, which only platform keys write
	router         string // policy decisions (the routing core's role)
	aIngest        string
	aViewer        string   // costs
	aCompliance    string   // the audit page
	aSubscribers   []string // viewer keys of the subscribers, subscribersPerKey each
	hIngest        string   // the slow-trickle bodies
	hCompliance    string   // the large pages
}

// subscribersPerKey stays under serve's --graphql-max-websockets-per-key (32): a
// subscriber's connection of the last phase may still hold its slot when the next
// phase's connects.
const subscribersPerKey = 25

// stack is the run's database, topic, keys and serve process.
type stack struct {
	cfg      *Config
	names    names
	ch       chdb.Config
	conn     driver.Conn
	producer *kafka.Producer // the key events and the task changes, with a platform writer's rights
	tokens   tokens

	dir         string // serve's log and metrics
	logPath     string
	logFile     *os.File
	addr, url   string
	metricsAddr string
	cmd         *exec.Cmd
	exited      chan struct{}
	waitErr     error
}

// newStack makes the database, the topic and the keys. On error what it made is
// removed again.
func newStack(ctx context.Context, cfg *Config) (_ *stack, err error) {
	s := &stack{cfg: cfg, names: newNames(time.Now())}
	s.ch = cfg.ClickHouse
	s.ch.Database = s.names.db
	defer func() {
		if err != nil {
			s.close(ctx, cfg.KeepData, false)
		}
	}()
	if s.dir, err = os.MkdirTemp("", s.names.topic+"-"); err != nil {
		return s, fmt.Errorf("cannot make a folder for serve's log: %w", err)
	}
	s.logPath = s.dir + "/serve.log"
	if s.conn, err = chdb.Open(ctx, s.ch); err != nil {
		return s, err
	}
	if _, err = chdb.MigrateOn(ctx, s.conn, s.ch); err != nil {
		return s, fmt.Errorf("cannot make database %s: %w", s.names.db, err)
	}
	if err = kafka.EnsureTopic(ctx, cfg.Brokers, s.names.topic, 4); err != nil {
		return s, err
	}
	if s.producer, err = kafka.NewProducer(kafka.ProducerConfig{Brokers: cfg.Brokers, Topic: s.names.topic, BatchSize: kafka.AuditBatchSize}); err != nil {
		return s, err
	}
	err = s.createKeys(ctx)
	return s, err
}

// createKeys makes the keys before serve starts, which then loads them.
func (s *stack) createKeys(ctx context.Context) error {
	store := keys.NewStore(s.conn, s.names.db, s.producer)
	mk := func(org string, role keys.Role, name string) (string, error) {
		_, token, err := store.Create(ctx, org, role, name, "bench-load")
		return token, err
	}
	t := &s.tokens
	var errs []error
	for _, k := range []struct {
		dst  *string
		org  string
		role keys.Role
		name string
	}{
		{&t.platformIngest, keys.PlatformOrg, keys.RoleIngest, "bench-load-directory"},
		{&t.router, keys.PlatformOrg, keys.RoleRouter, "bench-load-router"},
		{&t.aIngest, orgA, keys.RoleIngest, "bench-load-a-ingest"},
		{&t.aViewer, orgA, keys.RoleViewer, "bench-load-a-costs"},
		{&t.aCompliance, orgA, keys.RoleCompliance, "bench-load-a-audit"},
		{&t.hIngest, orgH, keys.RoleIngest, "bench-load-h-trickle"},
		{&t.hCompliance, orgH, keys.RoleCompliance, "bench-load-h-audit"},
	} {
		tok, err := mk(k.org, k.role, k.name)
		errs = append(errs, err)
		*k.dst = tok
	}
	for i := range (s.cfg.Subscribers + subscribersPerKey - 1) / subscribersPerKey {
		tok, err := mk(orgA, keys.RoleViewer, "bench-load-a-subscribers-"+strconv.Itoa(i))
		errs = append(errs, err)
		t.aSubscribers = append(t.aSubscribers, tok)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cannot create the benchmark's keys: %w", err)
	}
	return nil
}

// freeLoopbackAddr is a free port of 127.0.0.1 (free when asked: serve binds it a
// moment later).
func freeLoopbackAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("cannot find a free loopback port: %w", err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr, nil
}

// serveArgs are the flags of serve: the run's stack, loopback ports, and the caller's
// --serve-arg last.
func (s *stack) serveArgs() []string {
	ch := s.cfg.ClickHouse
	args := append([]string{}, s.cfg.ServeCommand[1:]...)
	args = append(args, "--listen", s.addr, "--metrics-listen", s.metricsAddr, "--otlp-grpc-listen", "",
		"--clickhouse", ch.Addr, "--clickhouse-db", s.names.db, "--clickhouse-user", ch.User,
		"--clickhouse-timeout", ch.ReadTimeout.String(),
		"--kafka", strings.Join(s.cfg.Brokers, ","), "--topic", s.names.topic,
		"--group", s.names.groups()[0], "--policy-group", s.names.groups()[1])
	if ch.Cluster != "" {
		args = append(args, "--cluster", ch.Cluster, "--insert-quorum", strconv.Itoa(ch.InsertQuorum))
	}
	return append(args, s.cfg.ServeArgs...)
}

// serveEnv is this process's environment without bandplane's settings, but for the
// ClickHouse password (never on a command line) and the log level: serve reads
// BANDPLANE_* as defaults, and a developer's BANDPLANE_POLICY_PEERS or
// BANDPLANE_AUDIT_KEY would measure another configuration than the flags say.
func serveEnv() []string {
	var out []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "BANDPLANE_") && k != "BANDPLANE_CLICKHOUSE_PASSWORD" && k != "BANDPLANE_LOG_LEVEL" {
			continue
		}
		out = append(out, kv)
	}
	return out
}

// startServer runs serve and waits until /readyz says ready (the policy directory
// loaded, the live reader positioned).
func (s *stack) startServer(ctx context.Context) error {
	var err error
	if s.addr, err = freeLoopbackAddr(); err != nil {
		return err
	}
	if s.metricsAddr, err = freeLoopbackAddr(); err != nil {
		return err
	}
	if s.logFile, err = os.Create(s.logPath); err != nil {
		return fmt.Errorf("cannot create serve's log: %w", err)
	}
	s.url = "http://" + s.addr
	// Not CommandContext: serve is stopped with SIGTERM and given time to flush.
	s.cmd = exec.Command(s.cfg.ServeCommand[0], s.serveArgs()...)
	s.cmd.Stdout, s.cmd.Stderr, s.cmd.Env = s.logFile, s.logFile, serveEnv()
	if err := s.cmd.Start(); err != nil {
		return fmt.Errorf("cannot start serve: %w", err)
	}
	s.exited = make(chan struct{})
	go func() { s.waitErr = s.cmd.Wait(); close(s.exited) }()
	deadline := time.Now().Add(2 * time.Minute)
	client := &http.Client{Timeout: 3 * time.Second}
	for {
		if ready, _ := s.ready(ctx, client); ready {
			return nil
		}
		select {
		case <-s.exited:
			return fmt.Errorf("serve exited (%s) before it was ready; its output:\n%s", s.exitStatus(), s.logTail(4000))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_, why := s.ready(ctx, client)
			return fmt.Errorf("serve is not ready after 2 minutes (/readyz: %s); its output:\n%s", why, s.logTail(4000))
		}
	}
}

func (s *stack) ready(ctx context.Context, c *http.Client) (bool, string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.url+"/readyz", nil)
	if err != nil {
		return false, err.Error()
	}
	resp, err := c.Do(req)
	if err != nil {
		return false, err.Error()
	}
	defer resp.Body.Close() //nolint:errcheck // read to the end below
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode == http.StatusOK, strings.TrimSpace(string(b))
}

func (s *stack) pid() int {
	if s.cmd == nil || s.cmd.Process == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// alive says whether serve still runs.
func (s *stack) alive() bool {
	select {
	case <-s.exited:
		return false
	default:
		return s.cmd != nil
	}
}

// exitStatus says how serve ended (once it has).
func (s *stack) exitStatus() string {
	if s.waitErr == nil {
		return "exit status 0"
	}
	return s.waitErr.Error()
}

// logTail is the end of serve's output.
func (s *stack) logTail(n int) string { return tail(s.logPath, n) }

// saveMetrics writes serve's /metrics to the run's folder, for a look after the run
// (--keep).
func (s *stack) saveMetrics(ctx context.Context, name string) {
	if s.metricsAddr == "" {
		return
	}
	c := &http.Client{Timeout: 5 * time.Second}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+s.metricsAddr+"/metrics", nil)
	if err != nil {
		return
	}
	resp, err := c.Do(req)
	if err != nil {
		return
	}
	defer resp.Body.Close() //nolint:errcheck // read to the end below
	b, err := io.ReadAll(resp.Body)
	if err == nil {
		_ = os.WriteFile(s.dir+"/metrics-"+name+".txt", b, 0o600)
	}
}

// close stops serve (SIGTERM, then a kill after 30 s), and unless keep removes the
// database and the topics, and unless keep or keepLog the run's folder (serve's log
// and metrics). It returns where serve's log is, "" when it was removed.
func (s *stack) close(ctx context.Context, keep, keepLog bool) string {
	if s.cmd != nil && s.alive() {
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.exited:
		case <-time.After(30 * time.Second):
			_ = s.cmd.Process.Kill()
			<-s.exited
		}
	}
	if s.logFile != nil {
		_ = s.logFile.Close()
	}
	if s.producer != nil {
		_ = s.producer.Close() // every change was acknowledged when produced
	}
	if s.conn != nil {
		if !keep {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 3*time.Minute)
			q := "DROP DATABASE IF EXISTS " + s.names.db
			if s.ch.Cluster != "" {
				q += " ON CLUSTER " + s.ch.Cluster
			}
			_ = s.conn.Exec(dctx, q)
			cancel()
		}
		s.conn.Close()
	}
	if !keep {
		c := &kafkago.Client{Addr: kafkago.TCP(s.cfg.Brokers...), Timeout: 10 * time.Second}
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		_, _ = c.DeleteTopics(dctx, &kafkago.DeleteTopicsRequest{Topics: s.names.topics()})
		// serve's consumer groups too, best effort (a broker that is not their
		// coordinator refuses; Kafka expires them later anyway).
		_, _ = c.DeleteGroups(dctx, &kafkago.DeleteGroupsRequest{GroupIDs: s.names.groups()})
		cancel()
	}
	if keep || keepLog || s.dir == "" {
		return s.logPath
	}
	_ = os.RemoveAll(s.dir)
	return ""
}
