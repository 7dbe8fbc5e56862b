package graph_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/99designs/gqlgen/client"
	"github.com/google/go-cmp/cmp"
	"github.com/shopspring/decimal"
	"github.com/stretchr/testify/assert"

	"github.com/bandplane/bandplane/graph"
	"github.com/bandplane/bandplane/query"
	"github.com/bandplane/bandplane/schema/keys"
)

// fakeQuerier records what the resolvers asked and validates like the real one, so
// the API's error messages are the query package's.
type fakeQuerier struct {
	mu       sync.Mutex
	costs    []query.CostRow
	page     query.AuditPage
	err      error
	gotCost  query.CostQuery
	gotAudit query.AuditQuery
	names    map[string]query.Party // by id, every organization's
	namesOrg string                 // the organization of the last Names call
}

func (f *fakeQuerier) Names(_ context.Context, orgID string, ids []string) (map[string]query.Party, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.namesOrg = orgID
	out := map[string]query.Party{}
	for _, id := range ids {
		if p, ok := f.names[id]; ok {
			out[id] = p
		}
	}
	return out, nil
}

func (f *fakeQuerier) Costs(_ context.Context, q query.CostQuery) (query.CostReport, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gotCost = q
	if err := q.Validate(); err != nil {
		return query.CostReport{}, err
	}
	rows := f.costs
	if rows == nil {
		rows = []query.CostRow{}
	}
	return query.CostReport{Rows: rows, Totals: []query.CostRow{}, Unpriced: []query.CostRow{}}, f.err
}

func (f *fakeQuerier) AuditEvents(_ context.Context, q query.AuditQuery) (query.AuditPage, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gotAudit = q
	if err := q.Validate(); err != nil {
		return query.AuditPage{}, err
	}
	return f.page, f.err
}

// fakeKeys is a key store: tokens are "tok-<name>".
type fakeKeys map[string]keys.Key

func (f fakeKeys) Lookup(_ context.Context, token string) (keys.Key, bool) {
	k, ok := f[token]
	return k, ok
}

func (f fakeKeys) Held(token string) (keys.Key, bool) { return f.Lookup(context.Background(), token) }

var testKeys = fakeKeys{
	"tok-admin":        {ID: "k-admin", Org: keys.PlatformOrg, Role: keys.RoleAdmin},
	"tok-a-compliance": {ID: "k-a-comp", Org: "org-a", Role: keys.RoleCompliance},
	"tok-a-viewer":     {ID: "k-a-view", Org: "org-a", Role: keys.RoleViewer},
	"tok-b-compliance": {ID: "k-b-comp", Org: "org-b", Role: keys.RoleCompliance},
	"tok-a-ingest":     {ID: "k-a-ingest", Org: "org-a", Role: keys.RoleIngest},
	"tok-router":       {ID: "k-router", Org: keys.PlatformOrg, Role: keys.RoleRouter},
}

// newHandler is the API with the test keys, sending the platform admin's key when a
// request carries none.
func newHandler(q graph.Querier, opts ...graph.Option) http.Handler {
	h := graph.NewHandler(q, testKeys, opts...)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") == "" {
			r.Header.Set("Authorization", "Bearer tok-admin")
		}
		h.ServeHTTP(w, r)
	})
}

var (
	from = time.Date(2025, 3, 1, 0, 0, 0, 0, time.UTC)
	to   = time.Date(2025, 3, 2, 0, 0, 0, 0, time.UTC)
)

const costsQuery = `query($org: ID!, $from: Time!, $to: Time!) {
  costs(orgId: $org, from: $from, to: $to, groupBy: [DAY, AGENT, ROOM]) {
    rows {
      day agentId agentHandle agentName ownerId ownerHandle roomId roomName events pricedEvents unpricedEvents
      tokens { input output total } unpricedTokens { input } cost currency
    }
    truncated
  }
}`

