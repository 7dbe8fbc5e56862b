package graph_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/graph"
	"github.com/bandplane/bandplane/graph/wsclient"
	"github.com/bandplane/bandplane/query"
)

// slowQuerier blocks every Costs of org-a until release is closed or the request's
// context ends (then it fails as the real Querier does); other organizations answer at
// once.
type slowQuerier struct {
	fakeQuerier
	release  chan struct{}
	started  chan struct{}
	mu       sync.Mutex
	deadline time.Duration // how far off the last request's deadline was when it arrived
}

func (s *slowQuerier) Costs(ctx context.Context, q query.CostQuery) (query.CostReport, error) {
	s.mu.Lock()
	if d, ok := ctx.Deadline(); ok {
		s.deadline = time.Until(d)
	} else {
		s.deadline = -1
	}
	s.mu.Unlock()
	if q.OrgID != "org-a" {
		return query.CostReport{}, nil
	}
	s.started <- struct{}{}
	select {
	case <-s.release:
		return query.CostReport{}, nil
	case <-ctx.Done():
		return query.CostReport{}, fmt.Errorf("cannot query costs of org %q from secretdb.usage_hourly: %w (%w)", q.OrgID, query.ErrTimeout, ctx.Err())
	}
}

func newSlow() *slowQuerier {
	return &slowQuerier{release: make(chan struct{}), started: make(chan struct{}, 16)}
}

func costsOf(org string) string {
	return gqlBody(fmt.Sprintf(`{ costs(orgId: %q, from: "2025-03-01T00:00:00Z", to: "2025-03-02T00:00:00Z") { rows { cost } } }`, org))
}

func bearerOf(token string) http.Header { return http.Header{"Authorization": {"Bearer " + token}} }

// TestQueryTimeout: a query's deadline reaches the querier (and so ClickHouse), and a
// query over it answers TIMEOUT with the limit, not the database's details.
func TestQueryTimeout(t *testing.T) {
	sq := newSlow()
	h := newHandler(sq, graph.WithLimits(graph.Limits{QueryTimeout: 150 * time.Millisecond}))
	// The querier answers org-a only once its context ends: any answer is the deadline's.
	code, errs := post(t, h, costsOf("org-a"), nil)
	require.Equal(t, http.StatusOK, code)
	require.Len(t, errs, 1)
	assert.Equal(t, "TIMEOUT", errs[0].Extensions["code"])
	assert.Equal(t, "the query took longer than 150ms (--graphql-query-timeout); narrow its time range or filters", errs[0].Message)
	assert.NotContains(t, errs[0].Message, "secretdb")
	sq.mu.Lock()
	assert.Greater(t, sq.deadline, time.Duration(0), "the querier got a deadline")
	assert.LessOrEqual(t, sq.deadline, 150*time.Millisecond)
	sq.mu.Unlock()

	// The default: 10 s.
	sq2 := newSlow()
	close(sq2.release)
	_, errs = post(t, newHandler(sq2), costsOf("org-a"), nil)
	assert.Empty(t, errs)
	assert.InDelta(t, 10*time.Second, sq2.deadline, float64(time.Second))
}

// TestConcurrencyPerKey: a key runs at most MaxConcurrentPerKey reads at once;
// one more is refused at once with TOO_MANY_REQUESTS; other keys are not held up, and
// a finished operation frees its slot.
func TestConcurrencyPerKey(t *testing.T) {
	sq := newSlow()
	h := newHandler(sq, graph.WithLimits(graph.Limits{MaxConcurrentPerKey: 2}))
	var wg sync.WaitGroup
	results := make(chan []gqlError, 2)
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs := post(t, h, costsOf("org-a"), bearerOf("tok-a-viewer"))
			results <- errs
		}()
	}
	<-sq.started
	<-sq.started

	// Refused at once: were it queued, it would wait for the release below forever.
	_, errs := post(t, h, costsOf("org-a"), bearerOf("tok-a-viewer"))
	require.Len(t, errs, 1)
	assert.Equal(t, "TOO_MANY_REQUESTS", errs[0].Extensions["code"])
	assert.Contains(t, errs[0].Message, "key k-a-view already runs 2 queries at once (--graphql-max-concurrent-per-key)")

	// Another key of the same organization, and another organization's, still run.
	_, errs = post(t, h, costsOf("org-b"), bearerOf("tok-b-compliance"))
	assert.Empty(t, errs)

	close(sq.release)
	wg.Wait()
	close(results)
	for errs := range results {
		assert.Empty(t, errs)
	}
	// The slots are free again.
	_, errs = post(t, h, costsOf("org-a"), bearerOf("tok-a-viewer"))
	assert.Empty(t, errs)
}

