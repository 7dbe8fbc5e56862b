package prices

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/keys"
	"github.com/bandplane/bandplane/schema/pricing"
	"github.com/bandplane/bandplane/schema/share"
	"github.com/bandplane/bandplane/schema/store"
)

var now = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

func TestEntryValidation(t *testing.T) {
	cur := pricing.Default()
	ok := PriceInput{Model: "gpt-5", Input: "1.5", Output: "12", CacheRead: "0.15", Currency: "USD", Effective: now.Add(time.Hour + 500*time.Millisecond)}
	p, err := entry(cur, ok, now)
	require.NoError(t, err)
	assert.Equal(t, int64(1_500_000_000), p.Input)
	assert.Equal(t, int64(12_000_000_000), p.Output)
	assert.Equal(t, int64(150_000_000), p.CacheRead)
	assert.Equal(t, p.Input, p.CacheWrite, "a missing cache price is the input price")
	assert.Equal(t, now.Add(time.Hour), p.Effective, "to the second")
	assert.Equal(t, []string{"gpt-5-2025-08-07"}, p.Aliases, "an existing model keeps its aliases")
	assert.Equal(t, "openai", p.Provider)

	// A new model, no currency, no effective time: the catalog's currency, now.
	p, err = entry(cur, PriceInput{Model: "acme/llm-1:8b", Input: "0", Output: "0.5"}, now)
	require.NoError(t, err)
	assert.Equal(t, now, p.Effective)
	assert.Empty(t, p.Aliases)
	// Names usage can carry: spaces inside, non-ASCII letters, the longest allowed.
	for _, m := range []string{"my model v2", "modèle-ü", strings.Repeat("m", MaxModelBytes), "anthropic.claude-3-5-sonnet-20240620-v1:0"} {
		_, err = entry(cur, PriceInput{Model: m, Input: "1", Output: "1"}, now)
		assert.NoError(t, err, "%q", m)
	}

	for _, tc := range []struct {
		name string
		in   PriceInput
		want []string
	}{
		{"nothing", PriceInput{}, []string{"model: required", "input: required", "output: required"}},
		{"unknown is reserved", PriceInput{Model: "Unknown", Input: "1", Output: "1"}, []string{`model: "Unknown" is reserved`}},
		{"too long", PriceInput{Model: strings.Repeat("m", MaxModelBytes+1), Input: "1", Output: "1"}, []string{"model: 257 bytes is longer than the limit of 256"}},
		{"control", PriceInput{Model: "gpt\x00", Input: "1", Output: "1"}, []string{"model:", "control, format or space character (U+0000)"}},
		{"bidi override", PriceInput{Model: "gpt\u202e5", Input: "1", Output: "1"}, []string{"(U+202E)"}},
		{"zero width", PriceInput{Model: "gpt\u200b5", Input: "1", Output: "1"}, []string{"(U+200B)"}},
		{"tab", PriceInput{Model: "gpt\t5", Input: "1", Output: "1"}, []string{"(U+0009)"}},
		{"spaces around", PriceInput{Model: " gpt-5", Input: "1", Output: "1"}, []string{"has spaces around it"}},
		{"two spaces", PriceInput{Model: "a  b", Input: "1", Output: "1"}, []string{"two spaces in a row"}},
		{"bad utf-8", PriceInput{Model: "gpt\xff", Input: "1", Output: "1"}, []string{"model: not valid UTF-8"}},
		{"an alias", PriceInput{Model: "gpt-5-2025-08-07", Input: "1", Output: "1"}, []string{`model: "gpt-5-2025-08-07" is an alias of "gpt-5": set the price of "gpt-5"`}},
		{"other case", PriceInput{Model: "GPT-5", Input: "1", Output: "1"}, []string{`differs only in case from the catalog's "gpt-5"`}},
		{"prices", PriceInput{Model: "m", Input: "-1", Output: "1e-2147483648", CacheRead: "abc", CacheWrite: "1000001"},
			[]string{`input: "-1" is negative`, "output: \"1e-2147483648\" is not a decimal", `cache_read: "abc" is not a decimal`, `cache_write: "1000001" is above the cap of 1000000`}},
		{"decimals", PriceInput{Model: "m", Input: "0.0000000001", Output: "1"}, []string{"input: \"0.0000000001\" has more than 9 decimal places"}},
		{"currency code", PriceInput{Model: "m", Input: "1", Output: "1", Currency: "usd"}, []string{`currency: "usd" is not a 3-letter currency code`}},
		{"currency long", PriceInput{Model: "m", Input: "1", Output: "1", Currency: strings.Repeat("X", 1000)}, []string{"currency: \"XXXXXXXXXXXXXXXX…\" is not"}},
		{"other currency", PriceInput{Model: "m", Input: "1", Output: "1", Currency: "EUR"}, []string{"currency: EUR: the catalog's prices are in USD"}},
		{"effective too early", PriceInput{Model: "m", Input: "1", Output: "1", Effective: time.Date(2019, 12, 31, 0, 0, 0, 0, time.UTC)}, []string{"effective: 2019-12-31T00:00:00Z is outside [2020-01-01, now + 366 days]"}},
		{"effective too late", PriceInput{Model: "m", Input: "1", Output: "1", Effective: now.Add(400 * 24 * time.Hour)}, []string{"effective:", "is outside"}},
		{"effective far", PriceInput{Model: "m", Input: "1", Output: "1", Effective: time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)}, []string{"effective: 9999-01-01T00:00:00Z is outside"}},
	} {
		_, err := entry(cur, tc.in, now)
		require.Error(t, err, tc.name)
		assert.True(t, errors.Is(err, schema.ErrInvalid), tc.name)
		for _, w := range tc.want {
			assert.ErrorContains(t, err, w, tc.name)
		}
	}
}

