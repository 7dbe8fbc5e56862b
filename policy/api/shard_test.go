package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/policy"
	"github.com/bandplane/bandplane/policy/api"
	"github.com/bandplane/bandplane/policy/shard"
	"github.com/bandplane/bandplane/schema"
)

var testPeers = []string{"http://policy-1:8080", "http://policy-2:8080"}

// replicaPair is two APIs of one deployment over the same directory: the owner of
// org-acme and the other one.
type replicaPair struct {
	owner, other       *api.API
	ownerEng, otherEng *policy.Engine
	ownerAud, otherAud *fakeAuditor
	ownerURL           string
}

func newPair(t *testing.T) replicaPair {
	t.Helper()
	var p replicaPair
	for _, self := range testPeers {
		s, err := shard.New(shard.Config{Peers: testPeers, Self: self})
		require.NoError(t, err)
		aud := &fakeAuditor{}
		a, eng := newAPI(t, aud, func(c *api.Config) { c.Shards = s })
		if s.Owns("org-acme") {
			p.owner, p.ownerEng, p.ownerAud, p.ownerURL = a, eng, aud, self
		} else {
			p.other, p.otherEng, p.otherAud = a, eng, aud
		}
	}
	require.NotNil(t, p.owner)
	require.NotNil(t, p.other)
	return p
}

func send(t *testing.T, h http.Handler, token, body string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest("POST", "/v1/decisions/send_message", strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func TestAReplicaDecidesOnlyForTheOrganizationsItOwns(t *testing.T) {
	p := newPair(t)
	body := `{"agent":"a-architect","room":"room-webhook-retries","tokens":1000}`

	rec := send(t, p.other, "t", body)
	require.Equal(t, http.StatusMisdirectedRequest, rec.Code, rec.Body.String())
	assert.Equal(t, p.ownerURL, rec.Header().Get(api.OwnerHeader))
	var mis api.MisdirectedBody
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &mis))
	assert.Equal(t, api.CodeMisdirected, mis.Code)
	assert.Equal(t, p.ownerURL, mis.Owner)
	assert.Contains(t, mis.Message, p.ownerURL)
	assert.Empty(t, p.otherAud.eventsOf(schema.TypePolicyDecided), "a misdirected decision is not audited")
	assert.Equal(t, 0, p.otherEng.Limiter().Len(), "nor counted")
	assert.Equal(t, 0, p.otherEng.Ledger().Reservations(), "nor reserved")

	rec = send(t, p.owner, "t", body)
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	assert.Equal(t, p.ownerURL, rec.Header().Get(api.OwnerHeader), "the owner names itself")
	var d policy.Decision
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &d))
	assert.True(t, d.Allow, "%+v", d)
	require.Len(t, p.ownerAud.eventsOf(schema.TypePolicyDecided), 1)
	assert.Equal(t, 1, p.ownerEng.Ledger().Reservations())

	// An organization's own key is sent on as well.
	rec = send(t, p.other, "acme-route", body)
	assert.Equal(t, http.StatusMisdirectedRequest, rec.Code)

	// Stateless decisions: any replica answers, and says nothing of owners.
	for _, h := range []*api.API{p.owner, p.other} {
		for _, c := range []struct{ path, body string }{
			{"/v1/decisions/add_participant", `{"actor":"a-architect","room":"room-webhook-retries","participant":"a-reviewer"}`},
			{"/v1/decisions/peer_visible", `{"agent":"a-architect"}`},
			{"/v1/decisions/contact_request", `{"from":"a-architect","handle":"@bob/notes-agent"}`},
		} {
			req := httptest.NewRequest("POST", c.path, strings.NewReader(c.body))
			req.Header.Set("Authorization", "Bearer t")
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			assert.Equal(t, http.StatusOK, rec.Code, "%s: %s", c.path, rec.Body.String())
			assert.Empty(t, rec.Header().Get(api.OwnerHeader))
		}
		code, _ := call(t, h, "GET", "/v1/peers?agent=a-architect", "t", "")
		assert.Equal(t, http.StatusOK, code)
	}
}

