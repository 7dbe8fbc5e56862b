package ingest_test

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/simulate"
	"github.com/bandplane/bandplane/deploy/stacktest"
	"github.com/bandplane/bandplane/ingest"
	"github.com/bandplane/bandplane/query/trail"
)

// Outage tests stop shared servers or kill processes, so `make test` runs them alone,
// after the other tests, with BANDPLANE_OUTAGE_TESTS=1.
func requireOutage(t *testing.T) {
	stacktest.Require(t)
	if os.Getenv("BANDPLANE_OUTAGE_TESTS") != "1" {
		t.Skip("outage test: stops shared servers; `make test` runs it on its own")
	}
}

// sealAlong seals the pipeline's trail every second while the test runs, as serve
// --audit-key does; the returned check stops it (after its last seal) and verifies the
// trail: an outage must never raise a false alarm.
func (p *pipeline) sealAlong() (check func()) {
	p.t.Helper()
	_, key, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(p.t, err)
	t := trail.Topics{Brokers: stacktest.Brokers(), Stored: stacktest.StoredTopic(p.topic), Checkpoints: p.topic + "_checkpoints"}
	require.NoError(p.t, trail.EnsureTopics(context.Background(), t, 1))
	s, closeSealer, err := trail.NewOnKafka(trail.Config{Conn: p.conn, Database: p.db, Key: key, Every: time.Second, Logger: stacktest.Logger()}, t)
	require.NoError(p.t, err)
	p.t.Cleanup(func() { _ = closeSealer() })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Run(ctx) }()
	p.t.Cleanup(cancel)
	return func() {
		p.t.Helper()
		cancel()
		<-done
		verifyTrail(p.t, p.conn, p.db, key.Public().(ed25519.PublicKey))
	}
}

// verifyTrail checks the sealed trail and fails on any problem.
func verifyTrail(t *testing.T, conn driver.Conn, db string, pub ed25519.PublicKey) {
	t.Helper()
	rep, err := trail.Verify(context.Background(), conn, db, trail.Keys{Anchors: []ed25519.PublicKey{pub}}, trail.Filter{})
	require.NoError(t, err, "verifying the sealed trail of %s", db)
	require.Empty(t, rep.Problems, "the outage raised an alarm in the sealed trail")
	require.Positive(t, rep.SealedEvents, "events sealed in %s", db)
	t.Logf("verify: %d checkpoints, %d leaves, %d events sealed, %d not sealed yet", rep.Checkpoints, rep.Leaves, rep.SealedEvents, rep.UnsealedEvents)
}

// produceInBackground sends a paced workload and returns its summary on the channel.
func (p *pipeline) produceInBackground(events int, rate float64, seed int64) <-chan simulate.Summary {
	out := make(chan simulate.Summary, 1)
	go func() {
		cfg := simulate.DefaultConfig()
		cfg.Events, cfg.Seed, cfg.Rate, cfg.BatchSize = events, seed, rate, 200
		cfg.Start = time.Date(2026, 11, 3, 9, 0, 0, 0, time.UTC)
		sum, err := simulate.Run(context.Background(), cfg, ingest.ProducerSink{Producer: p.producer}, nil)
		if err != nil {
			p.t.Errorf("simulate: %v", err)
		}
		out <- sum
	}()
	return out
}

// stackScript runs deploy/local/<server>.sh cmd (start, stop) on the shared servers.
func stackScript(t *testing.T, server, cmd string) {
	t.Helper()
	c := exec.Command(filepath.Join(stacktest.RepoRoot(), "deploy", "local", server+".sh"), cmd)
	out, err := c.CombinedOutput()
	require.NoError(t, err, "%s.sh %s: %s", server, cmd, out)
}

func TestIntegrationOutageClickHouseRestart(t *testing.T) {
	requireOutage(t)
	p := newPipeline(t)
	p.start("ingest")
	sealed := p.sealAlong()
	done := p.produceInBackground(12000, 3000, 11)
	time.Sleep(1500 * time.Millisecond)
	stackScript(t, "clickhouse", "stop")
	t.Log("clickhouse stopped mid-stream")
	// Make sure the stream went on while the database was down.
	time.Sleep(3 * time.Second)
	t.Cleanup(func() { stackScript(t, "clickhouse", "start") })
	stackScript(t, "clickhouse", "start")
	t.Log("clickhouse started again")
	sum := <-done
	p.waitSums(expected(sum), 120*time.Second)
	sealed()
}