func TestCosts(t *testing.T) {
	fq := &fakeQuerier{costs: []query.CostRow{{
		Day: from, AgentID: "agent-1", RoomID: "room-1", Events: 3, UnpricedEvents: 1, Tokens: query.Tokens{Input: 5_000_000_000, Output: 80},
		UnpricedTokens: query.Tokens{Input: 7}, Cost: decimal.RequireFromString("2.0012345"), Currency: "USD",
	}, {Day: from, AgentID: "agent-unknown", Events: 2, UnpricedEvents: 2, Cost: decimal.Zero, Currency: "USD"}},
		names: map[string]query.Party{"agent-1": {Kind: "agent", Handle: "alice/architect", Name: "Architect"}}}
	c := client.New(newHandler(fq))
	var resp struct {
		Costs struct {
			Rows      []map[string]any
			Truncated bool
		}
	}
	c.MustPost(costsQuery, &resp, client.Var("org", "org-a"), client.Var("from", from.Format(time.RFC3339)),
		client.Var("to", "2025-03-02T01:00:00+01:00"))

	wantQ := query.CostQuery{OrgID: "org-a", From: from, To: to, GroupBy: []string{"day", "agent", "room"}}
	if diff := cmp.Diff(wantQ, fq.gotCost, cmp.Comparer(time.Time.Equal)); diff != "" {
		t.Errorf("query (-want +got):\n%s", diff)
	}
	want := []map[string]any{{
		"day": "2025-03-01T00:00:00Z", "agentId": "agent-1", "agentHandle": "alice/architect", "agentName": "Architect",
		"ownerId": nil, "ownerHandle": nil, // not grouped: null
		"roomId": "room-1", "roomName": nil, // no room.added seen
		"events": float64(3), "pricedEvents": float64(2), "unpricedEvents": float64(1),
		"tokens":         map[string]any{"input": float64(5_000_000_000), "output": float64(80), "total": float64(5_000_000_080)},
		"unpricedTokens": map[string]any{"input": float64(7)},
		"cost":           "2.001235", "currency": "USD",
	}, {
		"day": "2025-03-01T00:00:00Z", "agentId": "agent-unknown", "agentHandle": nil, "agentName": nil, // not in the directory
		"ownerId": nil, "ownerHandle": nil, "roomId": "", "roomName": nil,
		"events": float64(2), "pricedEvents": float64(0), "unpricedEvents": float64(2),
		"tokens":         map[string]any{"input": float64(0), "output": float64(0), "total": float64(0)},
		"unpricedTokens": map[string]any{"input": float64(0)},
		"cost":           nil, // nothing priced: unknown, not 0
		"currency":       "USD",
	}}
	if diff := cmp.Diff(want, resp.Costs.Rows); diff != "" {
		t.Errorf("costs (-want +got):\n%s", diff)
	}
	if fq.namesOrg != "org-a" {
		t.Errorf("names looked up in organization %q, want the query's, org-a", fq.namesOrg)
	}
}

func TestAuditEventsArguments(t *testing.T) {
	fq := &fakeQuerier{}
	c := client.New(newHandler(fq))
	var resp struct{ AuditEvents struct{ NextCursor *string } }
	err := c.Post(`{ auditEvents(orgId: "org-a", from: "2025-03-01T00:00:00Z", to: "2025-03-02T00:00:00.5Z",
		roomId: "r1", actorId: "a1", types: ["tool.called", "message.posted"], limit: 5, before: "PREV") { nextCursor } }`, &resp)
	// The resolver passes the cursor through; the query package rejects it.
	if err == nil || !strings.Contains(err.Error(), `before: malformed cursor \"PREV\"`) {
		t.Errorf("error = %v, want the malformed cursor", err)
	}
	wantQ := query.AuditQuery{OrgID: "org-a", From: from, To: to.Add(500 * time.Millisecond), RoomID: "r1", ActorID: "a1",
		Types: []string{"tool.called", "message.posted"}, Limit: 5, Before: "PREV"}
	if diff := cmp.Diff(wantQ, fq.gotAudit); diff != "" {
		t.Errorf("query (-want +got):\n%s", diff)
	}
}

