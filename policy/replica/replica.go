// Package replica keeps the policy directory and the day's spend current from the audit
// trail: on start it replays the governance events already in ClickHouse (agents,
// people, contacts, contact requests, room membership, suspensions, and the bindings of
// senders' identities to agents), loads the budgets
// ingest keeps and sums the month's usage, then
// follows the events topic from exactly where ClickHouse ends, as its own consumer
// group. A restart therefore never replays the topic from the beginning. With a
// limiter it also rebuilds the message rates and open reservations of the
// organizations it owns from the allowed send_message decisions of the trail
// (restore.go says how).
//
// It may import schema/ and its own folder's packages only; ingest/, policy/ and query/
// stand side by side and never import each other (deploy/layers).
package replica

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	kafkago "github.com/segmentio/kafka-go"
	"github.com/shopspring/decimal"

	"github.com/bandplane/bandplane/policy"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/directory"
	"github.com/bandplane/bandplane/schema/kafka"
	"github.com/bandplane/bandplane/schema/pricing"
	"github.com/bandplane/bandplane/schema/store"
)

// Config configures a Replica.
type Config struct {
	// Directory is the policies' directory, which the replica keeps: relations,
	// rooms, contacts and suspensions, and the agents and people Registrations holds.
	Directory *policy.Directory
	// Registrations is the process's directory of agents and people (schema/directory),
	// which the pipeline and the live reader apply registrations to as well; nil: one
	// of the replica's own. The replica alone applies the bindings to it.
	Registrations *directory.Directory
	Ledger        *policy.Ledger
	Catalog       pricing.Source
	Conn          driver.Conn
	Database      string
	Brokers       []string
	Topic         string
	GroupID       string // one group per policy process: every replica needs every partition
	Logger        *slog.Logger
	Now           func() time.Time

	// Limiter, when set, is rebuilt at start from the allowed send_message decisions
	// of the trail (ClickHouse, then the topic up to its end at start) made in the last
	// RestoreWindow before Started, of the organizations Owns says are this replica's,
	// and their open reservations (those of the Ledger's TTL) are reserved again. Nil:
	// both start empty.
	Limiter *policy.Limiter
	// Owns says whether this replica decides send_message for an organization (nil:
	// every one; policy/shard's Shards.Owns).
	Owns func(org string) bool
	// RestoreWindow is how far back decisions can still weigh on a rate: the largest
	// quota window of the policy data (default DefaultRestoreWindow).
	RestoreWindow time.Duration
	// Started is when this process began deciding nothing yet: decisions from then on
	// are its own, already in its limiter (default: New's clock).
	Started time.Time
	// Trail, when set, checks what the replica restores from ClickHouse against the
	// audit log (Trail); nil trusts ClickHouse, as a deployment without an audit key
	// must.
	Trail Trail
	// CatchUpTimeout bounds how long Run reads the topic's tail before it reports ready
	// (default DefaultCatchUpTimeout); past it, it serves with what it read, and says so.
	CatchUpTimeout time.Duration
}

// Defaults of Config.
const (
	DefaultRestoreWindow  = time.Hour
	DefaultCatchUpTimeout = 60 * time.Second
)

func (c *Config) Validate() error {
	var errs []error
	if c.Directory == nil || c.Ledger == nil || c.Catalog == nil {
		errs = append(errs, errors.New("replica: directory, ledger and catalog are required"))
	}
	return errors.Join(errs...)
}

// validateSources checks what Bootstrap and Run read from; Apply needs neither.
func (c *Config) validateSources() error {
	var errs []error
	if c.Conn == nil || c.Database == "" {
		errs = append(errs, errors.New("replica: no ClickHouse connection"))
	}
	if len(c.Brokers) == 0 || c.Topic == "" || c.GroupID == "" {
		errs = append(errs, errors.New("replica: kafka brokers, topic and group are required (--kafka, --topic, --policy-group)"))
	}
	return errors.Join(errs...)
}

// Replica applies governance events to the policy directory.
type Replica struct {
	cfg Config
	log *slog.Logger

	mu       sync.Mutex
	requests map[string][2]string // contact request id -> (from, to)

	// orphans is usage of agents the directory does not know yet (registrations and
	// usage travel on different partitions, so usage may come first), applied when the
	// agent registers; at most MaxOrphans events.
	orphans    map[string][]usage
	norphans   int
	orphanOrgs map[string]int

	recent recentIDs // usage event ids applied lately
	chains chains    // the initiators the trail's decisions named, by agent and execution

	restored restoreState // decisions restored into the limiter (restore.go)
}

// MaxOrphans bounds the usage events kept for agents not registered yet; beyond it,
// such usage counts against its organization only (when it names one).
const MaxOrphans = 10_000

func New(cfg Config) (*Replica, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Started.IsZero() {
		cfg.Started = cfg.Now()
	}
	if cfg.RestoreWindow <= 0 {
		cfg.RestoreWindow = DefaultRestoreWindow
	}
	if cfg.CatchUpTimeout <= 0 {
		cfg.CatchUpTimeout = DefaultCatchUpTimeout
	}
	if cfg.Owns == nil {
		cfg.Owns = func(string) bool { return true }
	}
	if cfg.Registrations == nil {
		cfg.Registrations = directory.New()
	}
	return &Replica{cfg: cfg, log: cfg.Logger.With("component", "policy-replica"), requests: map[string][2]string{},
		orphans: map[string][]usage{}, orphanOrgs: map[string]int{}}, nil
}

