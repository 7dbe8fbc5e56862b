package simulate

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/pricing"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// memSink collects lines in memory.
type memSink struct {
	mu      sync.Mutex
	lines   [][]byte
	batches int
}

func (m *memSink) Send(ctx context.Context, lines [][]byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lines = append(m.lines, lines...)
	m.batches++
	return nil
}

func testConfig(events int) Config {
	cfg := DefaultConfig()
	cfg.Start = time.Date(2026, 11, 2, 9, 0, 0, 0, time.UTC)
	cfg.Events = events
	cfg.BatchSize = 256
	return cfg
}

func run(t *testing.T, cfg Config) (Summary, [][]byte) {
	t.Helper()
	sink := &memSink{}
	s, err := Run(context.Background(), cfg, sink, nil)
	require.NoError(t, err)
	return s, sink.lines
}

// The same Config yields the same bytes; another seed or start does not.
func TestDeterministic(t *testing.T) {
	cfg := testConfig(4000)
	s1, a := run(t, cfg)
	cfg.BatchSize = 97 // batching does not change the stream
	s2, b := run(t, cfg)
	require.Len(t, a, 4000)
	require.Len(t, b, 4000)
	for i := range a {
		require.True(t, bytes.Equal(a[i], b[i]), "line %d differs:\n%s\n%s", i, a[i], b[i])
	}
	assert.Equal(t, s1.String(), s2.String())

	cfg.Seed = 2
	_, c := run(t, cfg)
	assert.NotEqual(t, a[len(a)-1], c[len(c)-1])
}

// recount rebuilds a Summary from the lines alone.
func recount(t *testing.T, lines [][]byte) Summary {
	t.Helper()
	cat := pricing.Default()
	s := Summary{ByType: map[string]int{}, ByAgent: map[string]AgentSummary{}, ContactOutcomes: map[string]int{}}
	models, handles := map[string]string{}, map[string]string{}
	ids := map[string]bool{}
	for i, l := range lines {
		ev, err := schema.Decode(l)
		require.NoError(t, err, "line %d: %s", i, l)
		require.False(t, ids[ev.ID], "line %d repeats id %s", i, ev.ID)
		ids[ev.ID] = true
		s.Events++
		s.ByType[ev.Type]++
		switch ev.Type {
		case schema.TypeAgentRegistered:
			var a schema.AgentData
			require.NoError(t, json.Unmarshal(ev.Data, &a))
			models[ev.Subject.ID], handles[ev.Subject.ID] = a.Model, a.Handle
		case schema.TypeMessageCreated:
			s.Messages++
			if h, ok := handles[ev.Actor.ID]; ok {
				as := s.ByAgent[h]
				as.Messages++
				s.ByAgent[h] = as
			}
		case schema.TypeUsageReported:
			var u schema.UsageData
			require.NoError(t, json.Unmarshal(ev.Data, &u))
			s.UsageEvents++
			s.InputTokens += u.InputTokens
			s.OutputTokens += u.OutputTokens
			s.CacheReadTokens += u.CacheReadTokens
			s.CacheWriteTokens += u.CacheWriteTokens
			if u.ReasoningTokens != nil {
				s.ReasoningTokens += *u.ReasoningTokens
			}
			c, ok := cat.Cost(models[ev.Actor.ID], u)
			if !ok {
				s.UnpricedEvents++
			}
			s.CostMicros += c
			h := handles[ev.Actor.ID]
			as := s.ByAgent[h]
			as.CostMicros += c
			as.UsageEvents++
			as.InputTokens += u.InputTokens
			s.ByAgent[h] = as
		case schema.TypeContactRequestUpdated:
			var c schema.ContactData
			require.NoError(t, json.Unmarshal(ev.Data, &c))
			s.ContactOutcomes[c.Status]++
		}
	}
	return s
}

