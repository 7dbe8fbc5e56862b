package policy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/storage"
	"github.com/open-policy-agent/opa/v1/storage/inmem"
)

// Agent is an agent as the policies see it. Handle is "owner/slug" (lowercase, no "@").
type Agent struct {
	ID     string `json:"id"`
	Handle string `json:"handle"`
	Owner  string `json:"owner"` // person id
	Org    string `json:"org"`   // the owner's organization
	Model  string `json:"model,omitempty"`
	// RegistryAccess is the platform's Personal Registry Access setting: while on,
	// siblings, global agents and agents shared with the owner's organization are peers.
	// On by default for new agents (a missing field in a directory file means true).
	RegistryAccess bool `json:"personal_registry_access"`
	SharedWithOrg  bool `json:"shared_with_org"` // shared with the organization Org
	Global         bool `json:"global"`
	// Listed is "listed in the directory"; an unlisted agent is not contactable.
	// Missing in a directory file means true.
	Listed bool `json:"listed"`
	// Suspended is the platform's own flag (agent.registered, agent.updated).
	Suspended bool `json:"suspended"`
	// OperatorSuspended is an operator's suspension (agent.suspended, agent.resumed):
	// the directory keeps it apart from the registration, so no agent.updated from the
	// platform lifts it; only a resume does. The policies see one flag, "suspended",
	// set when either is.
	OperatorSuspended bool `json:"operator_suspended,omitempty"`
}

// IsSuspended says whether the policies treat the agent as suspended.
func (a Agent) IsSuspended() bool { return a.Suspended || a.OperatorSuspended }

// UnmarshalJSON applies the platform's defaults: Personal Registry Access and directory
// listing are on unless the file says otherwise.
func (a *Agent) UnmarshalJSON(b []byte) error {
	type plain Agent
	aux := struct {
		*plain
		RegistryAccess *bool `json:"personal_registry_access"`
		Listed         *bool `json:"listed"`
	}{plain: (*plain)(a)}
	if err := json.Unmarshal(b, &aux); err != nil {
		return err
	}
	a.RegistryAccess = aux.RegistryAccess == nil || *aux.RegistryAccess
	a.Listed = aux.Listed == nil || *aux.Listed
	return nil
}

// Person is a human account. Handle is lowercase, without "@".
type Person struct {
	ID     string `json:"id"`
	Handle string `json:"handle"`
	Org    string `json:"org"`
}

// PendingRequest is a contact request waiting for an answer.
type PendingRequest struct {
	ID   string `json:"id"`
	From string `json:"from"`
	To   string `json:"to"`
}

// Snapshot is the whole directory in plain form: the JSON format of directory files
// (see README.md) and what the reference implementation reads. Contacts are symmetric;
// each pair appears once. Rooms map a room id to its participants (agents and people).
type Snapshot struct {
	People   []Person            `json:"people"`
	Agents   []Agent             `json:"agents"`
	Contacts [][2]string         `json:"contacts"`
	Pending  []PendingRequest    `json:"pending"`
	Rooms    map[string][]string `json:"rooms"`
}

// LoadDirectoryFile reads a directory file (the Snapshot JSON format).
func LoadDirectoryFile(path string) (Snapshot, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Snapshot{}, fmt.Errorf("cannot read directory file: %w", err)
	}
	var s Snapshot
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return Snapshot{}, fmt.Errorf("cannot parse directory file %s: %w", path, err)
	}
	return s, nil
}

