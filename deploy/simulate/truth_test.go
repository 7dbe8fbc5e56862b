package simulate_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/simulate"
	"github.com/bandplane/bandplane/ingest"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/directory"
	"github.com/bandplane/bandplane/schema/store"
)

// linked is one simulated run as ingest links it: every line decoded (schema.Decode,
// as the collector does), the directory events applied, each event observed by
// ingest's cause tracker in stream order, and the links that late triggers resolve
// put in place of the pending ones, as the consumer rewrites them.
type linked struct {
	sum    simulate.Summary
	truths []simulate.Truth
	events map[string]schema.Event // by id
	owner  map[string]string       // agent id → its owner
	chains map[string]store.Chain  // event id → its link as stored (ingest.ChainOf)
	lines  int
}

func link(t *testing.T, cfg simulate.Config) linked {
	t.Helper()
	l := linked{events: map[string]schema.Event{}, owner: map[string]string{}, chains: map[string]store.Chain{}}
	cfg.Truth = func(tr simulate.Truth) { l.truths = append(l.truths, tr) }
	var lines [][]byte
	sum, err := simulate.Run(context.Background(), cfg, simulate.SinkFunc(func(_ context.Context, ls [][]byte) error {
		lines = append(lines, ls...)
		return nil
	}), nil)
	require.NoError(t, err)
	l.sum, l.lines = sum, len(lines)

	dir := directory.New()
	tr := ingest.NewTracker(dir)
	for i, line := range lines {
		ev, err := schema.Decode(line)
		require.NoError(t, err, "line %d", i)
		if schema.IsDirectoryType(ev.Type) {
			_, err := dir.Apply(&ev)
			require.NoError(t, err, "line %d", i)
			if ev.Type == schema.TypeAgentRegistered {
				if a, ok := dir.Agent(ev.Subject.ID); ok {
					l.owner[a.ID] = a.OwnerID
				}
			}
		}
		ingest.Enrich(&ev, dir)
		l.events[ev.ID] = ev
		o, ok := tr.Observe(&ev, nil)
		if ok {
			l.chains[ev.ID] = ingest.ChainOf(o.Link)
		}
		for _, r := range o.Resolved {
			l.chains[r.EventID] = ingest.ChainOf(r.Link)
		}
	}
	return l
}

// reconciliation is how the links of a run compare with its truth.
type reconciliation struct {
	simulate.Tally                // usage events
	all            simulate.Score // every event with a truth
	unexplained    []string       // of every event
}

func reconcile(t *testing.T, l linked) reconciliation {
	t.Helper()
	var r reconciliation
	usage := 0
	for _, ev := range l.events {
		if ev.Type == schema.TypeUsageReported {
			usage++
		}
	}
	truthUsage := 0
	for _, tr := range l.truths {
		ev, ok := l.events[tr.EventID]
		require.True(t, ok, "the truth of %s names an event that was sent", tr.EventID)
		c, linkedOK := l.chains[tr.EventID]
		require.True(t, linkedOK, "%s %s by %s has a truth but no link", ev.Type, ev.ID, ev.Actor.ID)
		ok = tr.Agrees(c)
		r.all.Add(ok)
		if !ok && !tr.Ambiguous {
			r.unexplained = append(r.unexplained, fmt.Sprintf("%s %s by %s: want %+v, got %+v (truth %+v)", ev.Type, ev.ID, ev.Actor.ID, tr.Chain(), c, tr))
		}
		if ev.Type == schema.TypeUsageReported {
			truthUsage++
			r.Add(tr, c)
		}
	}
	require.Equal(t, usage, truthUsage, "every usage event has a truth")
	return r
}

