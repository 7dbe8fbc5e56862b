package dashboards_test

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/simulate"
	"github.com/bandplane/bandplane/deploy/stacktest"
	"github.com/bandplane/bandplane/deploy/stacktest/dual"
	"github.com/bandplane/bandplane/ingest"
	"github.com/bandplane/bandplane/ingest/prices"
	"github.com/bandplane/bandplane/policy"
	"github.com/bandplane/bandplane/policy/api"
	"github.com/bandplane/bandplane/query/trail"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/kafka"
	"github.com/bandplane/bandplane/schema/pricing"
	"github.com/bandplane/bandplane/schema/store"
	"github.com/bandplane/bandplane/schema/tlog"
)

// world is the data the dashboards are tried on: a simulated workload and bandplane's
// own events (decisions, suspensions, budgets, dead letters) written through the real
// ingest pipeline into a recorded database and sealed into each organization's log
// (sealWorld), then replayed so that the 18.16 server and ClickHouse 26.9 hold the same
// rows in db.
type world struct {
	db       string // the replayed database, on both engines
	server   dual.Engine
	current  dual.Engine
	from, to time.Time // a dashboard time range covering every event
	now      time.Time // what the queries read as now(), once the data is loaded

	orgs   []entity // the simulator's organizations, with a label each
	agents []entity // agents with messages, by org
	owners []entity
	rooms  []entity
	models []string

	hostile hostileWorld
	twins   twinWorld
	seal    sealWorld
}

// entity is an id and, for the assertions, the org it belongs to.
type entity struct{ id, org string }

// hostileWorld is an organization whose ids are made of the characters that break
// string literals and URL encodings. Every variable of every dashboard is tried with
// them.
type hostileWorld struct {
	org, owner, room, model string
	agents                  []string
}

