package query

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/stacktest"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/store"
)

func TestWalkBackSpans(t *testing.T) {
	u := time.Date(2025, 3, 1, 10, 0, 0, 7_000_000, time.UTC)
	h, d, w := u.Add(-time.Hour), u.Add(-24*time.Hour), u.Add(-7*24*time.Hour)
	var open time.Time
	f := func(name string, upper, from time.Time, want ...span) {
		t.Helper()
		t.Run(name, func(t *testing.T) {
			got := walkBackSpans(upper, from)
			if diff := cmp.Diff(want, got, cmp.AllowUnexported(span{})); diff != "" {
				t.Errorf("walkBackSpans(%s, %s) (-want +got):\n%s", upper, from, diff)
			}
		})
	}
	f("unbounded: hour, day, week, the rest", u, open, span{h, open}, span{d, h}, span{w, d}, span{open, w})
	f("sub-millisecond upper", u.Add(999*time.Microsecond), open, span{h, open}, span{d, h}, span{w, d}, span{open, w})
	f("non-UTC upper", u.In(time.FixedZone("X", 3600)), open, span{h, open}, span{d, h}, span{w, d}, span{open, w})
	f("from three days back: the rest starts at from", u, u.Add(-72*time.Hour), span{h, open}, span{d, h}, span{open, d})
	f("from just before the week", u, w.Add(-time.Millisecond), span{h, open}, span{d, h}, span{w, d}, span{open, w})
	f("from at the week's start", u, w, span{h, open}, span{d, h}, span{open, d})
	f("from just before the hour", u, h.Add(-time.Millisecond), span{h, open}, span{open, h})
	f("from at the hour's start: one query", u, h, span{})
	f("range under an hour: one query", u, u.Add(-30*time.Minute), span{})
	f("from after upper (a cursor below from): one query", u, u.Add(time.Hour), span{})
	epoch := time.Unix(0, 0).UTC()
	f("near 1970: no window before it", epoch.Add(30*time.Minute), open, span{})
	f("a day after 1970", epoch.Add(25*time.Hour), open,
		span{epoch.Add(24 * time.Hour), open}, span{epoch.Add(time.Hour), epoch.Add(24 * time.Hour)}, span{open, epoch.Add(time.Hour)})

	// Consecutive windows share their bound, newest first: no gap, no overlap.
	for _, from := range []time.Time{open, u.Add(-100 * time.Hour), u.Add(-time.Hour - time.Millisecond)} {
		s := walkBackSpans(u, from)
		require.True(t, s[0].to.IsZero(), "the first window is open above")
		require.True(t, s[len(s)-1].from.IsZero(), "the last window is open below")
		for i := 1; i < len(s); i++ {
			require.Equal(t, s[i-1].from, s[i].to)
			require.True(t, s[i].to.After(s[i].from) || s[i].from.IsZero())
		}
	}
}

func TestAuditSpansUpper(t *testing.T) {
	now := time.Date(2025, 3, 10, 12, 0, 0, 0, time.UTC)
	f := func(name string, s auditSQL, want time.Time) {
		t.Helper()
		t.Run(name, func(t *testing.T) {
			require.NoError(t, s.q.Validate())
			require.Equal(t, want, s.upper(now))
			got := s.spans(now)
			require.Len(t, got, 4)
			require.Equal(t, want.Add(-time.Hour), got[0].from)
		})
	}
	f("first page: now", auditSQL{q: AuditQuery{OrgID: "o"}}, now)
	f("to before now", auditSQL{q: AuditQuery{OrgID: "o", To: now.Add(-48 * time.Hour)}}, now.Add(-48*time.Hour))
	f("to after now", auditSQL{q: AuditQuery{OrgID: "o", To: now.Add(48 * time.Hour)}}, now)
	c := cursor{asOf: now.Unix(), sec: now.Add(-5 * 24 * time.Hour).Unix(), ms: 250, id: "e"}.String()
	at := now.Add(-5*24*time.Hour + 250*time.Millisecond)
	f("cursor", auditSQL{q: AuditQuery{OrgID: "o", Before: c}}, at)
	f("cursor below to", auditSQL{q: AuditQuery{OrgID: "o", Before: c, To: now.Add(-time.Hour)}}, at)
	future := cursor{asOf: now.Unix(), sec: now.Add(time.Hour).Unix(), id: "e"}.String()
	f("cursor after now (a clock ahead)", auditSQL{q: AuditQuery{OrgID: "o", Before: future}}, now)

	require.Equal(t, []span{{}}, auditSQL{q: AuditQuery{OrgID: "o"}, whole: true}.spans(now), "whole: one query")
}

