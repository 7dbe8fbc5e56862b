package ingest_test

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	kafkago "github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/simulate"
	"github.com/bandplane/bandplane/deploy/stacktest"
	"github.com/bandplane/bandplane/ingest"
	"github.com/bandplane/bandplane/query/trail"
	"github.com/bandplane/bandplane/schema/chdb"
	"github.com/bandplane/bandplane/schema/kafka"
)

// The cluster tests of ClickHouse (`make test-cluster`): the database is made on
// deploy/local/cluster.sh's 2 shards x 2 replicas with `migrate --cluster`, and every
// read below goes through the Distributed tables, as the product's do.

// clusterStream produces events of a seeded workload at rate per second in the
// background; wait returns its summary.
func clusterStream(t *testing.T, p *pipeline, events int, seed int64, rate float64) (wait func() simulate.Summary) {
	cfg := simulate.DefaultConfig()
	cfg.Events, cfg.Seed, cfg.Rate, cfg.BatchSize = events, seed, rate, 250
	cfg.Start = time.Date(2026, 11, 2, 9, 0, 0, 0, time.UTC)
	var sum simulate.Summary
	var err error
	done := make(chan struct{})
	go func() {
		defer close(done)
		sum, err = simulate.Run(context.Background(), cfg, ingest.ProducerSink{Producer: p.producer}, nil)
	}()
	return func() simulate.Summary {
		<-done
		require.NoError(t, err)
		require.Equal(t, events, sum.Events)
		return sum
	}
}

// storedEvents is the events stored so far, through the Distributed table.
func (p *pipeline) storedEvents() uint64 {
	var n uint64
	_ = p.conn.QueryRow(context.Background(), "SELECT count() FROM "+p.db+".events").Scan(&n)
	return n
}

// replicaDigest is what one server holds of a local table: rows, and a sum of their
// hashes (order-free), after FINAL.
func replicaDigest(t *testing.T, conn driver.Conn, db, table, key string) (rows, digest uint64, err error) {
	err = conn.QueryRow(context.Background(), fmt.Sprintf("SELECT count(), sum(cityHash64(%s)) FROM %s.%s%s FINAL", key, db, table, chdb.LocalSuffix)).Scan(&rows, &digest)
	return rows, digest, err
}

// waitReplicasConverge waits until both replicas of each shard hold the same rows of
// every table named, and returns the rows per shard of the first.
func waitReplicasConverge(t *testing.T, db string, tables map[string]string, timeout time.Duration) map[string][2]uint64 {
	t.Helper()
	conns := make([]driver.Conn, stacktest.ClusterNodes+1)
	for n := 1; n <= stacktest.ClusterNodes; n++ {
		conns[n] = stacktest.NodeConn(t, n)
	}
	perShard := map[string][2]uint64{}
	var last string
	ok := stacktest.Eventually(t, timeout, 500*time.Millisecond, func() bool {
		for table, key := range tables {
			var shards [2]uint64
			for shard := 0; shard < 2; shard++ {
				a, b := 2*shard+1, 2*shard+2
				ra, da, err := replicaDigest(t, conns[a], db, table, key)
				if err != nil {
					last = fmt.Sprintf("node %d: %v", a, err)
					return false
				}
				rb, db2, err := replicaDigest(t, conns[b], db, table, key)
				if err != nil {
					last = fmt.Sprintf("node %d: %v", b, err)
					return false
				}
				if ra != rb || da != db2 {
					last = fmt.Sprintf("%s: node %d holds %d rows, node %d %d", table, a, ra, b, rb)
					return false
				}
				shards[shard] = ra
			}
			perShard[table] = shards
		}
		return true
	})
	require.True(t, ok, "replicas did not converge within %s: %s", timeout, last)
	return perShard
}

var clusterTables = map[string]string{"events": "org_id, id", "usage": "event_id, input_tokens, output_tokens, toString(cost)", "usage_hourly": "org_id, hour, agent_id, events, toString(cost)"}

