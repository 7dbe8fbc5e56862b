package simulate

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/pricing"
)

// The world: organizations, people, agents and rooms, all drawn from the seed.

type user struct {
	ID, Handle, Name, OrgID string
	agents                  []*agent
}

type agent struct {
	ID, Handle, Slug, Name, Description string
	Model                               string
	Owner                               *user
	PersonalRegistryAccess              bool
	SharedWithOrg, Global, Listed       bool
	reasoning                           bool // the model reports reasoning tokens
	chatty                              bool
}

// party is a room participant: a person or an agent.
type party struct {
	id, name, handle string
	kind             string // "User" | "Agent"
	ag               *agent
	us               *user
}

type sentMsg struct {
	id, content string
	sender      party
	mentions    []party
	inserted    time.Time
	chain       chain // the chain the message is part of: what an execution it starts continues
}

// chain is what the simulator knows of how an event came to be.
type chain struct {
	initiator schema.Party
	depth     int
	explicit  bool // every trigger from the root was sent
	ambiguous bool // see Truth.Ambiguous
}

type task struct {
	id, title, status string
	assignee          *agent
	owner             *user
	inserted          time.Time
}

type room struct {
	ID, Title string
	owner     *user
	members   []party // current participants, in order of joining
	removed   []party // former participants that may come back
	recent    []sentMsg
	tasks     []*task
	weight    int
}

func (r *room) agents() []party {
	var out []party
	for _, p := range r.members {
		if p.kind == "Agent" {
			out = append(out, p)
		}
	}
	return out
}

func (r *room) has(id string) bool {
	for _, p := range r.members {
		if p.id == id {
			return true
		}
	}
	return false
}

func userParty(u *user) party {
	return party{id: u.ID, name: u.Name, handle: u.Handle, kind: "User", us: u}
}

func agentParty(a *agent) party {
	return party{id: a.ID, name: a.Name, handle: a.Handle, kind: "Agent", ag: a}
}

// rnd wraps the seeded source with the helpers the generator needs.
type rnd struct{ *rand.Rand }

func newRnd(seed int64) rnd {
	return rnd{rand.New(rand.NewPCG(uint64(seed), 0x62616e64706c616e))} // "bandplan"
}

// uuid draws a version-4 UUID from the seeded source.
func (r rnd) uuid() string {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], r.Uint64())
	binary.LittleEndian.PutUint64(b[8:], r.Uint64())
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

const alnum = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"

func (r rnd) token(prefix string, n int) string {
	var b strings.Builder
	b.WriteString(prefix)
	for range n {
		b.WriteByte(alnum[r.IntN(len(alnum))])
	}
	return b.String()
}

func (r rnd) chance(p float64) bool { return r.Float64() < p }

// between is uniform in [lo, hi].
func (r rnd) between(lo, hi int) int { return lo + r.IntN(hi-lo+1) }

// logUniform is log-uniform in [lo, hi]: most values small, a long tail of large ones.
func (r rnd) logUniform(lo, hi int) int {
	v := math.Exp(math.Log(float64(lo)) + r.Float64()*(math.Log(float64(hi))-math.Log(float64(lo))))
	return int(math.Round(v))
}

func pick[T any](r rnd, s []T) T { return s[r.IntN(len(s))] }

var firstNames = []string{"Alex", "Priya", "Jonas", "Mei", "Carlos", "Fatima", "Noah", "Aiko", "Liam", "Sofia",
	"Omar", "Elena", "Kwame", "Hannah", "Ravi", "Chloe", "Mateo", "Ingrid", "Yusuf", "Grace", "Tomás", "Leila",
	"Sven", "Amara", "Diego", "Nadia", "Kenji", "Zoe", "Ivan", "Ana"}

var lastNames = []string{"Kim", "Shah", "Berg", "Chen", "Ruiz", "Haddad", "Walker", "Tanaka", "Murphy", "Rossi",
	"Farouk", "Petrova", "Mensah", "Schmidt", "Iyer", "Dubois", "Silva", "Larsen", "Demir", "Okafor", "Novak",
	"Costa", "Moreau", "Sato"}

type agentKind struct {
	name, description string
	tools             []string
	topics            []string
}