func TestSummaryMatchesRecount(t *testing.T) {
	s, lines := run(t, testConfig(6000))
	want := recount(t, lines)

	assert.Equal(t, len(lines), s.Events)
	assert.Equal(t, want.Events, s.Events)
	assert.Equal(t, want.ByType, s.ByType)
	assert.Equal(t, want.Messages, s.Messages)
	assert.Equal(t, want.UsageEvents, s.UsageEvents)
	assert.Equal(t, want.InputTokens, s.InputTokens)
	assert.Equal(t, want.OutputTokens, s.OutputTokens)
	assert.Equal(t, want.CacheReadTokens, s.CacheReadTokens)
	assert.Equal(t, want.CacheWriteTokens, s.CacheWriteTokens)
	assert.Equal(t, want.ReasoningTokens, s.ReasoningTokens)
	assert.Equal(t, want.CostMicros, s.CostMicros)
	assert.Equal(t, want.UnpricedEvents, s.UnpricedEvents)
	assert.Zero(t, s.UnpricedEvents, "every agent has a catalog model")
	assert.Equal(t, want.ContactOutcomes, s.ContactOutcomes)
	assert.Equal(t, "USD", s.Currency)
	assert.Equal(t, pricing.Default().Version(), s.PriceVersion)
	require.Equal(t, len(want.ByAgent), len(s.ByAgent))
	for h, w := range want.ByAgent {
		got := s.ByAgent[h]
		assert.Equal(t, w.Messages, got.Messages, h)
		assert.Equal(t, w.UsageEvents, got.UsageEvents, h)
		assert.Equal(t, w.InputTokens, got.InputTokens, h)
		assert.Equal(t, w.CostMicros, got.CostMicros, h)
	}

	// Realistic token counts.
	assert.Positive(t, s.ReasoningTokens)
	assert.Positive(t, s.CacheReadTokens)
	assert.Positive(t, s.CacheWriteTokens)
	for _, l := range lines {
		ev, _ := schema.Decode(l)
		if ev.Type != schema.TypeUsageReported {
			continue
		}
		var u schema.UsageData
		require.NoError(t, json.Unmarshal(ev.Data, &u))
		assert.GreaterOrEqual(t, u.InputTokens, int64(150))
		assert.LessOrEqual(t, u.InputTokens, int64(20000))
		assert.GreaterOrEqual(t, u.OutputTokens, int64(15))
		assert.LessOrEqual(t, u.OutputTokens, int64(3000))
		if u.ReasoningTokens != nil {
			assert.LessOrEqual(t, *u.ReasoningTokens, u.OutputTokens)
		}
	}

	// The summary prints as one JSON line and reads back.
	str := s.String()
	assert.NotContains(t, str, "\n")
	var back Summary
	require.NoError(t, json.Unmarshal([]byte(str), &back))
	assert.Equal(t, s.CostMicros, back.CostMicros)
}

func TestContentCoverage(t *testing.T) {
	cfg := testConfig(8000)
	late := map[string]bool{} // the platform ids of the messages that come late
	cfg.Truth = func(tr Truth) {
		if tr.Late {
			late[tr.TriggerMessageID] = true
		}
	}
	s, lines := run(t, cfg)

	for _, typ := range []string{
		schema.TypeUserRegistered, schema.TypeAgentRegistered, schema.TypeRoomAdded,
		schema.TypeParticipantAdded, schema.TypeParticipantRemoved,
		schema.TypeMessageCreated, schema.TypeMessageUpdated,
		schema.TypeToolCall, schema.TypeToolResult, schema.TypeThought, schema.TypeError,
		schema.TypeTask, schema.TypeAttention, schema.TypeUsageReported,
		schema.TypeContactRequestReceived, schema.TypeContactRequestUpdated, schema.TypeContactAdded,
		schema.TypeTaskCreated, schema.TypeTaskUpdated,
	} {
		assert.Positive(t, s.ByType[typ], typ)
	}
	for _, outcome := range []string{"approved", "rejected", "cancelled"} {
		assert.Positive(t, s.ContactOutcomes[outcome], outcome)
	}

	// The directory comes first, in canonical form; then only frames, which name no
	// organization and no model.
	dir := s.ByType[schema.TypeUserRegistered] + s.ByType[schema.TypeAgentRegistered]
	assert.Equal(t, 3*3+2, s.ByType[schema.TypeUserRegistered])
	assert.Equal(t, 3*3*3+5, s.ByType[schema.TypeAgentRegistered])
	var first schema.Event
	require.NoError(t, json.Unmarshal(lines[0], &first))
	assert.Equal(t, testConfig(0).Start, first.Time, "the first event is at Start")
	for i, l := range lines {
		var probe struct {
			Topic   *string        `json:"topic"`
			Payload map[string]any `json:"payload"`
		}
		require.NoError(t, json.Unmarshal(l, &probe))
		if i < dir {
			assert.Nil(t, probe.Topic, "line %d", i)
			continue
		}
		require.NotNil(t, probe.Topic, "line %d", i)
		assert.NotContains(t, string(l), `"org_id"`)
		assert.NotContains(t, string(l), `"model"`)
	}

	text := string(bytes.Join(lines, []byte("\n")))
	// The tutorial room and its cast.
	assert.Contains(t, text, `"title":"Webhook Retries"`)
	for _, h := range []string{"maya/architect-agent", "maya/coder-agent", "maya/reviewer-agent", "partner/reviewer-agent"} {
		assert.Contains(t, text, `"handle":"`+h+`"`)
	}
	// Both tool call forms, and @mentions in content and metadata.
	assert.Contains(t, text, `\"tool_call_id\":`)
	assert.Contains(t, text, `"metadata":{"function":{`)
	assert.Contains(t, text, `"content":"@`)
	assert.Contains(t, text, `"mentions":[{`)
	// Tasks go through every status.
	for _, st := range []string{"open", "in_progress", "blocked", "done"} {
		assert.Contains(t, text, `"status":"`+st+`"`)
	}
	// Attention requests mention a person.
	assert.Contains(t, text, `"message_type":"attention","metadata":{"mentions":[{"id":`)
	// Contact requests start pending.
	assert.Contains(t, text, `"status":"pending"`)
	// Event times never go back, but for the triggers that come after the events they
	// caused.
	var last time.Time
	back := 0
	for i, l := range lines {
		ev, err := schema.Decode(l)
		require.NoError(t, err)
		if ev.Time.Before(last) {
			var d schema.MessageData
			require.NoError(t, json.Unmarshal(ev.Data, &d))
			assert.True(t, ev.Type == schema.TypeMessageCreated && late[d.MessageID], "line %d goes back in time", i)
			back++
			continue
		}
		last = ev.Time
	}
	assert.Positive(t, back, "some triggers come late")
	assert.LessOrEqual(t, back, len(late))
}