// An organization's keys share MaxConcurrentPerOrg, and tenants together leave a
// quarter of MaxConcurrent to the platform's keys.
func TestConcurrencyPerOrgAndThePlatformsReserve(t *testing.T) {
	sq := newSlow()
	h := newHandler(sq, graph.WithLimits(graph.Limits{MaxConcurrentPerKey: 2, MaxConcurrentPerOrg: 3, MaxConcurrent: 4}))
	var wg sync.WaitGroup
	for _, tok := range []string{"tok-a-viewer", "tok-a-viewer", "tok-a-compliance"} {
		wg.Go(func() {
			_, errs := post(t, h, costsOf("org-a"), bearerOf(tok))
			assert.Empty(t, errs)
		})
	}
	for range 3 {
		<-sq.started
	}
	_, errs := post(t, h, costsOf("org-a"), bearerOf("tok-a-compliance"))
	require.Len(t, errs, 1)
	assert.Equal(t, "TOO_MANY_REQUESTS", errs[0].Extensions["code"])
	assert.Contains(t, errs[0].Message, "organization org-a already runs 3 queries at once (--graphql-max-concurrent-per-org)")

	_, errs = post(t, h, costsOf("org-b"), bearerOf("tok-b-compliance"))
	require.Len(t, errs, 1, "tenants hold 3 of 4: the last is the platform's")
	assert.Contains(t, errs[0].Message, "(--graphql-max-concurrent)")
	_, errs = post(t, h, costsOf("org-b"), bearerOf("tok-admin"))
	assert.Empty(t, errs, "the platform's key takes its reserved slot")

	close(sq.release)
	wg.Wait()
	_, errs = post(t, h, costsOf("org-b"), bearerOf("tok-b-compliance"))
	assert.Empty(t, errs)
}

// TestNoSlotWithoutAValidKey: requests with unknown keys take no slot (they are refused
// per field before anything is read), so they cannot use up a real key's.
func TestNoSlotWithoutAValidKey(t *testing.T) {
	sq := newSlow()
	close(sq.release)
	h := newHandler(sq, graph.WithLimits(graph.Limits{MaxConcurrentPerKey: 1}))
	for range 5 {
		_, errs := post(t, h, costsOf("org-a"), bearerOf("tok-nobody"))
		require.Len(t, errs, 1)
		assert.Equal(t, "UNAUTHENTICATED", errs[0].Extensions["code"])
	}
}

// TestConcurrencyPerKeyCountsAliases: the slots count ClickHouse reads, not operations:
// one operation of many aliases (gqlgen runs them in parallel) gets as many as the key
// has, and each other alias TOO_MANY_REQUESTS at once. The test runs in a synctest
// bubble: synctest.Wait returns once the two reads wait for their release and every
// other alias has given up, so no slot is freed before all six have asked.
func TestConcurrencyPerKeyCountsAliases(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sq := newSlow()
		h := newHandler(sq, graph.WithLimits(graph.Limits{MaxConcurrentPerKey: 2}))
		var q strings.Builder
		q.WriteString("{")
		for i := range 6 {
			fmt.Fprintf(&q, ` c%d: costs(orgId: "org-a", from: "2025-03-01T00:00:00Z", to: "2025-03-02T00:00:00Z") { rows { cost } }`, i)
		}
		q.WriteString("}")
		result := make(chan []gqlError, 1)
		go func() {
			_, errs := post(t, h, gqlBody(q.String()), bearerOf("tok-a-viewer"))
			result <- errs
		}()
		synctest.Wait()
		require.Equal(t, 2, len(sq.started), "reads started") // each read leaves a mark (buffered for all six)
		close(sq.release)
		errs := <-result
		require.Equal(t, 2, len(sq.started), "a third read started")
		require.Len(t, errs, 4)
		for _, e := range errs {
			assert.Equal(t, "TOO_MANY_REQUESTS", e.Extensions["code"], e.Message)
		}
	})
}

