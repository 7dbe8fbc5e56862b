package replica_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/simulate"
	"github.com/bandplane/bandplane/deploy/stacktest"
	"github.com/bandplane/bandplane/ingest"
	"github.com/bandplane/bandplane/policy"
	"github.com/bandplane/bandplane/policy/api"
	"github.com/bandplane/bandplane/policy/replica"
	"github.com/bandplane/bandplane/schema/kafka"
	"github.com/bandplane/bandplane/schema/pricing"
)

// The whole governance loop on the real stack: simulated platform traffic goes through
// Kafka into ClickHouse; a policy process bootstraps its directory from ClickHouse,
// follows the topic, answers decisions, and audits each through Kafka back into the
// audit trail.
func TestIntegrationDecisionsFollowTheStreamAndThrottleTheChattyAgent(t *testing.T) {
	ctx := context.Background()
	topic := stacktest.Topic(t, 4)
	conn, db := stacktest.Database(t)
	stacktest.RunIngest(t, topic, conn, db, "ingest")
	producer, err := kafka.NewProducer(kafka.ProducerConfig{Brokers: stacktest.Brokers(), Topic: topic})
	require.NoError(t, err)
	defer producer.Close() //nolint:errcheck // Publish returns once the brokers acknowledge: nothing is left to send

	// 1. Traffic from before the policy process starts: it must reach the directory
	// through ClickHouse (bootstrap), not by replaying the topic.
	cfg := simulate.DefaultConfig()
	cfg.Events, cfg.Seed = 3000, 5
	cfg.Start = time.Now().UTC().Add(-2 * time.Hour).Truncate(time.Second)
	sum, err := simulate.Run(ctx, cfg, ingest.ProducerSink{Producer: producer}, nil)
	require.NoError(t, err)
	require.True(t, stacktest.Eventually(t, 60*time.Second, 200*time.Millisecond, func() bool {
		var n uint64
		return conn.QueryRow(ctx, "SELECT count() FROM "+db+".events FINAL").Scan(&n) == nil && n == uint64(sum.Events)
	}), "ingest did not store the simulated traffic")

	// 2. The policy process.
	dir := policy.NewDirectory()
	eng, err := policy.New(ctx, policy.Config{Directory: dir})
	require.NoError(t, err)
	rep, err := replica.New(replica.Config{Directory: dir, Ledger: eng.Ledger(), Catalog: pricing.Default(), Conn: conn,
		Database: db, Brokers: stacktest.Brokers(), Topic: topic, GroupID: stacktest.Name(t), Logger: stacktest.Logger()})
	require.NoError(t, err)
	a, err := api.New(api.Config{Engine: eng, Auditor: producer})
	require.NoError(t, err)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ready, runErr := make(chan struct{}), make(chan error, 1)
	go func() { runErr <- rep.Run(rctx, ready) }()
	select {
	case <-ready:
	case err := <-runErr:
		t.Fatalf("replica: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("replica did not bootstrap")
	}
	resolve := func(h string) string {
		id, ok := dir.ResolveHandle(h)
		require.True(t, ok, "%s is not in the bootstrapped directory", h)
		return id
	}
	architect, partnerReviewer := resolve("maya/architect-agent"), resolve("partner/reviewer-agent")
	// The bootstrap sets the directory's position where ClickHouse ends; each record
	// the replica applies advances it, and each decision records it.
	boot := dir.Position()
	require.NotEmpty(t, boot, "the bootstrap sets the directory's position")
	total := func(p policy.Position) (n int64) {
		for _, o := range p {
			n += o
		}
		return n
	}

	// The tutorial's contact request (architect → partner's reviewer) was approved in the
	// stream: the partner's private agent is now the architect's peer, as a contact.
	d, err := a.Decide(ctx, policy.PeerVisible, &policy.PeerInput{Agent: architect, Candidate: partnerReviewer})
	require.NoError(t, err)
	assert.True(t, d.Allow, "contact approved in the stream: %+v", d)
	assert.True(t, d.IsContact)

	// 3. A new approval while the replica runs: the next decisions reflect it.
	snap := dir.Snapshot()
	archAgent, _ := dir.Agent(architect)
	var stranger policy.Agent
	for _, ag := range snap.Agents {
		if ag.Org != archAgent.Org && !ag.Global && !ag.Suspended && ag.Listed && ag.ID != partnerReviewer {
			d, err := a.Decide(ctx, policy.PeerVisible, &policy.PeerInput{Agent: architect, Candidate: ag.ID})
			require.NoError(t, err)
			if !d.Allow {
				stranger = ag
				break
			}
		}
	}
	require.NotEmpty(t, stranger.ID, "the simulated directory has no agent the architect cannot see")
	now := time.Now().UTC().Format(time.RFC3339Nano)
	frame := func(event, status string) []byte {
		b, _ := json.Marshal(map[string]any{"topic": "agent_contacts:" + stranger.ID, "event": event, "payload": map[string]any{
			"id": "req-it-" + stranger.ID, "from_handle": archAgent.Handle, "from_name": "Architect Agent",
			"status": status, "inserted_at": now, "updated_at": now}})
		return b
	}
	require.NoError(t, ingest.ProducerSink{Producer: producer}.Send(ctx, [][]byte{
		frame("contact_request_received", "pending"), frame("contact_request_updated", "approved")}))
	var seen policy.Decision
	require.True(t, stacktest.Eventually(t, 30*time.Second, 100*time.Millisecond, func() bool {
		d, err := a.Decide(ctx, policy.PeerVisible, &policy.PeerInput{Agent: architect, Candidate: stranger.ID})
		seen = d
		return err == nil && d.Allow && d.IsContact
	}), "an approval in the stream did not reach the decisions")
	assert.Greater(t, total(seen.Position), total(boot), "the decision that sees the approval records the records it came in")

	// 4. The chatty agent is throttled in its room.
	chatty := resolve(sum.ChattyAgent)
	var room string
	for r, members := range snap.Rooms {
		for _, m := range members {
			if m == chatty {
				room = r
			}
		}
	}
	require.NotEmpty(t, room, "the chatty agent is in no room")
	allowed, denied := 0, 0
	var retry int64
	for i := 0; i < 20; i++ {
		d, err := a.Decide(ctx, policy.SendMessage, &policy.MessageInput{Agent: chatty, Room: room})
		require.NoError(t, err)
		if d.Allow {
			allowed++
			continue
		}
		denied++
		retry = d.RetryAfterMs
		require.NotEmpty(t, d.Reasons)
		assert.Equal(t, "rate_limited", d.Reasons[0].Code)
	}
	assert.Equal(t, 12, allowed, "the default quota is 12 messages a minute per agent and room")
	assert.Equal(t, 8, denied)
	assert.Greater(t, retry, int64(0), "a throttled answer says when to retry")

	// 5. Its denials are in the audit trail, through Kafka and ingest.
	var stored uint64
	ok := stacktest.Eventually(t, 30*time.Second, 200*time.Millisecond, func() bool {
		return conn.QueryRow(ctx, fmt.Sprintf(`SELECT count() FROM %s.events FINAL
			WHERE type = 'policy.decided' AND actor_id = ? AND room_id = ? AND data LIKE '%%"allow":false%%'
			AND data LIKE '%%rate_limited%%'`, db), chatty, room).Scan(&stored) == nil && stored == uint64(denied)
	})
	assert.True(t, ok, "audit trail holds %d throttled decisions of the chatty agent, want %d", stored, denied)
}
