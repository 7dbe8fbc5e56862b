package main

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/stacktest"
	"github.com/bandplane/bandplane/policy"
	"github.com/bandplane/bandplane/schema/keys"
)

// isoMutation says how the isolation test asks one mutation: a document acting on a
// tenant's own objects, one acting (without orgId) on the other tenant's, and what must
// hold before each (prepare, as the tenant's admin). A mutation added to the schema
// without an entry here fails the test by name.
type isoMutation struct {
	own     func(tn *isoTenant) string               // acts on tn's own objects
	foreign func(tn, other *isoTenant) string        // tn's key acting on other's objects
	prepare func(t *testing.T, tn *isoTenant) string // a document run first as tn's admin ("" = none)
	// platform: every organization's key is refused; a platform key of the documented
	// role does it (prices are every organization's).
	platform bool
	// ownData: the answer carries the tenant's own ids (false: it carries nothing of
	// any tenant, e.g. a job id the test could not know).
	ownData bool
	// retry: the mutation may be refused for a while for a reason of its own (the
	// reprice queue's share of a key or an organization): retried for up to 30 s.
	retry bool
}

func isoMutations(from, to time.Time, bundle string) map[string]isoMutation {
	rng := `from: "` + from.Format(time.RFC3339) + `", to: "` + to.Format(time.RFC3339) + `"`
	setWriter := func(tn *isoTenant) string {
		return `mutation { setBudget(budget: {scope: AGENT, scopeId: "` + tn.writer.ID + `", period: MONTH, tokens: 999999999, mode: SOFT}) { id scopeId scopeName } }`
	}
	return map[string]isoMutation{
		"setBudget": {own: setWriter, ownData: true,
			foreign: func(tn, o *isoTenant) string {
				return `mutation { setBudget(budget: {scope: AGENT, scopeId: "` + o.writer.ID + `", period: MONTH, tokens: 5, mode: HARD}) { id scopeId scopeName } }`
			}},
		"deleteBudget": {ownData: true,
			prepare: func(_ *testing.T, tn *isoTenant) string { return setWriter(tn) },
			own: func(tn *isoTenant) string {
				return `mutation { deleteBudget(id: "` + isoBudgetID(tn) + `") { id scopeId } }`
			},
			foreign: func(tn, o *isoTenant) string {
				return `mutation { deleteBudget(id: "` + isoBudgetID(o) + `") { id scopeId } }`
			}},
		"suspendAgent": {ownData: true,
			own: func(tn *isoTenant) string {
				return `mutation { suspendAgent(agentId: "` + tn.writer.ID + `", reason: "isolation") { agentId agentHandle suspended eventIds } }`
			},
			foreign: func(tn, o *isoTenant) string {
				return `mutation { suspendAgent(agentId: "` + o.writer.ID + `") { agentId agentHandle suspended } }`
			}},
		"resumeAgent": {ownData: true,
			prepare: func(_ *testing.T, tn *isoTenant) string {
				return `mutation { suspendAgent(agentId: "` + tn.writer.ID + `") { suspended } }`
			},
			own: func(tn *isoTenant) string {
				return `mutation { resumeAgent(agentId: "` + tn.writer.ID + `") { agentId agentHandle suspended eventIds } }`
			},
			foreign: func(tn, o *isoTenant) string {
				return `mutation { resumeAgent(agentId: "` + o.writer.ID + `") { agentId agentHandle suspended } }`
			}},
		"upsertPrice": {platform: true,
			own: func(tn *isoTenant) string {
				return `mutation { upsertPrice(price: {model: "iso-priced-` + tn.tag + `", input: "1.5", output: "6"}) { model input output currency catalogVersion } }`
			},
			foreign: func(tn, o *isoTenant) string {
				return `mutation { upsertPrice(price: {model: "` + o.unpriced + `", input: "1", output: "1"}) { model } }`
			}},
		"startPolicyReplay": {retry: true, ownData: true,
			own: func(tn *isoTenant) string {
				return `mutation { startPolicyReplay(bundle: "` + bundle + `", ` + rng + `) { id orgId scoped state } }`
			},
			foreign: func(tn, o *isoTenant) string {
				return `mutation { startPolicyReplay(bundle: "` + bundle + `", ` + rng + `) { id orgId scoped } }`
			}},
		"reprice": {retry: true,
			own: func(tn *isoTenant) string { return `mutation { reprice(` + rng + `) { id kind state daysTotal } }` },
			foreign: func(tn, o *isoTenant) string {
				return `mutation { reprice(` + rng + `) { id kind state } }`
			}},
	}
}

func isoBudgetID(tn *isoTenant) string {
	return policy.BudgetID(tn.org, policy.ScopeAgent, tn.writer.ID, policy.PeriodMonth)
}

