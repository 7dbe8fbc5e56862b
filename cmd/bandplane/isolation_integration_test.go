package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/stacktest"
	"github.com/bandplane/bandplane/graph/wsclient"
	"github.com/bandplane/bandplane/policy"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/keys"
)

// TestIntegrationTenantIsolationFromSchema asks every root field of the API, found by
// introspection (so that a field added later is covered without editing this test),
// with the keys of organization A, while organization B has data for every field:
//
//	(a) aimed at B (orgId = B), every role of A gets FORBIDDEN and no data;
//	(b) not aimed (no orgId), and with B's ids in every id argument, every enum value
//	    and B's ids in every id-list filter, no answer carries any of B's ids, handles,
//	    names, room ids or titles, contents or event ids; and no answer of B's admin
//	    carries anything of A's;
//	(c) subscriptions aimed at B are FORBIDDEN; A's live subscriptions receive A's live
//	    events and none of B's, B's admin receives B's and none of A's.
//
// A also writes events that reuse B's ids (a message, usage and a task in B's room id,
// a task assigned to B's agent, a request mentioning B's person): B's names must still
// never show in A's answers ("nothing is named across organizations", graph/README.md);
// and events aimed at B's work status (an update of B's task id, a result for B's tool
// call): B's must not change. The roles each field answers must be graph/README.md's.
// A field with no orgId argument, or one the test could not exercise, fails it by name.
func TestIntegrationTenantIsolationFromSchema(t *testing.T) {
	began := time.Now()
	s := newStack(t)
	tag := isoTag()
	a, b := newIsoTenant("alpha", tag), newIsoTenant("bravo", tag)
	platform := s.key(t, "platform-ingest", keys.PlatformOrg, keys.RoleIngest)
	router := s.key(t, "platform-router", keys.PlatformOrg, keys.RoleRouter)
	aKeys := map[keys.Role]string{}
	for _, r := range isoRoles {
		aKeys[r] = s.key(t, "alpha-"+string(r), a.org, r)
	}
	bAdmin := s.key(t, "bravo-admin", b.org, keys.RoleAdmin)
	platformAdmin := s.key(t, "platform-admin", keys.PlatformOrg, keys.RoleAdmin)
	srv := s.serve(t)
	t.Logf("serve ready after %s", time.Since(began).Round(time.Millisecond))

	// The directories and the data of both organizations, then A's events that reuse
	// B's ids (with A's own ingest key, as an organization's client could).
	seedAt := time.Now().UTC().Add(-10 * time.Minute)
	isoPost(t, srv, platform, append(a.seed(t, seedAt), b.seed(t, seedAt)...))
	isoPost(t, srv, aKeys[keys.RoleIngest], a.crossSeed(t, b, seedAt.Add(5*time.Minute)))
	// Decisions: an allowed and a denied send_message of each, and one of A's agent in
	// B's room. The first waits until the policy directory knows the agents.
	for _, tn := range []*isoTenant{a, b} {
		require.True(t, stacktest.Eventually(t, 30*time.Second, 200*time.Millisecond, func() bool {
			d := isoDecide(t, srv, router, tn.coder.ID, tn.room, 0)
			if d.Allow {
				tn.addDecision(d.DecisionID)
			}
			return d.Allow
		}), "the policy directory never let %s post in %s", tn.coder.ID, tn.room)
		d := isoDecide(t, srv, router, tn.coder.ID, tn.room, math.MaxInt64)
		require.False(t, d.Allow, "an estimate of MaxInt64 tokens is denied: %+v", d)
		tn.addDecision(d.DecisionID)
	}
	a.addDecision(isoDecide(t, srv, router, a.coder.ID, b.room2, 0).DecisionID)
	isoWaitStored(t, s, append(slices.Clone(a.events), b.events...))
	// Each organization's budget (crossed live below) and a reprice job.
	for _, tn := range []*isoTenant{a, b} {
		admin := bAdmin
		if tn == a {
			admin = aKeys[keys.RoleAdmin]
		}
		ans := isoAsk(t, srv, admin, `mutation { setBudget(budget: {scope: AGENT, scopeId: "`+tn.coder.ID+`", period: DAY, tokens: 100000, mode: SOFT}) { id } }`)
		require.Empty(t, ans.Errors, "%s", ans.raw)
		var set struct{ SetBudget struct{ ID string } }
		require.NoError(t, json.Unmarshal(ans.Data, &set))
		tn.secret(set.SetBudget.ID)
		ans = isoAsk(t, srv, admin, `mutation { reprice(from: "`+seedAt.Add(-time.Hour).Format(time.RFC3339)+`", to: "`+time.Now().UTC().Format(time.RFC3339)+`") { id } }`)
		require.Empty(t, ans.Errors, "%s", ans.raw)
		var job struct{ Reprice struct{ ID string } }
		require.NoError(t, json.Unmarshal(ans.Data, &job))
		tn.secret(job.Reprice.ID)
		// A policy replay of its own decisions, which policyReplay reads.
		ans = isoAsk(t, srv, admin, `mutation { startPolicyReplay(bundle: "`+tarFS(t, policy.DefaultBundle())+`") { id } }`)
		require.Empty(t, ans.Errors, "%s", ans.raw)
		var replayed struct{ StartPolicyReplay struct{ ID string } }
		require.NoError(t, json.Unmarshal(ans.Data, &replayed))
		tn.replay = tn.secret(replayed.StartPolicyReplay.ID)
	}
	t.Logf("both organizations' data stored after %s", time.Since(began).Round(time.Millisecond))

	// What each side must never see: everything of the other, except the ids A's own
	// events reuse on purpose (the names behind them stay secret).
	notForA := isoWithout(b.own, b.reusedIDs())
	notForB := a.own
	bIDs := b.argIDs()

	sch := isoIntrospect(t, srv, aKeys[keys.RoleAdmin])
	roots := sch.roots(t)
	var names []string
	for _, f := range roots {
		names = append(names, f.op+" "+f.Name)
	}
	t.Logf("introspection found %d root fields: %s", len(roots), strings.Join(names, ", "))
	documented := isoDocumentedRoles(t)
	sch.lits = isoLits{from: time.Now().UTC().Add(-30 * 24 * time.Hour), to: time.Now().UTC().Add(time.Hour), id: a.room}
	// Both organizations hold a message of this platform id: each sees its own chain.
	sch.minimal = map[string]map[string]string{"delegation": {"messageId": isoQuote(a.msg)}, "policyReplay": {"id": isoQuote(a.replay)}}

	exercised := map[string][]string{} // field -> checks done
	problem := t.Errorf
	var subs, muts []isoField
	for _, f := range roots {
		if f.op == "subscription" {
			subs = append(subs, f)
			continue
		}
		if f.op == "mutation" {
			muts = append(muts, f) // part (d), after the subscriptions
			continue
		}
		key := f.op + " " + f.Name
		vs := sch.variants(f, bIDs)
		if !f.hasArg("orgId") {
			problem("%s has no orgId argument: it cannot be aimed at an organization, so its isolation cannot be checked here (add orgId, or extend this test)", key)
		}

		// Both sides have data for this field: B's admin sees B's, A's admin A's, in
		// some variant (ingest's derived tables and the rollup may lag the events).
		// A platform-wide field (the price catalog) carries nothing of either: both see
		// the same, non-empty answer.
		var bAnswers []isoAnswer
		seen := stacktest.Eventually(t, 20*time.Second, 250*time.Millisecond, func() bool {
			bAnswers = bAnswers[:0]
			bSees, aSees := false, false
			for _, v := range vs {
				ans := isoAsk(t, srv, bAdmin, sch.document(f, v, ""))
				bAnswers = append(bAnswers, ans)
				aAns := isoAsk(t, srv, aKeys[keys.RoleAdmin], sch.document(f, v, ""))
				if isoPlatformWide[f.Name] {
					same := len(ans.Errors) == 0 && !ans.fieldNull(f.Name) && string(ans.Data) == string(aAns.Data) && !strings.Contains(string(ans.Data), "[]")
					bSees, aSees = bSees || same, aSees || same
					continue
				}
				bSees = bSees || isoFind(string(ans.Data), isoWithout(b.own, v.passed)) != ""
				aSees = aSees || isoFind(string(aAns.Data), isoWithout(a.own, v.passed)) != ""
			}
			return bSees && aSees
		})
		if !seen {
			problem("%s: no variant shows B's admin any of B's data, or A's admin any of A's, after 20 s: the field was not exercised (give both organizations data for it)", key)
		} else {
			exercised[key] = append(exercised[key], "data on both sides")
		}
		// B's admin never sees A's.
		for i, ans := range bAnswers {
			if leak := isoFind(string(ans.raw), notForB); leak != "" {
				problem("%s (%s) as B's admin: the answer carries A's %q: %s", key, vs[i].name, leak, isoShort(ans.raw))
			}
		}

		// Which roles of A may ask, and (b) without orgId.
		var allowed []string
		for _, r := range isoRoles {
			ans := isoAsk(t, srv, aKeys[r], sch.document(f, vs[0], ""))
			switch {
			case ans.hasCode(f.Name, "FORBIDDEN"):
				if !ans.fieldNull(f.Name) {
					problem("%s as A's %s: FORBIDDEN but with data: %s", key, r, isoShort(ans.raw))
				}
				continue
			case len(ans.Errors) > 0:
				problem("%s as A's %s: %s", key, r, isoShort(ans.raw))
				continue
			}
			allowed = append(allowed, string(r))
			if leak := isoFind(string(ans.raw), notForA); leak != "" {
				problem("%s as A's %s without orgId: the answer carries B's %q: %s", key, r, leak, isoShort(ans.raw))
			}
		}
		if len(allowed) == 0 {
			problem("%s: every role of A's keys is FORBIDDEN: the field was not exercised", key)
			continue
		}
		t.Logf("%s: roles %s", key, strings.Join(allowed, ", "))
		if doc, ok := documented[f.Name]; !ok {
			problem("%s is not in graph/README.md's table of roles (it answers roles %v)", key, allowed)
		} else if !slices.Equal(doc, allowed) {
			problem("%s answers roles %v; graph/README.md documents %v", key, allowed, doc)
		}
		exercised[key] = append(exercised[key], "roles")

		// (b), the other variants: B's ids in id arguments and filters, every enum value.
		first := aKeys[keys.Role(allowed[0])]
		for _, v := range vs[1:] {
			ans := isoAsk(t, srv, first, sch.document(f, v, ""))
			for _, e := range ans.Errors {
				if e.code() != "BAD_USER_INPUT" {
					problem("%s (%s) as A's %s: %s", key, v.name, allowed[0], isoShort(ans.raw))
					break
				}
			}
			if leak := isoFind(string(ans.raw), isoWithout(notForA, v.passed)); leak != "" {
				problem("%s (%s) as A's %s: the answer carries B's %q: %s", key, v.name, allowed[0], leak, isoShort(ans.raw))
			}
		}
		exercised[key] = append(exercised[key], "no orgId")

		// (a) aimed at B, or at every organization (the platform's '*'): FORBIDDEN,
		// never data, whatever the role.
		if f.hasArg("orgId") {
			for _, aim := range []string{b.org, keys.PlatformOrg} {
				for _, r := range isoRoles {
					ans := isoAsk(t, srv, aKeys[r], sch.document(f, vs[0], aim))
					if !ans.hasCode(f.Name, "FORBIDDEN") || !ans.fieldNull(f.Name) {
						problem("%s(orgId: %q) as A's %s: want FORBIDDEN and no data, got %s", key, aim, r, isoShort(ans.raw))
					}
					if leak := isoFind(string(ans.Data), notForA); leak != "" {
						problem("%s(orgId: %q) as A's %s: the data carries B's %q", key, aim, r, leak)
					}
				}
			}
			exercised[key] = append(exercised[key], "orgId B")
		}
	}
	// A's update of B's task id and its result for B's tool call changed nothing of B's.
	var bWork struct {
		WorkStatus struct {
			Rooms []struct {
				Tasks []struct{ ID, Title, Status string }
			}
		}
		Agents []struct {
			ID            string
			OpenToolCalls []struct{ ToolCallID string }
		}
	}
	ans := isoAsk(t, srv, bAdmin, `{ workStatus { rooms { tasks { id title status } } } agents { id openToolCalls { toolCallId } } }`)
	require.Empty(t, ans.Errors, "%s", ans.raw)
	require.NoError(t, json.Unmarshal(ans.Data, &bWork))
	task, call := "", false
	for _, rm := range bWork.WorkStatus.Rooms {
		for _, tk := range rm.Tasks {
			if tk.ID == b.task {
				task = tk.Title + " / " + tk.Status
			}
		}
	}
	for _, ag := range bWork.Agents {
		for _, c := range ag.OpenToolCalls {
			call = call || (ag.ID == b.coder.ID && c.ToolCallID == b.call)
		}
	}
	if task != b.taskTitle+" / in_progress" {
		problem("B's task %s shows as %q to B's admin after A updated a task of the same id: want %q", b.task, task, b.taskTitle+" / in_progress")
	}
	if !call {
		problem("B's tool call %s is no longer open for B's admin after A posted a result of the same id: %s", b.call, ans.raw)
	}

	t.Logf("queries checked after %s", time.Since(began).Round(time.Millisecond))

	// (c) Subscriptions.
	if len(subs) > 0 {
		isoSubscriptions(t, srv, sch, subs, a, b, aKeys, bAdmin, platform, router, platformAdmin, documented, exercised, problem)
	}
	t.Logf("subscriptions checked after %s", time.Since(began).Round(time.Millisecond))

	// (d) Mutations.
	isoMutationChecks(t, srv, muts, a, b, aKeys, bAdmin, platformAdmin, documented, exercised, problem)
	t.Logf("mutations checked after %s", time.Since(began).Round(time.Millisecond))

	want := map[string][]string{"query": {"data on both sides", "roles", "no orgId", "orgId B"}, "mutation": {"data on both sides", "roles", "no orgId", "orgId B"},
		"subscription": {"roles", "orgId B", "live"}}
	for _, f := range roots {
		key := f.op + " " + f.Name
		var missing []string
		for _, c := range want[f.op] {
			if !slices.Contains(exercised[key], c) {
				missing = append(missing, c)
			}
		}
		if len(missing) > 0 {
			t.Errorf("%s was not exercised for: %s (done: %v)", key, strings.Join(missing, ", "), exercised[key])
		}
	}
	srv.alive()
}