// walkStore is the database of the walk-back tests, with merges stopped so that every
// insert stays a part of its own: a replay is a second row, as after a crash.
func walkStore(t *testing.T) (context.Context, *store.Store, *Querier) {
	conn, db := stacktest.Database(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	require.NoError(t, conn.Exec(ctx, "SYSTEM STOP MERGES "+db+".events"))
	return ctx, store.New(conn, db), New(conn, db)
}

// walkPage is one page as a reader returned it.
type walkPage struct {
	Events []Event
	Next   string
}

// walkAll pages through s to the end, whole or walking back, as AuditEvents would
// (the watermark of the first page on every page).
func walkAll(t *testing.T, ctx context.Context, qr *Querier, s auditSQL, whole bool) []walkPage {
	t.Helper()
	s.db, s.whole = qr.db, whole
	var pages []walkPage
	for {
		p, err := qr.auditPage(ctx, s)
		require.NoError(t, err)
		pages = append(pages, walkPage{p.Events, p.NextCursor})
		if p.NextCursor == "" {
			return pages
		}
		require.Less(t, len(pages), 2000, "pagination does not end")
		s.q.Before = p.NextCursor
		s.asOf = asOfOf(p.NextCursor, time.Time{})
	}
}

// Pages walked back window by window equal the pages of one query: the same rows, in
// the same order, with the same cursors, for every filter; windows that hold nothing,
// and page ends at a window's bound, included.
func TestIntegrationAuditWalkBack(t *testing.T) {
	ctx, st, qr := walkStore(t)
	// T is the upper bound of the first pages with To: T; without To, now, so that the
	// hour, the day and the week before now are empty windows. now is the Querier's
	// clock as well: the watermark and the cursors AuditEvents builds are then the ones
	// the test computes, whenever it runs.
	T := time.Date(2025, 3, 1, 10, 0, 0, 0, time.UTC)
	now := T.Add(10 * 24 * time.Hour)
	qr.now = func() time.Time { return now }
	old := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	rng := rand.New(rand.NewPCG(1, 2))
	types := []string{"message.created", "message.created", "tool.called", schema.TypePolicyDecided}
	var rows []store.EventRow
	n := 0
	add := func(org string, at time.Time) store.EventRow {
		n++
		r := store.EventRow{ID: fmt.Sprintf("e%04d", n), Type: types[rng.IntN(len(types))], Time: at, OrgID: org,
			RoomID: []string{"r1", "r2", "r3"}[rng.IntN(3)], ActorID: []string{"a1", "a2"}[rng.IntN(2)], ActorType: "agent",
			Source: "test", SchemaVersion: 1, Data: "{}", IngestedAt: old, Offset: int64(n)}
		if rng.IntN(5) == 0 {
			r.SubjectID, r.SubjectType = []string{"a1", "a2"}[rng.IntN(2)], "agent"
		}
		if r.Type == schema.TypePolicyDecided {
			r.Data = fmt.Sprintf(`{"decision":%q,"allow":%t}`, []string{"send_message", "peer_visible"}[rng.IntN(2)], rng.IntN(2) == 0)
		}
		if r.RoomID == "r3" && T.Sub(at) < 48*time.Hour {
			r.RoomID = "r1" // r3 has nothing in the last two days: empty newest windows
		}
		rows = append(rows, r)
		return r
	}
	// Events on a 15-minute grid over 40 days, so that a cursor's hour, day and week
	// back fall on other events: every slot of the three hours back from T, from a day
	// back and from a week back, one in 40 elsewhere. Some instants hold several events
	// (the id breaks the tie), some events sit a millisecond off a bound.
	for k := 0; k < 40*24*4; k++ {
		if full := k <= 12 || k >= 96 && k <= 96+12 || k >= 7*96 && k <= 7*96+12; !full && rng.IntN(40) != 0 {
			continue
		}
		at := T.Add(-time.Duration(k) * 15 * time.Minute)
		for range 1 + rng.IntN(3) {
			add("org-a", at)
		}
	}
	for _, b := range []time.Duration{time.Hour, 24 * time.Hour, 7 * 24 * time.Hour} {
		add("org-a", T.Add(-b))
		add("org-a", T.Add(-b-time.Millisecond))
		add("org-a", T.Add(-b+time.Millisecond))
	}
	add("org-a", T.Add(time.Hour)) // after To: T, and before now
	for _, r := range slices.Clone(rows) {
		o := r
		o.OrgID, o.Data = "org-b", `{"org":"b"}` // the same keys in another organization
		rows = append(rows, o)
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].Time.Before(rows[j].Time) })
	require.NoError(t, st.BatchInsert(ctx, &store.Batch{Events: rows}))
	var replays []store.EventRow
	for i, r := range rows {
		if i%7 == 0 && r.OrgID == "org-a" {
			replays = append(replays, r)
		}
	}
	late := replays[0]
	late.IngestedAt = now.Add(time.Hour) // after any watermark: never shown
	require.NoError(t, st.BatchInsert(ctx, &store.Batch{Events: append(replays, late)}))
	orgA := len(rows) / 2

	// The newest events up to a bound, in the one-query listing: the limits that end a
	// page exactly at a window's bound (and one either side).
	count := func(types []string, below time.Duration) int {
		all := walkAll(t, ctx, qr, auditSQL{q: AuditQuery{OrgID: "org-a", Types: types, To: T, Limit: MaxAuditLimit}}, true)
		require.Len(t, all, 1)
		c := 0
		for _, e := range all[0].Events {
			if !e.Time.Before(T.Add(-below)) {
				c++
			}
		}
		return c
	}
	hour, day := count(nil, time.Hour), count(nil, 24*time.Hour)
	require.Greater(t, hour, 10)
	require.Greater(t, day, hour)
	msgHour := count([]string{"message.created"}, time.Hour)

	asOf := asOfOf("", now)
	cases := map[string]auditSQL{}
	for _, limit := range []int{hour - 1, hour, hour + 1, day, day + 1, 100, MaxAuditLimit} {
		for _, to := range []time.Time{T, {}} {
			cases[fmt.Sprintf("org, limit %d, to %s", limit, to)] = auditSQL{q: AuditQuery{OrgID: "org-a", To: to, Limit: limit}}
		}
	}
	for _, limit := range []int{msgHour - 1, msgHour, msgHour + 1, 7} {
		cases[fmt.Sprintf("message.created, limit %d", limit)] = auditSQL{q: AuditQuery{OrgID: "org-a", To: T, Types: []string{"message.created"}, Limit: limit}}
	}
	for name, q := range map[string]AuditQuery{
		"room r1 messages":            {To: T, RoomID: "r1", Types: []string{"message.created"}, Limit: 10},
		"room r3, empty newest days":  {To: T, RoomID: "r3", Limit: 5},
		"room r3 without to":          {RoomID: "r3", Limit: 20},
		"actor a2":                    {To: T, ActorID: "a2", Limit: 25},
		"subject a1":                  {To: T, SubjectID: "a1", Limit: 4},
		"denied, one a page":          {To: T, Outcome: "denied", Limit: 1},
		"actor or subject a1":         {To: T, ActorID: "a1", SubjectID: "a1", Limit: 9},
		"denied":                      {To: T, Outcome: "denied", Limit: 6},
		"allowed, two types":          {To: T, Outcome: "allowed", Types: []string{schema.TypePolicyDecided, "tool.called"}, Limit: 3},
		"from three days back":        {To: T, From: T.Add(-72 * time.Hour), Limit: 11},
		"from at the hour's bound":    {To: T, From: T.Add(-time.Hour), Limit: 2},
		"from a millisecond past":     {To: T, From: T.Add(-time.Hour - time.Millisecond), Limit: 2},
		"from and to, one query":      {To: T, From: T.Add(-30 * time.Minute), Limit: 2},
		"from between two days":       {From: T.Add(-36 * time.Hour), To: T.Add(-12 * time.Hour), Limit: 8},
		"nothing":                     {To: T, RoomID: "r9"},
		"more than the whole listing": {Limit: MaxAuditLimit},
	} {
		q.OrgID = "org-a"
		cases[name] = auditSQL{q: q}
	}
	cases["send_message decisions"] = auditSQL{q: AuditQuery{OrgID: "org-a", To: T, Types: []string{schema.TypePolicyDecided}, Limit: 5}, decision: "send_message"}
	// As ContactRequests reads: no watermark, the newest of a long range.
	cases["contacts' shape: the newest 150"] = auditSQL{q: AuditQuery{OrgID: "org-a", From: T.Add(-30 * 24 * time.Hour), To: T, Limit: 149,
		Types: []string{"message.created", "tool.called"}, ActorID: "a1"}}

	for name, s := range cases {
		t.Run(name, func(t *testing.T) {
			require.NoError(t, s.q.Validate())
			if name != "contacts' shape: the newest 150" {
				s.asOf = asOf
			}
			want := walkAll(t, ctx, qr, s, true)
			got := walkAll(t, ctx, qr, s, false)
			if diff := cmp.Diff(want, got); diff != "" {
				t.Fatalf("walked back (-one query +walked back):\n%s", diff)
			}
			for _, p := range want {
				for _, e := range p.Events {
					require.Equal(t, "org-a", e.OrgID)
					require.Equal(t, old, e.IngestedAt, "the copy ingested before the watermark")
				}
			}
		})
	}

	// The whole listing, one event a row: every org-a event once, the replays collapsed.
	all := walkAll(t, ctx, qr, auditSQL{q: AuditQuery{OrgID: "org-a", Limit: 97}, asOf: asOf}, false)
	seen := map[string]bool{}
	for _, p := range all {
		for _, e := range p.Events {
			require.False(t, seen[e.ID], "%s twice", e.ID)
			seen[e.ID] = true
		}
	}
	require.Len(t, seen, orgA)

	// A first page through AuditEvents, with To: four windows, the page of one query.
	require.Len(t, auditSQL{q: AuditQuery{OrgID: "org-a", To: T}}.spans(now), 4)
	page, err := qr.AuditEvents(ctx, AuditQuery{OrgID: "org-a", To: T, Limit: hour})
	require.NoError(t, err)
	one := walkAll(t, ctx, qr, auditSQL{q: AuditQuery{OrgID: "org-a", To: T, Limit: hour}, asOf: asOf}, true)
	require.Equal(t, one[0].Events, page.Events)
	require.Equal(t, one[0].Next, page.NextCursor)
	require.Equal(t, T.Add(-time.Hour), page.Events[hour-1].Time, "the page ends at the hour's bound")
}