// Prices are platform-wide: every key but a platform admin is refused before anything
// is read or written (the service here has no database).
func TestOnlyPlatformAdminsSetPrices(t *testing.T) {
	s := &Service{}
	in := PriceInput{Model: "m", Input: "1", Output: "1"}
	for _, k := range []keys.Key{
		{ID: "k1", Org: "acme", Role: keys.RoleAdmin},              // an organization's admin: would change every tenant's costs
		{ID: "k2", Org: keys.PlatformOrg, Role: keys.RoleOperator}, // a platform key of another role
		{ID: "k3", Org: keys.PlatformOrg, Role: keys.RoleViewer},
		{ID: "k4", Org: keys.PlatformOrg, Role: keys.RoleIngest},
		{ID: "k5", Org: "", Role: keys.RoleAdmin},
		{},
	} {
		_, err := s.UpsertPrice(context.Background(), k, in)
		assert.ErrorIs(t, err, schema.ErrForbidden, "%+v", k)
		assert.ErrorContains(t, err, "only a platform key with role admin", "%+v", k)
	}
}

func TestRepriceRequestRights(t *testing.T) {
	s := &Service{}
	from, to := now.Add(-48*time.Hour), now
	for _, tc := range []struct {
		key  keys.Key
		org  string
		want string
	}{
		{keys.Key{ID: "v", Org: "acme", Role: keys.RoleViewer}, "acme", "needs role admin"},
		{keys.Key{ID: "o", Org: keys.PlatformOrg, Role: keys.RoleOperator}, "acme", "needs role admin"},
		{keys.Key{ID: "a", Org: "acme", Role: keys.RoleAdmin}, keys.PlatformOrg, "only a platform key may reprice every organization"},
		{keys.Key{ID: "a", Org: "acme", Role: keys.RoleAdmin}, "globex", `may not reprice organization "globex"`},
	} {
		_, err := s.StartReprice(context.Background(), tc.key, tc.org, from, to)
		assert.ErrorIs(t, err, schema.ErrForbidden, "%+v %s", tc.key, tc.org)
		assert.ErrorContains(t, err, tc.want)
	}
	_, err := s.CancelJob(context.Background(), keys.Key{ID: "v", Org: "acme", Role: keys.RoleManager}, "x")
	assert.ErrorIs(t, err, schema.ErrForbidden)
}