// Apply changes the directory (or the spend) for one event. Events of other types are
// ignored. Applying an event twice leaves the directory as applying it once.
func (r *Replica) Apply(ctx context.Context, ev *schema.Event) error {
	d := r.cfg.Directory
	switch ev.Type {
	case schema.TypeUserRegistered, schema.TypeAgentRegistered, schema.TypeAgentUpdated:
		row, err := r.cfg.Registrations.Apply(ev)
		if err != nil {
			return err
		}
		if err := r.project(ctx, row.ID); err != nil {
			return err
		}
		if row.Kind == directory.KindAgent {
			r.adopt(row.ID)
		}
		return nil
	case schema.TypeContactAdded:
		if other := subjectID(ev); ev.Actor.ID != "" && other != "" {
			return d.AddContact(ctx, ev.Actor.ID, other)
		}
	case schema.TypeContactRemoved:
		if other := subjectID(ev); ev.Actor.ID != "" && other != "" {
			return d.RemoveContact(ctx, ev.Actor.ID, other)
		}
	case schema.TypeContactRequestReceived, schema.TypeContactRequestUpdated:
		return r.contactRequest(ctx, ev)
	case schema.TypeParticipantAdded:
		if ev.RoomID != "" && subjectID(ev) != "" {
			return d.JoinRoom(ctx, ev.RoomID, subjectID(ev))
		}
	case schema.TypeParticipantRemoved:
		if ev.RoomID != "" && subjectID(ev) != "" {
			return d.LeaveRoom(ctx, ev.RoomID, subjectID(ev))
		}
	case schema.TypeRoomAdded:
		if ev.RoomID != "" && ev.Actor.ID != "" {
			return d.JoinRoom(ctx, ev.RoomID, ev.Actor.ID)
		}
	case schema.TypeRoomRemoved:
		if ev.RoomID != "" && ev.Actor.ID != "" {
			return d.LeaveRoom(ctx, ev.RoomID, ev.Actor.ID)
		}
	case schema.TypeRoomDeleted:
		if ev.RoomID != "" {
			return d.DeleteRoom(ctx, ev.RoomID)
		}
	case schema.TypeAgentSuspended, schema.TypeAgentResumed:
		// An operator's action, written by bandplane's policy API only (the collector
		// refuses these types from every client).
		if id := subjectID(ev); id != "" {
			return d.Suspend(ctx, id, ev.Type == schema.TypeAgentSuspended)
		}
	case schema.TypeAgentBound, schema.TypeAgentUnbound:
		return r.binding(ev)
	case schema.TypeBudgetSet, schema.TypeBudgetDeleted:
		return r.budget(ev)
	case schema.TypeUsageReported:
		return r.usage(ev)
	case schema.TypePolicyDecided:
		// Bandplane's own (the collector refuses the type from every client).
		if schema.OwnSource(ev.Source) {
			r.chains.remember(ev.Data)
		}
	}
	return nil
}

// binding applies an operator's binding of a sender's identity to an agent, or its
// removal, to the process's directory, where whatever attributes spans reads it
// (directory.Bound). Only bandplane writes binding events (the collector refuses the
// types from every client); one with another source is ignored all the same, since a
// binding decides which agent's budgets a sender's spans count against.
func (r *Replica) binding(ev *schema.Event) error {
	if !schema.OwnSource(ev.Source) {
		return fmt.Errorf("ignoring %s event %s from source %q: bindings come from bandplane only", ev.Type, ev.ID, ev.Source)
	}
	return r.cfg.Registrations.ApplyBinding(ev)
}

// budget applies a budget's change. Only bandplane's policy side writes budget events
// (the collector refuses budget.* from every client); one with another source is
// ignored all the same.
func (r *Replica) budget(ev *schema.Event) error {
	if !schema.OwnSource(ev.Source) {
		return fmt.Errorf("ignoring %s event %s from source %q: budgets come from bandplane only", ev.Type, ev.ID, ev.Source)
	}
	var b policy.Budget
	if err := unmarshal(ev, &b); err != nil {
		return err
	}
	b.Normalize()
	if err := b.Validate(); err != nil {
		return fmt.Errorf("invalid budget in %s event %s: %w", ev.Type, ev.ID, err)
	}
	if b.Org != ev.OrgID {
		return fmt.Errorf("budget of %s in an event of organization %s (event %s)", b.Org, ev.OrgID, ev.ID)
	}
	if ev.Type == schema.TypeBudgetDeleted {
		r.cfg.Ledger.Delete(b.ID, b.UpdatedAt)
		return nil
	}
	r.cfg.Ledger.Set(b, r.cfg.Now())
	return nil
}

// contactRequest tracks pending requests. The platform sends them on the recipient's
// channel (agent_contacts:<recipient>), naming the requester by handle.
func (r *Replica) contactRequest(ctx context.Context, ev *schema.Event) error {
	var c schema.ContactData
	if err := unmarshal(ev, &c); err != nil {
		return err
	}
	if c.RequestID == "" {
		return nil
	}
	r.mu.Lock()
	pair, known := r.requests[c.RequestID]
	r.mu.Unlock()
	if !known {
		from, ok := r.cfg.Directory.ResolveHandle(c.FromHandle)
		if !ok || ev.Actor.ID == "" {
			return nil // a requester we do not know cannot be a peer either
		}
		pair = [2]string{from, ev.Actor.ID}
		r.mu.Lock()
		r.requests[c.RequestID] = pair
		r.mu.Unlock()
	}
	if c.Status != "" && c.Status != "pending" {
		// Final: the request id is never looked up again, so it is not kept.
		r.mu.Lock()
		delete(r.requests, c.RequestID)
		r.mu.Unlock()
	}
	switch c.Status {
	case "", "pending":
		return r.cfg.Directory.SetPending(ctx, policy.PendingRequest{ID: c.RequestID, From: pair[0], To: pair[1]})
	case "approved":
		if err := r.cfg.Directory.ClearPending(ctx, pair[0], pair[1]); err != nil {
			return err
		}
		return r.cfg.Directory.AddContact(ctx, pair[0], pair[1])
	default: // rejected, cancelled: final
		return r.cfg.Directory.ClearPending(ctx, pair[0], pair[1])
	}
}