func TestAuditEventsPage(t *testing.T) {
	at := time.Date(2025, 3, 1, 10, 0, 1, 100_000_000, time.UTC)
	fq := &fakeQuerier{page: query.AuditPage{
		Events: []query.Event{{ID: "e2", Type: "tool.called", Time: at, OrgID: "org-a", ActorType: "agent",
			Data: `{"tool":"search"}`, IngestedAt: at, KafkaOffset: 42}},
		NextCursor: "CURSOR",
	}}
	c := client.New(newHandler(fq))
	var resp struct {
		AuditEvents struct {
			Events []struct {
				ID, Type, Time, ActorType, Data string
				KafkaOffset                     int64
			}
			NextCursor *string
		}
	}
	c.MustPost(`{ auditEvents(orgId: "org-a", types: ["tool.called"]) { events { id type time actorType data kafkaOffset } nextCursor } }`, &resp)
	wantQ := query.AuditQuery{OrgID: "org-a", Types: []string{"tool.called"}}
	if diff := cmp.Diff(wantQ, fq.gotAudit); diff != "" {
		t.Errorf("query (-want +got):\n%s", diff)
	}
	if len(resp.AuditEvents.Events) != 1 {
		t.Fatalf("events = %+v", resp.AuditEvents.Events)
	}
	e := resp.AuditEvents.Events[0]
	if e.ID != "e2" || e.Time != "2025-03-01T10:00:01.1Z" || e.Data != `{"tool":"search"}` || e.KafkaOffset != 42 || e.ActorType != "agent" {
		t.Errorf("event = %+v", e)
	}
	if resp.AuditEvents.NextCursor == nil || *resp.AuditEvents.NextCursor != "CURSOR" {
		t.Errorf("nextCursor = %v, want CURSOR", resp.AuditEvents.NextCursor)
	}

	fq.page.NextCursor = ""
	c.MustPost(`{ auditEvents(orgId: "org-a") { nextCursor } }`, &resp)
	if resp.AuditEvents.NextCursor != nil {
		t.Errorf("nextCursor on the last page = %q, want null", *resp.AuditEvents.NextCursor)
	}
}

type gqlError struct {
	Message    string
	Path       []any
	Extensions map[string]any
}

// post sends a query and returns the errors of the response.
func post(t *testing.T, h http.Handler, body string, header http.Header) (int, []gqlError) {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, "/graphql", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header[k] = v
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	var resp struct{ Errors []gqlError }
	if rec.Code == http.StatusOK {
		if err := json.Unmarshal(rec.Body.Bytes(), &resp); err != nil {
			t.Fatalf("cannot decode %s: %v", rec.Body, err)
		}
	}
	return rec.Code, resp.Errors
}

func gqlBody(q string) string {
	b, _ := json.Marshal(map[string]string{"query": q})
	return string(b)
}

func TestErrors(t *testing.T) {
	var logs bytes.Buffer
	fq := &fakeQuerier{}
	h := newHandler(fq, graph.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))

	_, errs := post(t, h, gqlBody(`{ costs(orgId: "org-a", from: "2025-03-02T00:00:00Z", to: "2025-03-01T00:00:00Z") { rows { cost } } }`), nil)
	want := []gqlError{{Message: "to: must be after from (from 2025-03-02T00:00:00Z, to 2025-03-01T00:00:00Z)",
		Path: []any{"costs"}, Extensions: map[string]any{"code": "BAD_USER_INPUT"}}}
	if diff := cmp.Diff(want, errs); diff != "" {
		t.Errorf("invalid query (-want +got):\n%s", diff)
	}

	fq.err = errors.New("cannot query audit events of org \"org-a\" from db.events: code 241: memory limit")
	_, errs = post(t, h, gqlBody(`{ auditEvents(orgId: "org-a") { nextCursor } }`), nil)
	want = []gqlError{{Message: "internal error", Path: []any{"auditEvents"}, Extensions: map[string]any{"code": "INTERNAL_SERVER_ERROR"}}}
	if diff := cmp.Diff(want, errs); diff != "" {
		t.Errorf("failure (-want +got):\n%s", diff)
	}
	if !strings.Contains(logs.String(), "memory limit") || !strings.Contains(logs.String(), "field=auditEvents") {
		t.Errorf("the failure is not logged: %q", logs.String())
	}
}

