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
	"github.com/bandplane/bandplane/schema/cause"
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

// score counts links that agree with the truth.
type score struct{ n, ok int }

func (s *score) add(ok bool) {
	s.n++
	if ok {
		s.ok++
	}
}

func (s score) share() float64 {
	if s.n == 0 {
		return 1
	}
	return float64(s.ok) / float64(s.n)
}

func (s score) String() string {
	return fmt.Sprintf("%d of %d (%.3f %%)", s.ok, s.n, 100*s.share())
}

// reconciliation is how the links of a run compare with its truth.
type reconciliation struct {
	explicit, late, inferred score // usage events
	all                      score // every event with a truth
	unexplained              []string
}

// want is the stored link the truth says an event must have.
func want(tr simulate.Truth) store.Chain {
	c := store.Chain{InitiatorID: tr.Initiator.ID, InitiatorType: string(tr.Initiator.Type), Depth: uint16(tr.Depth),
		TriggerID: tr.TriggerMessageID, Link: cause.SourceInferred}
	if tr.Explicit {
		c.Link = cause.SourceExplicit
	}
	return c
}

// got is the part of a stored link the truth speaks of.
func got(c store.Chain) store.Chain {
	return store.Chain{InitiatorID: c.InitiatorID, InitiatorType: c.InitiatorType, Depth: c.Depth, TriggerID: c.TriggerID, Link: c.Link}
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
		ok = want(tr) == got(c)
		r.all.add(ok)
		if !ok && !tr.Ambiguous {
			r.unexplained = append(r.unexplained, fmt.Sprintf("%s %s by %s: want %+v, got %+v (truth %+v)", ev.Type, ev.ID, ev.Actor.ID, want(tr), got(c), tr))
		}
		if ev.Type != schema.TypeUsageReported {
			continue
		}
		truthUsage++
		switch {
		case tr.Late:
			r.late.add(ok)
			r.explicit.add(ok)
		case tr.Explicit:
			r.explicit.add(ok)
		default:
			r.inferred.add(ok)
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
		r.explicit, r.late, r.inferred, r.all.n, r.all)
	assert.Empty(t, r.unexplained, "links wrong where inference is not ambiguous")
	assert.Equal(t, r.explicit.n, r.explicit.ok, "explicit links right: %s", r.explicit)
	assert.Equal(t, r.late.n, r.late.ok, "late links right: %s", r.late)
	assert.Positive(t, r.late.n, "the traffic has late triggers")
	assert.Positive(t, r.explicit.n-r.late.n, "the traffic has explicit triggers sent in time")
	assert.GreaterOrEqual(t, r.inferred.share(), 0.99, "inferred links right: %s", r.inferred)
	assert.Less(t, r.inferred.ok, r.inferred.n, "the default traffic has ambiguous cases (Overlap)")
}

// Without overlaps, inference from mentions is exact on the simulated traffic; with
// many loops and late triggers every link still reconciles.
func TestInitiatorsExactWithoutOverlap(t *testing.T) {
	cfg := simulate.DefaultConfig()
	cfg.Start = time.Date(2026, 11, 2, 9, 0, 0, 0, time.UTC)
	cfg.Events = 20_000
	cfg.Overlap, cfg.Loops, cfg.LateTriggers, cfg.ExplicitTriggers = 0, 0.1, 0.3, 0.3
	r := reconcile(t, link(t, cfg))
	t.Logf("usage events: explicit %s (late %s), inferred %s", r.explicit, r.late, r.inferred)
	assert.Equal(t, r.all.n, r.all.ok, "every link right: %s; wrong: %v", r.all, r.unexplained)
	assert.Positive(t, r.late.n)
	assert.Positive(t, r.inferred.n)
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