// TestNoOwnerIsToldToWhoMayNotAsk: authentication and authorization come first; an
// unauthenticated or unauthorized request learns no owner, in the header or the body.
func TestNoOwnerIsToldToWhoMayNotAsk(t *testing.T) {
	p := newPair(t)
	body := `{"agent":"a-architect","room":"room-webhook-retries"}`
	for _, tc := range []struct {
		name, token string
		code        int
	}{
		{"no key", "", http.StatusUnauthorized},
		{"unknown key", "nope", http.StatusUnauthorized},
		{"a viewer", "viewer", http.StatusForbidden},
		{"an operator", "op", http.StatusForbidden},
		{"another organization's router", "other-rt", http.StatusForbidden},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := send(t, p.other, tc.token, body)
			assert.Equal(t, tc.code, rec.Code, rec.Body.String())
			assert.Empty(t, rec.Header().Get(api.OwnerHeader))
			assert.NotContains(t, rec.Body.String(), "policy-1")
			assert.NotContains(t, rec.Body.String(), "policy-2")
		})
	}
	// An org key asking about an agent of another organization gets the same 403 from
	// the owner and the other replica: no oracle of where an organization lives.
	a := send(t, p.owner, "other-rt", body)
	b := send(t, p.other, "other-rt", body)
	assert.Equal(t, a.Code, b.Code)
	assert.Equal(t, a.Body.String(), b.Body.String())
	assert.Empty(t, p.otherAud.events)
}

// TestAnUnknownAgentIsDecidedWhereAsked: its organization is unknown, so it is decided
// (denied) locally, takes nothing, and its answer names no owner to pin to.
func TestAnUnknownAgentIsDecidedWhereAsked(t *testing.T) {
	p := newPair(t)
	for _, h := range []*api.API{p.owner, p.other} {
		rec := send(t, h, "t", `{"agent":"a-nobody","room":"r","tokens":5}`)
		require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
		assert.Empty(t, rec.Header().Get(api.OwnerHeader))
		var d policy.Decision
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &d))
		assert.False(t, d.Allow)
		assert.Equal(t, "unknown_agent", d.Reasons[0].Code)
	}
	assert.Equal(t, 0, p.otherEng.Limiter().Len())
	assert.Equal(t, 0, p.otherEng.Ledger().Reservations())
	assert.Len(t, p.otherAud.eventsOf(schema.TypePolicyDecided), 1, "a deny is audited where it is taken")
}

func TestDecideReturnsMisdirectedError(t *testing.T) {
	p := newPair(t)
	_, err := p.other.Decide(t.Context(), policy.SendMessage, &policy.MessageInput{Agent: "a-architect", Room: "r"})
	var mis *api.MisdirectedError
	require.True(t, errors.As(err, &mis), "%v", err)
	assert.Equal(t, p.ownerURL, mis.Owner)
	assert.Equal(t, "a-architect", mis.Agent)
}

// TestAllowedMessagesRecordWhatTheyTook: the audit event of an allowed send_message
// carries the TATs it left and its quota; a deny carries none.
func TestAllowedMessagesRecordWhatTheyTook(t *testing.T) {
	aud := &fakeAuditor{}
	a, eng := newAPI(t, aud, nil)
	before := time.Now()
	d, err := a.Decide(t.Context(), policy.SendMessage, &policy.MessageInput{Agent: "a-coder", Room: "room-webhook-retries", Tokens: 10})
	require.NoError(t, err)
	require.True(t, d.Allow)
	evs := aud.eventsOf(schema.TypePolicyDecided)
	require.Len(t, evs, 1)
	var data api.DecidedData
	require.NoError(t, json.Unmarshal(evs[0].Data, &data))
	require.NotNil(t, data.Taken)
	agentTAT, _ := eng.Limiter().TAT(policy.AgentRateKey("a-coder"))
	roomTAT, _ := eng.Limiter().TAT(policy.RoomRateKey("a-coder", "room-webhook-retries"))
	assert.True(t, data.Taken.AgentTAT.Equal(agentTAT), "%s %s", data.Taken.AgentTAT, agentTAT)
	assert.True(t, data.Taken.RoomTAT.Equal(roomTAT))
	assert.Equal(t, int64(60), data.Taken.Quota.MessagesPerWindowAgent)
	assert.Equal(t, int64(12), data.Taken.Quota.MessagesPerWindowAgentRoom)
	assert.False(t, data.Taken.At.Before(before), "at is read during the call")
	assert.True(t, data.Taken.ReservationExpires.Equal(d.ReservationExpires))
	// "decision", "allow" and the reasons still come first (the SQL reads them with
	// visitParam*, which finds a key's first occurrence).
	assert.True(t, strings.HasPrefix(string(evs[0].Data), `{"decision":"send_message","allow":true,"reasons":`), "%s", evs[0].Data)

	for range 12 {
		_, _ = a.Decide(t.Context(), policy.SendMessage, &policy.MessageInput{Agent: "a-coder", Room: "room-webhook-retries"})
	}
	evs = aud.eventsOf(schema.TypePolicyDecided)
	data = api.DecidedData{}
	require.NoError(t, json.Unmarshal(evs[len(evs)-1].Data, &data))
	assert.False(t, data.Allow)
	assert.Nil(t, data.Taken)
}