// Directory is the replica of agents, people, contacts, pending requests and room
// membership that the policies read. Its agents and people are projected from the
// process's directory (schema/directory) by the policy replica. The Go maps are the source of truth; every
// mutation patches the OPA store at the changed paths in one write transaction, so the
// next decision sees it. Safe for concurrent decisions and mutations: mutations are
// serialized, and a decision reads one consistent store snapshot.
//
// Besides the relations, the store holds three indexes derived from the agents so the
// policies never scan all agents: owned[owner][agent], global[agent] and
// org_shared[org][agent].
//
// A directory kept from the events topic also knows its position: per partition, the
// offset of the next record not yet applied. The invariant is that a decision sees the
// effect of exactly the records below its position: the replica applies each record
// that changes what decisions read inside Applying, which holds applyMu for writing
// while it mutates and advances, and Engine.Decide holds applyMu for reading for the
// whole decision. The other records (messages, tool calls, most of the topic) only
// Advance, which waits for no decision. A replay of a
// recorded decision can then rebuild the very state it read from the trail. applyMu is
// apart from mu, which every mutation takes itself, so a record's mutations run under
// applyMu without locking mu twice.
type Directory struct {
	store storage.Store

	applyMu sync.RWMutex
	// partitions holds each partition's next offset, by partition number; it only
	// grows (under grow), copy on write, so readers load it without a lock.
	partitions atomic.Pointer[[]*offset]
	grow       sync.Mutex

	mu        sync.RWMutex
	agents    map[string]Agent
	people    map[string]Person
	handles   map[string]string
	contacts  map[string]map[string]bool
	pending   map[string]map[string]string // from -> to -> request id
	rooms     map[string]map[string]bool
	owned     map[string]map[string]bool
	global    map[string]bool
	orgShared map[string]map[string]bool
	// records holds each agent's and person's facts record (see facts.go), rebuilt
	// whenever the agent or person changes.
	records map[string]*ast.Term
	// suspended holds the operator's suspensions by agent id, also of agents not
	// registered (yet): a suspension replayed before its agent's registration holds.
	suspended map[string]bool
	// bulk defers the store's patches to the end of Bulk.
	bulk bool
}

// NewDirectory returns an empty directory with its own OPA store.
func NewDirectory() *Directory {
	d := &Directory{}
	d.reset()
	d.store = inmem.NewFromObjectWithOpts(map[string]any{"directory": d.document()},
		inmem.OptRoundTripOnWrite(false), inmem.OptReturnASTValuesOnRead(true))
	return d
}

// Position is where a directory stands in the events topic: partition → the offset of
// the next record not yet applied. A partition it lacks stands at its start.
type Position map[int]int64

// Applying runs apply, which may call any mutation of d, and then advances the position
// of partition to next (never back), with no decision in between: a decision sees all
// of a record's effect together with its position, or neither. apply must not decide,
// nor call Applying, Advance, SetPosition or Position.
func (d *Directory) Applying(partition int, next int64, apply func()) {
	d.applyMu.Lock()
	defer d.applyMu.Unlock()
	apply()
	d.slot(partition).advance(next)
}

// Advance advances the position of partition past a record that changes nothing a
// decision reads, without waiting for the decisions in flight: whether a decision's
// position includes such a record or not, it read the same state.
func (d *Directory) Advance(partition int, next int64) {
	d.slot(partition).advance(next)
}

// SetPosition replaces the position, after a bootstrap applied every record below p.
func (d *Directory) SetPosition(p Position) {
	d.applyMu.Lock()
	defer d.applyMu.Unlock()
	for _, o := range d.offsets() {
		o.Store(0)
	}
	for partition, next := range p {
		d.slot(partition).Store(next)
	}
}

// Position returns a copy of the position (nil while nothing set one: a directory not
// kept from the topic).
func (d *Directory) Position() Position {
	d.applyMu.RLock()
	defer d.applyMu.RUnlock()
	return d.positionLocked()
}

// positionLocked is a copy of the position, nil when empty; applyMu must be held.
func (d *Directory) positionLocked() Position {
	var p Position
	for partition, o := range d.offsets() {
		if next := o.Load(); next > 0 {
			if p == nil {
				p = Position{}
			}
			p[partition] = next
		}
	}
	return p
}

// offset is one partition's next offset.
type offset struct{ atomic.Int64 }

func (o *offset) advance(next int64) {
	for {
		cur := o.Load()
		if next <= cur || o.CompareAndSwap(cur, next) {
			return
		}
	}
}

func (d *Directory) offsets() []*offset {
	if s := d.partitions.Load(); s != nil {
		return *s
	}
	return nil
}

// slot is partition's offset, grown into the list (copy on write) the first time the
// partition is seen.
func (d *Directory) slot(partition int) *offset {
	if s := d.offsets(); partition < len(s) {
		return s[partition]
	}
	d.grow.Lock()
	defer d.grow.Unlock()
	s := d.offsets()
	if partition < len(s) {
		return s[partition]
	}
	n := append(make([]*offset, 0, partition+1), s...)
	for len(n) <= partition {
		n = append(n, &offset{})
	}
	d.partitions.Store(&n)
	return n[partition]
}

// Store is the OPA store the policies evaluate against.
func (d *Directory) Store() storage.Store { return d.store }