var agentKinds = []agentKind{
	{"Research Agent", "Finds and summarizes sources on a question", []string{"web_search", "fetch_url", "search_docs"}, []string{"vendor comparison", "rate-limit policies", "the RFC for idempotency keys"}},
	{"Support Agent", "Answers customer tickets and escalates the hard ones", []string{"search_tickets", "search_docs", "create_ticket"}, []string{"ticket #4821", "the refund backlog", "a customer's failed webhook"}},
	{"Billing Agent", "Reconciles invoices, usage and refunds", []string{"sql_query", "get_invoice", "issue_refund"}, []string{"the March invoices", "a double charge", "usage overages"}},
	{"Triage Agent", "Labels, deduplicates and routes incoming issues", []string{"search_issues", "label_issue", "assign_issue"}, []string{"the on-call queue", "duplicate bug reports", "flaky test reports"}},
	{"SQL Agent", "Writes and runs read-only analytics queries", []string{"sql_query", "describe_table"}, []string{"weekly active rooms", "token spend per org", "churned accounts"}},
	{"Docs Agent", "Keeps the developer docs accurate", []string{"read_file", "search_docs", "open_pull_request"}, []string{"the SDK quickstart", "the contacts guide", "the API changelog"}},
	{"Release Agent", "Prepares release notes and checks the release train", []string{"list_commits", "run_tests", "create_tag"}, []string{"release 2.14", "the hotfix branch", "the changelog"}},
	{"Security Agent", "Reviews dependencies and access policies", []string{"scan_dependencies", "read_file", "search_issues"}, []string{"a CVE in the HTTP client", "token scopes", "the audit log retention"}},
	{"QA Agent", "Writes test plans and runs the test suites", []string{"run_tests", "read_file", "create_ticket"}, []string{"the retry tests", "the login flow", "a regression in exports"}},
	{"Scheduler Agent", "Books meetings and keeps calendars in order", []string{"list_events", "create_event"}, []string{"the design review", "the quarterly planning", "an interview loop"}},
	{"Translator Agent", "Translates product copy and support replies", []string{"translate", "search_docs"}, []string{"the German release notes", "a Japanese support reply", "the pricing page"}},
	{"Data Agent", "Builds dashboards and explains metric changes", []string{"sql_query", "create_chart"}, []string{"the conversion dip", "latency percentiles", "the cost dashboard"}},
}

var roomTopics = []string{"Billing Migration", "Incident 2291 Review", "Q3 Planning", "Support Escalations", "Release Train",
	"Docs Refresh", "Security Review", "Customer Onboarding", "Data Quality", "Pricing Page Copy", "Flaky Tests",
	"Partner Integration", "On-call Handoff", "Churn Analysis", "Localization"}

// preferredModels are the catalog's models agents are given, most popular first
// (drawn with these weights); any other catalog model is drawn rarely.
var preferredModels = []struct {
	model  string
	weight int
}{
	{"claude-sonnet-4-5", 20}, {"gpt-5.4-mini", 14}, {"gpt-5", 10}, {"gpt-5-mini", 10}, {"claude-haiku-4-5", 8},
	{"claude-opus-4-5", 5}, {"gpt-4.1", 6}, {"gpt-4o", 5}, {"o3", 3}, {"o4-mini", 4}, {"gemini-2.5-pro", 6},
	{"gemini-2.5-flash", 8},
}

// reasoningModel reports whether a model reports reasoning tokens (inside its output).
func reasoningModel(m string) bool {
	return strings.HasPrefix(m, "gpt-5") || strings.HasPrefix(m, "o3") || strings.HasPrefix(m, "o4") ||
		strings.HasPrefix(m, "gemini-2.5") || strings.HasPrefix(m, "gemini-3") || strings.HasPrefix(m, "claude-opus")
}

func drawModel(r rnd, cat *pricing.Catalog) string {
	if r.chance(0.1) {
		return pick(r, cat.Models())
	}
	total := 0
	for _, m := range preferredModels {
		total += m.weight
	}
	n := r.IntN(total)
	for _, m := range preferredModels {
		if n < m.weight {
			if _, ok := cat.Lookup(m.model); ok {
				return m.model
			}
			break
		}
		n -= m.weight
	}
	return pick(r, cat.Models())
}