// usage adds usage of the current day and month to the spend the send_message budgets
// read, and settles the reservation of its execution. An event seen again (a client's
// retried POST, a redelivery) counts once.
func (r *Replica) usage(ev *schema.Event) error {
	now := r.cfg.Now().UTC()
	if ev.Time.Before(policy.PeriodStart(policy.PeriodMonth, now)) {
		return nil
	}
	var u schema.UsageData
	if err := unmarshal(ev, &u); err != nil {
		return err
	}
	if r.recent.seen(ev.OrgID, ev.ID) {
		return nil
	}
	u.Extra = nil
	o := usage{id: ev.ID, at: ev.Time, org: ev.OrgID, room: ev.RoomID, agent: ev.Actor.ID, execution: ev.ExecutionID, data: u}
	o.initiator, o.initiatorType = r.chains.initiator(o.agent, o.execution)
	r.charge(o, now)
	return nil
}

// usage is what the ledger needs of a usage report (kept for an agent not registered
// yet without the report's unknown fields). The initiator is the one the decisions of
// its execution named (chains): the canonical usage.reported carries no chain.
type usage struct {
	id, org, room, agent, execution string
	initiator, initiatorType        string
	at                              time.Time
	data                            schema.UsageData
}

func (r *Replica) charge(o usage, now time.Time) {
	a, known := r.cfg.Directory.Agent(o.agent)
	// An unbound OTLP sender never registers: its usage counts against its
	// organization at once.
	if !known && o.agent != "" && !strings.HasPrefix(o.agent, schema.UnboundSenderPrefix) && r.orphan(o, now) {
		return
	}
	u := o.data
	model := first(u.Model, a.Model)
	cost, _ := r.cfg.Catalog.Current().CostAt(model, o.at, u)
	org := first(o.org, a.Org)
	agent, owner, initiator := o.agent, a.Owner, o.initiator
	if a.Org != "" && org != a.Org {
		// Usage stamped with another organization than the agent's registration (an
		// org-scoped ingest key writing as an agent it does not own) counts against that
		// organization only, never against the agent's, its owner's or an initiator's
		// budgets.
		agent, owner, initiator = "", "", ""
	}
	ch := policy.Charge{Org: org, Owner: owner, Agent: agent, Room: o.room,
		Tokens: u.InputTokens + u.OutputTokens + u.CacheReadTokens + u.CacheWriteTokens, CostMicros: cost}
	if iorg, ok := r.cfg.Directory.InitiatorOrg(initiator, o.initiatorType, org); ok {
		ch.Initiator, ch.InitiatorOrg = initiator, iorg
	}
	r.cfg.Ledger.Spend(ch, o.execution, o.at, now)
}

// chains remembers, per agent and execution, the initiator that the allowed
// send_message decisions of the trail (policy.decided, every organization's) named in
// their input's chain, so that the execution's usage report counts against the
// initiator's budgets on every replica: the replica that took the decision also has it
// from the reservation the report settles (policy.Ledger.Spend), the others only from
// here. It keeps the latest maxChains executions.
type chains struct {
	mu   sync.Mutex
	m    map[string]chainRef
	ring []string
	next int
}

type chainRef struct{ initiator, typ string }

// maxChains bounds the executions chains remembers (about 100 bytes each).
const maxChains = 100_000

// chainOfDecision is what chains reads of a policy.decided event's data.
type chainOfDecision struct {
	Decision string `json:"decision"`
	Allow    bool   `json:"allow"`
	Input    struct {
		Agent       string `json:"agent"`
		ExecutionID string `json:"execution_id"`
		Chain       *struct {
			Initiator     string `json:"initiator"`
			InitiatorType string `json:"initiator_type"`
		} `json:"chain"`
	} `json:"input"`
}

var initiatorKey = []byte(`"initiator"`)

// remember notes the initiator of an allowed send_message decision's data, if it names
// one for an execution.
func (c *chains) remember(data []byte) {
	if !bytes.Contains(data, initiatorKey) { // most decisions: no chain, no decoding
		return
	}
	var d chainOfDecision
	if json.Unmarshal(data, &d) != nil || d.Decision != policy.SendMessage || !d.Allow ||
		d.Input.Agent == "" || d.Input.ExecutionID == "" || d.Input.Chain == nil || d.Input.Chain.Initiator == "" {
		return
	}
	k := d.Input.Agent + "\x00" + d.Input.ExecutionID
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]chainRef{}
	}
	if _, ok := c.m[k]; !ok {
		if len(c.ring) < maxChains {
			c.ring = append(c.ring, k)
		} else {
			delete(c.m, c.ring[c.next])
			c.ring[c.next] = k
			c.next = (c.next + 1) % maxChains
		}
	}
	c.m[k] = chainRef{d.Input.Chain.Initiator, d.Input.Chain.InitiatorType}
}