// TestAGrantThatCannotBeAuditedTakesNothing: the rate is given back with the
// reservation, so the limiter counts exactly the allowed decisions of the trail.
func TestAGrantThatCannotBeAuditedTakesNothing(t *testing.T) {
	aud := &fakeAuditor{err: errors.New("kafka down")}
	a, eng := newAPI(t, aud, nil)
	in := &policy.MessageInput{Agent: "a-coder", Room: "room-webhook-retries", Tokens: 10}
	for range 30 {
		d, err := a.Decide(t.Context(), policy.SendMessage, in)
		require.NoError(t, err)
		require.False(t, d.Allow)
		require.Equal(t, "audit_unavailable", d.Reasons[len(d.Reasons)-1].Code)
	}
	assert.Equal(t, 0, eng.Ledger().Reservations())
	aud.mu.Lock()
	aud.err = nil
	aud.mu.Unlock()
	allowed := 0
	for range 20 {
		d, err := a.Decide(t.Context(), policy.SendMessage, in)
		require.NoError(t, err)
		if d.Allow {
			allowed++
		}
	}
	assert.Equal(t, 12, allowed, "the room's whole rate is still there")
}

func TestOnlyTheOwnerReportsCrossings(t *testing.T) {
	p := newPair(t)
	b := policy.Budget{Org: "org-acme", Scope: policy.ScopeOrg, Period: policy.PeriodDay, Tokens: 100, Hard: true}
	b.Normalize()
	b.ID = policy.BudgetID(b.Org, b.Scope, b.ScopeID, b.Period)
	now := time.Now() // one reading: the budget's day and the spend's are the same
	for _, eng := range []*policy.Engine{p.ownerEng, p.otherEng} {
		eng.Ledger().Set(b, now)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go p.owner.RunCrossings(ctx)
	otherCtx, stopOther := context.WithCancel(t.Context())
	defer stopOther()
	otherDone := make(chan struct{})
	go func() { defer close(otherDone); p.other.RunCrossings(otherCtx) }()
	for _, eng := range []*policy.Engine{p.ownerEng, p.otherEng} {
		// Usage from the stream reaches every replica; each ledger queues its crossings
		// (80 % and 100 %) before Spend returns.
		eng.Ledger().Spend(policy.Charge{Org: "org-acme", Tokens: 100}, "", now, now)
	}
	require.Eventually(t, func() bool { return len(p.ownerAud.eventsOf(schema.TypeBudgetCrossed)) == 2 }, 5*time.Second, 10*time.Millisecond)
	// The other replica's loop has taken both crossings once its queue is empty, and has
	// handled them once it returns: it stops only between crossings.
	require.Eventually(t, func() bool { return len(p.otherEng.Ledger().Crossings()) == 0 }, 5*time.Second, time.Millisecond)
	stopOther()
	<-otherDone
	assert.Empty(t, p.otherAud.eventsOf(schema.TypeBudgetCrossed), "the other replica leaves them to the owner")
}