func slugify(name string) string {
	var b strings.Builder
	dash := false
	for _, c := range strings.ToLower(name) {
		switch {
		case c >= 'a' && c <= 'z' || c >= '0' && c <= '9':
			b.WriteRune(c)
			dash = false
		case !dash && b.Len() > 0:
			b.WriteByte('-')
			dash = true
		}
	}
	return strings.TrimRight(b.String(), "-")
}

// asciiFold drops accents from the names used here, for handles.
var asciiFold = strings.NewReplacer("á", "a", "é", "e", "í", "i", "ó", "o", "ú", "u", "ñ", "n")

// world is the directory plus the rooms.
type world struct {
	orgs    []string
	users   []*user // in registration order
	agents  []*agent
	rooms   []*room
	handles map[string]bool
	webhook *room
	cast    struct {
		owner, partner                                      *user
		architect, coder, reviewer, partnerReviewer, chatty *agent
	}
	catalog  *pricing.Catalog
	kindOf   map[*agent]agentKind
	contacts map[[2]string]bool // approved, either direction
}

func (w *world) newUser(r rnd, org, name, handle string) *user {
	base := handle
	for i := 2; w.handles[handle]; i++ {
		handle = fmt.Sprintf("%s%d", base, i)
	}
	w.handles[handle] = true
	u := &user{ID: r.uuid(), Handle: handle, Name: name, OrgID: org}
	w.users = append(w.users, u)
	return u
}

func (w *world) newAgent(r rnd, owner *user, kind agentKind, name string) *agent {
	slug := slugify(name)
	base := slug
	for i := 2; w.handles[owner.Handle+"/"+slug]; i++ {
		slug = fmt.Sprintf("%s-%d", base, i)
	}
	h := owner.Handle + "/" + slug
	w.handles[h] = true
	a := &agent{
		ID: r.uuid(), Handle: h, Slug: slug, Name: name, Description: kind.description, Owner: owner,
		Model:                  drawModel(r, w.catalog),
		PersonalRegistryAccess: r.chance(0.85),
		SharedWithOrg:          r.chance(0.3),
		Global:                 r.chance(0.06),
		Listed:                 r.chance(0.6),
	}
	a.reasoning = reasoningModel(a.Model)
	owner.agents = append(owner.agents, a)
	w.agents = append(w.agents, a)
	w.kindOf[a] = kind
	return a
}

// buildWorld draws the directory and the rooms. The cast of the "Webhook Retries"
// tutorial (owner, Architect/Coder/Reviewer Agent, the partner account's Reviewer
// Agent) and the talkative Status Agent come on top of the generated accounts.
func buildWorld(r rnd, cfg Config, cat *pricing.Catalog) *world {
	w := &world{handles: map[string]bool{}, catalog: cat, kindOf: map[*agent]agentKind{}, contacts: map[[2]string]bool{}}
	for range cfg.Orgs {
		w.orgs = append(w.orgs, r.uuid())
	}
	// The tutorial's cast.
	owner := w.newUser(r, w.orgs[0], "Maya Lindqvist", "maya")
	partnerOrg := w.orgs[min(1, len(w.orgs)-1)]
	partner := w.newUser(r, partnerOrg, "Partner Account", "partner")
	w.cast.owner, w.cast.partner = owner, partner
	mk := func(o *user, name, desc, model string, tools []string, topics []string) *agent {
		a := w.newAgent(r, o, agentKind{name, desc, tools, topics}, name)
		a.Model, a.reasoning = model, reasoningModel(model)
		a.PersonalRegistryAccess, a.Global, a.SharedWithOrg, a.Listed = true, false, false, true
		return a
	}
	webhookTopics := []string{"the retry backoff", "the webhook signature check", "the dead-letter queue", "retry limits"}
	w.cast.architect = mk(owner, "Architect Agent", "Designs changes and writes the requirements for them", "gpt-5.4-mini",
		[]string{"band_lookup_peers", "search_docs", "read_file"}, webhookTopics)
	w.cast.coder = mk(owner, "Coder Agent", "Writes and updates code for the requested change", "claude-sonnet-4-5",
		[]string{"read_file", "write_file", "run_tests"}, webhookTopics)
	w.cast.reviewer = mk(owner, "Reviewer Agent", "Reviews proposed code changes for correctness and clarity", "gpt-5.4-mini",
		[]string{"read_file", "run_tests"}, webhookTopics)
	w.cast.partnerReviewer = mk(partner, "Reviewer Agent", "Reviews proposed code changes for correctness and clarity", "gpt-5.4-mini",
		[]string{"read_file", "run_tests"}, webhookTopics)
	w.cast.chatty = mk(owner, "Status Agent", "Posts progress digests for every room it is in", "gpt-5-mini",
		[]string{"list_commits", "search_issues"}, []string{"today's progress", "open pull requests", "the build status"})
	w.cast.chatty.chatty = true

	// Generated accounts.
	for _, org := range w.orgs {
		for range cfg.OwnersPerOrg {
			first, last := pick(r, firstNames), pick(r, lastNames)
			u := w.newUser(r, org, first+" "+last, asciiFold.Replace(strings.ToLower(first+"."+last)))
			for range cfg.AgentsPerOwner {
				k := pick(r, agentKinds)
				w.newAgent(r, u, k, k.name)
			}
		}
	}

	// Rooms.
	w.webhook = &room{ID: r.uuid(), Title: "Webhook Retries", owner: owner, weight: 4}
	w.rooms = append(w.rooms, w.webhook)
	if cfg.Rooms >= 2 {
		w.rooms = append(w.rooms, &room{ID: r.uuid(), Title: "Status Digest", owner: owner, weight: 2})
	}
	titles := map[string]int{}
	generated := w.users[2:]
	for len(w.rooms) < cfg.Rooms {
		t := pick(r, roomTopics)
		titles[t]++
		if titles[t] > 1 {
			t = fmt.Sprintf("%s %d", t, titles[t])
		}
		w.rooms = append(w.rooms, &room{ID: r.uuid(), Title: t, owner: pick(r, generated), weight: 2})
	}
	return w
}