// TestIntegrationClusterReplicaKilled: a ClickHouse server (node 1: the first replica of
// shard 1, and the first address ingest connects to) is SIGKILLed while events stream
// in, and started again 8 s later. Ingest fails over to the other servers, its inserts
// into shard 1 wait for the quorum of 2 until node 1 is back (nothing acknowledged
// lives on one replica only), and then every sum through the Distributed tables is
// exact and both replicas of each shard hold the same rows.
func TestIntegrationClusterReplicaKilled(t *testing.T) {
	stacktest.RequireClickHouseCluster(t)
	topic := stacktest.ClusterTopic(t, 8)
	conn, db := stacktest.Database(t)
	producer, err := kafka.NewProducer(kafka.ProducerConfig{Brokers: stacktest.ClusterBrokers(), Topic: topic})
	require.NoError(t, err)
	t.Cleanup(func() { _ = producer.Close() })
	p := &pipeline{t: t, topic: topic, conn: conn, db: db, producer: producer}
	stacktest.RunClusterIngest(t, topic, conn, db, stacktest.Name(t))

	const events = 30_000
	wait := clusterStream(t, p, events, 21, 1500)
	require.True(t, stacktest.Eventually(t, time.Minute, 100*time.Millisecond, func() bool { return p.storedEvents() >= events/4 }),
		"ingest stored %d events in a minute", p.storedEvents())
	atKill := p.storedEvents()
	killed := time.Now()
	stacktest.KillClickHouse(t, 1)
	time.Sleep(8 * time.Second)
	duringOutage := p.storedEvents()
	stacktest.StartClickHouse(t, 1)
	restarted := time.Now()
	sum := wait()
	t.Logf("node 1 killed with %d events stored; %d stored when it was started again %.1f s later (a batch spans both shards: every insert waited for shard 1's quorum of 2)",
		atKill, duringOutage, restarted.Sub(killed).Seconds())

	p.waitSums(expected(sum), 3*time.Minute)
	t.Logf("every sum exact %.1f s after the restart", time.Since(restarted).Seconds())
	shards := waitReplicasConverge(t, db, clusterTables, 2*time.Minute)
	assert.Equal(t, uint64(events), shards["events"][0]+shards["events"][1], "events over both shards")
	assert.NotZero(t, shards["events"][0], "shard 1 holds events")
	assert.NotZero(t, shards["events"][1], "shard 2 holds events")
	t.Logf("replicas converged: events per shard %v, usage %v, usage_hourly %v", shards["events"], shards["usage"], shards["usage_hourly"])
}

// serveProcess is a `bandplane serve` process of a cluster test.
type serveProcess struct {
	cmd  *exec.Cmd
	done chan error
	log  *strings.Builder
	mu   *sync.Mutex
}

var (
	clusterBinOnce sync.Once
	clusterBin     string
	clusterBinErr  error
)

func bandplaneBinary(t *testing.T) string {
	t.Helper()
	clusterBinOnce.Do(func() {
		dir, err := os.MkdirTemp("", "bandplane-cluster-bin-")
		if err != nil {
			clusterBinErr = err
			return
		}
		clusterBin = filepath.Join(dir, "bandplane")
		out, err := exec.Command("go", "build", "-o", clusterBin, "../cmd/bandplane").CombinedOutput()
		if err != nil {
			clusterBinErr = fmt.Errorf("go build: %w\n%s", err, out)
		}
	})
	if clusterBinErr != nil {
		t.Fatal(clusterBinErr)
	}
	t.Cleanup(func() { _ = os.RemoveAll(filepath.Dir(clusterBin)) })
	return clusterBin
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *strings.Builder
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// startIngest runs `bandplane serve --no-policy` as ingest process of group on the
// cluster, and waits until it answers /readyz.
func startIngest(t *testing.T, bin, topic, db, group string, extra ...string) *serveProcess {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	_ = ln.Close() // only its free port was wanted
	cmd := exec.Command(bin, "serve", "--listen", addr, "--otlp-grpc-listen", "", "--no-policy", "--no-live",
		"--clickhouse", stacktest.ClickHouseAddr(), "--cluster", stacktest.ClickHouseCluster(), "--clickhouse-db", db,
		"--kafka", strings.Join(stacktest.ClusterBrokers(), ","), "--topic", topic, "--dlq-topic", topic+"_dlq", "--group", group,
		"--batch-age", "200ms", "--rollup-interval", "500ms")
	cmd.Args = append(cmd.Args, extra...)
	sp := &serveProcess{cmd: cmd, done: make(chan error, 1), log: &strings.Builder{}, mu: &sync.Mutex{}}
	cmd.Stdout, cmd.Stderr = lockedWriter{sp.mu, sp.log}, lockedWriter{sp.mu, sp.log}
	require.NoError(t, cmd.Start())
	go func() { sp.done <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-sp.done: //nolint:errcheck // stopped by SIGTERM: how it exits is not what this cleanup checks
			case <-time.After(30 * time.Second):
				_ = cmd.Process.Kill()
			}
		}
		if t.Failed() {
			sp.mu.Lock()
			t.Logf("serve %s output:\n%s", addr, tailOf(sp.log.String(), 3000))
			sp.mu.Unlock()
		}
	})
	ready := stacktest.Eventually(t, 90*time.Second, 200*time.Millisecond, func() bool {
		select {
		case err := <-sp.done:
			sp.done <- err
			return true
		default:
		}
		resp, err := httpGet("http://" + addr + "/readyz")
		return err == nil && resp == 200
	})
	select {
	case err := <-sp.done:
		sp.done <- err
		sp.mu.Lock()
		defer sp.mu.Unlock()
		t.Fatalf("serve exited (%v):\n%s", err, tailOf(sp.log.String(), 3000))
	default:
	}
	require.True(t, ready, "serve not ready in 90 s")
	return sp
}