// isoSubscriptions is part (c): roles, aiming at B, then live events of both. metrics is
// a platform key that reads /metrics.
func isoSubscriptions(t *testing.T, srv *server, sch *isoSchema, subs []isoField, a, b *isoTenant,
	aKeys map[keys.Role]string, bAdmin, platform, router, metrics string, documented map[string][]string, exercised map[string][]string, problem func(string, ...any)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	wsURL := "ws" + strings.TrimPrefix(srv.url, "http") + "/graphql"
	conns := map[string]*wsclient.Conn{}
	dial := func(name, token string) *wsclient.Conn {
		c, err := wsclient.Dial(ctx, wsURL, token)
		require.NoError(t, err, "as %s", name)
		t.Cleanup(func() { _ = c.Close() })
		conns[name] = c
		return c
	}
	for _, r := range isoRoles {
		dial(string(r), aKeys[r])
	}
	dial("bravo-admin", bAdmin)
	subscribe := func(conn, doc string) <-chan wsclient.Message {
		_, ch, err := conns[conn].Subscribe(ctx, doc, nil, 256)
		require.NoError(t, err)
		return ch
	}
	bIDs := b.argIDs()

	// Roles: a refused subscription answers at once; an accepted one stays quiet.
	type pending struct {
		f    isoField
		role keys.Role
		ch   <-chan wsclient.Message
	}
	var first []pending
	for _, f := range subs {
		vs := sch.variants(f, bIDs)
		for _, r := range isoRoles {
			first = append(first, pending{f, r, subscribe(string(r), sch.document(f, vs[0], ""))})
		}
	}
	// A refused subscription is answered at once (a "next" of errors, then "complete"),
	// an accepted one stays quiet. One refused later than this (a loaded machine) is
	// told apart at the end, by its messages.
	time.Sleep(1500 * time.Millisecond)
	var live []*isoSub             // A's subscriptions, then the variants, then B's admin's
	early := map[string][]string{} // the roles accepted so far, to ask the variants with
	for _, p := range first {
		s := &isoSub{name: fmt.Sprintf("%s as A's %s", p.f.Name, p.role), field: p.f.Name, role: string(p.role), ch: p.ch, own: a}
		s.drain()
		if !s.refused() {
			early[p.f.Name] = append(early[p.f.Name], s.role)
		}
		live = append(live, s)
	}

	// Aimed at B, or at '*': FORBIDDEN for every role, never data.
	for _, f := range subs {
		if !f.hasArg("orgId") {
			problem("subscription %s has no orgId argument: it cannot be aimed at an organization, so its isolation cannot be checked here", f.Name)
			continue
		}
		vs := sch.variants(f, bIDs)
		ok := true
		for _, aim := range []string{b.org, keys.PlatformOrg} {
			for _, r := range isoRoles {
				ch := subscribe(string(r), sch.document(f, vs[0], aim))
				select {
				case m := <-ch:
					if !isoMsgCode(m, "FORBIDDEN") || !isoNull(m.Data) {
						problem("subscription %s(orgId: %q) as A's %s: want FORBIDDEN and no data, got data %s, errors %+v (%v)", f.Name, aim, r, m.Data, m.Errors, m.Err)
						ok = false
					}
				case <-time.After(5 * time.Second):
					problem("subscription %s(orgId: %q) as A's %s: no answer within 5 s (want FORBIDDEN)", f.Name, aim, r)
					ok = false
				}
			}
		}
		if ok {
			exercised["subscription "+f.Name] = append(exercised["subscription "+f.Name], "orgId B")
		}
	}

	// The other variants as A's first accepted role, and B's admin, all listening.
	for _, f := range subs {
		if len(early[f.Name]) == 0 {
			continue
		}
		role := early[f.Name][0]
		vs := sch.variants(f, bIDs)
		for _, v := range vs[1:] {
			live = append(live, &isoSub{name: fmt.Sprintf("%s (%s) as A's %s", f.Name, v.name, role), field: f.Name,
				ch: subscribe(role, sch.document(f, v, "")), own: a, passed: v.passed, variant: true})
		}
		live = append(live, &isoSub{name: f.Name + " as B's admin", ch: subscribe("bravo-admin", sch.document(f, vs[0], "")), own: b, field: f.Name})
	}
	// The subscribe frames are read before the events: the hub holds every subscription
	// of live that has no answer (a refused one is answered at once, an accepted one
	// stays quiet).
	quiet := 0
	held := stacktest.Eventually(t, 30*time.Second, 20*time.Millisecond, func() bool {
		quiet = 0
		for _, s := range live {
			s.drain()
			if len(s.msgs) == 0 {
				quiet++
			}
		}
		return liveSubscriptions(t, srv, metrics) == quiet
	})
	require.True(t, held, "the hub holds %d subscriptions; %d of %d are unanswered", liveSubscriptions(t, srv, metrics), quiet, len(live))

	// Live events: B's first, then A's (with A's that reuse B's ids).
	now := time.Now().UTC()
	b.live(t, srv, platform, router, now)
	a.live(t, srv, platform, router, now.Add(time.Second))
	a.crossLive(t, srv, aKeys[keys.RoleIngest], b, now.Add(2*time.Second))

	// Wait until every live event of A reached one of A's subscriptions, and every one
	// of B's one of B's admin's (B's were posted first: by then a leak would be there).
	covered := func(own *isoTenant, ids []string) []string {
		var missing []string
		for _, id := range ids {
			found := false
			for _, s := range live {
				if s.own == own && s.carries(id) {
					found = true
					break
				}
			}
			if !found {
				missing = append(missing, id)
			}
		}
		return missing
	}
	var missA, missB []string
	stacktest.Eventually(t, 20*time.Second, 100*time.Millisecond, func() bool {
		for _, s := range live {
			s.drain()
		}
		missA, missB = covered(a, a.liveIDs), covered(b, b.liveIDs)
		return len(missA) == 0 && len(missB) == 0
	})
	time.Sleep(500 * time.Millisecond)
	for _, s := range live {
		s.drain()
	}
	if len(missA) > 0 {
		problem("A's live events %v reached none of A's subscriptions", missA)
	}
	if len(missB) > 0 {
		problem("B's live events %v reached none of B's admin's subscriptions", missB)
	}
	notForA := isoWithout(b.own, b.reusedIDs())
	allowed := map[string][]string{}
	for _, s := range live {
		if s.role != "" && s.refused() { // a role the field does not accept
			if len(s.msgs) != 1 || !isoNull(s.msgs[0].Data) {
				problem("subscription %s: FORBIDDEN, but with data or more: %+v", s.name, s.msgs)
			}
			continue
		}
		if s.role != "" {
			allowed[s.field] = append(allowed[s.field], s.role)
		}
		forbidden := notForA
		if s.own == b {
			forbidden = a.own
		}
		forbidden = isoWithout(forbidden, s.passed)
		for _, m := range s.msgs {
			if m.Err != nil || len(m.Errors) > 0 {
				problem("subscription %s: %v %+v", s.name, m.Err, m.Errors)
			}
			if leak := isoFind(string(m.Data), forbidden); leak != "" {
				problem("subscription %s received the other organization's %q: %s", s.name, leak, isoShort(m.Data))
			}
		}
		if !s.variant && isoFind(s.text(), s.own.own) == "" {
			problem("subscription %s received none of its own organization's live events (%d messages)", s.name, len(s.msgs))
		}
	}
	for _, f := range subs {
		key := "subscription " + f.Name
		if len(allowed[f.Name]) == 0 {
			problem("%s: every role of A's keys is FORBIDDEN: the field was not exercised", key)
			continue
		}
		t.Logf("%s: roles %s", key, strings.Join(allowed[f.Name], ", "))
		if doc, ok := documented[f.Name]; !ok {
			problem("%s is not in graph/README.md's table of roles (it answers roles %v)", key, allowed[f.Name])
		} else if !slices.Equal(doc, allowed[f.Name]) {
			problem("%s answers roles %v; graph/README.md documents %v", key, allowed[f.Name], doc)
		}
		exercised[key] = append(exercised[key], "roles")
	}
	// A field is exercised live when A's and B's subscriptions of it both received
	// their own organization's events.
	for _, f := range subs {
		gotA, gotB := false, false
		for _, s := range live {
			if s.field == f.Name && !s.variant && isoFind(s.text(), s.own.own) != "" {
				gotA, gotB = gotA || s.own == a, gotB || s.own == b
			}
		}
		if gotA && gotB {
			exercised["subscription "+f.Name] = append(exercised["subscription "+f.Name], "live")
		}
	}
}