func (d *Directory) reset() {
	d.agents = map[string]Agent{}
	d.people = map[string]Person{}
	d.handles = map[string]string{}
	d.contacts = map[string]map[string]bool{}
	d.pending = map[string]map[string]string{}
	d.rooms = map[string]map[string]bool{}
	d.owned = map[string]map[string]bool{}
	d.global = map[string]bool{}
	d.orgShared = map[string]map[string]bool{}
	d.records = map[string]*ast.Term{}
	d.suspended = map[string]bool{}
}

// Load replaces the whole directory with the snapshot (bootstrap, tests, files).
func (d *Directory) Load(ctx context.Context, s Snapshot) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.reset()
	t := &patches{}
	var errs []error
	for _, p := range s.People {
		errs = append(errs, d.upsertPerson(t, p))
	}
	for _, a := range s.Agents {
		if a.OperatorSuspended {
			d.suspended[a.ID] = true
		}
		errs = append(errs, d.upsertAgent(t, a))
	}
	for _, c := range s.Contacts {
		errs = append(errs, d.addContact(t, c[0], c[1]))
	}
	for _, p := range s.Pending {
		errs = append(errs, d.setPending(t, p))
	}
	for room, ids := range s.Rooms {
		for _, id := range ids {
			errs = append(errs, d.joinRoom(t, room, id))
		}
	}
	// One write of the whole document instead of the patches.
	err := errors.Join(errs...)
	if werr := d.rewriteLocked(ctx); werr != nil {
		err = errors.Join(err, werr)
	}
	if err != nil {
		return fmt.Errorf("cannot load directory: %w", err)
	}
	return nil
}

// Snapshot returns the directory in plain form, sorted, so two equal directories give
// equal snapshots.
func (d *Directory) Snapshot() Snapshot {
	d.mu.RLock()
	defer d.mu.RUnlock()
	s := Snapshot{Rooms: map[string][]string{}}
	for _, id := range slices.Sorted(maps.Keys(d.people)) {
		s.People = append(s.People, d.people[id])
	}
	for _, id := range slices.Sorted(maps.Keys(d.agents)) {
		s.Agents = append(s.Agents, d.agents[id])
	}
	for _, a := range slices.Sorted(maps.Keys(d.contacts)) {
		for _, b := range slices.Sorted(maps.Keys(d.contacts[a])) {
			if a < b {
				s.Contacts = append(s.Contacts, [2]string{a, b})
			}
		}
	}
	for _, from := range slices.Sorted(maps.Keys(d.pending)) {
		for _, to := range slices.Sorted(maps.Keys(d.pending[from])) {
			s.Pending = append(s.Pending, PendingRequest{ID: d.pending[from][to], From: from, To: to})
		}
	}
	for room, ids := range d.rooms {
		s.Rooms[room] = slices.Sorted(maps.Keys(ids))
	}
	return s
}

// Agent returns the agent with the id.
func (d *Directory) Agent(id string) (Agent, bool) {
	d.mu.RLock()
	a, ok := d.agents[id]
	d.mu.RUnlock()
	return a, ok
}

// OrgOf returns the organization an agent or a person is registered in.
func (d *Directory) OrgOf(id string) (org string, known bool) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if a, ok := d.agents[id]; ok {
		return a.Org, true
	}
	if p, ok := d.people[id]; ok {
		return p.Org, true
	}
	return "", false
}

// InitiatorOrg is the organization whose initiator budgets count the work initiator
// (of kind typ: "user", "agent" or "system") set going in organization agentOrg: a
// person's or an agent's own organization, as the directory has it (false when it does
// not know the id as that kind), and for a system outside chat, agentOrg (a system has
// no organization of its own: each organization budgets what it sets going there).
func (d *Directory) InitiatorOrg(initiator, typ, agentOrg string) (string, bool) {
	if initiator == "" {
		return "", false
	}
	switch typ {
	case "user":
		d.mu.RLock()
		defer d.mu.RUnlock()
		p, ok := d.people[initiator]
		return p.Org, ok && p.Org != ""
	case "agent":
		d.mu.RLock()
		defer d.mu.RUnlock()
		a, ok := d.agents[initiator]
		return a.Org, ok && a.Org != ""
	case "system":
		return agentOrg, agentOrg != ""
	}
	return "", false
}

// ResolveHandle returns the id of the agent or person with the handle, given with or
// without "@", in any case.
func (d *Directory) ResolveHandle(handle string) (string, bool) {
	h := NormalizeHandle(handle)
	d.mu.RLock()
	id, ok := d.handles[h]
	d.mu.RUnlock()
	return id, ok
}