func TestChattyAgent(t *testing.T) {
	s, _ := run(t, testConfig(10000))
	assert.Equal(t, "maya/status-agent", s.ChattyAgent)
	share := float64(s.ByAgent[s.ChattyAgent].Messages) / float64(s.Messages)
	assert.InDelta(t, share, s.ChattyShare, 1e-9)
	assert.InDelta(t, 0.25, share, 0.02)
	for h, a := range s.ByAgent {
		if h != s.ChattyAgent {
			assert.Less(t, a.Messages, s.ByAgent[s.ChattyAgent].Messages/2, h)
		}
	}
}

func TestSmallWorld(t *testing.T) {
	cfg := testConfig(1500)
	cfg.Orgs, cfg.OwnersPerOrg, cfg.AgentsPerOwner, cfg.Rooms = 1, 1, 1, 1
	s, lines := run(t, cfg)
	assert.Len(t, lines, 1500)
	assert.Equal(t, 1, s.ByType[schema.TypeRoomAdded])
	recount(t, lines)
}

func TestConfigValidate(t *testing.T) {
	require.NoError(t, DefaultConfig().Validate())
	bad := Config{Orgs: 0, OwnersPerOrg: -1, AgentsPerOwner: 0, Rooms: 0, Events: -1, Rate: -1, Duration: -time.Second, BatchSize: 0}
	err := bad.Validate()
	require.Error(t, err)
	for _, flag := range []string{"--orgs", "--owners-per-org", "--agents-per-owner", "--rooms", "--events must be >= 0", "--rate", "--duration", "--batch-size"} {
		assert.Contains(t, err.Error(), flag)
	}
	big := DefaultConfig()
	big.Orgs, big.OwnersPerOrg, big.AgentsPerOwner = 1000, 100, 10
	assert.ErrorContains(t, big.Validate(), "<= 100000")

	_, err = Run(context.Background(), bad, &memSink{}, nil)
	assert.Error(t, err)

	// The shares of the chains: each in [0, 1], named in the error with its value.
	for _, tc := range []struct {
		set  func(*Config)
		want string
	}{
		{func(c *Config) { c.Loops = -0.1 }, "--loops must be in [0, 1], got -0.1"},
		{func(c *Config) { c.Loops = 1.5 }, "--loops must be in [0, 1], got 1.5"},
		{func(c *Config) { c.ExplicitTriggers = math.NaN() }, "--explicit-triggers must be in [0, 1], got NaN"},
		{func(c *Config) { c.LateTriggers = math.Inf(1) }, "--late-triggers must be in [0, 1], got +Inf"},
		{func(c *Config) { c.Overlap = math.Inf(-1) }, "--overlap must be in [0, 1], got -Inf"},
		{func(c *Config) { c.ExplicitTriggers, c.LateTriggers = 0.7, 0.4 }, "--explicit-triggers + --late-triggers must be <= 1, got 0.7 + 0.4"},
	} {
		c := DefaultConfig()
		tc.set(&c)
		assert.ErrorContains(t, c.Validate(), tc.want)
	}
	edge := DefaultConfig()
	edge.Loops, edge.ExplicitTriggers, edge.LateTriggers, edge.Overlap = 1, 0.25, 0.75, 1
	assert.NoError(t, edge.Validate(), "the bounds are allowed")
}

// Every link share at its bound still makes traffic that decodes: all loops, every
// trigger late, an overlap in every execution; and none at all.
func TestChainSharesAtTheirBounds(t *testing.T) {
	for _, shares := range [][4]float64{{1, 0, 1, 1}, {0, 1, 0, 0}, {0, 0, 0, 0}} {
		cfg := testConfig(3000)
		cfg.Loops, cfg.ExplicitTriggers, cfg.LateTriggers, cfg.Overlap = shares[0], shares[1], shares[2], shares[3]
		truths := 0
		cfg.Truth = func(Truth) { truths++ }
		s, lines := run(t, cfg)
		assert.Equal(t, 3000, s.Events, "%v", shares)
		assert.Positive(t, truths, "%v", shares)
		recount(t, lines)
	}
}