func TestAuthorizer(t *testing.T) {
	fq := &fakeQuerier{}
	h := graph.NewHandler(fq, testKeys)
	audit := gqlBody(`{ auditEvents(orgId: "org-a") { nextCursor } }`)
	costs := gqlBody(`{ costs(orgId: "org-a", from: "2025-03-01T00:00:00Z", to: "2025-03-02T00:00:00Z") { rows { events } } }`)
	for _, tc := range []struct {
		name, body, authorization string
		wantStatus                int
		wantCode, wantMessage     string
	}{
		{"no key", audit, "", http.StatusOK, "UNAUTHENTICATED", "no API key"},
		{"unknown key", audit, "Bearer tok-nobody", http.StatusOK, "UNAUTHENTICATED", "unknown or revoked"},
		{"another organization", audit, "Bearer tok-b-compliance", http.StatusOK, "FORBIDDEN", `may not read organization "org-a"`},
		{"viewer reads no audit trail", audit, "Bearer tok-a-viewer", http.StatusOK, "FORBIDDEN", "needs one of compliance, admin"},
		{"ingest key reads nothing", costs, "Bearer tok-a-ingest", http.StatusOK, "FORBIDDEN", "has role ingest"},
		{"compliance reads its org", audit, "Bearer tok-a-compliance", http.StatusOK, "", ""},
		{"viewer reads costs", costs, "Bearer tok-a-viewer", http.StatusOK, "", ""},
		{"scheme in any case", audit, "bearer tok-a-compliance", http.StatusOK, "", ""},
		{"platform admin names an org", audit, "Bearer tok-admin", http.StatusOK, "", ""},
		{"not bearer", audit, "Basic dTpw", http.StatusUnauthorized, "", ""},
		{"empty bearer", audit, "Bearer ", http.StatusUnauthorized, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			header := http.Header{}
			if tc.authorization != "" {
				header.Set("Authorization", tc.authorization)
			}
			status, errs := post(t, h, tc.body, header)
			if status != tc.wantStatus {
				t.Fatalf("status %d, want %d", status, tc.wantStatus)
			}
			var code, msg string
			if len(errs) > 0 {
				code, _ = errs[0].Extensions["code"].(string)
				msg = errs[0].Message
			}
			if code != tc.wantCode || !strings.Contains(msg, tc.wantMessage) {
				t.Errorf("error %q %q (%+v), want %q containing %q", code, msg, errs, tc.wantCode, tc.wantMessage)
			}
			if tc.wantCode != "" && fq.gotAudit.OrgID != "" {
				t.Errorf("the query ran although the key was refused: %+v", fq.gotAudit)
			}
			fq.gotAudit = query.AuditQuery{}
		})
	}
}

func TestComplexityCountsWhatAFieldReturns(t *testing.T) {
	h := newHandler(&fakeQuerier{})
	page := `auditEvents(orgId: "org-a", limit: 10000) { events { id type data } }`
	for _, tc := range []struct {
		name, query string
		refused     bool
	}{
		{"one full page", "{ " + page + " }", false},
		{"two full pages", "{ a: " + page + " b: " + page + " }", true},
		{"330 aliased pages", "{ " + func() string {
			var b strings.Builder
			for i := range 330 {
				fmt.Fprintf(&b, "p%d: %s ", i, page)
			}
			return b.String()
		}() + "}", true},
		{"ten default pages", "{ " + func() string {
			var b strings.Builder
			for i := range 10 {
				fmt.Fprintf(&b, `p%d: auditEvents(orgId: "org-a") { events { id } } `, i)
			}
			return b.String()
		}() + "}", false},
	} {
		req := httptest.NewRequest(http.MethodPost, "/graphql", strings.NewReader(gqlBody(tc.query)))
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if got := strings.Contains(rec.Body.String(), "complexity"); got != tc.refused {
			t.Errorf("%s: refused=%v, want %v: %s", tc.name, got, tc.refused, rec.Body.String()[:min(200, rec.Body.Len())])
		}
	}
}

func TestLimits(t *testing.T) {
	fq := &fakeQuerier{}
	h := newHandler(fq, graph.WithLimits(graph.Limits{MaxBodyBytes: 200, MaxTokens: 50, MaxComplexity: 3}))
	req := httptest.NewRequest(http.MethodPost, "/graphql", strings.NewReader(`{"query":"`+strings.Repeat(" ", 300)+`{ __typename }"}`))
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusRequestEntityTooLarge || !strings.Contains(rec.Body.String(), "larger than 200 bytes") {
		t.Errorf("oversized body: %d %s", rec.Code, rec.Body)
	}
	// Deep nesting is refused by the parser's token limit, before it recurses far, and
	// aliases count towards complexity.
	for _, tc := range []struct{ name, query, want string }{
		{"deep", strings.Repeat("{a", 40) + strings.Repeat("}", 40), "token limit"},
		{"aliases", `{ a: auditEvents(orgId: "org-a") { nextCursor } b: auditEvents(orgId: "org-a") { nextCursor } }`, "complexity"},
	} {
		req := httptest.NewRequest(http.MethodPost, "/graphql", strings.NewReader(gqlBody(tc.query)))
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if !strings.Contains(rec.Body.String(), tc.want) {
			t.Errorf("%s query: %d %s, want %q", tc.name, rec.Code, rec.Body, tc.want)
		}
	}
}