// UpsertAgent adds or replaces an agent, and keeps the handle and registry indexes.
func (d *Directory) UpsertAgent(ctx context.Context, a Agent) error {
	return d.mutate(ctx, "upsert agent "+a.ID, func(t *patches) error { return d.upsertAgent(t, a) })
}

// UpsertPerson adds or replaces a person.
func (d *Directory) UpsertPerson(ctx context.Context, p Person) error {
	return d.mutate(ctx, "upsert person "+p.ID, func(t *patches) error { return d.upsertPerson(t, p) })
}

// AddContact records an approved contact between a and b (symmetric).
func (d *Directory) AddContact(ctx context.Context, a, b string) error {
	return d.mutate(ctx, "add contact "+a+" "+b, func(t *patches) error { return d.addContact(t, a, b) })
}

// RemoveContact removes the contact between a and b, if any.
func (d *Directory) RemoveContact(ctx context.Context, a, b string) error {
	return d.mutate(ctx, "remove contact "+a+" "+b, func(t *patches) error {
		delIn(t, "contacts", d.contacts, a, b)
		delIn(t, "contacts", d.contacts, b, a)
		return nil
	})
}

// SetPending records a pending contact request.
func (d *Directory) SetPending(ctx context.Context, r PendingRequest) error {
	return d.mutate(ctx, "set pending request "+r.ID, func(t *patches) error { return d.setPending(t, r) })
}

// ClearPending forgets the pending request from -> to (approved, rejected or cancelled).
func (d *Directory) ClearPending(ctx context.Context, from, to string) error {
	return d.mutate(ctx, "clear pending request "+from+" "+to, func(t *patches) error {
		delIn(t, "pending", d.pending, from, to)
		return nil
	})
}

// JoinRoom records that participant (agent or person) is in room.
func (d *Directory) JoinRoom(ctx context.Context, room, participant string) error {
	return d.mutate(ctx, "join room "+room, func(t *patches) error { return d.joinRoom(t, room, participant) })
}

// LeaveRoom records that participant left room.
func (d *Directory) LeaveRoom(ctx context.Context, room, participant string) error {
	return d.mutate(ctx, "leave room "+room, func(t *patches) error {
		delIn(t, "rooms", d.rooms, room, participant)
		return nil
	})
}

// DeleteRoom forgets a room and its membership (room.deleted).
func (d *Directory) DeleteRoom(ctx context.Context, room string) error {
	return d.mutate(ctx, "delete room "+room, func(t *patches) error {
		if _, ok := d.rooms[room]; ok {
			delete(d.rooms, room)
			t.add(storage.RemoveOp, docPath("rooms", room), nil)
		}
		return nil
	})
}

// Suspend sets or clears an operator's suspension of an agent. It holds for an agent
// that is not registered yet, from its registration on; registrations and updates
// never change it.
func (d *Directory) Suspend(ctx context.Context, agent string, suspended bool) error {
	return d.mutate(ctx, "suspend agent "+agent, func(t *patches) error {
		if agent == "" {
			return errors.New("agent without id")
		}
		if suspended {
			d.suspended[agent] = true
		} else {
			delete(d.suspended, agent)
		}
		a, ok := d.agents[agent]
		if !ok {
			return nil
		}
		a.OperatorSuspended = suspended
		d.agents[agent] = a
		d.records[agent] = agentRecord(a)
		t.add(storage.AddOp, docPath("agents", agent, "suspended"), a.IsSuspended())
		return nil
	})
}

// mutate runs fn under the write lock and applies its patches in one transaction. If
// the store refuses a patch, the store is rewritten from the Go model, which stays the
// source of truth.
func (d *Directory) mutate(ctx context.Context, what string, fn func(t *patches) error) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	t := &patches{}
	if err := fn(t); err != nil {
		return fmt.Errorf("cannot %s: %w", what, err)
	}
	if len(t.ops) == 0 || d.bulk {
		return nil
	}
	if err := storage.Txn(ctx, d.store, storage.WriteParams, func(txn storage.Transaction) error {
		for _, p := range t.ops {
			if err := d.store.Write(ctx, txn, p.op, p.path, p.value); err != nil {
				return fmt.Errorf("cannot patch %v: %w", p.path, err)
			}
		}
		return nil
	}); err != nil {
		if rerr := d.rewriteLocked(ctx); rerr != nil {
			return fmt.Errorf("cannot %s: %w", what, errors.Join(err, rerr))
		}
	}
	return nil
}