// TestIntegrationOutageKafkaRestart stops the broker while the consumer works through a
// backlog (its fetches and offset commits fail), starts it again, and produces more:
// everything is counted exactly once.
func TestIntegrationOutageKafkaRestart(t *testing.T) {
	requireOutage(t)
	p := newPipeline(t)
	before := p.simulate(20000, 13) // the backlog, produced while the broker is up
	p.start("ingest")
	sealed := p.sealAlong()
	time.Sleep(300 * time.Millisecond)
	stackScript(t, "kafka", "stop")
	t.Logf("kafka stopped while the consumer was working (%d of %d events stored)", p.rawCount("events"), before.Events)
	t.Cleanup(func() { stackScript(t, "kafka", "start") })
	time.Sleep(4 * time.Second)
	stackScript(t, "kafka", "start")
	t.Log("kafka started again")
	after := p.simulateFrom(5000, 14, time.Date(2026, 11, 4, 9, 0, 0, 0, time.UTC))
	p.waitSums(plus(expected(before), expected(after)), 180*time.Second)
	sealed()
}

func plus(a, b sums) sums {
	return sums{
		Events: a.Events + b.Events, Input: a.Input + b.Input, Output: a.Output + b.Output,
		CacheRead: a.CacheRead + b.CacheRead, CacheWrite: a.CacheWrite + b.CacheWrite,
		CostMicros: a.CostMicros + b.CostMicros, Unpriced: a.Unpriced + b.Unpriced,
		RollupInput: a.RollupInput + b.RollupInput, RollupOutput: a.RollupOutput + b.RollupOutput,
		RollupCostMicros: a.RollupCostMicros + b.RollupCostMicros, RollupEvents: a.RollupEvents + b.RollupEvents,
	}
}

func TestIntegrationOutageConsumerKilledMidBatch(t *testing.T) {
	requireOutage(t)
	bin := filepath.Join(t.TempDir(), "bandplane")
	build := exec.Command("go", "build", "-o", bin, "./cmd/bandplane")
	build.Dir = stacktest.RepoRoot()
	out, err := build.CombinedOutput()
	require.NoError(t, err, "go build: %s", out)

	p := newPipeline(t)
	auditKey := filepath.Join(t.TempDir(), "audit.key")
	require.NoError(t, trail.GenerateKey(auditKey))
	serve := func() (*exec.Cmd, *strings.Builder) {
		cmd := exec.Command(bin, "serve", "--topic", p.topic, "--dlq-topic", p.topic+"_dlq", "--clickhouse-db", p.db,
			"--kafka", strings.Join(stacktest.Brokers(), ","), "--clickhouse", stacktest.ClickHouseAddr(),
			"--listen", "127.0.0.1:0", "--otlp-grpc-listen", "", "--batch-size", "3000", "--batch-age", "1s",
			"--rollup-interval", "200ms", "--audit-key", auditKey, "--seal-every", "1s")
		var log strings.Builder
		stderr, err := cmd.StderrPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		started := make(chan struct{})
		go func() {
			s := bufio.NewScanner(stderr)
			once := false
			for s.Scan() {
				log.WriteString(s.Text() + "\n")
				if !once && strings.Contains(s.Text(), `"msg":"serving"`) {
					once = true
					close(started)
				}
			}
		}()
		select {
		case <-started:
		case <-time.After(60 * time.Second):
			_ = cmd.Process.Kill()
			t.Fatalf("bandplane serve did not start:\n%s", log.String())
		}
		return cmd, &log
	}
	first, _ := serve()
	done := p.produceInBackground(15000, 3000, 12)
	time.Sleep(2500 * time.Millisecond)
	require.NoError(t, first.Process.Signal(syscall.SIGKILL))
	_ = first.Wait()
	t.Log("consumer killed with SIGKILL mid-stream")
	time.Sleep(time.Second)
	second, log := serve()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			_ = second.Process.Signal(syscall.SIGTERM)
			_ = second.Wait()
		}
	}
	t.Cleanup(stop)
	sum := <-done
	var got sums
	ok := stacktest.Eventually(t, 120*time.Second, 250*time.Millisecond, func() bool {
		got = p.sums()
		return got == expected(sum)
	})
	require.True(t, ok, "after the kill: got %+v, want %+v\nserve log:\n%s", got, expected(sum), tail(log.String(), 30))
	// A clean stop seals what is left; the kill and the redelivery raised no alarm.
	stop()
	pub, err := trail.LoadPublicKey(auditKey + ".pub")
	require.NoError(t, err)
	verifyTrail(t, p.conn, p.db, pub)
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n") + fmt.Sprintf("\n(%d lines)", len(lines))
}