// TestDeferIsRefused: @defer would resolve after the operation's deadline is released;
// it is refused, inline or in a fragment.
func TestDeferIsRefused(t *testing.T) {
	h := newHandler(&fakeQuerier{})
	for _, q := range []string{
		`{ ... @defer { costs(orgId: "org-a", from: "2025-03-01T00:00:00Z", to: "2025-03-02T00:00:00Z") { rows { cost } } } }`,
		`{ ...F @defer } fragment F on Query { __typename }`,
		`{ ...F } fragment F on Query { ... @defer { __typename } }`,
	} {
		_, errs := post(t, h, gqlBody(q), nil)
		require.Len(t, errs, 1, q)
		assert.Equal(t, "BAD_USER_INPUT", errs[0].Extensions["code"], q)
		assert.Equal(t, "@defer is not supported", errs[0].Message, q)
	}
	_, errs := post(t, h, gqlBody(`{ ...F } fragment F on Query { __typename }`), nil)
	assert.Empty(t, errs, "fragments without @defer are fine")
}

// TestClientCancelIsNotAnError: a client that goes away gets its fields cancelled
// quietly: no ERROR in the log, no "internal error".
func TestClientCancelIsNotAnError(t *testing.T) {
	var logs bytes.Buffer
	sq := newSlow()
	h := newHandler(sq, graph.WithLogger(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))))
	ctx, cancel := context.WithCancel(context.Background())
	req := httptest.NewRequest(http.MethodPost, "/graphql", strings.NewReader(costsOf("org-a"))).WithContext(ctx)
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	done := make(chan struct{})
	go func() { defer close(done); h.ServeHTTP(rec, req) }()
	<-sq.started
	cancel()
	<-done
	assert.NotContains(t, logs.String(), "level=ERROR")
	assert.Contains(t, logs.String(), "field cancelled by the client")
}

// TestOrgIDDefaultsToTheKeys: a field reads the key's own organization; orgId may only
// repeat it, and a platform key must name one.
func TestOrgIDDefaultsToTheKeys(t *testing.T) {
	fq := &fakeQuerier{}
	h := graph.NewHandler(fq, testKeys)
	costs := func(org string) string {
		arg := ""
		if org != "" {
			arg = fmt.Sprintf("orgId: %q, ", org)
		}
		return gqlBody(fmt.Sprintf(`{ costs(%sfrom: "2025-03-01T00:00:00Z", to: "2025-03-02T00:00:00Z") { rows { cost } } }`, arg))
	}
	_, errs := post(t, h, costs(""), bearerOf("tok-a-viewer"))
	assert.Empty(t, errs)
	assert.Equal(t, "org-a", fq.gotCost.OrgID, "the key's organization")

	_, errs = post(t, h, costs("org-a"), bearerOf("tok-a-viewer"))
	assert.Empty(t, errs, "repeating it is fine")

	_, errs = post(t, h, costs("org-b"), bearerOf("tok-a-viewer"))
	require.Len(t, errs, 1)
	assert.Equal(t, "FORBIDDEN", errs[0].Extensions["code"])

	_, errs = post(t, h, costs(""), bearerOf("tok-admin"))
	require.Len(t, errs, 1)
	assert.Equal(t, "BAD_USER_INPUT", errs[0].Extensions["code"])
	assert.Equal(t, "orgId: required with a platform key (organization '*'): name the organization to read", errs[0].Message)

	_, errs = post(t, h, costs("org-b"), bearerOf("tok-admin"))
	assert.Empty(t, errs)
	assert.Equal(t, "org-b", fq.gotCost.OrgID)

	_, errs = post(t, h, costs(""), nil)
	require.Len(t, errs, 1)
	assert.Equal(t, "UNAUTHENTICATED", errs[0].Extensions["code"])

	// The key's role is checked before its arguments: a platform key of the wrong role
	// is FORBIDDEN, with or without orgId.
	for _, org := range []string{"", "org-a"} {
		_, errs = post(t, h, costs(org), bearerOf("tok-router"))
		require.Len(t, errs, 1)
		assert.Equal(t, "FORBIDDEN", errs[0].Extensions["code"], org)
	}

	_, errs = post(t, h, gqlBody(`{ auditEvents { nextCursor } }`), bearerOf("tok-b-compliance"))
	assert.Empty(t, errs)
	assert.Equal(t, "org-b", fq.gotAudit.OrgID)
}

