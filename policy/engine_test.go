package policy

import (
	"context"
	"encoding/json"
	"io/fs"
	"math"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const webhookRoom = "room-webhook-retries"

func copyBundle(t *testing.T) fstest.MapFS {
	t.Helper()
	m := fstest.MapFS{}
	require.NoError(t, fs.WalkDir(DefaultBundle(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(DefaultBundle(), p)
		m[p] = &fstest.MapFile{Data: b}
		return err
	}))
	return m
}

func TestConfigValidate(t *testing.T) {
	_, err := New(context.Background(), Config{})
	require.ErrorContains(t, err, "no directory")
}

func TestDecideUnknownName(t *testing.T) {
	e := exampleEngine(t)
	_, err := e.Decide(context.Background(), "launch_rockets", map[string]any{})
	require.ErrorContains(t, err, `cannot decide "launch_rockets": unknown decision`)
}

func TestDecideMapAndTypedInputsAgree(t *testing.T) {
	ctx := context.Background()
	e := exampleEngine(t)
	typed, err := e.AddParticipant(ctx, AddInput{Actor: "a-architect", Room: webhookRoom, Participant: "a-reviewer"})
	require.NoError(t, err)
	untyped, err := e.Decide(ctx, AddParticipant, map[string]any{"actor": "a-architect", "room": webhookRoom, "participant": "a-reviewer"})
	require.NoError(t, err)
	assert.True(t, typed.Allow)
	assert.Equal(t, typed.Via, untyped.Via)
	assert.Equal(t, typed.Reasons, untyped.Reasons)
	assert.NotEqual(t, typed.DecisionID, untyped.DecisionID)
	assert.Len(t, typed.DecisionID, 36)
	assert.Equal(t, e.Revision(), typed.PolicyRevision)
	assert.Len(t, typed.PolicyRevision, 64)
}

func TestCallerCannotSupplyFacts(t *testing.T) {
	ctx := context.Background()
	e := exampleEngine(t)
	// A stranger claiming, through input.facts, to be its target's contact.
	forged := map[string]any{"actor": "a-architect", "room": webhookRoom, "participant": "a-partner-reviewer",
		"facts": map[string]any{"contact": true}}
	_, err := e.Decide(ctx, AddParticipant, forged)
	require.ErrorContains(t, err, "input.facts is reserved")
	_, err = e.Decide(ctx, SendMessage, map[string]any{"agent": "a-architect", "room": webhookRoom, "facts": map[string]any{}})
	require.ErrorContains(t, err, "input.facts is reserved")

	// The engine's own facts: the same question without them is denied.
	delete(forged, "facts")
	d, err := e.Decide(ctx, AddParticipant, forged)
	require.NoError(t, err)
	assert.False(t, d.Allow)
}

func TestDecideLeavesACallersASTInputAlone(t *testing.T) {
	e := exampleEngine(t)
	in := ast.MustParseTerm(`{"actor": "a-architect", "room": "room-webhook-retries", "participant": "a-reviewer"}`).Value
	d, err := e.Decide(context.Background(), AddParticipant, in)
	require.NoError(t, err)
	assert.True(t, d.Allow)
	assert.Nil(t, in.(ast.Object).Get(ast.StringTerm("facts")), "the engine's facts went into the caller's value")
}

func TestFactsFollowDirectoryChanges(t *testing.T) {
	ctx := context.Background()
	e := exampleEngine(t)
	in := AddInput{Actor: "a-architect", Room: webhookRoom, Participant: "a-reviewer"}
	d, err := e.AddParticipant(ctx, in)
	require.NoError(t, err)
	require.True(t, d.Allow)

	require.NoError(t, e.Directory().Suspend(ctx, "a-reviewer", true))
	d, err = e.AddParticipant(ctx, in)
	require.NoError(t, err)
	assert.Equal(t, "participant_suspended", d.Reasons[0].Code)

	require.NoError(t, e.Directory().Suspend(ctx, "a-reviewer", false))
	require.NoError(t, e.Directory().JoinRoom(ctx, webhookRoom, "a-reviewer"))
	d, err = e.AddParticipant(ctx, in)
	require.NoError(t, err)
	assert.Equal(t, "already_participant", d.Reasons[0].Code)

	m, err := e.SendMessage(ctx, MessageInput{Agent: "a-reviewer", Room: webhookRoom})
	require.NoError(t, err)
	assert.True(t, m.Allow, m.Reasons)
}

func TestEvalErrorAndUndefinedDeny(t *testing.T) {
	ctx := context.Background()
	b := copyBundle(t)
	// contact_request that errs at run time, and send_message that is undefined.
	b["contact_request.rego"] = &fstest.MapFile{Data: []byte(`package bandplane.contact_request

decision := {"allow": true, "n": to_number(input.handle)}
`)}
	b["send_message.rego"] = &fstest.MapFile{Data: []byte(`package bandplane.send_message

decision := {"allow": true} if input.never
`)}
	delete(b, "contact_request_test.rego")
	delete(b, "send_message_test.rego")
	e, err := New(ctx, Config{Directory: NewDirectory(), Bundle: b})
	require.NoError(t, err)

	d, err := e.ContactRequest(ctx, ContactInput{From: "a", Handle: "not a number"})
	require.NoError(t, err)
	assert.False(t, d.Allow)
	require.Len(t, d.Reasons, 1)
	assert.Equal(t, CodeEvalError, d.Reasons[0].Code)

	d, err = e.SendMessage(ctx, MessageInput{Agent: "a", Room: "r"})
	require.NoError(t, err)
	assert.False(t, d.Allow)
	assert.Equal(t, []Reason{{Code: CodeUndefined, Message: "send_message is undefined for this input"}}, d.Reasons)
}

func TestReload(t *testing.T) {
	ctx := context.Background()
	e := exampleEngine(t)
	old := e.Revision()

	t.Run("a failing Rego test keeps the old revision", func(t *testing.T) {
		b := copyBundle(t)
		b["extra_test.rego"] = &fstest.MapFile{Data: []byte("package extra_test\n\ntest_fails if false\n")}
		_, err := e.Reload(ctx, b)
		require.ErrorContains(t, err, "1 Rego tests failed: data.extra_test.test_fails")
		assert.Equal(t, old, e.Revision())
	})
	t.Run("a syntax error keeps the old revision", func(t *testing.T) {
		b := copyBundle(t)
		b["lib.rego"] = &fstest.MapFile{Data: []byte("package bandplane.lib\n\nthis is not rego\n")}
		_, err := e.Reload(ctx, b)
		require.ErrorContains(t, err, "cannot parse policy file lib.rego")
		assert.Equal(t, old, e.Revision())
	})
	t.Run("a bundle without a decision is refused", func(t *testing.T) {
		b := copyBundle(t)
		delete(b, "send_message.rego")
		delete(b, "send_message_test.rego")
		_, err := e.Reload(ctx, b)
		require.ErrorContains(t, err, "no rule data.bandplane.send_message.decision")
		assert.Equal(t, old, e.Revision())
	})
	t.Run("a good bundle serves the next decisions", func(t *testing.T) {
		b := copyBundle(t)
		b["data.json"].Data = []byte(`{"governance": {"cross_org_add_requires_contact": false},
			"quotas": {"defaults": {"window_seconds": 60, "messages_per_window_agent": 1, "messages_per_window_agent_room": 5}, "orgs": {}, "agents": {}}}`)
		rev, err := e.Reload(ctx, b)
		require.NoError(t, err)
		assert.NotEqual(t, old, rev)
		assert.Equal(t, rev, e.Revision())
		d, err := e.AddParticipant(ctx, AddInput{Actor: "a-architect", Room: webhookRoom, Participant: "a-search"})
		require.NoError(t, err)
		assert.True(t, d.Allow, "global agent across orgs is allowed once the setting is off: %+v", d)
		assert.Equal(t, rev, d.PolicyRevision)
		// The same files give the same revision.
		again, err := e.Reload(ctx, b)
		require.NoError(t, err)
		assert.Equal(t, rev, again)
	})
}

// TestConcurrentDecisionsMutationsReloads runs decisions while the directory changes
// and bundles swap; run with -race. The last change leaves a-reviewer out of the room
// and not suspended.
func TestConcurrentDecisionsMutationsReloads(t *testing.T) {
	ctx := context.Background()
	e := exampleEngine(t)
	dir := e.Directory()
	in := AddInput{Actor: "a-architect", Room: webhookRoom, Participant: "a-reviewer"}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 2 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				d, err := e.AddParticipant(ctx, in)
				if err != nil || d.PolicyRevision == "" {
					t.Error(err, d)
					return
				}
				if _, err := e.SendMessage(ctx, MessageInput{Agent: "a-reviewer", Room: webhookRoom}); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	for i := range 50 {
		// The facts' records are rebuilt on every change of an agent.
		require.NoError(t, dir.Suspend(ctx, "a-reviewer", i%3 == 0))
		if i%2 == 0 {
			require.NoError(t, dir.JoinRoom(ctx, webhookRoom, "a-reviewer"))
		} else {
			require.NoError(t, dir.LeaveRoom(ctx, webhookRoom, "a-reviewer"))
		}
		if i%10 == 0 {
			_, err := e.Reload(ctx, DefaultBundle())
			require.NoError(t, err)
		}
	}
	close(stop)
	wg.Wait()
	d, err := e.AddParticipant(ctx, in)
	require.NoError(t, err)
	assert.True(t, d.Allow, "reviewer left last: %+v", d)
}

func TestMutationsAreSeenImmediately(t *testing.T) {
	ctx := context.Background()
	e := exampleEngine(t)
	dir := e.Directory()
	add := AddInput{Actor: "a-architect", Room: webhookRoom, Participant: "a-partner-reviewer"}

	d, err := e.AddParticipant(ctx, add)
	require.NoError(t, err)
	assert.Equal(t, "not_peer", d.Reasons[0].Code)

	// The partner approves: the request clears and the two become contacts.
	require.NoError(t, dir.ClearPending(ctx, "a-architect", "a-partner-reviewer"))
	require.NoError(t, dir.AddContact(ctx, "a-architect", "a-partner-reviewer"))
	d, err = e.AddParticipant(ctx, add)
	require.NoError(t, err)
	assert.True(t, d.Allow)
	assert.True(t, d.IsContact)
	assert.Equal(t, "contact", d.Via)

	p, err := e.PeerVisible(ctx, PeerInput{Agent: "a-architect", Room: webhookRoom})
	require.NoError(t, err)
	assert.Contains(t, p.Peers, Peer{ID: "a-partner-reviewer", Kind: "agent", Handle: "partner/reviewer-agent", IsContact: true, Reason: "contact"})

	require.NoError(t, dir.Suspend(ctx, "a-partner-reviewer", true))
	d, err = e.AddParticipant(ctx, add)
	require.NoError(t, err)
	assert.Equal(t, "participant_suspended", d.Reasons[0].Code)

	require.NoError(t, dir.Suspend(ctx, "a-partner-reviewer", false))
	require.NoError(t, dir.RemoveContact(ctx, "a-partner-reviewer", "a-architect"))
	d, err = e.AddParticipant(ctx, add)
	require.NoError(t, err)
	assert.False(t, d.Allow, "no other connection after removal")

	// Org sharing is indexed: turning it on makes the agent a peer.
	notes, ok := dir.Agent("a-notes")
	require.True(t, ok)
	notes.SharedWithOrg = true
	require.NoError(t, dir.UpsertAgent(ctx, notes))
	d, err = e.AddParticipant(ctx, AddInput{Actor: "a-architect", Room: webhookRoom, Participant: "a-notes"})
	require.NoError(t, err)
	assert.Equal(t, "org_shared", d.Via)

	id, ok := dir.ResolveHandle(" @Partner/Reviewer-Agent")
	assert.True(t, ok)
	assert.Equal(t, "a-partner-reviewer", id)
	_, ok = dir.ResolveHandle("@nobody")
	assert.False(t, ok)

	// An operator's suspension of an agent not registered yet holds from its registration.
	require.NoError(t, dir.Suspend(ctx, "a-later", true))
	require.NoError(t, dir.UpsertAgent(ctx, Agent{ID: "a-later", Owner: "u-bob", Handle: "bob/later-agent", Listed: true}))
	later, ok := dir.Agent("a-later")
	require.True(t, ok)
	assert.True(t, later.IsSuspended())
	assert.ErrorContains(t, dir.Suspend(ctx, "", true), "agent without id")
	assert.ErrorContains(t, dir.UpsertAgent(ctx, Agent{ID: "a-x", Owner: "u-bob", Handle: "alice/coder-agent"}), "belongs to a-coder")
}

func TestContactRequestErrors(t *testing.T) {
	ctx := context.Background()
	e := exampleEngine(t)
	for _, tc := range []struct {
		from, handle string
		status       int
		code, msg    string
	}{
		{"a-architect", "@bob/security-agent", 200, "pending", "Contact request sent to @bob/security-agent"},
		{"a-partner-reviewer", "alice/architect-agent", 200, "approved", "@alice/architect-agent had a pending request to you; both are now contacts"},
		{"a-architect", "@@x", 400, "invalid_handle", "Invalid handle format"},
		{"a-architect", "@partner/nobody", 404, "handle_not_found", "Handle not found: @partner/nobody"},
		{"a-coder", "@Partner/Reviewer-Agent", 409, "already_contacts", "Already contacts with @partner/reviewer-agent"},
		{"a-architect", "@partner/reviewer-agent", 409, "pending_exists", "A pending request already exists for @partner/reviewer-agent"},
		{"a-architect", "@alice", 409, "recipient_is_owner", "Cannot send a contact request to this agent's owner"},
		{"a-architect", "@alice/architect-agent", 409, "self", "Cannot send a contact request to this entity"},
		{"a-architect", "@partner/hidden-agent", 409, "not_contactable", "Cannot send a contact request to this entity"},
	} {
		d, err := e.ContactRequest(ctx, ContactInput{From: tc.from, Handle: tc.handle})
		require.NoError(t, err)
		assert.Equal(t, tc.status, d.HTTPStatus, tc.handle)
		assert.Equal(t, tc.code, d.Code, tc.handle)
		assert.Equal(t, tc.msg, d.Message, tc.handle)
		assert.Equal(t, tc.status == 200, d.Allow, tc.handle)
	}
}

func TestSendMessageLimits(t *testing.T) {
	ctx := context.Background()
	dir := exampleDirectory(t)
	now := time.Date(2026, 3, 1, 23, 59, 0, 0, time.UTC)
	e, err := New(ctx, Config{Directory: dir, Now: func() time.Time { return now }})
	require.NoError(t, err)
	msg := MessageInput{Agent: "a-coder", Room: webhookRoom, Tokens: 1000}

	// Default quota: 12 per minute per agent and room.
	for i := range 12 {
		d, err := e.SendMessage(ctx, msg)
		require.NoError(t, err)
		require.True(t, d.Allow, "message %d: %+v", i, d)
	}
	d, err := e.SendMessage(ctx, msg)
	require.NoError(t, err)
	assert.False(t, d.Allow)
	assert.Equal(t, CodeRateLimited, d.Reasons[0].Code)
	assert.Equal(t, int64(5000), d.RetryAfterMs) // one emission interval: 60 s / 12

	// Budgets: the owner's tokens for the day are spent; retry at UTC midnight.
	now = now.Add(time.Minute / 2)
	e.Ledger().Spend(Charge{Org: "org-acme", Owner: "u-alice", Tokens: 10_000_000}, "", now, now)
	d, err = e.SendMessage(ctx, msg)
	require.NoError(t, err)
	assert.False(t, d.Allow)
	assert.Equal(t, CodeBudgetExceeded, d.Reasons[0].Code)
	assert.Contains(t, d.Reasons[0].Message, "the daily quota of owner u-alice: 10000000 spent and 12000 reserved of 10000000 tokens this day")
	assert.Equal(t, int64(30_000), d.RetryAfterMs)

	// A new day starts clean.
	now = now.Add(time.Minute)
	d, err = e.SendMessage(ctx, msg)
	require.NoError(t, err)
	assert.True(t, d.Allow, "%+v", d)

	// An estimate too big to add is over every budget, never wrapped into an allow.
	huge := msg
	huge.Tokens = math.MaxInt64
	d, err = e.SendMessage(ctx, huge)
	require.NoError(t, err)
	assert.False(t, d.Allow, "%+v", d)
	assert.Equal(t, CodeBudgetExceeded, d.Reasons[0].Code)
	huge = msg
	huge.CostMicros = math.MaxInt64
	d, err = e.SendMessage(ctx, huge)
	require.NoError(t, err)
	assert.False(t, d.Allow, "%+v", d)
	assert.Equal(t, CodeBudgetExceeded, d.Reasons[0].Code)

	// Suspension is the policy's deny.
	require.NoError(t, dir.Suspend(ctx, "a-coder", true))
	d, err = e.SendMessage(ctx, msg)
	require.NoError(t, err)
	assert.Equal(t, "suspended", d.Reasons[0].Code)
	assert.Zero(t, d.RetryAfterMs)
}

// An evaluation stops when its context ends: the decision is a deny naming the
// cancellation, not the answer the policy would have reached much later. Each
// evaluation cancels its own, never another that shares its engine.
func TestDecideStopsWhenItsContextEnds(t *testing.T) {
	b := copyBundle(t)
	for name := range b {
		if strings.HasSuffix(name, "_test.rego") {
			delete(b, name) // they would time out on the slow rule
		}
	}
	raw, err := json.Marshal(map[string]map[string]any{"bulk": {"items": make([]int, 3000)}})
	require.NoError(t, err)
	b["bulk/data.json"] = &fstest.MapFile{Data: raw}
	src, err := fs.ReadFile(b, "peer_visible.rego")
	require.NoError(t, err)
	b["peer_visible.rego"] = &fstest.MapFile{Data: append(src, []byte(`
candidate_deny contains lib.reason("slow", "slow") if {
	input.candidate == "slow"
	count([1 | walk(data.bulk.bulk.items, _); walk(data.bulk.bulk.items, _)]) < 0
}
`)...)}
	dir := exampleDirectory(t)
	e, err := New(context.Background(), Config{Directory: dir, Bundle: b})
	require.NoError(t, err)

	// The slow rule takes seconds: 20 ms ends it.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	d, err := e.Decide(ctx, PeerVisible, PeerInput{Agent: "a-architect", Candidate: "slow"})
	require.NoError(t, err)
	assert.False(t, d.Allow)
	require.Len(t, d.Reasons, 1)
	assert.Equal(t, CodeEvalError, d.Reasons[0].Code)
	assert.Contains(t, d.Reasons[0].Message, "cancel")

	// A context that ends after its evaluation, and one that never ends, cancel nothing.
	done, stop := context.WithCancel(context.Background())
	d, err = e.Decide(done, PeerVisible, PeerInput{Agent: "a-architect", Candidate: "a-reviewer"})
	require.NoError(t, err)
	stop()
	assert.NotEqual(t, CodeEvalError, firstCode(d.Reasons))
	d2, err := e.Decide(context.Background(), PeerVisible, PeerInput{Agent: "a-architect", Candidate: "a-reviewer"})
	require.NoError(t, err)
	assert.Equal(t, d.Allow, d2.Allow)
	assert.NotEqual(t, CodeEvalError, firstCode(d2.Reasons))
}

func firstCode(rs []Reason) string {
	if len(rs) == 0 {
		return ""
	}
	return rs[0].Code
}

// Bundle is the serving revision's files: loading them gives the same revision, and a
// caller that changes its copy changes nobody else's.
func TestBundleIsTheServingRevisionsOwnCopy(t *testing.T) {
	e := exampleEngine(t)
	first := e.Bundle().(fstest.MapFS)
	again, err := New(t.Context(), Config{Directory: NewDirectory(), Bundle: first})
	require.NoError(t, err)
	assert.Equal(t, e.Revision(), again.Revision())

	for name := range first {
		first[name].Data[0] ^= 0xff
	}
	first["extra.rego"] = &fstest.MapFile{Data: []byte("package extra\n")}
	second := e.Bundle().(fstest.MapFS)
	assert.NotContains(t, second, "extra.rego")
	other, err := New(t.Context(), Config{Directory: NewDirectory(), Bundle: second})
	require.NoError(t, err)
	assert.Equal(t, e.Revision(), other.Revision())
}