// isoPlatformWide are the fields whose answers are every organization's (the price
// catalog): checked for roles and aiming, and for carrying nothing of either side.
var isoPlatformWide = map[string]bool{"prices": true}

// isoRoles are every role a key can have.
var isoRoles = []keys.Role{keys.RoleIngest, keys.RoleRouter, keys.RoleViewer, keys.RoleManager, keys.RoleCompliance, keys.RoleOperator, keys.RoleAdmin}

func isoTag() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// isoTenant is one organization's directory and data. Every string of it that an
// answer could carry (ids, handles, names, titles, contents, event ids) is in own.
type isoTenant struct {
	name, title                         string // alpha, Alpha
	tag                                 string
	org                                 string
	lead, second, coder, writer, system schema.Party
	leadName, secondName                string
	coderName, writerName               string
	room, room2, roomTitle, room2Title  string
	task, taskTitle, unpriced, call     string
	msg                                 string // a platform message id both organizations hold
	replay                              string // the id of its policy replay job
	own                                 []string
	events                              []string // ids of the events posted (decisions included)
	liveIDs                             []string // ids of the live events
	n                                   int
}

func newIsoTenant(name, tag string) *isoTenant {
	title := strings.ToUpper(name[:1]) + name[1:]
	lead := name + "-lead-" + tag
	tn := &isoTenant{name: name, title: title, tag: tag, org: "org-" + name + "-" + tag,
		lead:     schema.Party{ID: "usr_" + name + "_lead_" + tag, Type: schema.ActorUser, Handle: lead},
		second:   schema.Party{ID: "usr_" + name + "_ops_" + tag, Type: schema.ActorUser, Handle: name + "-ops-" + tag},
		coder:    schema.Party{ID: "agt_" + name + "_coder_" + tag, Type: schema.ActorAgent, Handle: lead + "/coder"},
		writer:   schema.Party{ID: "agt_" + name + "_writer_" + tag, Type: schema.ActorAgent, Handle: lead + "/writer"},
		system:   schema.Party{ID: "system", Type: schema.ActorSystem},
		leadName: title + " Lead " + tag, secondName: title + " Ops " + tag,
		coderName: title + " Coder " + tag, writerName: title + " Writer " + tag,
		room: "room_" + name + "_main_" + tag, room2: "room_" + name + "_side_" + tag,
		roomTitle: title + " Main Room " + tag, room2Title: title + " Side Room " + tag,
		task: "task_" + name + "_" + tag, taskTitle: title + " ships the release " + tag,
		unpriced: name + "-model-" + tag, call: "call-" + name + "-" + tag,
		msg: "msg-iso-" + tag,
	}
	tn.own = []string{tn.org, tn.lead.ID, tn.lead.Handle, tn.leadName, tn.second.ID, tn.second.Handle, tn.secondName,
		tn.coder.ID, tn.coder.Handle, tn.coderName, tn.writer.ID, tn.writer.Handle, tn.writerName,
		tn.room, tn.room2, tn.roomTitle, tn.room2Title, tn.task, tn.taskTitle, tn.unpriced, tn.call}
	return tn
}