// TestInitiatorsReconcileWithTruth links the default simulated traffic as ingest does
// and compares every usage event's initiator, trigger, depth and kind of link with the
// simulator's ground truth: every explicit link (late ones included, once their
// trigger came) is right, and inferred ones are at least 99 % right, every wrong one
// being a case the truth calls ambiguous (a person mentioned the agent again while it
// still ran).
func TestInitiatorsReconcileWithTruth(t *testing.T) {
	cfg := simulate.DefaultConfig()
	cfg.Start = time.Date(2026, 11, 2, 9, 0, 0, 0, time.UTC)
	cfg.Events = 60_000
	l := link(t, cfg)
	r := reconcile(t, l)
	t.Logf("usage events: explicit links right %s (late %s), inferred links right %s; all %d events with a truth: %s",
		r.Explicit, r.Late, r.Inferred, r.all.N, r.all)
	assert.Empty(t, r.unexplained, "links wrong where inference is not ambiguous")
	assert.Equal(t, r.Explicit.N, r.Explicit.OK, "explicit links right: %s", r.Explicit)
	assert.Equal(t, r.Late.N, r.Late.OK, "late links right: %s", r.Late)
	assert.Positive(t, r.Late.N, "the traffic has late triggers")
	assert.Positive(t, r.Explicit.N-r.Late.N, "the traffic has explicit triggers sent in time")
	assert.GreaterOrEqual(t, r.Inferred.Share(), 0.99, "inferred links right: %s", r.Inferred)
	assert.Less(t, r.Inferred.OK, r.Inferred.N, "the default traffic has ambiguous cases (Overlap)")
}

// Without overlaps, inference from mentions is exact on the simulated traffic; with
// many loops and late triggers every link still reconciles.
func TestInitiatorsExactWithoutOverlap(t *testing.T) {
	cfg := simulate.DefaultConfig()
	cfg.Start = time.Date(2026, 11, 2, 9, 0, 0, 0, time.UTC)
	cfg.Events = 20_000
	cfg.Overlap, cfg.Loops, cfg.LateTriggers, cfg.ExplicitTriggers = 0, 0.1, 0.3, 0.3
	r := reconcile(t, link(t, cfg))
	t.Logf("usage events: explicit %s (late %s), inferred %s", r.Explicit, r.Late, r.Inferred)
	assert.Equal(t, r.all.N, r.all.OK, "every link right: %s; wrong: %v", r.all, r.unexplained)
	assert.Positive(t, r.Late.N)
	assert.Positive(t, r.Inferred.N)
}

// The truth covers the chains the simulator is meant to make: single-owner and
// cross-owner chains, runaway loops, scheduled work and digests, triggers sent in
// time, late and never, and overlaps; and it is the same for the same Config.
func TestTruthCoversTheChains(t *testing.T) {
	cfg := simulate.DefaultConfig()
	cfg.Start = time.Date(2026, 11, 2, 9, 0, 0, 0, time.UTC)
	cfg.Events = 30_000
	l := link(t, cfg)
	var people, schedule, crossOwner, sameOwner, deep, scheduleChains, late, sent, inferred, ambiguous int
	for _, tr := range l.truths {
		ev := l.events[tr.EventID]
		switch {
		case tr.Initiator.Type == schema.ActorUser && tr.Depth == 0:
			people++
			assert.Equal(t, ev.Actor.ID, tr.Initiator.ID, "a person's message is a root")
			assert.Equal(t, schema.TypeMessageCreated, ev.Type)
			continue
		case tr.Initiator.Type == schema.ActorSystem:
			assert.Equal(t, "schedule", tr.Initiator.ID)
			schedule++
			if tr.Depth == 1 {
				assert.True(t, tr.Explicit, "a schedule's trigger is always sent")
			} else {
				scheduleChains++
			}
		case l.owner[ev.Actor.ID] == tr.Initiator.ID:
			sameOwner++
		default:
			crossOwner++
		}
		require.Equal(t, schema.ActorAgent, ev.Actor.Type, "%s: only agents' events continue a chain", ev.Type)
		if tr.Depth >= 9 {
			deep++
		}
		switch {
		case tr.Late:
			late++
		case tr.Explicit:
			sent++
		default:
			inferred++
		}
		if tr.Ambiguous {
			ambiguous++
		}
	}
	t.Logf("%d truths: %d people's messages, %d agent events whose initiator is their owner, %d whose initiator is not (another person, through a room or a contact), %d scheduled (%d in chains a schedule started), %d at depth >= 9 (loops); %d sent in time, %d late, %d inferred, %d ambiguous",
		len(l.truths), people, sameOwner, crossOwner, schedule, scheduleChains, deep, sent, late, inferred, ambiguous)
	for name, n := range map[string]int{"people": people, "same owner": sameOwner, "cross owner": crossOwner, "schedule": schedule,
		"schedule chains": scheduleChains, "loops": deep, "late": late, "sent": sent, "inferred": inferred, "ambiguous": ambiguous} {
		assert.Positive(t, n, name)
	}

	again := link(t, cfg)
	assert.Equal(t, l.truths, again.truths, "the same Config, the same truth")
}