// isoMutationChecks is part (d): every mutation of the schema, with the checks of the
// queries: the roles of graph/README.md, FORBIDDEN when aimed at B (or '*'), refused
// and silent when A names B's objects, and each side's own answer free of the other's.
func isoMutationChecks(t *testing.T, srv *server, muts []isoField, a, b *isoTenant, aKeys map[keys.Role]string, bAdmin, platformAdmin string,
	documented map[string][]string, exercised map[string][]string, problem func(string, ...any)) {
	t.Helper()
	table := isoMutations(time.Now().UTC().Add(-48*time.Hour), time.Now().UTC(), tarFS(t, policy.DefaultBundle()))
	keyOf := map[*isoTenant]string{a: aKeys[keys.RoleAdmin], b: bAdmin}
	notForA := isoWithout(b.own, b.reusedIDs())
	ask := func(m isoMutation, field, token, doc string) isoAnswer {
		ans := isoAsk(t, srv, token, doc)
		if m.retry && len(ans.Errors) > 0 && !ans.hasCode(field, "FORBIDDEN") {
			stacktest.Eventually(t, 30*time.Second, 500*time.Millisecond, func() bool {
				ans = isoAsk(t, srv, token, doc)
				return len(ans.Errors) == 0
			})
		}
		return ans
	}
	prepare := func(m isoMutation, tn *isoTenant) {
		if m.prepare != nil {
			ans := isoAsk(t, srv, keyOf[tn], m.prepare(t, tn))
			require.Empty(t, ans.Errors, "prepare: %s", ans.raw)
		}
	}
	for _, f := range muts {
		key := "mutation " + f.Name
		m, ok := table[f.Name]
		if !ok {
			problem("%s is not in isoMutations: say how to ask it on one's own objects and on another organization's", key)
			continue
		}
		if !f.hasArg("orgId") {
			problem("%s has no orgId argument: it cannot be aimed at an organization", key)
		}
		// Roles.
		var allowed []string
		for _, r := range isoRoles {
			prepare(m, a)
			ans := ask(m, f.Name, aKeys[r], m.own(a))
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
			if m.platform {
				problem("%s as A's %s: an organization's key changed what every organization shares: %s", key, r, isoShort(ans.raw))
			}
			allowed = append(allowed, string(r))
			if leak := isoFind(string(ans.raw), notForA); leak != "" {
				problem("%s as A's %s: the answer carries B's %q: %s", key, r, leak, isoShort(ans.raw))
			}
		}
		if m.platform {
			ans := ask(m, f.Name, platformAdmin, m.own(a))
			if len(ans.Errors) > 0 || ans.fieldNull(f.Name) {
				problem("%s as the platform's admin: %s", key, isoShort(ans.raw))
			} else {
				allowed = []string{string(keys.RoleAdmin)}
			}
		}
		if len(allowed) == 0 {
			problem("%s: every role is FORBIDDEN: the field was not exercised", key)
			continue
		}
		t.Logf("%s: roles %s", key, strings.Join(allowed, ", "))
		if doc, ok := documented[f.Name]; !ok {
			problem("%s is not in graph/README.md's table of roles (it answers roles %v)", key, allowed)
		} else if !slices.Equal(doc, allowed) {
			problem("%s answers roles %v; graph/README.md documents %v", key, allowed, doc)
		}
		exercised[key] = append(exercised[key], "roles")

		// Each side's own answer, free of the other's.
		both := true
		for _, tn := range []*isoTenant{a, b} {
			if m.platform {
				break
			}
			other := a
			if tn == a {
				other = b
			}
			prepare(m, tn)
			ans := ask(m, f.Name, keyOf[tn], m.own(tn))
			if len(ans.Errors) > 0 || ans.fieldNull(f.Name) {
				problem("%s as %s's admin on its own objects: %s", key, tn.name, isoShort(ans.raw))
				both = false
				continue
			}
			if m.ownData && isoFind(string(ans.Data), tn.own) == "" {
				problem("%s as %s's admin: the answer carries none of its own ids: %s", key, tn.name, isoShort(ans.raw))
				both = false
			}
			forbidden := other.own
			if tn == a {
				forbidden = notForA
			}
			if leak := isoFind(string(ans.raw), forbidden); leak != "" {
				problem("%s as %s's admin: the answer carries the other's %q: %s", key, tn.name, leak, isoShort(ans.raw))
			}
		}
		if both {
			exercised[key] = append(exercised[key], "data on both sides")
		}

		// A names B's objects, without orgId: refused, and nothing of B's in the answer.
		prepare(m, b)
		first := aKeys[keys.Role(allowed[0])]
		if m.platform {
			first = aKeys[keys.RoleAdmin]
		}
		ans := ask(m, f.Name, first, m.foreign(a, b))
		refused := m.platform && ans.hasCode(f.Name, "FORBIDDEN") || ans.hasCode(f.Name, "BAD_USER_INPUT")
		ownOnly := f.Name == "reprice" || f.Name == "startPolicyReplay"
		if ownOnly {
			// It names no object: it acts on the key's own organization only.
			refused = len(ans.Errors) == 0 || ans.hasCode(f.Name, "BAD_USER_INPUT")
		}
		if !refused || (!ownOnly && !ans.fieldNull(f.Name)) {
			problem("%s naming B's objects as A's %s: want it refused (BAD_USER_INPUT) with no data, got %s", key, allowed[0], isoShort(ans.raw))
		}
		if leak := isoFind(string(ans.raw), isoWithout(notForA, b.argIDs())); leak != "" {
			problem("%s naming B's objects: the answer carries B's %q: %s", key, leak, isoShort(ans.raw))
		}
		exercised[key] = append(exercised[key], "no orgId")

		// Aimed at B or '*': FORBIDDEN for every role, never data.
		for _, aim := range []string{b.org, keys.PlatformOrg} {
			for _, r := range isoRoles {
				doc := strings.Replace(m.own(a), f.Name+"(", f.Name+`(orgId: "`+aim+`", `, 1)
				ans := isoAsk(t, srv, aKeys[r], doc)
				if !ans.hasCode(f.Name, "FORBIDDEN") || !ans.fieldNull(f.Name) {
					problem("%s(orgId: %q) as A's %s: want FORBIDDEN and no data, got %s", key, aim, r, isoShort(ans.raw))
				}
			}
		}
		exercised[key] = append(exercised[key], "orgId B")
	}
	// Nothing stays suspended.
	for _, tn := range []*isoTenant{a, b} {
		ans := isoAsk(t, srv, keyOf[tn], `mutation { resumeAgent(agentId: "`+tn.writer.ID+`") { suspended } }`)
		require.Empty(t, ans.Errors, "%s", ans.raw)
	}
}