func TestAliasesAreCapped(t *testing.T) {
	h := newHandler(&fakeQuerier{}, graph.WithLimits(graph.Limits{MaxAliases: 3, MaxComplexity: 1 << 30}))
	field := func(i int) string { return fmt.Sprintf(` a%d: rooms(orgId: "org-a") { id }`, i) }
	var three, four strings.Builder
	for i := range 3 {
		three.WriteString(field(i))
	}
	four.WriteString(three.String() + field(3))
	_, errs := post(t, h, gqlBody("{"+three.String()+" }"), bearerOf("tok-a-viewer"))
	require.Empty(t, errs, "three aliases are allowed")
	_, errs = post(t, h, gqlBody("{"+four.String()+" }"), bearerOf("tok-a-viewer"))
	require.Len(t, errs, 1)
	require.Equal(t, "BAD_USER_INPUT", errs[0].Extensions["code"])
	require.Contains(t, errs[0].Message, "--graphql-max-aliases")

	// Through fragments, as often as they are spread: two spreads of two aliases.
	frag := `query { ...F ...G } fragment F on Query { x: rooms(orgId: "org-a") { id } y: rooms(orgId: "org-a") { id } }
		fragment G on Query { ...F }`
	_, errs = post(t, h, gqlBody(frag), bearerOf("tok-a-viewer"))
	require.Len(t, errs, 1, "4 aliases through fragments")
	require.Contains(t, errs[0].Message, "aliased fields")
}

func TestWebSocketsPerKey(t *testing.T) {
	srv := httptest.NewServer(graph.NewHandler(&fakeQuerier{}, testKeys, graph.WithLimits(graph.Limits{MaxWebSocketsPerKey: 1})))
	defer srv.Close()
	url := "ws" + strings.TrimPrefix(srv.URL, "http")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	first, err := wsclient.Dial(ctx, url, "tok-a-viewer")
	require.NoError(t, err)
	_, err = wsclient.Dial(ctx, url, "tok-a-viewer")
	require.Error(t, err)
	require.Contains(t, err.Error(), "--graphql-max-websockets-per-key")
	other, err := wsclient.Dial(ctx, url, "tok-a-compliance")
	require.NoError(t, err, "another key has its own connections")
	require.NoError(t, other.Close())
	require.NoError(t, first.Close())
	require.Eventually(t, func() bool {
		c, err := wsclient.Dial(ctx, url, "tok-a-viewer")
		if err != nil {
			return false
		}
		_ = c.Close()
		return true
	}, 5*time.Second, 50*time.Millisecond, "a closed connection gives its place back")
}

func TestSubscriptionArgumentsAreBounded(t *testing.T) {
	srv := httptest.NewServer(graph.NewHandler(&fakeQuerier{}, testKeys, graph.WithHub(graph.NewHub(graph.HubConfig{}))))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := wsclient.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http"), "tok-a-viewer")
	require.NoError(t, err)
	defer func() { _ = c.Close() }()
	for _, tc := range []struct{ query, code string }{
		{`subscription { workStatusChanged(roomId: "` + strings.Repeat("r", 257) + `") { kind } }`, "BAD_USER_INPUT"},
		{`subscription { attentionRequested(orgId: "org-b") { id } }`, "FORBIDDEN"},
		{`subscription { policyDenied { decision { id } } }`, "FORBIDDEN"}, // a viewer may not
	} {
		_, ch, err := c.Subscribe(ctx, tc.query, nil, 1)
		require.NoError(t, err)
		m := <-ch
		require.NotEmpty(t, m.Errors, tc.query)
		require.Equal(t, tc.code, m.Errors[0].Code(), tc.query)
	}
}

// budgetQuerier refuses every audit page as over the response's budget, as ClickHouse
// does with max_result_bytes (query's integration test runs the real refusal).
type budgetQuerier struct{ fakeQuerier }

func (b *budgetQuerier) AuditEvents(_ context.Context, q query.AuditQuery) (query.AuditPage, error) {
	return query.AuditPage{}, fmt.Errorf("cannot query audit events of org %q from db.events: %w", q.OrgID, query.ErrResponseTooLarge)
}

func TestResponseOverItsBudget(t *testing.T) {
	h := newHandler(&budgetQuerier{}, graph.WithLimits(graph.Limits{MaxResponseBytes: 1 << 20}))
	_, errs := post(t, h, gqlBody(`{ auditEvents(orgId: "org-a", limit: 10000) { events { id data } } }`), bearerOf("tok-a-compliance"))
	require.Len(t, errs, 1)
	assert.Equal(t, "RESPONSE_TOO_LARGE", errs[0].Extensions["code"])
	assert.Contains(t, errs[0].Message, "larger than 1048576 bytes, the most one response may carry (--graphql-max-response-bytes)")
	assert.NotContains(t, errs[0].Message, "db.events", "the database is not named")
}
