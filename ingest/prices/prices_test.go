package prices

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/keys"
	"github.com/bandplane/bandplane/schema/pricing"
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
