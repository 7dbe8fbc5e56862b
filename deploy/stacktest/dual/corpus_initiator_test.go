package dual_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/stacktest"
	"github.com/bandplane/bandplane/deploy/stacktest/dual"
	"github.com/bandplane/bandplane/policy"
	"github.com/bandplane/bandplane/policy/replica"
	"github.com/bandplane/bandplane/schema/pricing"
)

// A policy replica's bootstrap of the initiators' spend, on the same simulated traffic,
// on 18.16 and on 26.9: today's and yesterday's from the usage rows ingest linked to
// their chains, the month's earlier days from the day rows of initiator_rollup.
func TestIntegrationCorpusInitiatorSpend(t *testing.T) {
	ctx := context.Background()
	other := dual.Chdb(t)
	rec, db := dual.Database(t)
	loadSimulated(t, rec, 2000)
	now := time.Now().UTC().Truncate(time.Second)

	// Today: the usage rows ingest stored, with the initiator schema/cause derived (the
	// simulated clock runs past now, and may run into tomorrow, which no counter has yet).
	expected := map[[2]string]int64{} // (initiator, type) -> tokens
	today := policy.PeriodStart(policy.PeriodDay, now)
	rows, err := rec.Conn.Query(ctx, `SELECT initiator_id, initiator_type,
		toInt64(sum(input_tokens + output_tokens + cache_read_tokens + cache_write_tokens))
		FROM `+db+`.usage FINAL WHERE initiator_id != '' AND time >= ? AND time < ? GROUP BY initiator_id, initiator_type ORDER BY initiator_id`,
		today, today.AddDate(0, 0, 1))
	require.NoError(t, err)
	for rows.Next() {
		var id, typ string
		var n int64
		require.NoError(t, rows.Scan(&id, &typ, &n))
		expected[[2]string{id, typ}] += n
	}
	require.NoError(t, rows.Err())
	rows.Close()
	require.NotEmpty(t, expected, "the simulated usage has initiators")

	bootstrap := func(at time.Time) (*policy.Directory, *policy.Ledger) {
		t.Helper()
		dir := policy.NewDirectory()
		eng, err := policy.New(ctx, policy.Config{Directory: dir})
		require.NoError(t, err)
		rep, err := replica.New(replica.Config{Directory: dir, Ledger: eng.Ledger(), Catalog: pricing.Default(), Conn: rec, Database: db,
			Brokers: stacktest.Brokers(), Topic: stacktest.Topic(t, 1), GroupID: stacktest.Name(t), Logger: stacktest.Logger(),
			Now: func() time.Time { return at }})
		require.NoError(t, err)
		_, err = rep.Bootstrap(ctx)
		require.NoError(t, err)
		return dir, eng.Ledger()
	}
	dir, ledger := bootstrap(now)
	people := 0
	for k, tokens := range expected {
		org, ok := dir.InitiatorOrg(k[0], k[1], "")
		if !ok || k[1] != "user" {
			continue
		}
		people++
		spent, _, _, _ := ledger.Spent(org, policy.ScopeInitiator, k[0], policy.PeriodDay, now)
		assert.Equal(t, tokens, spent, "initiator %s of %s", k[0], org)
	}
	require.NotZero(t, people, "some of the simulated initiators are people of the directory")

	// The month's earlier days: the day rows of initiator_rollup, written here for the
	// first day of next month, read by a bootstrap on its 5th. The simulated traffic is
	// this month's: that bootstrap reads none of it, whatever today's date.
	later := policy.PeriodStart(policy.PeriodMonth, now).AddDate(0, 1, 4)
	day := policy.PeriodStart(policy.PeriodMonth, later)
	var person policy.Person
	for _, p := range dir.Snapshot().People {
		if p.Org != "" {
			person = p
			break
		}
	}
	require.NotEmpty(t, person.ID)
	for i, r := range []struct {
		org, model, initiator, typ string
		tokens                     int
		version                    int
	}{
		{"org-corpus-delegate", "m-a", person.ID, "user", 1000, 1},
		{"org-corpus-delegate", "m-a", person.ID, "user", 1500, 2}, // a rebuild of the same group: FINAL reads its newest
		{person.Org, "m-b", person.ID, "user", 250, 1},
		{"org-corpus-delegate", "m-c", "webhook:corpus", "system", 300, 1},
		{"org-corpus-delegate", "m-d", "u-ghost", "user", 999, 1}, // not in the directory: no budget to count on
	} {
		require.NoError(t, rec.Exec(ctx, fmt.Sprintf(`INSERT INTO %s.initiator_rollup (grain, bucket, org_id, owner_id, model,
			initiator_id, initiator_type, initiator_owner, chain_depth, events, input_tokens, output_tokens, cost, currency, version)
			SELECT 'day', toDateTime('%s', 'UTC'), '%s', 'u-owner', '%s', '%s', '%s', '%s', 2, 1, %d, 0, toDecimal128('0.5', 6), 'USD', %d`,
			db, day.Format(time.DateTime), r.org, r.model, r.initiator, r.typ, r.initiator, r.tokens, r.version)), "row %d", i)
	}
	_, ledger = bootstrap(later)
	spent, cost, _, _ := ledger.Spent(person.Org, policy.ScopeInitiator, person.ID, policy.PeriodMonth, later)
	assert.Equal(t, int64(1500+250), spent, "across organizations, the newest version of each group")
	assert.Equal(t, int64(1_000_000), cost)
	spent, _, _, _ = ledger.Spent("org-corpus-delegate", policy.ScopeInitiator, "webhook:corpus", policy.PeriodMonth, later)
	assert.Equal(t, int64(300), spent, "a system's spend is its organization's")
	spent, _, _, _ = ledger.Spent("org-corpus-delegate", policy.ScopeInitiator, "u-ghost", policy.PeriodMonth, later)
	assert.Zero(t, spent)
	spent, _, _, _ = ledger.Spent("org-corpus-delegate", policy.ScopeOrg, "org-corpus-delegate", policy.PeriodMonth, later)
	assert.Zero(t, spent, "initiator_rollup counts on initiators only: usage_rollup has the organizations' days")

	steps := rec.Replay(ctx, t, other)
	t.Logf("%d steps replayed on %s", len(steps), other.Name())
}