// argIDs are the tenant's ids the other organization puts in id arguments.
func (tn *isoTenant) argIDs() []string {
	ids := []string{tn.room, tn.room2, tn.coder.ID, tn.writer.ID, tn.lead.ID, tn.task}
	if tn.replay != "" {
		ids = append(ids, tn.replay)
	}
	return ids
}

// reusedIDs are the tenant's ids that the other organization's own events reuse
// (crossSeed, crossLive): its answers carry them, never the names behind them.
func (tn *isoTenant) reusedIDs() []string {
	return []string{tn.room2, tn.writer.ID, tn.second.ID, tn.task, tn.call}
}

// secret is a string of the tenant's that some answer may carry: it is searched for.
func (tn *isoTenant) secret(s string) string { tn.own = append(tn.own, s); return s }

func (tn *isoTenant) addDecision(id string) {
	if id != "" {
		tn.own = append(tn.own, id)
		tn.events = append(tn.events, id)
	}
}

// event is a canonical event of the tenant's organization.
func (tn *isoTenant) event(t *testing.T, typ, room string, actor schema.Party, subject *schema.Party, data any, at time.Time) schema.Event {
	t.Helper()
	tn.n++
	raw, err := json.Marshal(data)
	require.NoError(t, err)
	e := schema.Event{ID: tn.secret(fmt.Sprintf("ev-%s-%s-%d", tn.name, tn.tag, tn.n)), Type: typ, Time: at.UTC(), OrgID: tn.org, RoomID: room,
		Actor: actor, Subject: subject, Source: "isolation-test", SchemaVersion: schema.Version, Data: raw}
	require.NoError(t, e.Validate(), "%s %s", typ, e.ID)
	tn.events = append(tn.events, e.ID)
	return e
}