// Bulk runs fn, which may call any mutation of d, and writes the OPA store once at the
// end instead of once per mutation: a patch of the store costs a hash of the objects
// along its path, so loading a large directory record by record (a replay's first
// state, tens of thousands of contacts) would cost the square of its size. No
// decision may run meanwhile: the store is stale until fn returns.
func (d *Directory) Bulk(ctx context.Context, fn func()) error {
	d.mu.Lock()
	d.bulk = true
	d.mu.Unlock()
	fn()
	d.mu.Lock()
	defer d.mu.Unlock()
	d.bulk = false
	return d.rewriteLocked(ctx)
}

// rewriteLocked writes the whole directory document; d.mu must be held.
func (d *Directory) rewriteLocked(ctx context.Context) error {
	return storage.Txn(ctx, d.store, storage.WriteParams, func(txn storage.Transaction) error {
		return d.store.Write(ctx, txn, storage.AddOp, storage.Path{"directory"}, d.document())
	})
}

// document renders the Go model as the data.directory document. Fresh maps: the store
// keeps what it is given (round trip on write is off).
func (d *Directory) document() map[string]any {
	agents := make(map[string]any, len(d.agents))
	for id, a := range d.agents {
		agents[id] = agentDoc(a)
	}
	people := make(map[string]any, len(d.people))
	for id, p := range d.people {
		people[id] = personDoc(p)
	}
	handles := make(map[string]any, len(d.handles))
	for h, id := range d.handles {
		handles[h] = id
	}
	global := make(map[string]any, len(d.global))
	for id := range d.global {
		global[id] = true
	}
	return map[string]any{
		"agents":     agents,
		"people":     people,
		"handles":    handles,
		"contacts":   nestedDoc(d.contacts),
		"pending":    nestedDoc(d.pending),
		"rooms":      nestedDoc(d.rooms),
		"owned":      nestedDoc(d.owned),
		"global":     global,
		"org_shared": nestedDoc(d.orgShared),
	}
}

func nestedDoc[V any](m map[string]map[string]V) map[string]any {
	out := make(map[string]any, len(m))
	for k, in := range m {
		o := make(map[string]any, len(in))
		for k2, v := range in {
			o[k2] = v
		}
		out[k] = o
	}
	return out
}

func agentDoc(a Agent) map[string]any {
	return map[string]any{
		"id":              a.ID,
		"handle":          a.Handle,
		"owner":           a.Owner,
		"org":             a.Org,
		"model":           a.Model,
		"registry_access": a.RegistryAccess,
		"shared_with_org": a.SharedWithOrg,
		"global":          a.Global,
		"listed":          a.Listed,
		"suspended":       a.IsSuspended(),
	}
}

func personDoc(p Person) map[string]any {
	return map[string]any{"id": p.ID, "handle": p.Handle, "org": p.Org}
}

// NormalizeHandle returns the handle as the directory keys it: trimmed, lowercase,
// without the leading "@".
func NormalizeHandle(h string) string {
	return strings.TrimPrefix(strings.ToLower(strings.TrimSpace(h)), "@")
}

func (d *Directory) upsertPerson(t *patches, p Person) error {
	if p.ID == "" {
		return errors.New("person without id")
	}
	p.Handle = NormalizeHandle(p.Handle)
	if _, ok := d.agents[p.ID]; ok {
		return fmt.Errorf("id %q is an agent", p.ID)
	}
	old, existed := d.people[p.ID]
	if err := d.claimHandle(t, p.ID, old.Handle, p.Handle, existed); err != nil {
		return err
	}
	d.people[p.ID] = p
	d.records[p.ID] = personRecord(p)
	t.add(storage.AddOp, docPath("people", p.ID), personDoc(p))
	return nil
}