// initialMembers are a room's participants at its creation, the owner first.
func (w *world) initialMembers(r rnd, rm *room) []party {
	c := &w.cast
	switch {
	case rm == w.webhook:
		return []party{userParty(c.owner), agentParty(c.architect), agentParty(c.coder), agentParty(c.reviewer), agentParty(c.chatty)}
	case rm.owner == c.owner && rm.Title == "Status Digest":
		return []party{userParty(c.owner), agentParty(c.chatty), agentParty(c.architect)}
	}
	ps := []party{userParty(rm.owner)}
	own := append([]*agent(nil), rm.owner.agents...)
	r.Shuffle(len(own), func(i, j int) { own[i], own[j] = own[j], own[i] })
	for _, a := range own[:min(len(own), r.between(1, 3))] {
		ps = append(ps, agentParty(a))
	}
	if r.chance(0.5) {
		if a := w.peerFor(r, rm.owner, rm); a != nil {
			ps = append(ps, agentParty(a))
		}
	}
	if len(ps) < 3 && r.chance(0.5) {
		// a colleague from the same organization
		for range 5 {
			u := pick(r, w.users)
			if u != rm.owner && u.OrgID == rm.owner.OrgID {
				ps = append(ps, userParty(u))
				break
			}
		}
	}
	return ps
}

// peerFor draws an agent of another owner that the owner may add: global, shared with
// the owner's organization, or a contact of one of the owner's agents.
func (w *world) peerFor(r rnd, owner *user, rm *room) *agent {
	for range 20 {
		a := pick(r, w.agents)
		if a.Owner == owner || a.chatty || (rm != nil && rm.has(a.ID)) {
			continue
		}
		if w.reachable(owner, a) {
			return a
		}
	}
	return nil
}

// reachable says whether an owner's agents may work with agent a of another owner: a
// is global, shared with the owner's organization, or an approved contact of one of
// the owner's agents.
func (w *world) reachable(owner *user, a *agent) bool {
	if a.Global || (a.SharedWithOrg && a.Owner.OrgID == owner.OrgID) {
		return true
	}
	for _, mine := range owner.agents {
		if w.contacts[pairKey(mine.ID, a.ID)] {
			return true
		}
	}
	return false
}

// mayHandOver says whether agent a may hand work over to agent b by mentioning it: b
// has the same owner, or is reachable by a's owner.
func (w *world) mayHandOver(a, b *agent) bool {
	return a != b && !b.chatty && (a.Owner == b.Owner || w.reachable(a.Owner, b))
}

func pairKey(a, b string) [2]string {
	if a > b {
		a, b = b, a
	}
	return [2]string{a, b}
}