// seed is the tenant's directory and data: for every field of the API.
func (tn *isoTenant) seed(t *testing.T, at time.Time) []schema.Event {
	t.Helper()
	step := func() time.Time { at = at.Add(time.Second); return at }
	usage := func(in, out int64, model string) schema.UsageData {
		return schema.UsageData{InputTokens: in, OutputTokens: out, CacheReadTokens: 10, CacheWriteTokens: 5, Model: model}
	}
	return []schema.Event{
		tn.event(t, schema.TypeUserRegistered, "", tn.system, &tn.lead, schema.UserData{Handle: tn.lead.Handle, Name: tn.leadName}, step()),
		tn.event(t, schema.TypeUserRegistered, "", tn.system, &tn.second, schema.UserData{Handle: tn.second.Handle, Name: tn.secondName}, step()),
		tn.event(t, schema.TypeAgentRegistered, "", tn.lead, &tn.coder, schema.AgentData{Handle: tn.coder.Handle, Name: tn.coderName, OwnerID: tn.lead.ID,
			Model: "gpt-5-mini", PersonalRegistryAccess: true, Listed: true}, step()),
		tn.event(t, schema.TypeAgentRegistered, "", tn.lead, &tn.writer, schema.AgentData{Handle: tn.writer.Handle, Name: tn.writerName, OwnerID: tn.lead.ID,
			Model: "gpt-5-mini", PersonalRegistryAccess: true, Listed: true}, step()),
		tn.event(t, schema.TypeRoomAdded, tn.room, tn.coder, nil, schema.RoomData{Title: tn.roomTitle}, step()),
		tn.event(t, schema.TypeRoomAdded, tn.room2, tn.writer, nil, schema.RoomData{Title: tn.room2Title}, step()),
		tn.event(t, schema.TypeParticipantAdded, tn.room, tn.system, &tn.coder, schema.ParticipantData{ParticipantID: tn.coder.ID, ParticipantType: schema.ActorAgent}, step()),
		tn.event(t, schema.TypeParticipantAdded, tn.room2, tn.system, &tn.writer, schema.ParticipantData{ParticipantID: tn.writer.ID, ParticipantType: schema.ActorAgent}, step()),
		// The lead's request starts the coder's work there; the ops person's starts the
		// writer's, an agent of another owner (the lead): spend caused across owners.
		tn.event(t, schema.TypeMessageCreated, tn.room, tn.lead, nil, schema.MessageData{Content: tn.secret(tn.title + " lead asks " + tn.tag),
			MessageID: tn.msg, Mentions: []schema.Mention{{ID: tn.coder.ID, Handle: tn.coder.Handle}}}, step()),
		tn.event(t, schema.TypeMessageCreated, tn.room2, tn.second, nil, schema.MessageData{Content: tn.secret(tn.title + " ops asks " + tn.tag),
			Mentions: []schema.Mention{{ID: tn.writer.ID, Handle: tn.writer.Handle}}}, step()),
		tn.event(t, schema.TypeMessageCreated, tn.room, tn.coder, nil, schema.MessageData{Content: tn.secret(tn.title + " coder answers " + tn.tag)}, step()),
		tn.event(t, schema.TypeMessageCreated, tn.room2, tn.writer, nil, schema.MessageData{Content: tn.secret(tn.title + " writer drafts " + tn.tag)}, step()),
		tn.event(t, schema.TypeUsageReported, tn.room, tn.coder, nil, usage(1200, 300, ""), step()),
		tn.event(t, schema.TypeUsageReported, tn.room2, tn.writer, nil, usage(700, 90, tn.unpriced), step()),
		tn.event(t, schema.TypeToolCall, tn.room, tn.coder, nil, schema.ToolCallData{ToolName: tn.secret("tool_" + tn.name + "_" + tn.tag),
			ToolCallID: tn.call}, step()),
		tn.event(t, schema.TypeTaskCreated, tn.room, tn.lead, nil, schema.TaskData{TaskID: tn.task, Title: tn.taskTitle, Status: "in_progress", Assignee: tn.coder.ID}, step()),
		tn.event(t, schema.TypeAttention, tn.room, tn.coder, nil, schema.MessageData{Content: tn.secret("@" + tn.lead.Handle + " " + tn.title + " needs a decision " + tn.tag),
			Mentions: []schema.Mention{{ID: tn.lead.ID, Handle: tn.lead.Handle}}}, step()),
		tn.event(t, schema.TypeContactRequestReceived, "", tn.coder, nil, schema.ContactData{RequestID: tn.secret("cr-" + tn.name + "-" + tn.tag), Status: "pending",
			FromHandle: tn.secret(tn.name + "-friend-" + tn.tag), ToHandle: tn.coder.Handle, Message: tn.secret(tn.title + " wants to talk " + tn.tag)}, step()),
		tn.event(t, schema.TypeContactRequestUpdated, "", tn.coder, nil, schema.ContactData{RequestID: "cr-" + tn.name + "-" + tn.tag, Status: "approved",
			FromHandle: tn.name + "-friend-" + tn.tag, ToHandle: tn.coder.Handle}, step()),
	}
}

// crossSeed are A's events that reuse B's ids: its agent posts and spends in B's room
// id, calls a tool there, a task there is assigned to B's agent, a request mentions
// B's person; and A's events that would change B's work status if the derived tables
// were not kept per organization: an update of B's task id, a result for B's tool call.
func (tn *isoTenant) crossSeed(t *testing.T, other *isoTenant, at time.Time) []schema.Event {
	t.Helper()
	step := func() time.Time { at = at.Add(time.Second); return at }
	return []schema.Event{
		tn.event(t, schema.TypeMessageCreated, other.room2, tn.coder, nil, schema.MessageData{Content: tn.secret(tn.title + " posts in a foreign room " + tn.tag)}, step()),
		tn.event(t, schema.TypeUsageReported, other.room2, tn.coder, nil, schema.UsageData{InputTokens: 500, OutputTokens: 50}, step()),
		tn.event(t, schema.TypeToolCall, other.room2, tn.coder, nil, schema.ToolCallData{ToolName: "tool_" + tn.name + "_" + tn.tag, ToolCallID: tn.secret("call-x-" + tn.name + "-" + tn.tag)}, step()),
		tn.event(t, schema.TypeTaskCreated, other.room2, tn.lead, nil, schema.TaskData{TaskID: tn.secret("task-x-" + tn.name + "-" + tn.tag),
			Title: tn.secret(tn.title + " cross task " + tn.tag), Status: "in_progress", Assignee: other.writer.ID}, step()),
		tn.event(t, schema.TypeAttention, tn.room, tn.coder, nil, schema.MessageData{Content: tn.secret(tn.title + " asks a stranger " + tn.tag),
			Mentions: []schema.Mention{{ID: other.second.ID, Handle: tn.second.Handle}}}, step()),
		tn.event(t, schema.TypeTaskUpdated, other.room2, tn.lead, nil, schema.TaskData{TaskID: other.task, Title: tn.secret(tn.title + " hijacks a task " + tn.tag),
			Status: "done", Assignee: tn.coder.ID}, step()),
		tn.event(t, schema.TypeToolResult, other.room2, tn.coder, nil, schema.ToolResultData{ToolName: "tool_" + tn.name + "_" + tn.tag, ToolCallID: other.call,
			IsError: true}, step()),
	}
}