func (d *Directory) upsertAgent(t *patches, a Agent) error {
	if a.ID == "" || a.Owner == "" {
		return fmt.Errorf("agent %q without id or owner", a.ID)
	}
	a.Handle = NormalizeHandle(a.Handle)
	a.OperatorSuspended = d.suspended[a.ID]
	if _, ok := d.people[a.ID]; ok {
		return fmt.Errorf("id %q is a person", a.ID)
	}
	old, existed := d.agents[a.ID]
	if err := d.claimHandle(t, a.ID, old.Handle, a.Handle, existed); err != nil {
		return err
	}
	if existed && old.Owner != a.Owner {
		delIn(t, "owned", d.owned, old.Owner, a.ID)
	}
	if !existed || old.Owner != a.Owner {
		setIn(t, "owned", d.owned, a.Owner, a.ID, true)
	}
	if existed && old.Global && !a.Global {
		delete(d.global, a.ID)
		t.add(storage.RemoveOp, docPath("global", a.ID), nil)
	}
	if a.Global && (!existed || !old.Global) {
		d.global[a.ID] = true
		t.add(storage.AddOp, docPath("global", a.ID), true)
	}
	if existed && old.SharedWithOrg && (!a.SharedWithOrg || old.Org != a.Org) {
		delIn(t, "org_shared", d.orgShared, old.Org, a.ID)
	}
	if a.SharedWithOrg && (!existed || !old.SharedWithOrg || old.Org != a.Org) {
		setIn(t, "org_shared", d.orgShared, a.Org, a.ID, true)
	}
	d.agents[a.ID] = a
	d.records[a.ID] = agentRecord(a)
	t.add(storage.AddOp, docPath("agents", a.ID), agentDoc(a))
	return nil
}

// claimHandle moves id's handle from old to h; a handle belongs to one id.
func (d *Directory) claimHandle(t *patches, id, old, h string, existed bool) error {
	if h != "" {
		if owner, ok := d.handles[h]; ok && owner != id {
			return fmt.Errorf("handle %q belongs to %s", h, owner)
		}
	}
	if existed && old == h {
		return nil
	}
	if existed && old != "" && d.handles[old] == id {
		delete(d.handles, old)
		t.add(storage.RemoveOp, docPath("handles", old), nil)
	}
	if h != "" {
		d.handles[h] = id
		t.add(storage.AddOp, docPath("handles", h), id)
	}
	return nil
}

func (d *Directory) addContact(t *patches, a, b string) error {
	if a == "" || b == "" || a == b {
		return fmt.Errorf("invalid contact pair %q, %q", a, b)
	}
	if !d.contacts[a][b] {
		setIn(t, "contacts", d.contacts, a, b, true)
	}
	if !d.contacts[b][a] {
		setIn(t, "contacts", d.contacts, b, a, true)
	}
	return nil
}

func (d *Directory) setPending(t *patches, r PendingRequest) error {
	if r.From == "" || r.To == "" || r.From == r.To {
		return fmt.Errorf("invalid pending request %q: %q -> %q", r.ID, r.From, r.To)
	}
	setIn(t, "pending", d.pending, r.From, r.To, r.ID)
	return nil
}

func (d *Directory) joinRoom(t *patches, room, id string) error {
	if room == "" || id == "" {
		return fmt.Errorf("invalid room membership %q, %q", room, id)
	}
	if !d.rooms[room][id] {
		setIn(t, "rooms", d.rooms, room, id, true)
	}
	return nil
}

// patches collects store writes for one transaction.
type patches struct{ ops []patch }

type patch struct {
	op    storage.PatchOp
	path  storage.Path
	value any
}

func (t *patches) add(op storage.PatchOp, p storage.Path, v any) {
	t.ops = append(t.ops, patch{op: op, path: p, value: v})
}

func docPath(rel string, keys ...string) storage.Path {
	return append(storage.Path{"directory", rel}, keys...)
}

// setIn sets m[outer][inner] = v and records the patch: the inner object is written
// whole when it is new, because the store cannot add below a missing key.
func setIn[V any](t *patches, rel string, m map[string]map[string]V, outer, inner string, v V) {
	in, ok := m[outer]
	if !ok {
		m[outer] = map[string]V{inner: v}
		t.add(storage.AddOp, docPath(rel, outer), map[string]any{inner: v})
		return
	}
	in[inner] = v
	t.add(storage.AddOp, docPath(rel, outer, inner), v)
}

// delIn deletes m[outer][inner] and drops the inner object once empty.
func delIn[V any](t *patches, rel string, m map[string]map[string]V, outer, inner string) {
	in, ok := m[outer]
	if !ok {
		return
	}
	if _, ok := in[inner]; !ok {
		return
	}
	delete(in, inner)
	if len(in) == 0 {
		delete(m, outer)
		t.add(storage.RemoveOp, docPath(rel, outer), nil)
		return
	}
	t.add(storage.RemoveOp, docPath(rel, outer, inner), nil)
}