// TestAuditWalkBackTimes measures the page of `bandplane bench query` (message.created in
// the busiest room, 100, newest first) read in one query and walked back, interleaved,
// against an existing database: BANDPLANE_AUDIT_BENCH=db[,org[,room]] (read only).
func TestAuditWalkBackTimes(t *testing.T) {
	spec := os.Getenv("BANDPLANE_AUDIT_BENCH")
	if spec == "" {
		t.Skip("BANDPLANE_AUDIT_BENCH=db[,org[,room]] not set")
	}
	var org, room string
	parts := strings.Split(spec, ",")
	db := parts[0]
	if len(parts) > 1 {
		org = parts[1]
	}
	if len(parts) > 2 {
		room = parts[2]
	}
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{stacktest.ClickHouseAddr()}})
	require.NoError(t, err)
	defer conn.Close()
	ctx := context.Background()
	if org == "" {
		require.NoError(t, conn.QueryRow(ctx, "SELECT org_id FROM "+db+".events GROUP BY org_id ORDER BY count() DESC LIMIT 1").Scan(&org))
	}
	if room == "" {
		require.NoError(t, conn.QueryRow(ctx, "SELECT room_id FROM "+db+".events WHERE org_id = ? AND type = 'message.created' AND room_id != ''"+
			" GROUP BY room_id ORDER BY count() DESC, room_id LIMIT 1", org).Scan(&room))
	}
	ids := &idConn{Conn: conn}
	qr := New(ids, db)
	q := AuditQuery{OrgID: org, Types: []string{"message.created"}, RoomID: room, Limit: 100}
	tag := fmt.Sprintf("walkback-%d", time.Now().UnixNano())
	run := func(i int, asOf time.Time, whole bool) (time.Duration, AuditPage, string) {
		// The queries of a page are logged with ids that start with the page's.
		id := fmt.Sprintf("%s-%d-%t", tag, i, whole)
		ids.prefix = id + "/"
		start := time.Now()
		p, err := qr.auditPage(ctx, auditSQL{db: db, q: q, asOf: asOf, whole: whole})
		require.NoError(t, err)
		return time.Since(start), p, id
	}
	const warm, runs = 3, 20
	type sample struct {
		wall time.Duration
		id   string
	}
	var one, walked []sample
	for i := range warm + runs {
		// One instant for both reads: the same watermark, the same windows, the same cursor.
		at := time.Now()
		qr.now = func() time.Time { return at }
		asOf := asOfOf("", at)
		d1, p1, id1 := run(i, asOf, true)
		d2, p2, id2 := run(i, asOf, false)
		require.Equal(t, p1, p2, "the same page")
		require.Len(t, p1.Events, 100)
		if i >= warm {
			one, walked = append(one, sample{d1, id1}), append(walked, sample{d2, id2})
		}
	}
	require.NoError(t, conn.Exec(ctx, "SYSTEM FLUSH LOGS"))
	server := map[string][2]float64{} // query id: ClickHouse ms, queries
	rows, err := conn.Query(ctx, "SELECT splitByChar('/', query_id)[1] AS page, sum(query_duration_ms), count() FROM system.query_log"+
		" WHERE event_date >= yesterday() AND type = 2 AND startsWith(query_id, ?) GROUP BY page", tag)
	require.NoError(t, err)
	for rows.Next() {
		var id string
		var d, n uint64
		require.NoError(t, rows.Scan(&id, &d, &n))
		server[id] = [2]float64{float64(d), float64(n)}
	}
	require.NoError(t, rows.Err())
	quantile := func(v []float64, q float64) float64 {
		s := slices.Clone(v)
		slices.Sort(s)
		return s[max(int(math.Ceil(q*float64(len(s))))-1, 0)]
	}
	report := func(name string, ss []sample) {
		var wall, ch, n []float64
		for _, s := range ss {
			wall = append(wall, float64(s.wall.Microseconds())/1000)
			v, ok := server[s.id]
			require.True(t, ok, "query %s not in system.query_log", s.id)
			ch, n = append(ch, v[0]), append(n, v[1])
		}
		t.Logf("%-12s wall p50 %6.1f ms p99 %6.1f ms | ClickHouse p50 %4.0f ms p99 %4.0f ms | queries a page %.0f to %.0f",
			name, quantile(wall, .5), quantile(wall, .99), quantile(ch, .5), quantile(ch, .99), quantile(n, 0), quantile(n, 1))
	}
	t.Logf("org %s, room %s: message.created, 100 newest, %d runs each, interleaved (after %d warm-up)", org, room, runs, warm)
	report("one query", one)
	report("walked back", walked)
}

// idConn runs every query with a query id of its own, prefix and a number, logged in
// system.query_log.
type idConn struct {
	driver.Conn
	prefix string
	n      int
}

func (c *idConn) Query(ctx context.Context, sql string, args ...any) (driver.Rows, error) {
	c.n++
	ctx = clickhouse.Context(ctx, clickhouse.WithQueryID(fmt.Sprintf("%s%d", c.prefix, c.n)),
		clickhouse.WithSettings(clickhouse.Settings{"log_queries": 1}))
	return c.Conn.Query(ctx, sql, args...)
}