// live posts the tenant's live events (a task step, a request, an agent's message, a
// denied decision) and returns their ids.
func (tn *isoTenant) live(t *testing.T, srv *server, ingest, router string, at time.Time) []string {
	t.Helper()
	step := func() time.Time { at = at.Add(10 * time.Millisecond); return at }
	evs := []schema.Event{
		tn.event(t, schema.TypeTaskUpdated, tn.room, tn.lead, nil, schema.TaskData{TaskID: tn.task, Title: tn.taskTitle, Status: "blocked", Assignee: tn.coder.ID}, step()),
		tn.event(t, schema.TypeAttention, tn.room, tn.coder, nil, schema.MessageData{Content: tn.secret(tn.title + " live question " + tn.tag),
			Mentions: []schema.Mention{{ID: tn.lead.ID, Handle: tn.lead.Handle}}}, step()),
		tn.event(t, schema.TypeMessageCreated, tn.room, tn.coder, nil, schema.MessageData{Content: tn.secret(tn.title + " live message " + tn.tag)}, step()),
	}
	isoPost(t, srv, ingest, evs)
	var ids []string
	for _, e := range evs {
		ids = append(ids, e.ID)
	}
	d := isoDecide(t, srv, router, tn.coder.ID, tn.room, math.MaxInt64)
	require.False(t, d.Allow)
	tn.addDecision(d.DecisionID)
	ids = append(ids, d.DecisionID)
	tn.liveIDs = append(tn.liveIDs, ids...)
	// An estimate past the coder's soft budget: allowed, and budgetExceeded tells.
	d = isoDecide(t, srv, router, tn.coder.ID, tn.room, 150_000)
	require.True(t, d.Allow, "a soft budget never denies: %+v", d)
	tn.addDecision(d.DecisionID)
	return ids
}

// crossLive are A's live events reusing B's ids, posted with A's own ingest key.
func (tn *isoTenant) crossLive(t *testing.T, srv *server, ingest string, other *isoTenant, at time.Time) []string {
	t.Helper()
	step := func() time.Time { at = at.Add(10 * time.Millisecond); return at }
	evs := []schema.Event{
		tn.event(t, schema.TypeTaskCreated, other.room2, tn.lead, nil, schema.TaskData{TaskID: tn.secret("task-xl-" + tn.name + "-" + tn.tag),
			Title: tn.secret(tn.title + " live cross task " + tn.tag), Status: "in_progress", Assignee: other.writer.ID}, step()),
		tn.event(t, schema.TypeAttention, other.room2, tn.coder, nil, schema.MessageData{Content: tn.secret(tn.title + " asks a stranger live " + tn.tag),
			Mentions: []schema.Mention{{ID: other.second.ID, Handle: tn.second.Handle}}}, step()),
		tn.event(t, schema.TypeMessageCreated, other.room2, tn.coder, nil, schema.MessageData{Content: tn.secret(tn.title + " live in a foreign room " + tn.tag)}, step()),
	}
	isoPost(t, srv, ingest, evs)
	var ids []string
	for _, e := range evs {
		ids = append(ids, e.ID)
	}
	tn.liveIDs = append(tn.liveIDs, ids...)
	return ids
}

// isoPost posts events through the collector; every line must be accepted.
func isoPost(t *testing.T, srv *server, token string, evs []schema.Event) {
	t.Helper()
	lines := make([]string, len(evs))
	for i, e := range evs {
		b, err := json.Marshal(e)
		require.NoError(t, err)
		lines[i] = string(b)
	}
	var code int
	var ans collectorAnswer
	// An organization's key is answered 503 until the collector's directory has loaded.
	require.True(t, stacktest.Eventually(t, 30*time.Second, 200*time.Millisecond, func() bool {
		code, ans = srv.post(token, lines...)
		return code != http.StatusServiceUnavailable
	}), "the collector answered 503 for 30 s: %+v", ans)
	require.Equal(t, http.StatusOK, code, "%+v", ans)
	require.Equal(t, len(lines), ans.Accepted, "%+v", ans)
}

type isoDecision struct {
	DecisionID string `json:"decision_id"`
	Allow      bool   `json:"allow"`
	Reasons    []struct {
		Code string `json:"code"`
	} `json:"reasons"`
}

// isoDecide asks send_message for agent in room, with an estimate of tokens.
func isoDecide(t *testing.T, srv *server, router, agent, room string, tokens int64) isoDecision {
	t.Helper()
	body, err := json.Marshal(map[string]any{"agent": agent, "room": room, "tokens": tokens})
	require.NoError(t, err)
	code, out := srv.do(http.MethodPost, "/v1/decisions/send_message", router, "application/json", body)
	require.Equal(t, http.StatusOK, code, "%s", out)
	var d isoDecision
	require.NoError(t, json.Unmarshal(out, &d), "%s", out)
	return d
}

// isoWaitStored waits until ClickHouse holds every event id.
func isoWaitStored(t *testing.T, s *stack, ids []string) {
	t.Helper()
	var n uint64
	var err error
	ok := stacktest.Eventually(t, 30*time.Second, 200*time.Millisecond, func() bool {
		err = s.conn.QueryRow(context.Background(), "SELECT uniqExact(id) FROM "+s.db+".events WHERE has(?, id)", ids).Scan(&n)
		return err == nil && n == uint64(len(ids))
	})
	require.True(t, ok, "ClickHouse holds %d of the %d events posted (%v)", n, len(ids), err)
}

// isoWithout is list without the strings of drop.
func isoWithout(list, drop []string) []string {
	var out []string
	for _, s := range list {
		if !slices.Contains(drop, s) {
			out = append(out, s)
		}
	}
	return out
}

// isoFind returns the first of secrets that text contains, or "".
func isoFind(text string, secrets []string) string {
	for _, s := range secrets {
		if s != "" && strings.Contains(text, s) {
			return s
		}
	}
	return ""
}

func isoShort(b []byte) string {
	if len(b) > 1500 {
		return string(b[:1500]) + "…"
	}
	return string(b)
}

