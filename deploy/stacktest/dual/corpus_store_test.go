package dual_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/stacktest"
	"github.com/bandplane/bandplane/deploy/stacktest/dual"
	"github.com/bandplane/bandplane/ingest"
	"github.com/bandplane/bandplane/ingest/prices"
	"github.com/bandplane/bandplane/policy"
	"github.com/bandplane/bandplane/policy/api"
	"github.com/bandplane/bandplane/policy/replica"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/directory"
	"github.com/bandplane/bandplane/schema/kafka"
	"github.com/bandplane/bandplane/schema/keys"
	"github.com/bandplane/bandplane/schema/pricing"
	"github.com/bandplane/bandplane/schema/store"
)

// The price catalog (seeded, a new version), a reprice job over the loaded range, the
// reprice of unpriced usage ingest runs for late registrations, budgets kept by ingest,
// and a policy replica's bootstrap (governance events, offsets, budgets, the spend of
// today, yesterday and the month) on the same simulated traffic, on 18.16 and on 26.9.
func TestIntegrationCorpusPricesBudgetsReplica(t *testing.T) {
	ctx := context.Background()
	other := dual.Chdb(t)
	rec, db := dual.Database(t)
	loadSimulated(t, rec, 2000)
	st := store.New(rec, db)

	// A budget of the first organization, as the policy side writes it.
	var org string
	require.NoError(t, rec.Conn.QueryRow(ctx, "SELECT any(org_id) FROM "+db+".usage_hourly WHERE org_id != ''").Scan(&org))
	now := time.Now().UTC().Truncate(time.Second)
	b := policy.Budget{ID: policy.BudgetID(org, policy.ScopeOrg, org, policy.PeriodMonth), Org: org, Scope: policy.ScopeOrg,
		ScopeID: org, Period: policy.PeriodMonth, CostMicros: 5_000_000, Hard: true, UpdatedAt: now}
	data, err := json.Marshal(b)
	require.NoError(t, err)
	require.NoError(t, st.BatchInsert(ctx, &store.Batch{Events: []store.EventRow{{ID: "budget-1", Type: schema.TypeBudgetSet,
		Time: now, OrgID: org, ActorID: "manager", ActorType: "user", Source: schema.SourceBandplane, Data: string(data),
		SchemaVersion: 1, IngestedAt: now}}}))
	budgets, err := st.Budgets(ctx, org)
	require.NoError(t, err)
	require.Len(t, budgets, 1)

	// What ingest reads at start and on replays: stale rollup hours and days, parties
	// stored without an organization, agents with usage of an unknown model (and
	// ingest's reprice of it below), stored copies of redelivered events.
	require.NoError(t, st.BatchInsert(ctx, &store.Batch{
		Events: []store.EventRow{{ID: "orphan-1", Type: schema.TypeMessageCreated, Time: now, ActorID: "agent-without-org",
			ActorType: "agent", Source: "platform", Data: `{}`, SchemaVersion: 1, IngestedAt: now}},
		Usage: []store.UsageRow{{EventID: "usage-unknown-1", Time: now.Add(-time.Minute), OrgID: org, AgentID: "agent-late",
			Model: "unknown", InputTokens: 10, OutputTokens: 5, Currency: "USD", Version: uint64(now.UnixNano())}},
	}))
	stale, err := st.StaleHours(ctx, 24*time.Hour)
	require.NoError(t, err)
	assert.NotEmpty(t, stale)
	_, err = st.StaleDays(ctx, now.Add(-24*time.Hour))
	require.NoError(t, err)
	parties, err := st.UnattributedParties(ctx, now.Add(-time.Hour))
	require.NoError(t, err)
	assert.Contains(t, parties, "agent-without-org")
	late, err := st.UnpricedAgents(ctx, now.Add(-time.Hour))
	require.NoError(t, err)
	assert.Contains(t, late, "agent-late")
	var eventKeys []store.EventKey
	rows, err := rec.Conn.Query(ctx, "SELECT org_id, toUInt32(time), id FROM "+db+".events ORDER BY time LIMIT 50")
	require.NoError(t, err)
	for rows.Next() {
		var k store.EventKey
		var sec uint32
		require.NoError(t, rows.Scan(&k.OrgID, &sec, &k.ID))
		k.Time = int64(sec)
		eventKeys = append(eventKeys, k)
	}
	require.NoError(t, rows.Err())
	rows.Close()
	stored, err := st.StoredEvents(ctx, eventKeys)
	require.NoError(t, err)
	assert.Len(t, stored, len(eventKeys))

	// Prices: the seeded catalog, a new version, a reprice job of every organization.
	auditTopic := stacktest.Topic(t, 1)
	producer, err := kafka.NewProducer(kafka.ProducerConfig{Brokers: stacktest.Brokers(), Topic: auditTopic, BatchSize: kafka.AuditBatchSize})
	require.NoError(t, err)
	defer producer.Close() //nolint:errcheck // Publish returns once the brokers acknowledge: nothing is left to send
	svc, err := prices.New(ctx, prices.Config{Conn: rec, Database: db, Seed: pricing.Default(), Auditor: producer,
		Logger: stacktest.Logger(), Runner: "corpus"})
	require.NoError(t, err)
	admin := keys.Key{ID: "key-platform-admin", Org: keys.PlatformOrg, Role: keys.RoleAdmin}
	from := now.Add(-3 * time.Hour).Truncate(time.Hour)
	_, err = svc.UpsertPrice(ctx, admin, prices.PriceInput{Model: "gpt-5-mini", Input: "0.4", Output: "3.3", Effective: from.Add(-24 * time.Hour)})
	require.NoError(t, err)
	list, err := svc.ListPrices(ctx)
	require.NoError(t, err)
	require.NotEmpty(t, list)
	job, err := svc.RunNow(ctx, "corpus", keys.PlatformOrg, "", from.Truncate(24*time.Hour), now.Add(time.Hour))
	require.NoError(t, err)
	assert.Equal(t, prices.JobDone, job.State)
	jobs, err := svc.Jobs(ctx, keys.PlatformOrg, 10)
	require.NoError(t, err)
	require.NotEmpty(t, jobs)

	// Ingest's own reprice of the usage of an agent whose model it learns late.
	res, err := ingest.Reprice(ctx, st, directory.New(), svc.Live(), store.UsageFilter{From: from, To: now.Add(time.Hour), UnpricedOnly: true})
	require.NoError(t, err)
	assert.NotZero(t, res.Scanned, "the unknown model's usage is scanned")

	// A policy replica bootstraps from ClickHouse, two weeks into the month so that both
	// the recent usage and the daily rollup are read.
	dir := policy.NewDirectory()
	eng, err := policy.New(ctx, policy.Config{Directory: dir})
	require.NoError(t, err)
	rep, err := replica.New(replica.Config{Directory: dir, Ledger: eng.Ledger(), Catalog: svc.Live(), Conn: rec, Database: db,
		Brokers: stacktest.Brokers(), Topic: auditTopic, GroupID: stacktest.Name(t), Logger: stacktest.Logger(),
		Now: func() time.Time { return now.AddDate(0, 0, 14) }})
	require.NoError(t, err)
	_, err = rep.Bootstrap(ctx)
	require.NoError(t, err)
	assert.NotEmpty(t, dir.Snapshot().Agents)

	// A restarted policy owner rebuilds its limiter and open reservations from the
	// allowed send_message decisions of the trail and the usage reports that settled
	// them (policy/replica/restore.go).
	decided := func(id, execution string, at time.Time) store.EventRow {
		in, err := json.Marshal(policy.MessageInput{Agent: "agent-chatty", Room: "room-1", Tokens: 100, ExecutionID: execution})
		require.NoError(t, err)
		d, err := json.Marshal(api.DecidedData{Decision: policy.SendMessage, Allow: true, PolicyRevision: "corpus", Input: in,
			Taken: &api.TakenData{At: at, Quota: policy.Quota{WindowSeconds: 60, MessagesPerWindowAgent: 10},
				AgentTAT: at.Add(30 * time.Second), ReservationExpires: at.Add(10 * time.Minute)}})
		require.NoError(t, err)
		return store.EventRow{ID: id, Type: schema.TypePolicyDecided, Time: at, OrgID: org, RoomID: "room-1", ActorID: "agent-chatty",
			ActorType: "agent", Source: api.SourcePolicy, Data: string(d), SchemaVersion: 1, IngestedAt: at}
	}
	require.NoError(t, st.BatchInsert(ctx, &store.Batch{Events: []store.EventRow{
		decided("decision-1", "exec-1", now.Add(-10*time.Second)), decided("decision-2", "exec-2", now.Add(-5*time.Second)),
		{ID: "usage-exec-1", Type: schema.TypeUsageReported, Time: now.Add(-2 * time.Second), OrgID: org, ActorID: "agent-chatty",
			ActorType: "agent", ExecutionID: "exec-1", Source: "platform", Data: `{}`, SchemaVersion: 1, IngestedAt: now},
	}}))
	owner, err := policy.New(ctx, policy.Config{Directory: dir})
	require.NoError(t, err)
	restarted, err := replica.New(replica.Config{Directory: dir, Ledger: owner.Ledger(), Limiter: owner.Limiter(), Catalog: svc.Live(),
		Conn: rec, Database: db, Brokers: stacktest.Brokers(), Topic: auditTopic, GroupID: stacktest.Name(t), Logger: stacktest.Logger(),
		Started: now, Now: func() time.Time { return now }})
	require.NoError(t, err)
	_, err = restarted.Bootstrap(ctx)
	require.NoError(t, err)
	_, ok := owner.Limiter().TAT(policy.AgentRateKey("agent-chatty"))
	assert.True(t, ok, "the agent's rate is restored from its decisions")

	steps := rec.Replay(ctx, t, other)
	t.Logf("%d steps replayed on %s", len(steps), other.Name())
}