// initiator is the initiator remembered for agent's execution ("" if none).
func (c *chains) initiator(agent, execution string) (id, typ string) {
	if agent == "" || execution == "" {
		return "", ""
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	ref := c.m[agent+"\x00"+execution]
	return ref.initiator, ref.typ
}

// MaxOrphansPerOrg bounds the usage kept for one organization's unregistered agents,
// so that one organization cannot fill the buffer for every other; kept usage older
// than OrphanTTL is dropped (its agent never registered).
const (
	MaxOrphansPerOrg = 1_000
	OrphanTTL        = time.Hour
)

// orphan keeps usage of an unknown agent for when it registers; false when full (then
// it counts at once, against its organization only).
func (r *Replica) orphan(o usage, now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.norphans >= MaxOrphans/2 {
		for agent, list := range r.orphans { // forget what waited too long
			kept := slices.DeleteFunc(list, func(x usage) bool { return now.Sub(x.at) > OrphanTTL })
			r.norphans -= len(list) - len(kept)
			r.orphanOrgs[orgOf(list)] -= len(list) - len(kept)
			if len(kept) == 0 {
				delete(r.orphans, agent)
			} else {
				r.orphans[agent] = kept
			}
		}
	}
	if r.norphans >= MaxOrphans || r.orphanOrgs[o.org] >= MaxOrphansPerOrg {
		return false
	}
	r.orphans[o.agent] = append(r.orphans[o.agent], o)
	r.norphans++
	r.orphanOrgs[o.org]++
	return true
}

func orgOf(list []usage) string {
	if len(list) == 0 {
		return ""
	}
	return list[0].org
}

// adopt applies the usage kept for agent, now registered.
func (r *Replica) adopt(agent string) {
	r.mu.Lock()
	list := r.orphans[agent]
	delete(r.orphans, agent)
	r.norphans -= len(list)
	for _, o := range list {
		r.orphanOrgs[o.org]--
	}
	r.mu.Unlock()
	now := r.cfg.Now().UTC()
	for _, o := range list {
		r.charge(o, now)
	}
}

// recentIDs remembers the last recentSize usage events by organization and id, as
// 64-bit hashes with a seed of the process's own: a sender cannot pick an id that
// collides with another to have its usage go uncharged, and two organizations' equal
// ids (OTLP's come from span ids) are two reports.
type recentIDs struct {
	mu   sync.Mutex
	set  map[uint64]struct{}
	ring []uint64
	next int
}

const recentSize = 100_000

var recentSeed = maphash.MakeSeed()

func (s *recentIDs) seen(org, id string) bool {
	var h maphash.Hash
	h.SetSeed(recentSeed)
	_, _ = h.WriteString(org)
	_ = h.WriteByte(0)
	_, _ = h.WriteString(id)
	k := h.Sum64()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.set == nil {
		s.set, s.ring = make(map[uint64]struct{}, recentSize), make([]uint64, 0, recentSize)
	}
	if _, ok := s.set[k]; ok {
		return true
	}
	if len(s.ring) < recentSize {
		s.ring = append(s.ring, k)
	} else {
		delete(s.set, s.ring[s.next])
		s.ring[s.next] = k
		s.next = (s.next + 1) % recentSize
	}
	s.set[k] = struct{}{}
	return false
}

func unmarshal(ev *schema.Event, v any) error {
	if len(ev.Data) == 0 {
		return nil
	}
	// The decoder ingest validated the event with: another one could read other values
	// from the same bytes (see schema.CheckJSON).
	if err := schema.DecodeData(ev.Data, v); err != nil {
		return fmt.Errorf("cannot decode data of %s event %s: %w", ev.Type, ev.ID, err)
	}
	return nil
}

// project puts the newest registration of an agent or a person the process's directory
// holds into the policies' directory. Another reader of the process (the pipeline, the
// live reader) may have applied a newer one already: the policies see it now rather
// than when the replica reaches it.
func (r *Replica) project(ctx context.Context, id string) error {
	row, ok := r.cfg.Registrations.Registered(id)
	if !ok {
		return nil
	}
	if row.Kind == directory.KindUser {
		return r.cfg.Directory.UpsertPerson(ctx, policy.Person{ID: row.ID, Handle: policy.NormalizeHandle(row.Handle), Org: row.OrgID})
	}
	return r.cfg.Directory.UpsertAgent(ctx, policy.Agent{
		ID: row.ID, Handle: policy.NormalizeHandle(row.Handle), Owner: row.OwnerID, Org: row.OrgID, Model: row.Model,
		RegistryAccess: row.PersonalRegistryAccess, SharedWithOrg: row.SharedWithOrg, Global: row.Global,
		Listed: row.Listed, Suspended: row.Suspended,
	})
}

func subjectID(ev *schema.Event) string {
	if ev.Subject == nil {
		return ""
	}
	return ev.Subject.ID
}

func first(vs ...string) string {
	for _, v := range vs {
		if v != "" {
			return v
		}
	}
	return ""
}

// Trail is how the replica checks what it restores from ClickHouse (cmd/bandplane
// wires query/trail's Log and the checkpoints topic to it): Coverage is the newest
// signed coverage of the events topic (tlog.Coverage; ok false while nothing is
// covered), and Sealed says which rows are leaves of their organization's log under a
// verified checkpoint.
type Trail interface {
	Coverage(ctx context.Context) (offsets map[int]int64, ok bool, err error)
	Sealed(ctx context.Context, rows []store.EventRow) ([]bool, error)
}

// start is where the replica takes the trail from: the records of each partition
// below offsets from ClickHouse, the rest from the topic. With a Trail the offsets are
// the signed coverage and a row is taken from ClickHouse only if it is sealed (checked
// says so); without, ClickHouse is trusted and the offsets are where it ends.
type start struct {
	offsets map[int]int64
	checked bool
}

func (r *Replica) start(ctx context.Context) (start, error) {
	if r.cfg.Trail == nil {
		offsets, err := r.storedOffsets(ctx)
		return start{offsets: offsets}, err
	}
	offsets, ok, err := r.cfg.Trail.Coverage(ctx)
	if err != nil {
		return start{}, fmt.Errorf("cannot read the signed coverage of the trail: %w", err)
	}
	if !ok {
		// Nothing sealed yet: every record comes from the topic.
		r.log.Warn("no signed coverage of the trail yet (is a sealer running?): the policy state is read from the events topic only")
		offsets = map[int]int64{}
	}
	return start{offsets: offsets, checked: true}, nil
}

// below says whether the record at partition p and offset o lies below the start: in
// ClickHouse's part.
func (s start) below(p int32, o int64) bool { return o < s.offsets[int(p)] }

// keep filters rows read from ClickHouse, every copy of each (they are read without
// FINAL, which keeps a key's last inserted copy: a forged copy inserted after a sealed
// one would hide it): without a Trail all of them; with one, those below the coverage
// that the log seals. The others are counted in the log: rows only ClickHouse vouches
// for (written by hand), or, above the coverage, rows the topic brings again. Of the
// copies kept, the first of each key is.
func (r *Replica) keep(ctx context.Context, st start, rows []store.EventRow, what string) ([]bool, error) {
	out, err := r.sealedRows(ctx, st, rows, what)
	if err != nil {
		return nil, err
	}
	first := make(map[store.EventKey]bool, len(rows))
	for i := range rows {
		if !out[i] {
			continue
		}
		k := store.KeyOf(&rows[i])
		if first[k] {
			out[i] = false
		}
		first[k] = true
	}
	return out, nil
}

func (r *Replica) sealedRows(ctx context.Context, st start, rows []store.EventRow, what string) ([]bool, error) {
	out := make([]bool, len(rows))
	if !st.checked {
		for i := range out {
			out[i] = true
		}
		return out, nil
	}
	var idx []int
	var below []store.EventRow
	for i := range rows {
		if st.below(rows[i].Partition, rows[i].Offset) {
			idx, below = append(idx, i), append(below, rows[i])
		}
	}
	sealed, err := r.cfg.Trail.Sealed(ctx, below)
	if err != nil {
		return nil, fmt.Errorf("cannot check the %s ClickHouse holds against the audit log: %w", what, err)
	}
	refused := 0
	for j, i := range idx {
		if sealed[j] {
			out[i] = true
		} else {
			refused++
		}
	}
	if refused > 0 {
		r.log.Error("ignoring rows ClickHouse holds that no verified leaf of the audit log seals (audit verify names them)",
			"what", what, "rows", refused)
	}
	return out, nil
}

// governanceCols are what Bootstrap reads of a governance event: the event, and the
// row's every column, which Trail.Sealed checks against its leaf.
const governanceCols = `id, type, time, time_ms, org_id, room_id, actor_id, toString(actor_type), actor_handle, owner_id,
		subject_id, subject_type, subject_handle, execution_id, source, schema_version, data, ingested_at, kafka_partition, kafka_offset`

// eventOf is the event a stored row holds, as the replica applies it: without its
// source, so that budgets come from the budgets table (bootstrapBudgets), as the
// stream's bandplane events do not repeat them. Bindings keep theirs: binding applies
// only bandplane's, and a stored row's source is as sealed as the rest of it (keep).
func eventOf(row *store.EventRow) schema.Event {
	ev := schema.Event{ID: row.ID, Type: row.Type, Time: row.Time, OrgID: row.OrgID, RoomID: row.RoomID,
		Actor: schema.Party{ID: row.ActorID, Type: schema.ActorType(row.ActorType), Handle: row.ActorHandle},
		Data:  json.RawMessage(row.Data),
	}
	if row.Type == schema.TypeAgentBound || row.Type == schema.TypeAgentUnbound {
		ev.Source = row.Source
	}
	if row.SubjectID != "" {
		ev.Subject = &schema.Party{ID: row.SubjectID, Type: schema.ActorType(row.SubjectType), Handle: row.SubjectHandle}
	}
	return ev
}

// Bootstrap replays the governance events stored in ClickHouse below the start (start)
// in time order, adds the day's usage to the spend, and returns, per partition, where
// the stream must continue.
func (r *Replica) Bootstrap(ctx context.Context) (map[int]int64, error) {
	if err := r.cfg.validateSources(); err != nil {
		return nil, err
	}
	db, conn := r.cfg.Database, r.cfg.Conn
	began := time.Now()
	// The start first: what is stored after it is read again from the stream, and
	// every change applied below is safe to apply twice, except usage, whose sum reads
	// only the events before it.
	st, err := r.start(ctx)
	if err != nil {
		return nil, err
	}
	rows, err := conn.Query(ctx, `SELECT `+governanceCols+`
		FROM `+db+`.events WHERE has(?, type) ORDER BY time, time_ms, kafka_partition, kafka_offset`, schema.GovernanceTypes)
	if err != nil {
		return nil, fmt.Errorf("cannot read governance events from %s.events: %w", db, err)
	}
	var gov []store.EventRow
	for rows.Next() {
		var row store.EventRow
		var ms uint16
		if err := rows.Scan(&row.ID, &row.Type, &row.Time, &ms, &row.OrgID, &row.RoomID, &row.ActorID, &row.ActorType, &row.ActorHandle,
			&row.OwnerID, &row.SubjectID, &row.SubjectType, &row.SubjectHandle, &row.ExecutionID, &row.Source, &row.SchemaVersion,
			&row.Data, &row.IngestedAt, &row.Partition, &row.Offset); err != nil {
			rows.Close()
			return nil, fmt.Errorf("cannot read governance events from %s.events: %w", db, err)
		}
		row.Time = row.Time.UTC().Add(time.Duration(ms) * time.Millisecond)
		row.IngestedAt = row.IngestedAt.UTC()
		gov = append(gov, row)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	keep, err := r.keep(ctx, st, gov, "governance events")
	if err != nil {
		return nil, err
	}
	n := 0
	for i := range gov {
		if !keep[i] {
			continue
		}
		ev := eventOf(&gov[i])
		if err := r.Apply(ctx, &ev); err != nil {
			r.log.Warn("skipping a governance event that cannot be applied", "event_id", ev.ID, "err", err)
		}
		n++
	}
	if err := r.bootstrapBudgets(ctx); err != nil {
		return nil, err
	}
	if err := r.bootstrapSpend(ctx, st.offsets); err != nil {
		return nil, err
	}
	if err := r.bootstrapRates(ctx, st); err != nil {
		return nil, err
	}
	r.log.Info("directory bootstrapped from clickhouse", "governance_events", n, "checked_against_the_audit_log", st.checked,
		"took", time.Since(began).String(), "resume_offsets", fmt.Sprint(st.offsets))
	return st.offsets, nil
}

// storedOffsets is, per partition, the offset after the last record ClickHouse holds.
func (r *Replica) storedOffsets(ctx context.Context) (map[int]int64, error) {
	db, conn := r.cfg.Database, r.cfg.Conn
	offsets := map[int]int64{}
	orows, err := conn.Query(ctx, "SELECT kafka_partition, max(kafka_offset) FROM "+db+".events GROUP BY kafka_partition")
	if err != nil {
		return nil, fmt.Errorf("cannot read ingested offsets from %s.events: %w", db, err)
	}
	defer orows.Close()
	for orows.Next() {
		var p int32
		var o int64
		if err := orows.Scan(&p, &o); err != nil {
			return nil, err
		}
		offsets[int(p)] = o + 1
	}
	return offsets, orows.Err()
}

// bootstrapBudgets puts the budgets in force that ingest keeps in the budgets table
// (the latest change of each; deleted ones are not in force).
func (r *Replica) bootstrapBudgets(ctx context.Context) error {
	rows, err := store.New(r.cfg.Conn, r.cfg.Database).Budgets(ctx, "")
	if err != nil {
		return err
	}
	n := 0
	for _, row := range rows {
		if row.Deleted {
			continue
		}
		ev := schema.Event{ID: row.EventID, Type: schema.TypeBudgetSet, OrgID: row.OrgID, Source: schema.SourceBandplane, Data: json.RawMessage(row.Data)}
		if err := r.budget(&ev); err != nil {
			r.log.Warn("skipping a stored budget that cannot be applied", "budget_id", row.BudgetID, "err", err)
			continue
		}
		n++
	}
	r.log.Info("budgets loaded from clickhouse", "budgets", n)
	return nil
}

func (r *Replica) bootstrapSpend(ctx context.Context, offsets map[int]int64) error {
	now := r.cfg.Now().UTC()
	day, month := policy.PeriodStart(policy.PeriodDay, now), policy.PeriodStart(policy.PeriodMonth, now)
	// Today and yesterday from the usage rows of the events stored before the offsets
	// (the stream brings the rest; the rollups may lag by their interval, more so just
	// after midnight), the days of the month before them from the daily rollup.
	// Crossings of restored spend were reported when they happened.
	r.cfg.Ledger.Quiet(true)
	defer r.cfg.Ledger.Quiet(false)
	recent := day.AddDate(0, 0, -1)
	if recent.Before(month) {
		recent = month
	}
	var stored []string
	for _, p := range slices.Sorted(maps.Keys(offsets)) {
		stored = append(stored, fmt.Sprintf("(kafka_partition = %d AND kafka_offset < %d)", p, offsets[p]))
	}
	if len(stored) > 0 {
		// With the chain ingest linked each usage row to (schema/cause): its initiator.
		q := `SELECT org_id, owner_id, agent_id, room_id, initiator_id, initiator_type,
			sum(input_tokens + output_tokens + cache_read_tokens + cache_write_tokens), sum(cost), max(time)
			FROM ` + r.cfg.Database + `.usage FINAL WHERE time >= ? AND time < ?
			AND event_id IN (SELECT id FROM ` + r.cfg.Database + `.events WHERE type = '` + schema.TypeUsageReported + `'
				AND time >= ? AND time < ? AND (` + strings.Join(stored, " OR ") + `))
			GROUP BY org_id, owner_id, agent_id, toDate(time), room_id, initiator_id, initiator_type`
		end := day.AddDate(0, 0, 1)
		if err := r.sumSpend(ctx, q, []any{recent, end, recent, end}, now); err != nil {
			return err
		}
	}
	if recent.After(month) {
		// The day rows of usage_rollup over every organization: FINAL, which merges the
		// parts in key order a block at a time, where a sort of each group's newest row
		// (what one organization's reads do) would hold all of them at once.
		q := `SELECT org_id, owner_id, agent_id, room_id, '', '',
			sum(input_tokens + output_tokens + cache_read_tokens + cache_write_tokens), sum(cost), max(bucket)
			FROM ` + r.cfg.Database + `.usage_rollup FINAL WHERE grain = 'day' AND bucket >= ? AND bucket < ?
			GROUP BY org_id, owner_id, agent_id, room_id`
		if err := r.sumSpend(ctx, q, []any{month, recent}, now); err != nil {
			return err
		}
		return r.bootstrapInitiatorDays(ctx, month, recent, now)
	}
	return nil
}

// bootstrapInitiatorDays adds the spend of the month's days before recent to the
// initiators' counters, from the day rows of initiator_rollup: only to them (the
// organization, owner, agent and room got those days' spend from usage_rollup). Its
// org_id is the organization whose agents spent; the budget's is the initiator's
// (Directory.InitiatorOrg), so one person's days in several organizations meet on one
// counter.
func (r *Replica) bootstrapInitiatorDays(ctx context.Context, month, recent, now time.Time) error {
	rows, err := r.cfg.Conn.Query(ctx, `SELECT org_id, initiator_id, initiator_type,
		sum(input_tokens + output_tokens + cache_read_tokens + cache_write_tokens), sum(cost), max(bucket)
		FROM `+r.cfg.Database+`.initiator_rollup FINAL WHERE grain = 'day' AND bucket >= ? AND bucket < ? AND initiator_id != ''
		GROUP BY org_id, initiator_id, initiator_type`, month, recent)
	if err != nil {
		return fmt.Errorf("cannot read this month's spend by initiator from %s.initiator_rollup: %w", r.cfg.Database, err)
	}
	defer rows.Close()
	for rows.Next() {
		var org, initiator, typ string
		var tokens uint64
		var cost decimal.Decimal
		var at time.Time
		if err := rows.Scan(&org, &initiator, &typ, &tokens, &cost, &at); err != nil {
			return fmt.Errorf("cannot read this month's spend by initiator: %w", err)
		}
		iorg, ok := r.cfg.Directory.InitiatorOrg(initiator, typ, org)
		if !ok {
			continue
		}
		r.cfg.Ledger.Spend(policy.Charge{Initiator: initiator, InitiatorOrg: iorg,
			Tokens: int64(min(tokens, math.MaxInt64)), CostMicros: cost.Shift(6).IntPart()}, "", at.UTC(), now)
	}
	return rows.Err()
}

func (r *Replica) sumSpend(ctx context.Context, sql string, args []any, now time.Time) error {
	rows, err := r.cfg.Conn.Query(ctx, sql, args...)
	if err != nil {
		return fmt.Errorf("cannot read this month's spend from %s: %w", r.cfg.Database, err)
	}
	defer rows.Close()
	for rows.Next() {
		var org, owner, agent, room, initiator, typ string
		var tokens uint64
		var cost decimal.Decimal
		var at time.Time
		if err := rows.Scan(&org, &owner, &agent, &room, &initiator, &typ, &tokens, &cost, &at); err != nil {
			return fmt.Errorf("cannot read this month's spend: %w", err)
		}
		// Attribution as for usage from the stream (charge): the owner and organization
		// from this replica's directory, loaded before, not from the row, which ingest
		// may have stored before it knew the agent (its registration came on another
		// partition) and attributes later.
		if a, ok := r.cfg.Directory.Agent(agent); ok {
			org = first(org, a.Org)
			owner = a.Owner
			if a.Org != "" && org != a.Org {
				agent, owner, initiator = "", "", ""
			}
		}
		ch := policy.Charge{Org: org, Owner: owner, Agent: agent, Room: room,
			Tokens: int64(min(tokens, math.MaxInt64)), CostMicros: cost.Shift(6).IntPart()}
		if iorg, ok := r.cfg.Directory.InitiatorOrg(initiator, typ, org); ok {
			ch.Initiator, ch.InitiatorOrg = initiator, iorg
		}
		r.cfg.Ledger.Spend(ch, "", at.UTC(), now)
	}
	return rows.Err()
}

// Run bootstraps, then consumes the topic from where ClickHouse ended until ctx ends.
// ready is closed once the bootstrap is done (decisions may then be served); with a
// Limiter, only once the topic is also read up to where it ended at start (or
// CatchUpTimeout passed): the decisions the previous process took and ingest has not
// stored yet are there.
func (r *Replica) Run(ctx context.Context, ready chan<- struct{}) error {
	offsets, err := r.Bootstrap(ctx)
	if err != nil {
		return err
	}
	r.cfg.Directory.SetPosition(offsets)
	if err := r.seekGroupWhenFree(ctx, offsets); err != nil {
		return err
	}
	var tail *catchUp
	if r.cfg.Limiter != nil {
		if tail, err = r.newCatchUp(ctx, offsets); err != nil {
			return err
		}
	}
	if tail.done() {
		r.caughtUp(tail, ready)
		ready = nil
	}
	reader, err := kafka.NewReader(kafka.ReaderConfig{Brokers: r.cfg.Brokers, Topic: r.cfg.Topic, GroupID: r.cfg.GroupID, Logger: r.cfg.Logger})
	if err != nil {
		return err
	}
	defer reader.Close() //nolint:errcheck // it commits only through CommitMessages: closing loses nothing
	var lastCommit time.Time
	var pending []kafkago.Message
	for {
		fctx, cancel := ctx, context.CancelFunc(func() {})
		if ready != nil {
			fctx, cancel = context.WithDeadline(ctx, tail.deadline)
		}
		m, err := reader.FetchMessage(fctx)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if ready != nil && time.Now().After(tail.deadline) {
				r.caughtUp(tail, ready)
				ready = nil
				continue
			}
			r.log.Warn("cannot fetch governance events, retrying", "err", err)
			time.Sleep(time.Second)
			continue
		}
		// Every record advances the directory's position, also one that does not decode
		// or apply: a decision's position names what it read (policy.Directory). A
		// record that changes what decisions read is applied with the advance, no
		// decision in between; the others (most of the topic) advance without waiting
		// for the decisions in flight.
		ev, err := schema.DecodeAt(m.Value, m.Time)
		switch {
		case err != nil:
			r.cfg.Directory.Advance(m.Partition, m.Offset+1)
		case r.changesDecisions(&ev):
			r.cfg.Directory.Applying(m.Partition, m.Offset+1, func() { r.applyRecord(ctx, &ev) })
		default:
			r.applyRecord(ctx, &ev)
			r.cfg.Directory.Advance(m.Partition, m.Offset+1)
		}
		if ready != nil && tail.read(m.Partition, m.Offset) {
			r.caughtUp(tail, ready)
			ready = nil
		}
		pending = append(pending, m)
		// Commits only report progress (lag): the start position comes from ClickHouse.
		if time.Since(lastCommit) > time.Second {
			_ = reader.CommitMessages(ctx, pending...)
			pending, lastCommit = pending[:0], time.Now()
		}
	}
}

// applyRecord applies one record of the topic.
func (r *Replica) applyRecord(ctx context.Context, ev *schema.Event) {
	// Enrichment is ingest's job; the replica needs the organization of usage only,
	// which it takes from the directory.
	if err := r.Apply(ctx, ev); err != nil {
		r.log.Warn("cannot apply governance event", "event_id", ev.ID, "err", err)
	}
	if r.restores(ev) && r.restoreDecision(ev.ID, ev.OrgID, ev.Data) {
		r.restored.count(true)
	}
}

// restores says whether ev is a decision whose rates and reservation the replica
// restores: one stamped before shortly after this process started (later ones are
// taken here, or by another process, then also after Started).
func (r *Replica) restores(ev *schema.Event) bool {
	return r.cfg.Limiter != nil && ev.Type == schema.TypePolicyDecided && ev.Time.Before(r.cfg.Started.Add(time.Minute))
}

// changesDecisions says whether applying ev changes what a decision reads: the
// directory, the ledger (budgets, usage) or the limiter (a restored decision). A
// decision event otherwise only tells the replica its chain, which no decision reads
// but the usage that follows it, applied after it.
func (r *Replica) changesDecisions(ev *schema.Event) bool {
	switch ev.Type {
	case schema.TypeBudgetSet, schema.TypeBudgetDeleted, schema.TypeUsageReported:
		return true
	case schema.TypePolicyDecided:
		return r.restores(ev)
	}
	return slices.Contains(schema.GovernanceTypes, ev.Type)
}

// seekGroupWhenFree retries seekGroup while the group still has a member (after a
// crash, the dead process stays a member until its session times out, 10 s) or while
// the broker has no coordinator for it yet (a fresh broker creates its offsets topic on
// the first group's request): a start must wait for either rather than fail.
func (r *Replica) seekGroupWhenFree(ctx context.Context, offsets map[int]int64) error {
	deadline := time.Now().Add(60 * time.Second)
	for attempt := 1; ; attempt++ {
		err := r.seekGroup(ctx, offsets)
		if err == nil || !errors.Is(err, errGroupBusy) && !coordinatorPending(err) || time.Now().After(deadline) {
			return err
		}
		if attempt == 1 && errors.Is(err, errGroupBusy) {
			r.log.Info("policy group still has a member (a previous process?); waiting for its session to expire", "group", r.cfg.GroupID)
		} else if attempt == 1 {
			r.log.Info("kafka has no coordinator for the policy group yet; waiting", "group", r.cfg.GroupID, "err", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

var errGroupBusy = errors.New("group has an active member")

// coordinatorPending says whether err means the group's coordinator is not ready yet.
func coordinatorPending(err error) bool {
	return errors.Is(err, kafkago.GroupCoordinatorNotAvailable) || errors.Is(err, kafkago.NotCoordinatorForGroup) ||
		errors.Is(err, kafkago.GroupLoadInProgress)
}

// seekGroup sets the group's committed offsets to where ClickHouse ends, so the reader
// starts there. The group must have no active member (one group per policy process).
func (r *Replica) seekGroup(ctx context.Context, offsets map[int]int64) error {
	c := &kafkago.Client{Addr: kafkago.TCP(r.cfg.Brokers...), Timeout: 10 * time.Second}
	md, err := c.Metadata(ctx, &kafkago.MetadataRequest{Topics: []string{r.cfg.Topic}})
	if err != nil {
		return fmt.Errorf("cannot read metadata of topic %s: %w", r.cfg.Topic, err)
	}
	if len(md.Topics) == 0 {
		return fmt.Errorf("cannot read metadata of topic %s: the broker returned no topic", r.cfg.Topic)
	}
	var commits []kafkago.OffsetCommit
	for _, p := range md.Topics[0].Partitions {
		commits = append(commits, kafkago.OffsetCommit{Partition: p.ID, Offset: offsets[p.ID]})
	}
	resp, err := c.OffsetCommit(ctx, &kafkago.OffsetCommitRequest{
		GroupID: r.cfg.GroupID, GenerationID: -1, Topics: map[string][]kafkago.OffsetCommit{r.cfg.Topic: commits},
	})
	if err != nil {
		return fmt.Errorf("cannot position policy group %s on topic %s: %w", r.cfg.GroupID, r.cfg.Topic, err)
	}
	for _, ps := range resp.Topics {
		for _, p := range ps {
			if p.Error != nil {
				err := p.Error
				if errors.Is(err, kafkago.UnknownMemberId) || errors.Is(err, kafkago.RebalanceInProgress) || errors.Is(err, kafkago.IllegalGeneration) {
					err = fmt.Errorf("%w: %w", errGroupBusy, err)
				}
				return fmt.Errorf("cannot position policy group %s (is another process using it? each policy process needs its own --policy-group): partition %d: %w",
					r.cfg.GroupID, p.Partition, err)
			}
		}
	}
	return nil
}