// isoAnswer is a GraphQL answer, with its raw text.
type isoAnswer struct {
	Data   json.RawMessage `json:"data"`
	Errors []isoError      `json:"errors"`
	raw    []byte
}

type isoError struct {
	Message    string         `json:"message"`
	Path       []any          `json:"path"`
	Extensions map[string]any `json:"extensions"`
}

func (e isoError) code() string { c, _ := e.Extensions["code"].(string); return c }

// hasCode says whether an error of field has code.
func (a isoAnswer) hasCode(field, code string) bool {
	for _, e := range a.Errors {
		if e.code() == code && len(e.Path) > 0 && e.Path[0] == field {
			return true
		}
	}
	return false
}

// fieldNull says whether the answer has no data for field.
func (a isoAnswer) fieldNull(field string) bool {
	var d map[string]json.RawMessage
	if len(a.Data) == 0 || string(a.Data) == "null" {
		return true
	}
	if json.Unmarshal(a.Data, &d) != nil {
		return false
	}
	v, ok := d[field]
	return !ok || string(v) == "null"
}

// isoAsk posts a GraphQL document.
func isoAsk(t *testing.T, srv *server, token, doc string) isoAnswer {
	t.Helper()
	body, err := json.Marshal(map[string]string{"query": doc})
	require.NoError(t, err)
	code, out := srv.do(http.MethodPost, "/graphql", token, "application/json", body)
	var a isoAnswer
	require.NoError(t, json.Unmarshal(out, &a), "%d %s\n%s", code, out, doc)
	a.raw = out
	return a
}

// The introspected schema.
type isoTypeRef struct {
	Kind   string      `json:"kind"`
	Name   string      `json:"name"`
	OfType *isoTypeRef `json:"ofType"`
}

func (r isoTypeRef) named() isoTypeRef {
	for r.OfType != nil {
		r = *r.OfType
	}
	return r
}

type isoValue struct {
	Name string     `json:"name"`
	Type isoTypeRef `json:"type"`
}

type isoFieldDef struct {
	Name string     `json:"name"`
	Args []isoValue `json:"args"`
	Type isoTypeRef `json:"type"`
}

type isoType struct {
	Kind        string        `json:"kind"`
	Name        string        `json:"name"`
	Fields      []isoFieldDef `json:"fields"`
	InputFields []isoValue    `json:"inputFields"`
	EnumValues  []struct {
		Name string `json:"name"`
	} `json:"enumValues"`
}

type isoSchema struct {
	QueryType, MutationType, SubscriptionType *struct {
		Name string `json:"name"`
	}
	Types []isoType `json:"types"`
	types map[string]isoType
	lits  isoLits // the values of the arguments every document gets
	// minimal are arguments the minimal document of a field adds, for a field that
	// needs one of several (delegation: an execution or a message).
	minimal map[string]map[string]string
}

// isoField is a root field and its operation (query, mutation, subscription).
type isoField struct {
	isoFieldDef
	op string
}

func (f isoField) hasArg(name string) bool {
	return slices.ContainsFunc(f.Args, func(v isoValue) bool { return v.Name == name })
}

const isoIntrospection = `query {
  __schema {
    queryType { name } mutationType { name } subscriptionType { name }
    types {
      kind name
      fields(includeDeprecated: true) { name args { name type { ...T } } type { ...T } }
      inputFields { name type { ...T } }
      enumValues(includeDeprecated: true) { name }
    }
  }
}
fragment T on __Type { kind name ofType { kind name ofType { kind name ofType { kind name ofType { kind name ofType { kind name } } } } } }`

func isoIntrospect(t *testing.T, srv *server, token string) *isoSchema {
	t.Helper()
	ans := isoAsk(t, srv, token, isoIntrospection)
	require.Empty(t, ans.Errors, "introspection: %s", isoShort(ans.raw))
	var d struct {
		Schema isoSchema `json:"__schema"`
	}
	require.NoError(t, json.Unmarshal(ans.Data, &d))
	sch := &d.Schema
	sch.types = map[string]isoType{}
	for _, ty := range sch.Types {
		sch.types[ty.Name] = ty
	}
	require.NotNil(t, sch.QueryType, "the schema has no query type")
	return sch
}

// roots lists the fields of Query, Mutation and Subscription.
func (x *isoSchema) roots(t *testing.T) []isoField {
	t.Helper()
	var out []isoField
	for _, r := range []struct {
		op  string
		typ *struct {
			Name string `json:"name"`
		}
	}{{"query", x.QueryType}, {"mutation", x.MutationType}, {"subscription", x.SubscriptionType}} {
		if r.typ == nil {
			continue
		}
		ty, ok := x.types[r.typ.Name]
		require.True(t, ok, "type %s is not in the schema's types", r.typ.Name)
		for _, f := range ty.Fields {
			out = append(out, isoField{f, r.op})
		}
	}
	return out
}

// isoLits are the values of the arguments every document gets.
type isoLits struct {
	from, to time.Time
	id       string // an id of A's, for required id arguments
}

// isoEnd says whether a time argument ends a range.
func isoEnd(arg string) bool {
	l := strings.ToLower(arg)
	return l == "to" || strings.HasSuffix(l, "to") || strings.Contains(l, "until") || strings.Contains(l, "end")
}

// literal is a minimal valid value of type r for argument arg.
func (x *isoSchema) literal(r isoTypeRef, arg string, depth int) string {
	l := x.lits
	switch r.Kind {
	case "NON_NULL":
		return x.literal(*r.OfType, arg, depth)
	case "LIST":
		return "[" + x.literal(*r.OfType, arg, depth) + "]"
	case "ENUM":
		return x.types[r.Name].EnumValues[0].Name
	case "INPUT_OBJECT":
		var parts []string
		for _, f := range x.types[r.Name].InputFields {
			if f.Type.Kind == "NON_NULL" && depth < 5 {
				parts = append(parts, f.Name+": "+x.literal(f.Type, f.Name, depth+1))
			}
		}
		return "{" + strings.Join(parts, ", ") + "}"
	}
	switch r.Name {
	case "Time":
		if isoEnd(arg) {
			return isoQuote(l.to.Format(time.RFC3339))
		}
		return isoQuote(l.from.Format(time.RFC3339))
	case "ID":
		return isoQuote(l.id)
	case "Int", "Int64":
		return "10"
	case "Float":
		return "1.5"
	case "Boolean":
		return "false"
	}
	return isoQuote("x")
}

func isoQuote(s string) string { b, _ := json.Marshal(s); return string(b) }

