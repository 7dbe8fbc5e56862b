package replica_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/policy"
	"github.com/bandplane/bandplane/schema"
)

// Run applies each record of the topic inside Directory.Applying (the wiring itself is
// covered by TestIntegrationDecisionsFollowTheStreamAndThrottleTheChattyAgent, which
// needs Kafka). Here: every kind of record Apply handles, and one that does not decode,
// applied that way, neither deadlocks (nothing Apply calls takes the directory's apply
// lock) nor fails to advance the position, and a decision reads the two together.
func TestRecordsAppliedInsideApplyingAdvanceThePosition(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2026, 11, 2, 12, 0, 0, 0, time.UTC)
	r, dir, spend := newReplica(t, now)
	dir.SetPosition(policy.Position{0: 10, 1: 3}) // where the bootstrap left ClickHouse
	eng, err := policy.New(ctx, policy.Config{Directory: dir, Ledger: spend, Now: func() time.Time { return now }})
	require.NoError(t, err)

	records := []struct {
		partition int
		value     string
	}{
		{0, alice},
		{0, architect},
		{1, `{"topic":"room_participants:room-1","event":"participant_added","payload":{"id":"a-arch","name":"Architect","type":"Agent","inserted_at":"2026-11-02T10:06:00Z"}}`},
		{1, `not an event`},
		{0, `{"id":"s1","type":"agent.suspended","time":"2026-11-02T09:10:00Z","org_id":"acme","actor":{"id":"key-op","type":"system"},"subject":{"id":"a-arch","type":"agent"},"source":"bandplane-policy","data":{"reason":"chatty"}}`},
		{1, `{"id":"u-1","type":"usage.reported","time":"2026-11-02T11:00:00Z","room_id":"room-1","actor":{"id":"a-arch","type":"agent"},"source":"t","data":{"input_tokens":1000,"output_tokens":100,"cache_read_tokens":0,"cache_write_tokens":0}}`},
	}
	next := map[int]int64{0: 10, 1: 3}
	decide := func() policy.Decision {
		d, err := eng.SendMessage(ctx, policy.MessageInput{Agent: "a-arch", Room: "room-1"})
		require.NoError(t, err)
		return d
	}
	assert.Equal(t, "unknown_agent", decide().Reasons[0].Code)
	for _, rec := range records {
		offset := next[rec.partition]
		next[rec.partition]++
		dir.Applying(rec.partition, offset+1, func() {
			if ev, err := schema.Decode([]byte(rec.value)); err == nil {
				assert.NoError(t, r.Apply(ctx, &ev))
			}
		})
		if rec.partition == 1 && next[1] == 5 {
			d := decide()
			assert.True(t, d.Allow, "registered and in the room: %+v", d)
			assert.Equal(t, policy.Position{0: 12, 1: 5}, d.Position)
		}
	}
	d := decide()
	assert.Equal(t, "suspended", d.Reasons[0].Code)
	assert.Equal(t, policy.Position{0: 13, 1: 6}, d.Position)
	assert.Equal(t, policy.Position{0: 13, 1: 6}, dir.Position())
}
