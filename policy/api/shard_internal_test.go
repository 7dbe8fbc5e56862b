package api

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/policy"
	"github.com/bandplane/bandplane/policy/shard"
)

// TestAnAgentRegisteredDuringTheDecisionIsGivenBack: the race misdirected cannot see
// (the agent unknown when it looked, registered in another replica's organization
// before the policy read the directory) is caught on the decision: what it took is
// given back and it is misdirected, not granted.
func TestAnAgentRegisteredDuringTheDecisionIsGivenBack(t *testing.T) {
	ctx := context.Background()
	snap, err := policy.LoadDirectoryFile("../testdata/directory.json")
	require.NoError(t, err)
	dir := policy.NewDirectory()
	require.NoError(t, dir.Load(ctx, snap))
	eng, err := policy.New(ctx, policy.Config{Directory: dir})
	require.NoError(t, err)
	peers := []string{"http://policy-1:8080", "http://policy-2:8080"}
	var s *shard.Shards
	for _, self := range peers {
		if s, err = shard.New(shard.Config{Peers: peers, Self: self}); err == nil && !s.Owns("org-acme") {
			break
		}
	}
	require.False(t, s.Owns("org-acme"))
	a, err := New(Config{Engine: eng, Shards: s})
	require.NoError(t, err)

	in := &policy.MessageInput{Agent: "a-coder", Room: "room-webhook-retries", Tokens: 50}
	// What Decide does when misdirected saw nothing: the engine decides and takes.
	d, err := eng.Decide(ctx, policy.SendMessage, in)
	require.NoError(t, err)
	require.True(t, d.Allow)
	require.Equal(t, 1, eng.Ledger().Reservations())
	agentTAT, _ := eng.Limiter().TAT(policy.AgentRateKey("a-coder"))

	err = a.registeredMeanwhile(&d, in)
	var mis *MisdirectedError
	require.True(t, errors.As(err, &mis), "%v", err)
	assert.Equal(t, s.Owner("org-acme"), mis.Owner)
	assert.Equal(t, 0, eng.Ledger().Reservations(), "the reservation is given back")
	after, _ := eng.Limiter().TAT(policy.AgentRateKey("a-coder"))
	assert.Equal(t, agentTAT.Add(-time.Second), after, "so is the rate")

	// A deny names its organization too, and is misdirected all the same.
	d = policy.Decision{Name: policy.SendMessage, Org: "org-acme"}
	assert.Error(t, a.registeredMeanwhile(&d, in))
	d = policy.Decision{Name: policy.SendMessage} // unknown agent: no organization
	assert.NoError(t, a.registeredMeanwhile(&d, in))
}

// BenchmarkMisdirectedCheck is what the shard check adds to an owned send_message: the
// agent's directory record and the owner of its organization.
func BenchmarkMisdirectedCheck(b *testing.B) {
	ctx := context.Background()
	snap, err := policy.LoadDirectoryFile("../testdata/directory.json")
	if err != nil {
		b.Fatal(err)
	}
	dir := policy.NewDirectory()
	if err := dir.Load(ctx, snap); err != nil {
		b.Fatal(err)
	}
	eng, err := policy.New(ctx, policy.Config{Directory: dir})
	if err != nil {
		b.Fatal(err)
	}
	peers := []string{"http://policy-1:8080", "http://policy-2:8080"}
	for _, self := range peers {
		s, _ := shard.New(shard.Config{Peers: peers, Self: self})
		if !s.Owns("org-acme") {
			continue
		}
		a, err := New(Config{Engine: eng, Shards: s})
		if err != nil {
			b.Fatal(err)
		}
		in := &policy.MessageInput{Agent: "a-coder", Room: "room-webhook-retries"}
		for b.Loop() {
			if err := a.misdirected(in); err != nil {
				b.Fatal(err)
			}
		}
	}
}