// selection selects every scalar and enum field of type name, and the object fields
// down to depth levels.
func (x *isoSchema) selection(name string, depth int) string {
	ty := x.types[name]
	switch ty.Kind {
	case "SCALAR", "ENUM":
		return ""
	case "UNION", "INTERFACE":
		return "{ __typename }"
	}
	var parts []string
	for _, f := range ty.Fields {
		args := x.args(f, nil)
		switch n := f.Type.named(); n.Kind {
		case "SCALAR", "ENUM":
			parts = append(parts, f.Name+args)
		case "OBJECT", "UNION", "INTERFACE":
			if depth > 1 {
				parts = append(parts, f.Name+args+" "+x.selection(n.Name, depth-1))
			}
		}
	}
	if len(parts) == 0 {
		parts = []string{"__typename"}
	}
	return "{ " + strings.Join(parts, " ") + " }"
}

// args renders the required arguments of f, the time range and a small limit, with
// extra overriding (or adding) some.
func (x *isoSchema) args(f isoFieldDef, extra map[string]string) string {
	var parts []string
	for _, a := range f.Args {
		v, ok := extra[a.Name]
		switch {
		case ok:
		case a.Name == "orgId":
			continue
		case a.Type.Kind == "NON_NULL":
			v = x.literal(a.Type, a.Name, 0)
		case a.Type.named().Name == "Time":
			v = x.literal(a.Type, a.Name, 0)
		case a.Name == "limit" && a.Type.named().Name == "Int":
			v = "50" // lists stay under the complexity limit
		default:
			continue
		}
		parts = append(parts, a.Name+": "+v)
	}
	if len(parts) == 0 {
		return ""
	}
	return "(" + strings.Join(parts, ", ") + ")"
}

// isoVariant is one way of asking a field: its arguments beyond the minimal ones, and
// the ids of B's it passes (an answer may echo them).
type isoVariant struct {
	name   string
	args   map[string]string
	passed []string
}

// variants are the minimal document first, then: each id argument with each of B's
// ids, each enum argument with each value (a list one also with all), each input
// object with B's ids in its id lists.
func (x *isoSchema) variants(f isoField, bIDs []string) []isoVariant {
	vs := []isoVariant{{name: "minimal", args: x.minimal[f.Name]}}
	for _, a := range f.Args {
		if a.Name == "orgId" {
			continue
		}
		n := a.Type.named()
		list := strings.Contains(isoTypeString(a.Type), "[")
		switch {
		case n.Kind == "SCALAR" && n.Name == "ID":
			for _, id := range bIDs {
				v := isoQuote(id)
				if list {
					v = "[" + v + "]"
				}
				vs = append(vs, isoVariant{name: a.Name + "=" + id, args: map[string]string{a.Name: v}, passed: []string{id}})
			}
		case n.Kind == "ENUM":
			var all []string
			for _, e := range x.types[n.Name].EnumValues {
				all = append(all, e.Name)
				v := e.Name
				if list {
					v = "[" + v + "]"
				}
				vs = append(vs, isoVariant{name: a.Name + "=" + e.Name, args: map[string]string{a.Name: v}})
			}
			if list {
				vs = append(vs, isoVariant{name: a.Name + "=all", args: map[string]string{a.Name: "[" + strings.Join(all, ", ") + "]"}})
			}
		case n.Kind == "INPUT_OBJECT":
			var parts []string
			for _, in := range x.types[n.Name].InputFields {
				if in.Type.named().Name == "ID" && strings.Contains(isoTypeString(in.Type), "[") {
					var ids []string
					for _, id := range bIDs {
						ids = append(ids, isoQuote(id))
					}
					parts = append(parts, in.Name+": ["+strings.Join(ids, ", ")+"]")
				}
			}
			if len(parts) > 0 {
				vs = append(vs, isoVariant{name: a.Name + " with B's ids", args: map[string]string{a.Name: "{" + strings.Join(parts, ", ") + "}"}, passed: bIDs})
			}
		}
	}
	return vs
}

func isoTypeString(r isoTypeRef) string {
	switch r.Kind {
	case "NON_NULL":
		return isoTypeString(*r.OfType) + "!"
	case "LIST":
		return "[" + isoTypeString(*r.OfType) + "]"
	}
	return r.Name
}

// document is the operation asking f as variant v, aimed at org when org is not "".
func (x *isoSchema) document(f isoField, v isoVariant, org string) string {
	extra := map[string]string{}
	for k, val := range v.args {
		extra[k] = val
	}
	if org != "" {
		extra["orgId"] = isoQuote(org)
	}
	return f.op + " { " + f.Name + x.args(f.isoFieldDef, extra) + " " + x.selection(f.Type.named().Name, 4) + " }"
}

// isoDocumentedRoles reads graph/README.md's table of roles: field → roles, in the
// order of isoRoles.
func isoDocumentedRoles(t *testing.T) map[string][]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(stacktest.RepoRoot(), "graph", "README.md"))
	require.NoError(t, err)
	out := map[string][]string{}
	tick := regexp.MustCompile("`([A-Za-z_]+)`")
	in := false
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "| field | roles |") {
			in = true
			continue
		}
		if !in {
			continue
		}
		if !strings.HasPrefix(line, "|") {
			break
		}
		cols := strings.Split(line, "|")
		if len(cols) < 4 || strings.HasPrefix(strings.TrimSpace(cols[1]), "---") {
			continue
		}
		var roles []string
		for _, r := range isoRoles {
			for _, c := range strings.Split(cols[2], ",") {
				if strings.TrimSpace(c) == string(r) {
					roles = append(roles, string(r))
				}
			}
		}
		for _, m := range tick.FindAllStringSubmatch(cols[1], -1) {
			out[m[1]] = roles
		}
	}
	require.NotEmpty(t, out, "graph/README.md has no table of roles (| field | roles |)")
	return out
}

// isoMsgCode says whether a subscription message carries an error with code.
func isoMsgCode(m wsclient.Message, code string) bool {
	for _, e := range m.Errors {
		if e.Code() == code {
			return true
		}
	}
	return false
}

// isoNull says whether a subscription message carries no data.
func isoNull(data json.RawMessage) bool {
	d := strings.TrimSpace(string(data))
	return d == "" || d == "null"
}

// isoSub is one open subscription and what it has received.
type isoSub struct {
	name, field string
	role        string // of A's key, for the subscriptions that find the field's roles
	ch          <-chan wsclient.Message
	msgs        []wsclient.Message
	own         *isoTenant // whose key subscribed
	passed      []string   // B's ids in its arguments
	variant     bool
}

func (s *isoSub) drain() {
	for {
		select {
		case m, ok := <-s.ch:
			if !ok {
				return
			}
			s.msgs = append(s.msgs, m)
		default:
			return
		}
	}
}

// refused says whether the server refused the subscription as FORBIDDEN.
func (s *isoSub) refused() bool {
	return slices.ContainsFunc(s.msgs, func(m wsclient.Message) bool { return isoMsgCode(m, "FORBIDDEN") })
}

func (s *isoSub) text() string {
	var b strings.Builder
	for _, m := range s.msgs {
		b.Write(m.Data)
	}
	return b.String()
}

func (s *isoSub) carries(id string) bool { return strings.Contains(s.text(), isoQuote(id)) }