func TestSinkErrorStopsRun(t *testing.T) {
	cfg := testConfig(1000)
	cfg.BatchSize = 100
	calls := 0
	boom := errors.New("broker down")
	s, err := Run(context.Background(), cfg, SinkFunc(func(ctx context.Context, lines [][]byte) error {
		calls++
		if calls == 3 {
			return boom
		}
		return nil
	}), nil)
	require.ErrorIs(t, err, boom)
	assert.Equal(t, 200, s.Events, "only accepted batches count")

	// The truth is told of the accepted batches' events only, in stream order.
	var accepted [][]byte
	var told []string
	cfg.Truth = func(tr Truth) { told = append(told, tr.EventID) }
	calls = 0
	_, err = Run(context.Background(), cfg, SinkFunc(func(ctx context.Context, lines [][]byte) error {
		calls++
		if calls == 3 {
			return boom
		}
		accepted = append(accepted, lines...)
		return nil
	}), nil)
	require.ErrorIs(t, err, boom)
	var ids []string
	for _, l := range accepted {
		ev, err := schema.Decode(l)
		require.NoError(t, err)
		if slices.Contains(told, ev.ID) {
			ids = append(ids, ev.ID)
		}
	}
	require.NotEmpty(t, told)
	assert.Equal(t, ids, told)
}

// TestRateAndDuration runs in a synctest bubble: Run paces itself with time.Now and
// timers, which there are the bubble's clock, moving on only while every goroutine in
// it waits. The pace is measured exactly, whatever the machine's speed.
func TestRateAndDuration(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// 60 events at 300/s: batches of 30, the second one due after 100 ms.
		cfg := testConfig(60)
		cfg.Rate = 300
		sink := &memSink{}
		began := time.Now()
		s, err := Run(context.Background(), cfg, sink, nil)
		require.NoError(t, err)
		assert.Equal(t, 60, s.Events)
		assert.Equal(t, 2, sink.batches)
		assert.Equal(t, 100*time.Millisecond, time.Since(began))

		// Until Duration: batches of 100 due at 0, 100 and 200 ms; the next one's time is
		// past the end.
		cfg = testConfig(0)
		cfg.Rate, cfg.Duration = 1000, 250*time.Millisecond
		began = time.Now()
		s, err = Run(context.Background(), cfg, &memSink{}, nil)
		require.NoError(t, err)
		assert.Equal(t, 250*time.Millisecond, time.Since(began))
		assert.Equal(t, 300, s.Events)

		// Neither Events nor Duration: until cancelled, which is a normal end.
		cfg = testConfig(0)
		cfg.Rate = 2000
		ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
		defer cancel()
		s, err = Run(ctx, cfg, &memSink{}, nil)
		require.NoError(t, err)
		assert.Equal(t, 400, s.Events, "batches of 200 at 0 and 100 ms")

		// With an event count, cancellation is an error.
		cfg = testConfig(100000)
		cfg.Rate = 1000
		ctx, cancel2 := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel2()
		_, err = Run(ctx, cfg, &memSink{}, nil)
		require.ErrorIs(t, err, context.DeadlineExceeded)
	})
}

// TestProgressCallback runs in a synctest bubble (TestRateAndDuration says why): batches
// of 40 are due every 100 ms up to the end at 1.3 s, and the one at 1 s is the first a
// second after the start.
func TestProgressCallback(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig(0)
		cfg.Rate, cfg.Duration = 400, 1300*time.Millisecond
		var got []Summary
		s, err := Run(context.Background(), cfg, &memSink{}, func(s Summary) { got = append(got, s) })
		require.NoError(t, err)
		require.Len(t, got, 1)
		assert.Equal(t, 440, got[0].Events)
		assert.Equal(t, 560, s.Events)
		// a copy: later counting does not change it
		before := got[0].ByType[schema.TypeMessageCreated]
		assert.LessOrEqual(t, before, s.ByType[schema.TypeMessageCreated])
	})
}

// TestZeroStartIsNow runs in a synctest bubble, whose clock stands still while Run
// works: the start is the clock's reading, to the second.
func TestZeroStartIsNow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig(50)
		cfg.Start = time.Time{}
		s, _ := run(t, cfg)
		assert.Equal(t, time.Now().UTC().Truncate(time.Second), s.Start)
		assert.True(t, strings.HasSuffix(s.Start.Format(time.RFC3339Nano), "Z"))
	})
}