func hostileIDs() hostileWorld {
	return hostileWorld{
		org:    `a'b`,
		owner:  `c,d`,
		room:   `e&f=g%20 {x}`,
		model:  `ünï/cødé "模型"`,
		agents: []string{`x\`, `x\' OR 1=1 --`, `агент Ω ✓`},
	}
}

// simulated is the size of the simulated workload: a few thousand events, which a
// 2-core machine ingests in seconds and which give every panel rows.
const simulated = 2500

func loadWorld(t *testing.T) *world {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	rec, db := dual.Database(t)
	topic := stacktest.Topic(t, 4)
	stop := stacktest.RunIngest(t, topic, rec, db, "ingest")
	producer, err := kafka.NewProducer(kafka.ProducerConfig{Brokers: stacktest.Brokers(), Topic: topic})
	require.NoError(t, err)
	t.Cleanup(func() { _ = producer.Close() })

	// The price catalog as serve seeds it (the cache-savings panels read bandplane.prices);
	// its price.seeded event is in the trail too.
	_, err = prices.New(ctx, prices.Config{Conn: rec, Database: db, Seed: pricing.Default(), Auditor: producer})
	require.NoError(t, err)

	// The workload (about 11 hours of simulated time) ends a little before now, so that
	// "now" panels (budgets of the current period, freshness, ages) see it, whatever time
	// of day the test runs.
	now := time.Now().UTC()
	start := now.Add(-12 * time.Hour).Truncate(time.Minute)
	cfg := simulate.DefaultConfig()
	cfg.Events, cfg.Seed, cfg.Start = simulated, 7, start
	sum, err := simulate.Run(ctx, cfg, ingest.ProducerSink{Producer: producer}, nil)
	require.NoError(t, err)
	want := uint64(sum.Events) + 1
	waitEvents(t, rec, db, want)

	w := &world{from: start.Add(-time.Hour), to: now.Add(time.Hour)}
	w.readEntities(t, ctx, rec, db)
	w.hostile = hostileIDs()

	// The twins' people, agents and rooms are registered first, so that their usage is
	// attributed whatever batch it lands in.
	twins, twinDir, twinRest := twinEvents(w.models[0], start.Add(40*time.Minute), now)
	w.twins = twins
	require.NoError(t, producer.Produce(ctx, twinDir))
	want += uint64(len(twinDir))
	waitEvents(t, rec, db, want)

	own := w.ownEvents(t, now)
	own = append(own, hostileEvents(w.hostile, start.Add(30*time.Minute))...)
	own = append(own, twinRest...)
	require.NoError(t, producer.Produce(ctx, own))
	poison := []kafkago.Message{
		{Key: []byte("poison"), Value: []byte(`{"topic":"chat_room:r1","event":"message_created","payload":`)},
		{Key: []byte("poison"), Value: []byte(`["not","an","event"]`)},
	}
	require.NoError(t, producer.ProduceMessages(ctx, poison))
	want += uint64(len(own))
	waitEvents(t, rec, db, want)
	require.True(t, stacktest.Eventually(t, 60*time.Second, 200*time.Millisecond, func() bool {
		var n uint64
		_ = rec.Conn.QueryRow(ctx, "SELECT count() FROM "+db+".dead_letters FINAL").Scan(&n)
		return n == uint64(len(poison))
	}), "dead letters of the poison records")

	w.seal = sealTrail(t, ctx, rec, db, w.hostile.org)
	stop()

	w.current = dual.Chdb(t)
	rec.Replay(ctx, t, w.current)
	w.server = dual.Server(t)
	w.db = rec.ReplayDB()
	w.now = time.Now().UTC()
	return w
}

func waitEvents(t *testing.T, rec *dual.Recorder, db string, want uint64) {
	t.Helper()
	ctx := context.Background()
	var n uint64
	ok := stacktest.Eventually(t, 90*time.Second, 200*time.Millisecond, func() bool {
		_ = rec.Conn.QueryRow(ctx, "SELECT count() FROM "+db+".events FINAL").Scan(&n)
		return n >= want
	})
	if !ok {
		rows, err := rec.Conn.Query(ctx, "SELECT stage, reason, substring(raw, 1, 300) FROM "+db+".dead_letters FINAL")
		require.NoError(t, err)
		defer rows.Close()
		for rows.Next() {
			var stage, reason, raw string
			require.NoError(t, rows.Scan(&stage, &reason, &raw))
			t.Logf("dead letter: %s: %s: %s", stage, reason, raw)
		}
		t.Fatalf("events in %s: %d, want %d", db, n, want)
	}
}

func (w *world) readEntities(t *testing.T, ctx context.Context, rec *dual.Recorder, db string) {
	t.Helper()
	scan := func(sql string, each func(a, b string)) {
		rows, err := rec.Conn.Query(ctx, sql)
		require.NoError(t, err, sql)
		defer rows.Close()
		for rows.Next() {
			var a, b string
			require.NoError(t, rows.Scan(&a, &b))
			each(a, b)
		}
		require.NoError(t, rows.Err())
	}
	scan("SELECT DISTINCT org_id, org_id FROM "+db+".directory FINAL WHERE org_id != '' ORDER BY org_id", func(a, _ string) {
		w.orgs = append(w.orgs, entity{a, a})
	})
	scan("SELECT actor_id, any(org_id) FROM "+db+".events FINAL WHERE type = 'message.created' AND actor_type = 'agent' AND org_id != '' GROUP BY actor_id ORDER BY count() DESC, actor_id", func(a, b string) {
		w.agents = append(w.agents, entity{a, b})
	})
	scan("SELECT owner_id, any(org_id) FROM "+db+".usage FINAL WHERE owner_id != '' GROUP BY owner_id ORDER BY count() DESC, owner_id", func(a, b string) {
		w.owners = append(w.owners, entity{a, b})
	})
	scan("SELECT room_id, any(org_id) FROM "+db+".usage FINAL WHERE room_id != '' GROUP BY room_id ORDER BY count() DESC, room_id", func(a, b string) {
		w.rooms = append(w.rooms, entity{a, b})
	})
	scan("SELECT model, '' FROM "+db+".usage FINAL GROUP BY model ORDER BY count() DESC, model", func(a, _ string) {
		w.models = append(w.models, a)
	})
	require.NotEmpty(t, w.orgs)
	require.NotEmpty(t, w.agents)
	require.NotEmpty(t, w.owners)
	require.NotEmpty(t, w.rooms)
	require.NotEmpty(t, w.models)
}

// ownEvents are the events bandplane's policy side writes, as policy/api writes them:
// decisions (allowed, throttled, denied for a suspension and for a cross-organization
// add, under two policy revisions), an operator's suspension and resume, budgets of
// every scope (hard and soft) and a crossing.
func (w *world) ownEvents(t *testing.T, now time.Time) []schema.Event {
	t.Helper()
	var out []schema.Event
	chatty := w.agents[0] // the most messages: the simulator's chatty agent
	n := 0
	decided := func(at time.Time, agent entity, room, decision string, allow bool, rev string, reasons ...policy.Reason) {
		n++
		in, _ := json.Marshal(map[string]any{"agent": agent.id, "room": room, "n": n})
		data, err := json.Marshal(api.DecidedData{Decision: decision, Allow: allow, Reasons: reasons, PolicyRevision: rev,
			InputDigest: fmt.Sprintf("%064x", n), Input: in, RetryAfterMs: map[bool]int64{true: 0, false: 1500}[allow]})
		require.NoError(t, err)
		out = append(out, schema.Event{ID: schema.NewID(), Type: schema.TypePolicyDecided, Time: at.Truncate(time.Millisecond),
			OrgID: agent.org, RoomID: room, Actor: schema.Party{ID: agent.id, Type: schema.ActorAgent},
			Source: api.SourcePolicy, SchemaVersion: schema.Version, Data: data})
	}
	revA, revB := "rev-a1b2c3", "rev-d4e5f6"
	room := w.rooms[0].id
	for i := range 40 {
		at := w.from.Add(time.Hour + time.Duration(i)*4*time.Minute)
		rev := revA
		if i >= 20 {
			rev = revB
		}
		a := w.agents[i%len(w.agents)]
		decided(at, a, room, "send_message", true, rev, policy.Reason{Code: "allowed", Message: "within limits"})
		decided(at.Add(time.Second), a, room, "peer_visible", true, rev, policy.Reason{Code: "owner", Message: "owner"})
		if i%5 == 0 {
			decided(at.Add(2*time.Second), a, room, "add_participant", false, rev,
				policy.Reason{Code: "cross_org_requires_contact", Message: "another organization"})
			decided(at.Add(3*time.Second), a, room, "contact_request", false, rev, policy.Reason{Code: "pending", Message: "pending"})
		}
		if i%7 == 0 {
			decided(at.Add(4*time.Second), a, room, "add_participant", true, rev, policy.Reason{Code: "contact", Message: "contact"})
		}
	}
	// The chatty agent is throttled again and again in the last minutes (the alert's window).
	for i := range 8 {
		decided(now.Add(-5*time.Minute+time.Duration(i)*20*time.Second), chatty, room, "send_message", false, revB,
			policy.Reason{Code: policy.CodeRateLimited, Message: "message rate used up"})
	}
	decided(now.Add(-20*time.Minute), chatty, room, "send_message", false, revB,
		policy.Reason{Code: policy.CodeBudgetExceeded, Message: "daily budget spent"})
	// An operator suspends an agent and resumes it; decisions in between are denied.
	susp := w.agents[1%len(w.agents)]
	op := schema.Party{ID: "key-operator", Type: schema.ActorSystem}
	opData, _ := json.Marshal(api.OperatorData{Reason: "runaway loop", KeyName: "ops"})
	out = append(out, schema.Event{ID: schema.NewID(), Type: schema.TypeAgentSuspended, Time: now.Add(-90 * time.Minute).Truncate(time.Second),
		OrgID: susp.org, Actor: op, Subject: &schema.Party{ID: susp.id, Type: schema.ActorAgent}, Source: api.SourcePolicy,
		SchemaVersion: schema.Version, Data: opData})
	decided(now.Add(-80*time.Minute), susp, room, "send_message", false, revB, policy.Reason{Code: "suspended", Message: "suspended"})
	out = append(out, schema.Event{ID: schema.NewID(), Type: schema.TypeAgentResumed, Time: now.Add(-60 * time.Minute).Truncate(time.Second),
		OrgID: susp.org, Actor: op, Subject: &schema.Party{ID: susp.id, Type: schema.ActorAgent}, Source: api.SourcePolicy,
		SchemaVersion: schema.Version, Data: opData})

	// Budgets: per scope, hard and soft, daily and monthly, some well spent already.
	budget := func(org string, scope policy.BudgetScope, id string, period policy.Period, tokens, costMicros int64, hard bool) policy.Budget {
		b := policy.Budget{ID: policy.BudgetID(org, scope, id, period), Org: org, Scope: scope, ScopeID: id, Period: period,
			Tokens: tokens, CostMicros: costMicros, Hard: hard, UpdatedAt: w.from.Add(30 * time.Minute), UpdatedBy: "key-admin"}
		data, err := json.Marshal(b)
		require.NoError(t, err)
		out = append(out, schema.Event{ID: schema.NewID(), Type: schema.TypeBudgetSet, Time: b.UpdatedAt, OrgID: org,
			Actor: schema.Party{ID: "key-admin", Type: schema.ActorSystem}, Source: api.SourcePolicy, SchemaVersion: schema.Version, Data: data})
		return b
	}
	org := w.orgs[0].id
	hardOrg := budget(org, policy.ScopeOrg, org, policy.PeriodDay, 0, 2_000_000, true)
	budget(org, policy.ScopeOrg, org, policy.PeriodMonth, 0, 500_000_000, false)
	budget(chatty.org, policy.ScopeAgent, chatty.id, policy.PeriodDay, 200_000, 0, true)
	budget(w.owners[0].org, policy.ScopeOwner, w.owners[0].id, policy.PeriodMonth, 50_000_000, 100_000_000, false)
	budget(w.rooms[0].org, policy.ScopeRoom, w.rooms[0].id, policy.PeriodDay, 0, 1_000_000, true)
	gone := budget(org, policy.ScopeAgent, w.agents[len(w.agents)-1].id, policy.PeriodDay, 1000, 0, true)
	goneData, _ := json.Marshal(gone)
	out = append(out, schema.Event{ID: schema.NewID(), Type: schema.TypeBudgetDeleted, Time: gone.UpdatedAt.Add(time.Minute), OrgID: org,
		Actor: schema.Party{ID: "key-admin", Type: schema.ActorSystem}, Source: api.SourcePolicy, SchemaVersion: schema.Version, Data: goneData})
	crossing, _ := json.Marshal(policy.Crossing{Budget: hardOrg, Threshold: 80, PeriodStart: policy.PeriodStart(policy.PeriodDay, now),
		SpentCost: 1_700_000, At: now.Add(-30 * time.Minute).Truncate(time.Second)})
	out = append(out, schema.Event{ID: schema.NewID(), Type: schema.TypeBudgetCrossed, Time: now.Add(-30 * time.Minute).Truncate(time.Second), OrgID: org,
		Actor: schema.Party{ID: api.SourcePolicy, Type: schema.ActorSystem}, Subject: &schema.Party{ID: org, Type: schema.ActorSystem},
		Source: api.SourcePolicy, SchemaVersion: schema.Version, Data: crossing})
	return out
}

// hostileEvents are a small organization whose ids are hostile, in canonical form: its
// directory, a room, messages with mentions, a tool call that fails, usage of a model
// with a hostile name, a task, a request for attention and a throttled decision.
func hostileEvents(h hostileWorld, at time.Time) []schema.Event {
	var out []schema.Event
	step := 0
	ev := func(typ, room string, actor schema.Party, subject *schema.Party, data any) {
		step++
		raw, err := json.Marshal(data)
		if err != nil {
			panic(err)
		}
		src := simulate.Source
		if typ == schema.TypePolicyDecided || typ == schema.TypeBudgetSet {
			src = api.SourcePolicy
		}
		out = append(out, schema.Event{ID: schema.NewID(), Type: typ, Time: at.Add(time.Duration(step) * 7 * time.Second), OrgID: h.org,
			RoomID: room, Actor: actor, Subject: subject, Source: src, SchemaVersion: schema.Version, Data: raw})
	}
	owner := schema.Party{ID: h.owner, Type: schema.ActorUser, Handle: "hostile.owner"}
	system := schema.Party{ID: "system", Type: schema.ActorSystem}
	ev(schema.TypeUserRegistered, "", system, &owner, schema.UserData{Handle: "hostile.owner", Name: `Owner "O'Hara" \ ünï`})
	var agents []schema.Party
	for i, id := range h.agents {
		handle := fmt.Sprintf("hostile.owner/agent-%d", i)
		a := schema.Party{ID: id, Type: schema.ActorAgent, Handle: handle}
		agents = append(agents, a)
		ev(schema.TypeAgentRegistered, "", owner, &a, schema.AgentData{Handle: handle, Name: fmt.Sprintf("Agent %d ' \\ ,", i),
			OwnerID: h.owner, Model: h.model, Listed: true})
	}
	ev(schema.TypeRoomAdded, h.room, owner, nil, schema.RoomData{Title: `Room 'e&f' \ {x}`})
	for _, a := range agents {
		ev(schema.TypeParticipantAdded, h.room, owner, &a, schema.ParticipantData{ParticipantID: a.ID, ParticipantType: schema.ActorAgent, Handle: a.Handle})
	}
	for i, a := range agents {
		other := agents[(i+1)%len(agents)]
		ev(schema.TypeMessageCreated, h.room, a, nil, schema.MessageData{Content: "@" + other.Handle + " hi", MessageType: "text",
			Mentions: []schema.Mention{{ID: other.ID, Handle: other.Handle}}})
		ev(schema.TypeToolCall, h.room, a, nil, schema.ToolCallData{ToolName: "sql_query", ToolCallID: fmt.Sprintf("call_%d", i)})
		ev(schema.TypeToolResult, h.room, a, nil, schema.ToolResultData{ToolName: "sql_query", ToolCallID: fmt.Sprintf("call_%d", i), IsError: i == 0})
		ev(schema.TypeUsageReported, h.room, a, nil, schema.UsageData{InputTokens: 1000 * int64(i+1), OutputTokens: 100, CacheReadTokens: 500, Model: h.model})
	}
	ev(schema.TypeTaskCreated, h.room, agents[0], nil, schema.TaskData{TaskID: `t'1\`, Title: "hostile task", Status: "blocked", Assignee: agents[0].ID})
	ev(schema.TypeAttention, h.room, agents[1], nil, schema.MessageData{Content: "@hostile.owner decide?", MessageType: "attention",
		Mentions: []schema.Mention{{ID: h.owner, Handle: "hostile.owner"}}})
	b := policy.Budget{ID: policy.BudgetID(h.org, policy.ScopeAgent, h.agents[0], policy.PeriodDay), Org: h.org, Scope: policy.ScopeAgent,
		ScopeID: h.agents[0], Period: policy.PeriodDay, Tokens: 5000, Hard: true, UpdatedAt: at}
	ev(schema.TypeBudgetSet, "", schema.Party{ID: "key-admin", Type: schema.ActorSystem}, nil, b)
	reason := []policy.Reason{{Code: policy.CodeRateLimited, Message: "rate"}}
	data := api.DecidedData{Decision: "send_message", Allow: false, Reasons: reason, PolicyRevision: "rev-d4e5f6", InputDigest: "00", Input: json.RawMessage(`{}`)}
	ev(schema.TypePolicyDecided, h.room, agents[0], nil, data)
	return out
}

// twinWorld is an organization whose names collide: two rooms with one title, each with
// a hard budget that its usage has taken past the alert's 80 %, and two agents with one
// handle, each throttled more often than the chatty-agent rule allows. An alert instance
// labelled by names alone would have the same labels as its twin, and Grafana refuses a
// rule whose instances are not told apart by their labels.
type twinWorld struct {
	org     string
	rooms   []string
	budgets []string // the rooms' hard budgets, by budget id
	agents  []string
	// used is each budget's share of its limit (the value the budget rule compares with
	// 0.8); throttles is how often each agent was throttled in the last minutes.
	used      map[string]float64
	throttles int
}

// Budget and title of the twins.
const (
	twinTitle       = "Standup"
	twinHandle      = "twin.owner/helper"
	twinLimitTokens = 1000
)

// twinEvents are the twins' events: first the registrations and rooms (dir), then the
// budgets, usage and throttled decisions (rest). Registrations are at, usage and
// decisions in the minutes before now (usage in now's UTC month, the budgets' period).
func twinEvents(model string, at, now time.Time) (twinWorld, []schema.Event, []schema.Event) {
	w := twinWorld{org: "twin-" + schema.NewID(), used: map[string]float64{}, throttles: 5}
	var dir, rest []schema.Event
	ev := func(out *[]schema.Event, typ string, t time.Time, room string, actor schema.Party, subject *schema.Party, data any) {
		raw, err := json.Marshal(data)
		if err != nil {
			panic(err)
		}
		src := simulate.Source
		if typ == schema.TypePolicyDecided || typ == schema.TypeBudgetSet {
			src = api.SourcePolicy
		}
		*out = append(*out, schema.Event{ID: schema.NewID(), Type: typ, Time: t.Truncate(time.Millisecond), OrgID: w.org, RoomID: room,
			Actor: actor, Subject: subject, Source: src, SchemaVersion: schema.Version, Data: raw})
	}
	system := schema.Party{ID: "system", Type: schema.ActorSystem}
	owner := schema.Party{ID: "twin-owner-" + schema.NewID(), Type: schema.ActorUser, Handle: "twin.owner"}
	ev(&dir, schema.TypeUserRegistered, at, "", system, &owner, schema.UserData{Handle: "twin.owner"})
	var agents []schema.Party
	for i := range 2 {
		a := schema.Party{ID: fmt.Sprintf("twin-agent-%d-%s", i, schema.NewID()), Type: schema.ActorAgent, Handle: twinHandle}
		agents = append(agents, a)
		w.agents = append(w.agents, a.ID)
		ev(&dir, schema.TypeAgentRegistered, at.Add(time.Second), "", owner, &a, schema.AgentData{Handle: twinHandle, OwnerID: owner.ID, Model: model})
		room := fmt.Sprintf("twin-room-%d-%s", i, schema.NewID())
		w.rooms = append(w.rooms, room)
		ev(&dir, schema.TypeRoomAdded, at.Add(2*time.Second), room, owner, nil, schema.RoomData{Title: twinTitle})
	}
	usedAt := now.Add(-2 * time.Minute)
	if usedAt.UTC().Month() != now.UTC().Month() {
		usedAt = now
	}
	admin := schema.Party{ID: "key-admin", Type: schema.ActorSystem}
	for i, room := range w.rooms {
		b := policy.Budget{ID: policy.BudgetID(w.org, policy.ScopeRoom, room, policy.PeriodMonth), Org: w.org, Scope: policy.ScopeRoom,
			ScopeID: room, Period: policy.PeriodMonth, Tokens: twinLimitTokens, Hard: true, UpdatedAt: at.Add(time.Minute), UpdatedBy: admin.ID}
		w.budgets = append(w.budgets, b.ID)
		ev(&rest, schema.TypeBudgetSet, b.UpdatedAt, "", admin, nil, b)
		tokens := int64(900 + 50*i) // 90 % and 95 % of the limit
		w.used[b.ID] = float64(tokens) / twinLimitTokens
		ev(&rest, schema.TypeUsageReported, usedAt, room, agents[i], nil, schema.UsageData{InputTokens: tokens - 100, OutputTokens: 100, Model: model})
		for k := range w.throttles {
			data := api.DecidedData{Decision: "send_message", Allow: false, RetryAfterMs: 1500, PolicyRevision: "rev-d4e5f6",
				Reasons:     []policy.Reason{{Code: policy.CodeRateLimited, Message: "message rate used up"}},
				InputDigest: fmt.Sprintf("%064x", 1000+10*i+k), Input: json.RawMessage(`{}`)}
			ev(&rest, schema.TypePolicyDecided, now.Add(-4*time.Minute+time.Duration(k)*10*time.Second), room, agents[i], nil, data)
		}
	}
	return w, dir, rest
}

// sealWorld is the audit trail's log the seal status panel and the unsealed alert are
// tried on. Every row ingest stored is sealed; then rows are stored without a note (as
// when the notes are stuck: ingest stored them, the sealer never saw them):
//   - late: rows of the hostile organization, ingested lateAge ago, after its sealed
//     ones;
//   - never: the rows of an organization with no leaf and no checkpoint;
//   - forged: the rows of an organization with no leaf, and a checkpoint row forged for
//     it that claims more leaves than its log holds (no signature can be checked in SQL:
//     the panel must still not call it sealed).
type sealWorld struct {
	sealed map[string]uint64 // organization → its sealed rows (leaves), for every organization with a log
	late   unsealedRows
	never  unsealedRows
	forged unsealedRows
	// forgedSize is the forged checkpoint's size.
	forgedSize uint64
}

// unsealedRows are n rows of org stored at ingested with no note.
type unsealedRows struct {
	org      string
	n        int
	ingested time.Time
}

// Ages of the unsealed rows: all above the unsealed rule's 10 minutes.
const (
	lateAge   = 20 * time.Minute
	neverAge  = 30 * time.Minute
	forgedAge = 15 * time.Minute
)

// sealTrail notes every row stored in db (the newest copy of each key, which is what
// ingest noted), stores the unsealed rows, seals, and forges the checkpoint row, all
// through rec so that the replay holds the same log.
func sealTrail(t *testing.T, ctx context.Context, rec *dual.Recorder, db, hostileOrg string) sealWorld {
	t.Helper()
	stored := storedRows(t, ctx, rec, db)
	notes := &memNotes{}
	notes.add(stored)
	sw := sealWorld{sealed: map[string]uint64{}, forgedSize: 1000}
	for _, r := range stored {
		sw.sealed[r.OrgID]++
	}

	at := time.Now().UTC().Truncate(time.Second)
	sw.late = unsealedRows{org: hostileOrg, n: 7, ingested: at.Add(-lateAge)}
	sw.never = unsealedRows{org: `never\sealed's`, n: 4, ingested: at.Add(-neverAge)}
	sw.forged = unsealedRows{org: "forged-" + schema.NewID(), n: 5, ingested: at.Add(-forgedAge)}
	var rows []store.EventRow
	for _, u := range []unsealedRows{sw.late, sw.never, sw.forged} {
		for i := range u.n {
			rows = append(rows, store.EventRow{ID: fmt.Sprintf("unsealed-%s-%d", schema.NewID(), i), Type: schema.TypeMessageCreated,
				Time: u.ingested.Add(-time.Duration(i+1) * time.Minute), OrgID: u.org, ActorID: "system", ActorType: string(schema.ActorSystem),
				Source: "test", SchemaVersion: 1, Data: fmt.Sprintf(`{"content":"not noted %d"}`, i), IngestedAt: u.ingested,
				Partition: 0, Offset: int64(1_000_000 + len(rows))})
		}
	}
	require.NoError(t, store.New(rec, db).BatchInsert(ctx, &store.Batch{Events: rows}))

	_, key, err := ed25519.GenerateKey(nil)
	require.NoError(t, err)
	topic := &memTopic{}
	sealer, err := trail.New(trail.Config{Conn: rec, Database: db, Key: key, Notes: notes, Publisher: topic, Logger: stacktest.Logger()})
	require.NoError(t, err)
	res, err := sealer.SealNow(ctx)
	require.NoError(t, err)
	require.Equal(t, len(stored), res.Leaves, "a leaf per stored row")
	require.Equal(t, len(sw.sealed), res.Orgs, "a log per organization with rows")
	require.Zero(t, notes.pending(), "notes left")
	require.Positive(t, topic.published(), "checkpoints published")

	// A checkpoint row anyone with write access could insert: no signature, a size the
	// log does not have, signed "now".
	// INSERT … SELECT: an INSERT … VALUES sent with Exec leaves 18.16 waiting for a data
	// block that the driver never sends.
	require.NoError(t, rec.Exec(ctx, fmt.Sprintf("INSERT INTO %s.checkpoints (org_id, size, root, signed_at, key_id, note) "+
		"SELECT '%s', toUInt64(%d), '%064x', toDateTime(%d, 'UTC'), 'forged', 'forged note'", db, sw.forged.org, sw.forgedSize, 1, at.Unix())))
	return sw
}

// storedRows reads back every row stored in db, the newest copy of each key, past the
// Recorder: the test's own reads, not bandplane's.
func storedRows(t *testing.T, ctx context.Context, rec *dual.Recorder, db string) []store.EventRow {
	t.Helper()
	rows, err := rec.Conn.Query(ctx, "SELECT DISTINCT org_id, toUInt32(time), id FROM "+db+".events")
	require.NoError(t, err)
	var keys []store.EventKey
	for rows.Next() {
		var k store.EventKey
		var sec uint32
		require.NoError(t, rows.Scan(&k.OrgID, &sec, &k.ID))
		k.Time = int64(sec)
		keys = append(keys, k)
	}
	require.NoError(t, rows.Err())
	rows.Close()
	copies, err := store.New(rec.Conn, db).StoredEvents(ctx, keys)
	require.NoError(t, err)
	newest := map[store.EventKey]store.EventRow{}
	for _, r := range copies {
		k := store.KeyOf(&r)
		if n, ok := newest[k]; !ok || r.IngestedAt.After(n.IngestedAt) {
			newest[k] = r
		}
	}
	require.Len(t, newest, len(keys), "a stored row per key")
	out := make([]store.EventRow, 0, len(newest))
	for _, r := range newest {
		out = append(out, r)
	}
	return out
}

// memNotes stands in for the stored-events topic (trail.NoteSource): the notes of the
// rows it is given, keyed by organization, as ingest produces them.
type memNotes struct {
	mu      sync.Mutex
	queue   []kafkago.Message
	drained int
}

func (n *memNotes) add(rows []store.EventRow) {
	byOrg := map[string][]tlog.Leaf{}
	for i := range rows {
		byOrg[rows[i].OrgID] = append(byOrg[rows[i].OrgID], tlog.LeafOf(&rows[i]))
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	orgs := make([]string, 0, len(byOrg))
	for org := range byOrg {
		orgs = append(orgs, org)
	}
	slices.Sort(orgs)
	for _, org := range orgs {
		for _, m := range tlog.EncodeNotes(byOrg[org]) {
			n.queue = append(n.queue, kafkago.Message{Key: []byte(org), Value: m})
		}
	}
}

// Drain returns up to max of the queued notes after the drained ones; they stay
// queued until Commit.
func (n *memNotes) Drain(_ context.Context, max int) ([]kafkago.Message, bool, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	k := min(max, len(n.queue)-n.drained)
	out := slices.Clone(n.queue[n.drained : n.drained+k])
	n.drained += k
	return out, n.drained < len(n.queue), nil
}

// Rewind makes the next Drain return the drained notes again.
func (n *memNotes) Rewind() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.drained = 0
}

// Generation never changes: the topic is never handed out again.
func (n *memNotes) Generation() int64 { return 1 }

func (n *memNotes) Commit(context.Context) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.queue = n.queue[n.drained:]
	n.drained = 0
	return nil
}

// Holds is true: this sealer is the only one.
func (n *memNotes) Holds() bool { return true }

func (n *memNotes) pending() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.queue)
}

// memTopic stands in for the checkpoints topic (trail.Publisher).
type memTopic struct {
	mu sync.Mutex
	n  int
}

func (p *memTopic) ProduceMessages(_ context.Context, msgs []kafkago.Message) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.n += len(msgs)
	return nil
}

func (p *memTopic) published() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}