// groupMembers is the number of members of a consumer group on the Kafka cluster (0
// when it cannot be read).
func groupMembers(ctx context.Context, group string) int {
	c := &kafkago.Client{Addr: kafkago.TCP(stacktest.ClusterBrokers()...), Timeout: 10 * time.Second}
	resp, err := c.DescribeGroups(ctx, &kafkago.DescribeGroupsRequest{GroupIDs: []string{group}})
	if err != nil || len(resp.Groups) != 1 || resp.Groups[0].Error != nil {
		return 0
	}
	return len(resp.Groups[0].Members)
}

func httpGet(url string) (int, error) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, err
	}
	_ = resp.Body.Close() // only the status is wanted
	return resp.StatusCode, nil
}

func tailOf(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// TestIntegrationClusterIngestScaleOut: two `bandplane serve` processes in one consumer
// group share the 8 partitions of the events topic on the Kafka cluster and write to
// the ClickHouse cluster; one is SIGKILLed mid-stream (it commits nothing more, and
// what it had stored but not committed is delivered again to the other). The survivor
// takes its partitions over, and every sum is exact.
func TestIntegrationClusterIngestScaleOut(t *testing.T) {
	stacktest.RequireClickHouseCluster(t)
	bin := bandplaneBinary(t)
	topic := stacktest.ClusterTopic(t, 8)
	conn, db := stacktest.Database(t)
	ctx := context.Background()
	t.Cleanup(func() {
		c := &kafkago.Client{Addr: kafkago.TCP(stacktest.ClusterBrokers()...), Timeout: 10 * time.Second}
		_, _ = c.DeleteTopics(context.Background(), &kafkago.DeleteTopicsRequest{Topics: []string{topic + "_dlq"}})
	})
	producer, err := kafka.NewProducer(kafka.ProducerConfig{Brokers: stacktest.ClusterBrokers(), Topic: topic})
	require.NoError(t, err)
	t.Cleanup(func() { _ = producer.Close() })
	p := &pipeline{t: t, topic: topic, conn: conn, db: db, producer: producer}
	group := stacktest.Name(t)
	// Both seal too: the sealers' group gives the stored-events topic to one, and the
	// survivor's takes over when that one dies.
	auditKey := filepath.Join(t.TempDir(), "audit.key")
	require.NoError(t, trail.GenerateKey(auditKey))
	sealing := []string{"--audit-key", auditKey, "--seal-every", "1s"}

	a := startIngest(t, bin, topic, db, group, sealing...)
	startIngest(t, bin, topic, db, group, sealing...)
	// Both members hold partitions before the stream starts.
	require.True(t, stacktest.Eventually(t, time.Minute, 250*time.Millisecond, func() bool {
		return groupMembers(ctx, group) == 2
	}), "the group never had two members")

	const events = 30_000
	wait := clusterStream(t, p, events, 31, 1500)
	require.True(t, stacktest.Eventually(t, 2*time.Minute, 100*time.Millisecond, func() bool { return p.storedEvents() >= events/4 }),
		"ingest stored %d events in two minutes", p.storedEvents())
	atKill := p.storedEvents()
	require.NoError(t, a.cmd.Process.Signal(syscall.SIGKILL))
	killed := time.Now()
	<-a.done //nolint:errcheck // SIGKILLed: its exit error says only that
	sum := wait()
	p.waitSums(expected(sum), 3*time.Minute)
	t.Logf("one of two ingest processes SIGKILLed with %d of %d events stored; every sum exact %.1f s later, the survivor holding all 8 partitions",
		atKill, events, time.Since(killed).Seconds())
	var lag int64
	require.True(t, stacktest.Eventually(t, time.Minute, 250*time.Millisecond, func() bool {
		lag, _, err = kafka.Lag(ctx, stacktest.ClusterBrokers(), topic, group)
		return err == nil && lag == 0
	}), "the group's lag is still %d", lag)

	// The trail is sealed whole, and verifies, whichever sealer held the topic.
	pub, err := trail.LoadPublicKey(auditKey + ".pub")
	require.NoError(t, err)
	var rep trail.Report
	require.True(t, stacktest.Eventually(t, 2*time.Minute, time.Second, func() bool {
		rep, err = trail.Verify(ctx, conn, db, trail.Keys{Anchors: []ed25519.PublicKey{pub}}, trail.Filter{})
		require.NoError(t, err)
		require.Empty(t, rep.Problems, "the cluster raised an alarm in the sealed trail")
		return rep.UnsealedEvents == 0
	}), "%d events still unsealed", rep.UnsealedEvents)
	t.Logf("verify on the cluster: %d checkpoints, %d leaves, %d sealed events", rep.Checkpoints, rep.Leaves, rep.SealedEvents)
}