func TestGET(t *testing.T) {
	fq := &fakeQuerier{page: query.AuditPage{Events: []query.Event{{ID: "e1"}}}}
	h := newHandler(fq)
	req := httptest.NewRequest(http.MethodGet, "/graphql?query="+url.QueryEscape(`{ auditEvents(orgId: "org-a") { events { id } } }`), nil)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if want := `{"data":{"auditEvents":{"events":[{"id":"e1"}]}}}`; rec.Code != http.StatusOK || rec.Body.String() != want {
		t.Errorf("GET: %d %s, want 200 %s", rec.Code, rec.Body, want)
	}
}

// GET runs queries only; a malformed body or query string is refused with what was
// wrong, and the body is not echoed back.
func TestHTTPTransportRefusesWhatItCannotRun(t *testing.T) {
	h := newHandler(&fakeQuerier{})
	for name, tc := range map[string]struct {
		method, target, body string
		status               int
		want                 string
	}{
		"GET mutation": {"GET", "/graphql?query=" + url.QueryEscape(`mutation { deleteBudget(orgId: "org-a", id: "x") { id } }`), "",
			http.StatusMethodNotAllowed, "a GET request may run a query only, not a mutation"},
		"GET variables not an object": {"GET", "/graphql?query=" + url.QueryEscape(`{ agents { id } }`) + "&variables=%5B1%5D", "",
			http.StatusBadRequest, "the query string's variables are not a JSON object"},
		"GET bad escape": {"GET", "/graphql?query=%zz", "", http.StatusBadRequest, "the query string is malformed"},
		"POST not JSON":  {"POST", "/graphql", "secret-token-in-body{", http.StatusBadRequest, "the request body is not a JSON object"},
		"POST two values": {"POST", "/graphql", `{"query":"{ agents { id } }"} {"query":"{ agents { id } }"}`,
			http.StatusBadRequest, "more than one JSON value"},
		"POST variables array": {"POST", "/graphql", `{"query":"{ agents { id } }","variables":[1]}`,
			http.StatusBadRequest, "the request body is not a JSON object"},
		"POST parse error": {"POST", "/graphql", `{"query":"{ agents { id "}`, http.StatusUnprocessableEntity, "Expected Name"},
	} {
		t.Run(name, func(t *testing.T) {
			req := httptest.NewRequest(tc.method, tc.target, strings.NewReader(tc.body))
			if tc.method == "POST" {
				req.Header.Set("Content-Type", "application/json")
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			assert.Equal(t, tc.status, rec.Code, rec.Body.String())
			assert.Contains(t, rec.Body.String(), tc.want)
			assert.NotContains(t, rec.Body.String(), "secret-token-in-body")
			assert.True(t, json.Valid(rec.Body.Bytes()), "JSON: %s", rec.Body)
			assert.Equal(t, "nosniff", rec.Header().Get("X-Content-Type-Options"))
		})
	}
	// graphql-response+json answers a request it cannot parse with 400.
	req := httptest.NewRequest("POST", "/graphql", strings.NewReader(`{"query":"{ agents { id "}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/graphql-response+json")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	assert.Equal(t, http.StatusBadRequest, rec.Code)
	assert.Equal(t, "application/graphql-response+json", rec.Header().Get("Content-Type"))
}

func TestWebsocket(t *testing.T) {
	fq := &fakeQuerier{costs: []query.CostRow{{Events: 1, Cost: decimal.New(5, -1), Currency: "USD"}}}
	c := client.New(graph.NewHandler(fq, testKeys))
	sub := c.WebsocketWithPayload(`{ costs(orgId: "org-a", from: "2025-03-01T00:00:00Z", to: "2025-03-02T00:00:00Z") { rows { events cost currency } } }`,
		map[string]any{"Authorization": "Bearer tok-a-viewer"})
	defer func() { _ = sub.Close() }()
	var resp struct {
		Costs struct {
			Rows []struct {
				Events         int
				Cost, Currency string
			}
		}
	}
	if err := sub.Next(&resp); err != nil {
		t.Fatalf("query over websocket: %v", err)
	}
	if len(resp.Costs.Rows) != 1 || resp.Costs.Rows[0].Cost != "0.500000" || resp.Costs.Rows[0].Events != 1 {
		t.Errorf("costs over websocket = %+v", resp.Costs)
	}
}