func TestRepriceRequestValidation(t *testing.T) {
	s := &Service{cfg: Config{Now: func() time.Time { return now }}}
	from, to, err := s.checkRequest("key-1", "acme", "", now.Add(-30*24*time.Hour+time.Millisecond), now)
	require.NoError(t, err)
	assert.Equal(t, now.Add(-30*24*time.Hour), from, "to the second")
	assert.Equal(t, now, to)
	_, _, err = s.checkRequest("key-1", keys.PlatformOrg, "agent-1", now.Add(-400*24*time.Hour), now)
	assert.NoError(t, err, "400 days, every organization, one agent")

	for _, tc := range []struct {
		by, org, agent string
		from, to       time.Time
		want           []string
	}{
		{"", "", "", time.Time{}, time.Time{}, []string{"by: who acts is empty", "org: required", "from: required", "to: required"}},
		{"k", "acme", "", now, now.Add(-time.Hour), []string{"to: must be after from"}},
		{"k", "acme", "", now, now, []string{"to: must be after from"}},
		{"k", "acme", "", now.Add(-401 * 24 * time.Hour), now, []string{"to: the range is 401.0 days, more than the 400"}},
		{"k", "acme", "", time.Date(1999, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(1999, 2, 1, 0, 0, 0, 0, time.UTC), []string{"from: 1999-01-01T00:00:00Z is before 2000-01-01"}},
		{"k", "acme", "", now, now.Add(48 * time.Hour), []string{"more than a day ahead"}},
		{"k", "ac*me", "", now.Add(-time.Hour), now, []string{"org:", "contains '*'"}},
		{"k", strings.Repeat("o", 300), "", now.Add(-time.Hour), now, []string{"org:", "300 bytes"}},
		{"k", "acme", strings.Repeat("a", 257), now.Add(-time.Hour), now, []string{"agent: 257 bytes"}},
		{"k", "acme", "a\nb", now.Add(-time.Hour), now, []string{"agent: has a control character"}},
		{"k\x1b[31m", "acme", "", now.Add(-time.Hour), now, []string{"by: control character at byte 1"}},
		{strings.Repeat("k", 300), "acme", "", now.Add(-time.Hour), now, []string{"by: 300 bytes"}},
	} {
		_, _, err := s.checkRequest(tc.by, tc.org, tc.agent, tc.from, tc.to)
		require.Error(t, err, "%+v", tc)
		assert.True(t, errors.Is(err, schema.ErrInvalid))
		for _, w := range tc.want {
			assert.ErrorContains(t, err, w, "%+v", tc)
		}
	}
	// Job ids and listing bounds are checked before any read.
	_, err = s.Job(context.Background(), "acme", "'; DROP TABLE jobs; --")
	assert.True(t, errors.Is(err, schema.ErrInvalid))
	_, err = s.Job(context.Background(), "", "abc")
	assert.True(t, errors.Is(err, schema.ErrInvalid))
	for _, limit := range []int{-1, MaxJobLimit + 1} {
		_, err = s.Jobs(context.Background(), "acme", limit)
		assert.True(t, errors.Is(err, schema.ErrInvalid), "%d", limit)
	}
}

func TestDays(t *testing.T) {
	d := func(s string) time.Time { t, _ := time.Parse(time.RFC3339, s); return t }
	got := days(d("2026-11-01T10:30:00Z"), d("2026-11-03T05:00:00Z"))
	assert.Equal(t, [][2]time.Time{
		{d("2026-11-01T10:30:00Z"), d("2026-11-02T00:00:00Z")},
		{d("2026-11-02T00:00:00Z"), d("2026-11-03T00:00:00Z")},
		{d("2026-11-03T00:00:00Z"), d("2026-11-03T05:00:00Z")},
	}, got)
	assert.Len(t, days(d("2026-11-01T00:00:00Z"), d("2026-11-08T00:00:00Z")), 7)
	assert.Len(t, days(d("2026-11-01T00:00:00Z"), d("2026-11-01T00:00:01Z")), 1)
	assert.Empty(t, days(d("2026-11-01T00:00:00Z"), d("2026-11-01T00:00:00Z")))
}

// fold builds each catalog version from the rows: the seed, then one entry per upsert,
// the later row of an entry winning; versions between are reconstructible.
func TestFoldVersions(t *testing.T) {
	at := func(s string) time.Time { t, _ := time.Parse(time.DateOnly, s); return t }
	row := func(v uint64, model, eff string, in int64, setID string) store.PriceRow {
		return store.PriceRow{CatalogVersion: v, Model: model, Effective: at(eff), Currency: "USD", Input: in, Output: in, CacheRead: in, CacheWrite: in,
			SetBy: "k", SetAt: at("2026-11-01"), SetID: setID}
	}
	rows := []store.PriceRow{
		row(1, "a", "2026-01-01", 1e9, "s1"), row(1, "b", "2026-01-01", 2e9, "s1"), // the seed
		row(2, "a", "2026-06-01", 3e9, "x"), // a's new price from June
		row(3, "a", "2026-01-01", 5e9, "y"), // a correction of a's first price
		row(4, "c", "2026-01-01", 7e9, "p"), // two writers of version 4: both apply
		row(4, "c", "2026-01-01", 8e9, "q"), // same entry: the later (set_at, set_id) wins
		row(4, "d", "2026-01-01", 9e9, "r"),
	}
	u := schema.UsageData{InputTokens: 1_000_000}
	cost := func(c *pricing.Catalog, model, t string) int64 {
		got, _ := c.CostAt(model, at(t), u)
		return got
	}
	c, meta, v, err := fold(rows, 0)
	require.NoError(t, err)
	assert.Equal(t, uint64(4), v)
	assert.Equal(t, "4", c.Version())
	assert.Equal(t, int64(5_000_000), cost(c, "a", "2026-02-01"))
	assert.Equal(t, int64(3_000_000), cost(c, "a", "2026-07-01"))
	assert.Equal(t, int64(8_000_000), cost(c, "c", "2026-07-01"))
	assert.Equal(t, int64(9_000_000), cost(c, "d", "2026-07-01"))
	assert.Equal(t, uint64(3), meta[keyOf("a", at("2026-01-01"))].CatalogVersion, "the row behind each entry")
	assert.Len(t, c.Prices(), 5)

	c, _, v, err = fold(rows, 2)
	require.NoError(t, err)
	assert.Equal(t, uint64(2), v)
	assert.Equal(t, int64(1_000_000), cost(c, "a", "2026-02-01"), "version 2 predates the correction")
	assert.Equal(t, int64(3_000_000), cost(c, "a", "2026-07-01"))
	_, ok := c.PriceAt("c", at("2026-07-01"))
	assert.False(t, ok, "c came in version 4")

	c, _, _, err = fold(rows, 1)
	require.NoError(t, err)
	assert.Equal(t, int64(1_000_000), cost(c, "a", "2026-07-01"), "the seed")

	_, _, _, err = fold(nil, 0)
	assert.Error(t, err)
	_, _, _, err = fold(append(rows, store.PriceRow{CatalogVersion: 5, Model: "e", Effective: at("2026-01-01"), Currency: "EUR", SetID: "z"}), 0)
	assert.ErrorContains(t, err, `version 5 sets model "e" in EUR, the catalog is in USD`)
}

func TestJobEventsAreValid(t *testing.T) {
	j := Job{ID: schema.NewID(), Org: keys.PlatformOrg, Kind: KindReprice, From: now.Add(-time.Hour), To: now, State: JobQueued}
	ev := event(TypeJobQueued, j.Org, "key-1", j.ID, now, JobEventData{Job: j})
	require.NoError(t, ev.Validate())
	assert.Equal(t, "", ev.OrgID, "a job of every organization: no org_id ('*' is reserved)")
	assert.True(t, schema.OwnType(ev.Type))
	assert.True(t, schema.OwnSource(ev.Source))
	ev = event(TypePriceSet, "", "key-1", "gpt-5", now, PriceEventData{CatalogVersion: 2})
	require.NoError(t, ev.Validate())
	assert.True(t, schema.OwnType(ev.Type))
	ev = event(TypeJobFinished, "acme", "key-1", j.ID, now, JobEventData{Job: j})
	assert.Equal(t, "acme", ev.OrgID)

	var fe *schema.FieldError
	assert.True(t, errors.As(errors.Join(errors.New("x"), fieldErr("model", "bad")), &fe))
	assert.Equal(t, "model", fe.Field)
	assert.Equal(t, "abc", truncate("abcdef", 3))
	assert.Equal(t, "a", truncate("aé", 2), "never inside a UTF-8 sequence")
}

func queued(id, org, by string, at time.Time) store.JobRow {
	return store.JobRow{ID: id, OrgID: org, Kind: KindReprice, From: now.Add(-48 * time.Hour), To: now.Add(-24 * time.Hour),
		State: string(JobQueued), RequestedBy: by, RequestedAt: at}
}

// Each requester, organization and the queue as a whole hold their share of the
// unfinished jobs; the platform keeps one organization's share; a refusal names its
// bound and is a client's error.
func TestQueueShares(t *testing.T) {
	lim := Config{}.queueLimits()
	assert.Equal(t, DefaultMaxJobs, lim.Total)
	assert.Equal(t, DefaultMaxJobsPerOrg, lim.PerGroup)
	assert.Equal(t, DefaultMaxJobsPerKey, lim.PerClient)
	assert.Equal(t, DefaultMaxJobsPerOrg, lim.Reserved, "the platform keeps one organization's share")

	rows := []store.JobRow{queued("a1", "org-a", "ka1", now.Add(-3*time.Second))}
	r := queueRefusal(lim, rows, queued("a2", "org-a", "ka1", now))
	require.NotNil(t, r, "one job per key")
	assert.Equal(t, share.BoundClient, r.Bound)
	err := refusalErr(lim, Job{Org: "org-a", RequestedBy: "ka1"}, r)
	assert.ErrorIs(t, err, schema.ErrTooMany)
	assert.ErrorContains(t, err, "requester ka1 already has 1 reprice job queued or running; at most 1 (MaxJobsPerKey)")

	rows = append(rows, queued("a2", "org-a", "ka2", now.Add(-2*time.Second)))
	assert.Nil(t, queueRefusal(lim, rows[:1], queued("a2", "org-a", "ka2", now)), "another key of the organization")
	r = queueRefusal(lim, rows, queued("a3", "org-a", "ka3", now))
	require.NotNil(t, r, "two jobs per organization")
	assert.Equal(t, share.BoundGroup, r.Bound)
	err = refusalErr(lim, Job{Org: "org-a", RequestedBy: "ka3"}, r)
	assert.ErrorIs(t, err, schema.ErrTooMany)
	assert.False(t, errors.Is(err, schema.ErrConflict))
	assert.ErrorContains(t, err, "organization org-a already has 2 reprice jobs queued or running; at most 2 (MaxJobsPerOrg)")
	assert.Nil(t, queueRefusal(lim, rows, queued("b1", "org-b", "kb1", now)), "another tenant still asks")
	assert.Nil(t, queueRefusal(lim, rows, queued("p1", keys.PlatformOrg, "kp", now)), "and the platform")
	r = queueRefusal(lim, append(rows, queued("p1", keys.PlatformOrg, "kp1", now), queued("p2", keys.PlatformOrg, "kp2", now)),
		queued("p3", keys.PlatformOrg, "kp3", now))
	require.NotNil(t, r)
	assert.ErrorContains(t, refusalErr(lim, Job{Org: keys.PlatformOrg}, r), "the platform (jobs of every organization) already has 2")

	// Tenants fill what the platform does not keep; the platform still asks.
	small := Config{MaxJobs: 4}.queueLimits()
	full := []store.JobRow{queued("a1", "org-a", "ka1", now), queued("a2", "org-a", "ka2", now), queued("b1", "org-b", "kb1", now)}
	r = queueRefusal(small, full, queued("c1", "org-c", "kc1", now))
	require.NotNil(t, r)
	assert.Equal(t, share.BoundTotal, r.Bound)
	assert.ErrorContains(t, refusalErr(small, Job{Org: "org-c"}, r), "2 reprice jobs of organizations are queued or running, the most the queue holds (MaxJobs 4, of which 2 are the platform's)")
	assert.Nil(t, queueRefusal(small, full, queued("p1", keys.PlatformOrg, "kp", now)))

	// Two requests racing for one place: once both are recorded, each process sees the
	// older holding it.
	older, newer := queued("x1", "org-a", "ka1", now), queued("x2", "org-a", "ka1", now.Add(time.Second))
	both := []store.JobRow{newer, older}
	assert.Nil(t, queueRefusal(lim, ahead(both, older, true), older))
	assert.NotNil(t, queueRefusal(lim, ahead(both, newer, true), newer))
	assert.NotNil(t, queueRefusal(lim, ahead([]store.JobRow{newer}, older, false), older), "before it is recorded, every job is ahead")

	for _, c := range []Config{{MaxJobs: -1}, {MaxJobsPerKey: -1}, {MaxJobs: 3}, {MaxJobsPerOrg: 20}} {
		assert.Error(t, c.Validate(), "%+v", c)
	}
}

// A row a request could not have written is neither run nor counted: what running one
// costs is bounded by MaxRepriceRange whatever else the row says.
func TestRowProblem(t *testing.T) {
	good := queued("0f1e-2d", "org-a", "ka1", now)
	assert.Empty(t, rowProblem(good))
	assert.Empty(t, rowProblem(queued("0f1e-2d", keys.PlatformOrg, "ka1", now)))
	for name, tc := range map[string]func(*store.JobRow){
		"id":             func(r *store.JobRow) { r.ID = "x'; DROP" },
		"empty org":      func(r *store.JobRow) { r.OrgID = "" },
		"org with *":     func(r *store.JobRow) { r.OrgID = "a*" },
		"agent":          func(r *store.JobRow) { r.AgentID = "a\nb" },
		"long agent":     func(r *store.JobRow) { r.AgentID = strings.Repeat("a", schema.MaxIDBytes+1) },
		"requester":      func(r *store.JobRow) { r.RequestedBy = "" },
		"epoch":          func(r *store.JobRow) { r.From, r.To = time.Time{}, time.Date(2106, 1, 1, 0, 0, 0, 0, time.UTC) },
		"long range":     func(r *store.JobRow) { r.From = r.To.Add(-MaxRepriceRange - time.Second) },
		"before 2000":    func(r *store.JobRow) { r.From, r.To = MinRepriceFrom.Add(-time.Hour), MinRepriceFrom.Add(time.Hour) },
		"empty range":    func(r *store.JobRow) { r.To = r.From },
		"backwards":      func(r *store.JobRow) { r.From, r.To = r.To, r.From },
		"long requester": func(r *store.JobRow) { r.RequestedBy = strings.Repeat("k", 10_000) },
	} {
		r := good
		tc(&r)
		assert.NotEmpty(t, rowProblem(r), name)
	}
}

// Organizations take turns, the platform's jobs among them, whatever the order of
// requests; a job overlapping a live running one is not offered, and the platform's
// stops the order until the running jobs end.
func TestClaimOrder(t *testing.T) {
	const stale = 30 * time.Second
	at := func(s int) time.Time { return now.Add(time.Duration(s-100) * time.Second) }
	rows := []store.JobRow{
		queued("a1", "org-a", "ka1", at(1)), queued("a2", "org-a", "ka2", at(2)),
		queued("b1", "org-b", "kb1", at(3)), queued("b2", "org-b", "kb2", at(4)),
		queued("p1", keys.PlatformOrg, "kp", at(5)),
	}
	// Run each claimed job to its end, as one runner does, the clock still.
	last := map[string]time.Time{}
	var got []string
	for left := rows; len(left) > 0; {
		order := claimOrder(left, now, stale, last)
		require.NotEmpty(t, order)
		next := order[0]
		got = append(got, next.ID)
		last[next.OrgID] = now
		left = slices.DeleteFunc(slices.Clone(left), func(r store.JobRow) bool { return r.ID == next.ID })
	}
	assert.Equal(t, []string{"a1", "b1", "p1", "a2", "b2"}, got, "not a1 a2 b1 b2 p1, the order of requests")

	// Equal turns: the platform first.
	order := claimOrder([]store.JobRow{queued("b1", "org-b", "kb", at(1)), queued("p1", keys.PlatformOrg, "kp", at(2))}, now, stale,
		map[string]time.Time{"org-b": now, keys.PlatformOrg: now})
	assert.Equal(t, "p1", order[0].ID)

	running := func(id, org string, hb time.Time) store.JobRow {
		r := queued(id, org, "k-"+id, at(0))
		r.State, r.Runner, r.HeartbeatAt = string(JobRunning), "elsewhere", hb
		return r
	}
	ids := func(rs []store.JobRow) []string {
		out := []string{}
		for _, r := range rs {
			out = append(out, r.ID)
		}
		return out
	}
	// org-a's job runs elsewhere: org-a waits, org-b does not.
	busy := []store.JobRow{running("a0", "org-a", now.Add(-time.Second)), queued("a1", "org-a", "ka1", at(1)), queued("b1", "org-b", "kb1", at(2))}
	assert.Equal(t, []string{"b1"}, ids(claimOrder(busy, now, stale, nil)))
	// The platform's turn comes while it runs: nothing after it is offered.
	assert.Equal(t, []string{"b1"}, ids(claimOrder(append(busy, queued("p1", keys.PlatformOrg, "kp", at(3))), now, stale, nil)))
	assert.Empty(t, ids(claimOrder(append(busy, queued("p1", keys.PlatformOrg, "kp", at(0))), now, stale, nil)),
		"the platform's job waits for the running job, and holds the others back")
	// A silent runner's job is offered again (resumed); a heartbeat from the future keeps
	// nothing alive.
	assert.Equal(t, []string{"a0", "b1"}, ids(claimOrder([]store.JobRow{running("a0", "org-a", now.Add(-stale)), busy[1], busy[2]}, now, stale, nil)))
	assert.Equal(t, []string{"p0"}, ids(claimOrder([]store.JobRow{running("p0", keys.PlatformOrg, now.Add(24*time.Hour))}, now, stale, nil)))
	// A running platform job blocks everyone.
	assert.Empty(t, ids(claimOrder([]store.JobRow{running("p0", keys.PlatformOrg, now), busy[1], busy[2]}, now, stale, nil)))
}
