package stacktest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	kafkago "github.com/segmentio/kafka-go"

	"github.com/bandplane/bandplane/schema/kafka"
)

// The three-node Kafka cluster of `deploy/local/kafka.sh --brokers 3` (`make
// test-cluster` starts it). Cluster tests run when BANDPLANE_CLUSTER_TESTS=1 as well as
// BANDPLANE_INTEGRATION=1; the single-node stack's ClickHouse is used as it is.

// ClusterBrokers is the cluster's bootstrap list, node 1 first
// (BANDPLANE_CLUSTER_KAFKA, default the three loopback ports kafka.sh uses). Broker n of
// KillBroker and StartBroker is node n of kafka.sh, whose node.id is n.
func ClusterBrokers() []string {
	return strings.Split(env("BANDPLANE_CLUSTER_KAFKA", "127.0.0.1:29092,127.0.0.1:29192,127.0.0.1:29292"), ",")
}

// RequireCluster skips t unless cluster tests are enabled, and fails it when the
// cluster does not answer with three brokers.
func RequireCluster(t testing.TB) {
	t.Helper()
	if os.Getenv("BANDPLANE_CLUSTER_TESTS") != "1" {
		t.Skip("cluster test: run `make test-cluster` (starts the three-broker Kafka cluster, sets BANDPLANE_CLUSTER_TESTS=1)")
	}
	Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	n, err := kafka.LiveBrokers(ctx, ClusterBrokers())
	if err != nil || n != 3 {
		t.Fatalf("the three-broker cluster at %s is not up (%d brokers, %v): start it with `deploy/local/kafka.sh --brokers 3 start`",
			strings.Join(ClusterBrokers(), ","), n, err)
	}
}

// ClusterTopic creates a unique topic on the cluster with EnsureTopic and deletes it at
// cleanup.
func ClusterTopic(t testing.TB, partitions int) string {
	t.Helper()
	RequireCluster(t)
	topic := Name(t)
	ensureClusterTopic(t, topic, partitions)
	return topic
}

func ensureClusterTopic(t testing.TB, topic string, partitions int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := ensureTopic(ctx, ClusterBrokers(), topic, partitions); err != nil {
		t.Fatalf("%v\n(start the cluster with `deploy/local/kafka.sh --brokers 3 start`)", err)
	}
	t.Cleanup(func() {
		c := &kafkago.Client{Addr: kafkago.TCP(ClusterBrokers()...), Timeout: 10 * time.Second}
		_, _ = c.DeleteTopics(context.Background(), &kafkago.DeleteTopicsRequest{Topics: []string{topic}})
	})
}

// RunClusterIngest is RunIngest on the cluster: the real pipeline on topic (and a
// dead-letter topic beside it, on the cluster too) into db.
func RunClusterIngest(t testing.TB, topic string, conn driver.Conn, db, group string) (stop func()) {
	t.Helper()
	ensureClusterTopic(t, topic+"_dlq", 1)
	ensureClusterTopic(t, StoredTopic(topic), 1)
	return runIngest(t, ClusterBrokers(), topic, conn, db, group)
}

// kafkaSh runs deploy/local/kafka.sh --brokers 3 with args and returns its output.
func kafkaSh(ctx context.Context, args ...string) (string, error) {
	script := filepath.Join(RepoRoot(), "deploy", "local", "kafka.sh")
	cmd := exec.CommandContext(ctx, script, append([]string{"--brokers", "3"}, args...)...)
	// The script's ports follow BANDPLANE_CLUSTER_KAFKA when that is set.
	if v := os.Getenv("BANDPLANE_CLUSTER_KAFKA"); v != "" {
		var ports []string
		for _, a := range strings.Split(v, ",") {
			ports = append(ports, a[strings.LastIndex(a, ":")+1:])
		}
		cmd.Env = append(os.Environ(), "BANDPLANE_KAFKA_CLUSTER_PORTS="+strings.Join(ports, ","))
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kafka.sh --brokers 3 %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// KillBroker SIGKILLs broker n (1-3). If the test ends with it still down, cleanup
// starts it again, so the next test finds three brokers.
func KillBroker(t testing.TB, n int) {
	t.Helper()
	if _, err := kafkaSh(context.Background(), "kill-node", fmt.Sprint(n)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if out, err := kafkaSh(context.Background(), "start-node", fmt.Sprint(n)); err != nil {
			t.Logf("cannot restart broker %d after the test: %v\n%s", n, err, out)
		}
	})
}

// StartBroker starts broker n again and returns once kafka.sh reports it back in the
// cluster (registered with the controller and unfenced); it is idempotent.
func StartBroker(t testing.TB, n int) {
	t.Helper()
	if err := StartNode(context.Background(), n); err != nil {
		t.Fatal(err)
	}
}

// StartNode is StartBroker for another goroutine than the test's: it returns the error.
func StartNode(ctx context.Context, n int) error {
	_, err := kafkaSh(ctx, "start-node", fmt.Sprint(n))
	return err
}

// PartitionLeaders maps each partition of topic to its leader's broker id.
func PartitionLeaders(ctx context.Context, topic string) (map[int]int, error) {
	c := &kafkago.Client{Addr: kafkago.TCP(ClusterBrokers()...), Timeout: 10 * time.Second}
	md, err := c.Metadata(ctx, &kafkago.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return nil, fmt.Errorf("cannot read the metadata of topic %s: %w", topic, err)
	}
	out := map[int]int{}
	for _, tp := range md.Topics {
		if tp.Name == topic {
			for _, p := range tp.Partitions {
				out[p.ID] = p.Leader.ID
			}
		}
	}
	return out, nil
}

// GroupCoordinator is the broker id of the consumer group's coordinator.
func GroupCoordinator(ctx context.Context, group string) (int, error) {
	c := &kafkago.Client{Addr: kafkago.TCP(ClusterBrokers()...), Timeout: 10 * time.Second}
	resp, err := c.FindCoordinator(ctx, &kafkago.FindCoordinatorRequest{Key: group, KeyType: kafkago.CoordinatorKeyTypeConsumer})
	if err != nil {
		return 0, fmt.Errorf("cannot find the coordinator of group %s: %w", group, err)
	}
	if resp.Error != nil {
		return 0, fmt.Errorf("cannot find the coordinator of group %s: %w", group, resp.Error)
	}
	return resp.Coordinator.NodeID, nil
}

// WaitInSync waits until every partition of topic has all its replicas in sync (a
// restarted broker has caught up) and fails t if that takes longer than timeout.
func WaitInSync(t testing.TB, topic string, timeout time.Duration) {
	t.Helper()
	var behind []string
	ok := Eventually(t, timeout, 250*time.Millisecond, func() bool {
		c := &kafkago.Client{Addr: kafkago.TCP(ClusterBrokers()...), Timeout: 10 * time.Second}
		md, err := c.Metadata(context.Background(), &kafkago.MetadataRequest{Topics: []string{topic}})
		if err != nil {
			behind = []string{err.Error()}
			return false
		}
		behind = nil
		for _, tp := range md.Topics {
			for _, p := range tp.Partitions {
				var isr []int
				for _, b := range p.Isr {
					isr = append(isr, b.ID)
				}
				for _, r := range p.Replicas {
					if !slices.Contains(isr, r.ID) {
						behind = append(behind, fmt.Sprintf("partition %d: replica %d not in ISR %v", p.ID, r.ID, isr))
					}
				}
			}
		}
		return len(behind) == 0
	})
	if !ok {
		t.Fatalf("topic %s not fully in sync after %s: %s", topic, timeout, strings.Join(behind, "; "))
	}
}
