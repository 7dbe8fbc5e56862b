package replica_test

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/policy"
	"github.com/bandplane/bandplane/policy/api"
	"github.com/bandplane/bandplane/schema"
)

// decided is the policy.decided event of a send_message of agent (of org) for
// execution, set going by u-alice, as the policy API writes it.
func decided(t *testing.T, id, org, agent, execution string, allow bool, source string) schema.Event {
	t.Helper()
	in, err := json.Marshal(policy.MessageInput{Agent: agent, Room: "room-1", Tokens: 500, ExecutionID: execution,
		Chain: &policy.Chain{Depth: 2, Handoffs: 1, Initiator: "u-alice", InitiatorType: "user"}})
	require.NoError(t, err)
	data, err := json.Marshal(api.DecidedData{Decision: policy.SendMessage, Allow: allow, Reasons: []policy.Reason{}, Input: in})
	require.NoError(t, err)
	return schema.Event{ID: id, Type: schema.TypePolicyDecided, Time: time.Date(2026, 11, 2, 11, 0, 0, 0, time.UTC), OrgID: org,
		RoomID: "room-1", Actor: schema.Party{ID: agent, Type: schema.ActorAgent}, Source: source, SchemaVersion: schema.Version, Data: data}
}

func usageOf(id, execution string, tokens int) string {
	return `{"id":"` + id + `","type":"usage.reported","time":"2026-11-02T11:30:00Z","org_id":"other","room_id":"room-1","execution_id":"` + execution +
		`","actor":{"id":"a-rev","type":"agent"},"source":"t","data":{"input_tokens":` + strconv.Itoa(tokens) + `,"output_tokens":0,"cache_read_tokens":0,"cache_write_tokens":0}}`
}

// The canonical usage.reported carries no chain: a replica learns the initiator of an
// execution from the allowed send_message decisions of the trail, whichever replica
// took them, so the partner's agent's usage counts against u-alice's budgets (of her
// organization) on every replica, not only on the one holding the reservation.
func TestUsageOfADelegatedExecutionCountsAgainstItsInitiator(t *testing.T) {
	now := time.Date(2026, 11, 2, 12, 0, 0, 0, time.UTC)
	r, _, ledger := newReplica(t, now)
	apply(t, r, alice, partner, architect, reviewer)
	ctx := context.Background()
	for _, ev := range []schema.Event{
		decided(t, "d-1", "other", "a-rev", "x-1", true, api.SourcePolicy),
		decided(t, "d-2", "other", "a-rev", "x-2", false, api.SourcePolicy),   // denied: it ran nothing
		decided(t, "d-3", "other", "a-rev", "x-3", true, "router"),            // not bandplane's
		decided(t, "d-4", "other", "a-rev", "", true, api.SourcePolicy),       // no execution to follow
		decided(t, "d-1", "other", "a-rev", "x-1", true, api.SourcePolicy),    // a redelivery
		decided(t, "d-5", "other", "a-nobody", "x-1", true, api.SourcePolicy), // another agent's x-1
	} {
		require.NoError(t, r.Apply(ctx, &ev))
	}
	apply(t, r, usageOf("u-1", "x-1", 700), usageOf("u-2", "x-2", 50), usageOf("u-3", "x-3", 60), usageOf("u-4", "x-9", 80))

	tokens, _, _, _ := ledger.Spent("acme", policy.ScopeInitiator, "u-alice", policy.PeriodDay, now)
	assert.Equal(t, int64(700), tokens, "only the execution an allowed, bandplane-written decision named")
	tokens, _, _, _ = ledger.Spent("acme", policy.ScopeInitiator, "u-alice", policy.PeriodMonth, now)
	assert.Equal(t, int64(700), tokens)
	tokens, _, _, _ = ledger.Spent("other", policy.ScopeInitiator, "u-alice", policy.PeriodDay, now)
	assert.Zero(t, tokens, "a person's initiator budget is her organization's")
	tokens, _, _, _ = ledger.Spent("other", policy.ScopeAgent, "a-rev", policy.PeriodDay, now)
	assert.Equal(t, int64(890), tokens, "the agent's own budgets count all of it")

	// Usage stamped with another organization than its agent's counts against that
	// organization only: not against the initiator either.
	apply(t, r, `{"id":"u-5","type":"usage.reported","time":"2026-11-02T11:30:00Z","org_id":"mallory","room_id":"room-1","execution_id":"x-1","actor":{"id":"a-rev","type":"agent"},"source":"t","data":{"input_tokens":1000,"output_tokens":0,"cache_read_tokens":0,"cache_write_tokens":0}}`)
	tokens, _, _, _ = ledger.Spent("acme", policy.ScopeInitiator, "u-alice", policy.PeriodDay, now)
	assert.Equal(t, int64(700), tokens)
}

// On the replica that took the decision the reservation carries the initiator too: the
// usage report that settles it releases the initiator's reservation and counts the
// actual, once.
func TestSettlementReleasesTheInitiatorsReservation(t *testing.T) {
	now := time.Date(2026, 11, 2, 12, 0, 0, 0, time.UTC)
	r, _, ledger := newReplica(t, now)
	apply(t, r, alice, partner, architect, reviewer)
	b := policy.Budget{Org: "acme", Scope: policy.ScopeInitiator, ScopeID: "u-alice", Period: policy.PeriodDay, Tokens: 10_000, Hard: true, UpdatedAt: now}
	b.Normalize()
	ledger.Set(b, now)
	_, deny := ledger.Reserve("d-1", policy.Charge{Org: "other", Owner: "u-partner", Agent: "a-rev", Room: "room-1",
		Initiator: "u-alice", InitiatorOrg: "acme", Tokens: 5000}, "x-1", policy.DefaultLimits{}, now)
	require.Nil(t, deny)
	ev := decided(t, "d-1", "other", "a-rev", "x-1", true, api.SourcePolicy)
	require.NoError(t, r.Apply(context.Background(), &ev))
	apply(t, r, usageOf("u-1", "x-1", 700))
	spent, _, reserved, _ := ledger.Spent("acme", policy.ScopeInitiator, "u-alice", policy.PeriodDay, now)
	assert.Equal(t, [2]int64{700, 0}, [2]int64{spent, reserved})
}
