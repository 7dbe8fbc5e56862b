package policy

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestApplyingAdvancesThePosition(t *testing.T) {
	ctx := context.Background()
	dir := NewDirectory()
	assert.Nil(t, dir.Position(), "a directory not kept from the topic has no position")

	ran := false
	dir.Applying(2, 8, func() {
		ran = true
		require.NoError(t, dir.UpsertPerson(ctx, Person{ID: "u-1", Handle: "one", Org: "org-1"}))
	})
	assert.True(t, ran)
	_, ok := dir.OrgOf("u-1")
	assert.True(t, ok, "apply's mutations take effect")
	assert.Equal(t, Position{2: 8}, dir.Position())

	dir.Applying(2, 5, func() {}) // a record read again (at least once) never moves back
	dir.Applying(0, 1, func() {}) // a record with no effect still advances
	assert.Equal(t, Position{0: 1, 2: 8}, dir.Position())

	p := dir.Position()
	p[0] = 99
	assert.Equal(t, Position{0: 1, 2: 8}, dir.Position(), "Position returns a copy")

	boot := Position{0: 10, 1: 20}
	dir.SetPosition(boot)
	boot[0] = 0
	assert.Equal(t, Position{0: 10, 1: 20}, dir.Position(), "SetPosition replaces with a copy")
}

func TestDecideRecordsPositionAndClock(t *testing.T) {
	ctx := context.Background()
	dir := exampleDirectory(t)
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	e, err := New(ctx, Config{Directory: dir, Now: func() time.Time { return at }})
	require.NoError(t, err)

	d, err := e.PeerVisible(ctx, PeerInput{Agent: "a-architect", Room: webhookRoom})
	require.NoError(t, err)
	assert.Nil(t, d.Position, "no position without a replica: nothing allocated")
	assert.Equal(t, at, d.DecidedAt)

	dir.SetPosition(Position{0: 4, 3: 9})
	for _, name := range []string{PeerVisible, AddParticipant, ContactRequest, SendMessage} {
		d, err := e.Decide(ctx, name, map[string]any{"agent": "a-coder", "room": webhookRoom})
		require.NoError(t, err)
		assert.Equal(t, Position{0: 4, 3: 9}, d.Position, name)
		assert.Equal(t, at, d.DecidedAt, name)
	}
	// A policy result without a boolean allow is replaced by a deny: it keeps them.
	u := Decision{Name: SendMessage, Position: Position{1: 2}, DecidedAt: at}
	decode(&u, ast.NewObject())
	assert.Equal(t, CodeUndefined, u.Reasons[0].Code)
	assert.Equal(t, Position{1: 2}, u.Position)
	assert.Equal(t, at, u.DecidedAt)
}

// A decision sees a record's whole effect with its position, or neither: record i
// registers agent a-race-i and then puts it in the room (two mutations), and advances
// partition 0 to i. A decision about a-race-k must find it unknown while the position
// is below k and allowed from k on; "not in the room" would be half a record.
func TestDecisionSeesARecordWhole(t *testing.T) {
	ctx := context.Background()
	dir := NewDirectory()
	require.NoError(t, dir.UpsertPerson(ctx, Person{ID: "u-race", Handle: "race", Org: "org-race"}))
	// A clock an hour on at every reading: the rate limiter never throttles.
	var ticks atomic.Int64
	base := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	e, err := New(ctx, Config{Directory: dir, Now: func() time.Time {
		return base.Add(time.Duration(ticks.Add(1)) * time.Hour)
	}})
	require.NoError(t, err)

	const records, deciders = 300, 4
	var wg sync.WaitGroup
	var done atomic.Bool
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer done.Store(true)
		for i := 1; i <= records; i++ {
			id := fmt.Sprintf("a-race-%d", i)
			dir.Applying(0, int64(i), func() {
				assert.NoError(t, dir.UpsertAgent(ctx, Agent{ID: id, Handle: "race/" + id, Owner: "u-race", Org: "org-race", Listed: true}))
				assert.NoError(t, dir.JoinRoom(ctx, "room-race", id))
			})
		}
	}()
	var decided atomic.Int64
	for w := range deciders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; !done.Load() || n < 50; n++ {
				k := 1 + (n*deciders+w)%records
				d, err := e.SendMessage(ctx, MessageInput{Agent: fmt.Sprintf("a-race-%d", k), Room: "room-race"})
				if !assert.NoError(t, err) {
					return
				}
				decided.Add(1)
				pos := d.Position[0]
				if int64(k) <= pos {
					if !assert.True(t, d.Allow, "a-race-%d at position %d: %+v", k, pos, d) {
						return
					}
				} else if !assert.Equal(t, "unknown_agent", d.Reasons[0].Code, "a-race-%d at position %d: %+v", k, pos, d) {
					return
				}
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, Position{0: records}, dir.Position())
	assert.Greater(t, decided.Load(), int64(deciders*50))
}

// enforce takes from the limiter and the ledger at the decision's one clock reading, so
// a replay with the clock at DecidedAt takes the same.
func TestEnforceReadsTheDecisionsClock(t *testing.T) {
	ctx := context.Background()
	dir := exampleDirectory(t)
	var calls atomic.Int64
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	e, err := New(ctx, Config{Directory: dir, Now: func() time.Time {
		// Each reading a millisecond later: a second reading would show.
		return base.Add(time.Duration(calls.Add(1)) * time.Millisecond)
	}})
	require.NoError(t, err)
	msg := MessageInput{Agent: "a-coder", Room: webhookRoom, Tokens: 1000}

	d, err := e.SendMessage(ctx, msg)
	require.NoError(t, err)
	require.True(t, d.Allow, "%+v", d)
	assert.Equal(t, int64(1), calls.Load(), "one clock reading per decision")
	assert.Equal(t, base.Add(time.Millisecond), d.DecidedAt)
	assert.Equal(t, d.DecidedAt.Add(DefaultReservationTTL), d.ReservationExpires, "the ledger reserved at DecidedAt")
	tat, ok := e.Limiter().TAT(RoomRateKey("a-coder", webhookRoom))
	require.True(t, ok)
	assert.True(t, d.DecidedAt.Add(5*time.Second).Equal(tat), "the limiter took at DecidedAt (60 s / 12 per agent and room): TAT %v, decided at %v", tat, d.DecidedAt)

	// Up to the rate, then a deny that gives its reservation back: still one reading.
	for range 11 {
		d, err = e.SendMessage(ctx, msg)
		require.NoError(t, err)
		require.True(t, d.Allow, "%+v", d)
	}
	d, err = e.SendMessage(ctx, msg)
	require.NoError(t, err)
	require.False(t, d.Allow)
	assert.Equal(t, CodeRateLimited, d.Reasons[0].Code)
	assert.Equal(t, int64(13), calls.Load(), "one clock reading per decision, a denied one too")
	assert.Equal(t, base.Add(13*time.Millisecond), d.DecidedAt)
}

// Advance moves a partition's position without the exclusive lock (records that change
// nothing a decision reads); SetPosition replaces the whole position.
func TestAdvanceAndSetPosition(t *testing.T) {
	d := NewDirectory()
	assert.Nil(t, d.Position(), "a directory not kept from the topic has none")
	d.Advance(3, 10)
	d.Advance(3, 7) // never back
	d.Applying(0, 5, func() {})
	assert.Equal(t, Position{0: 5, 3: 10}, d.Position())
	d.SetPosition(Position{1: 2})
	assert.Equal(t, Position{1: 2}, d.Position())
}
