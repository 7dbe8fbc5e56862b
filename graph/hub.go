package graph

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vektah/gqlparser/v2/gqlerror"

	"github.com/bandplane/bandplane/graph/model"
	"github.com/bandplane/bandplane/policy"
	"github.com/bandplane/bandplane/query"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/keys"
	"github.com/bandplane/bandplane/schema/work"
)

// The hub fans the live events of one serve process (its "live" Kafka reader, see
// ingest.Live) out to GraphQL subscriptions. It keeps what it needs to see changes as
// they happen: the tasks in progress (seeded from ClickHouse at start, then followed),
// the requests for attention opened since it started, and a timer that finds the
// tasks becoming stuck without any new event. Every subscriber has a bounded buffer: a
// subscriber that falls behind by more than it is told so (an error SLOW_SUBSCRIBER)
// and dropped, so it never holds up the others or the reader.

// Hub defaults.
const (
	DefaultSubscriberBuffer = 256
	// DefaultMaxTracked bounds the tasks (and, apart, the requests for attention) the
	// hub follows for one organization, so that one organization cannot use up what
	// the others need.
	DefaultMaxTracked = 10_000
	// DefaultMaxSubscriptionsPerKey bounds one API key's open subscriptions.
	DefaultMaxSubscriptionsPerKey = 100
)

// Handles names the parties of live events from serve's directory (no ClickHouse
// read per event).
type Handles interface {
	// Handle returns the handle of an agent or person of org, and whether it is a
	// person; ok is false for an id org's directory does not know.
	Handle(org, id string) (handle string, person, ok bool)
}

// HubConfig configures a Hub. Zero fields take the defaults.
type HubConfig struct {
	Buffer                 int
	StuckAfter             time.Duration // default work.DefaultStuckAfter
	MaxTracked             int           // per organization, tasks and requests each
	MaxSubscriptionsPerKey int
	Tick                   time.Duration // how often stuck tasks are looked for; default 1 s
	Handles                Handles
	// Currency is the billing currency of budgets (budgetExceeded).
	Currency string
	// Forget is told the id of each key a key.revoked event of bandplane's revokes
	// (serve: the key cache's Forget), before the hub ends that key's subscriptions.
	Forget func(keyID string)
	Logger *slog.Logger
	Now    func() time.Time
}

// Hub is safe for concurrent use.
type Hub struct {
	cfg HubConfig
	log *slog.Logger

	mu      sync.Mutex
	subs    map[string]map[*sub]struct{} // by organization
	perKey  map[string]int
	orgs    map[string]*orgState
	nextDue time.Time // no tracked task can become stuck before it
	swept   time.Time // when old state was last forgotten

	delivered, dropped atomic.Int64
	rendered           atomic.Int64 // changes rendered by the WebSocket transport's render groups
}

// orgState is what the hub follows of one organization.
type orgState struct {
	tasks   map[string]*tracked      // task id → a task in progress
	byActor map[[2]string][]*tracked // room, assignee
	// seen is the time of the latest task event applied per task, finished tasks
	// included: an older or replayed event is ignored (Kafka delivers at least once).
	seen      map[string]taskSeen
	attention map[string][]*work.Attention // room → open requests, oldest first
	// asked holds the requests seen, open or answered, by id (when asked): one
	// delivered again after its answer opens nothing (Kafka delivers at least once).
	asked map[string]time.Time
}

type taskSeen struct {
	time time.Time
	id   string // the event's
}

type tracked struct {
	org  string
	task work.Task
}

// NewHub returns a hub; Run starts its stuck timer.
func NewHub(cfg HubConfig) *Hub {
	if cfg.Buffer <= 0 {
		cfg.Buffer = DefaultSubscriberBuffer
	}
	if cfg.StuckAfter <= 0 {
		cfg.StuckAfter = work.DefaultStuckAfter
	}
	if cfg.MaxTracked <= 0 {
		cfg.MaxTracked = DefaultMaxTracked
	}
	if cfg.MaxSubscriptionsPerKey <= 0 {
		cfg.MaxSubscriptionsPerKey = DefaultMaxSubscriptionsPerKey
	}
	if cfg.Tick <= 0 {
		cfg.Tick = time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Hub{cfg: cfg, log: log, subs: map[string]map[*sub]struct{}{}, perKey: map[string]int{}, orgs: map[string]*orgState{}}
}

// StuckAfter is the time without activity after which a task in progress is stuck.
func (h *Hub) StuckAfter() time.Duration { return h.cfg.StuckAfter }

// Stats returns the changes delivered to subscribers and the subscribers dropped for
// falling behind, since start.
func (h *Hub) Stats() (delivered, dropped int64) { return h.delivered.Load(), h.dropped.Load() }

// Renders is how many times a change was rendered for the WebSocket transport: once
// per render group it went to, however many subscribers each has.
func (h *Hub) Renders() int64 { return h.rendered.Load() }

func (h *Hub) org(id string) *orgState {
	o := h.orgs[id]
	if o == nil {
		o = &orgState{tasks: map[string]*tracked{}, byActor: map[[2]string][]*tracked{}, seen: map[string]taskSeen{},
			attention: map[string][]*work.Attention{}, asked: map[string]time.Time{}}
		h.orgs[id] = o
	}
	return o
}

// SeedTask makes the hub follow a task in progress that ingest stored before the hub
// started (serve seeds it from ClickHouse), so that it becomes stuck on time.
func (h *Hub) SeedTask(org string, t work.Task) {
	h.mu.Lock()
	defer h.mu.Unlock()
	o := h.org(org)
	if s, ok := o.seen[t.ID]; ok && !t.UpdatedAt.After(s.time) {
		return
	}
	o.seen[t.ID] = taskSeen{time: t.UpdatedAt}
	h.trackLocked(org, o, t)
}

// Run looks for tasks becoming stuck, and for subscriptions whose key no longer
// allows them, every Tick until ctx ends.
func (h *Hub) Run(ctx context.Context) {
	t := time.NewTicker(h.cfg.Tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			h.checkStuck()
			h.checkKeys()
		}
	}
}

func (h *Hub) checkStuck() {
	now := h.cfg.Now().UTC()
	h.mu.Lock()
	defer h.mu.Unlock()
	if now.Sub(h.swept) >= time.Minute {
		h.sweepLocked(now)
	}
	if now.Before(h.nextDue) {
		return
	}
	next := time.Time{}
	for org, o := range h.orgs {
		for _, tr := range o.tasks {
			if tr.task.Stuck {
				continue
			}
			tr.task.SetStuck(now, h.cfg.StuckAfter)
			if !tr.task.Stuck {
				if due := tr.task.LastActivity.Add(h.cfg.StuckAfter); next.IsZero() || due.Before(next) {
					next = due
				}
				continue
			}
			t := tr.task
			h.publishLocked(org, &change{work: &model.WorkStatusChange{Kind: model.WorkChangeKindTaskStuck, RoomID: t.RoomID,
				Time: t.StuckSince, Task: h.taskModel(org, t)}})
		}
	}
	if next.IsZero() {
		next = now.Add(time.Hour) // nothing to wait for; a new task moves it earlier
	}
	h.nextDue = next
}

// due notes that a tracked task may become stuck at t.
func (h *Hub) due(t time.Time) {
	if t.Before(h.nextDue) {
		h.nextDue = t
	}
}

// checkKeys ends the subscriptions whose key no longer allows them (revoked, or
// changed). The check (sub.valid) reads only what the process holds, outside the
// hub's lock: every open subscription is checked every tick.
func (h *Hub) checkKeys() {
	h.mu.Lock()
	var all []*sub
	for _, m := range h.subs {
		for s := range m {
			all = append(all, s)
		}
	}
	h.mu.Unlock()
	for _, s := range all {
		if s.valid == nil || s.valid() {
			continue
		}
		h.mu.Lock()
		h.endLocked(s)
		h.mu.Unlock()
	}
}

// endLocked ends a subscription whose key no longer allows it.
func (h *Hub) endLocked(s *sub) {
	if s.closed {
		return
	}
	endSubscription(s.ctx, &gqlerror.Error{Message: "the API key of this subscription was revoked or no longer allows it",
		Extensions: map[string]any{"code": "UNAUTHENTICATED"}})
	h.removeLocked(s.org, s)
}

// revoke ends every subscription of key id at once: a key.revoked event of bandplane's
// (keys.Source; nobody else may write that source) says it was revoked.
func (h *Hub) revoke(ev *schema.Event) {
	var d keys.EventData
	if ev.Source != keys.Source || schema.DecodeData(ev.Data, &d) != nil || d.KeyID == "" {
		return
	}
	// Forgotten first: a subscription opened in between would pass the key check.
	if h.cfg.Forget != nil {
		h.cfg.Forget(d.KeyID)
	}
	h.mu.Lock()
	for _, m := range h.subs {
		for s := range m {
			if s.key == d.KeyID {
				h.endLocked(s)
			}
		}
	}
	h.mu.Unlock()
}

// sweepLocked forgets the requests for attention older than work.AttentionWindow
// (workStatus no longer shows them either) and what it knows of finished tasks not
// seen for a day.
func (h *Hub) sweepLocked(now time.Time) {
	h.swept = now
	for id, o := range h.orgs {
		for room, list := range o.attention {
			kept := list[:0]
			for _, a := range list {
				if now.Sub(a.Since) < work.AttentionWindow {
					kept = append(kept, a)
				}
			}
			if len(kept) == 0 {
				delete(o.attention, room)
			} else {
				o.attention[room] = kept
			}
		}
		for ask, since := range o.asked {
			if now.Sub(since) >= work.AttentionWindow {
				delete(o.asked, ask)
			}
		}
		for task, s := range o.seen {
			if _, following := o.tasks[task]; !following && now.Sub(s.time) > 24*time.Hour {
				delete(o.seen, task)
			}
		}
		if len(o.tasks) == 0 && len(o.asked) == 0 && len(o.seen) == 0 {
			delete(h.orgs, id)
		}
	}
}

func (h *Hub) trackLocked(org string, o *orgState, t work.Task) {
	if old, ok := o.tasks[t.ID]; ok {
		h.untrackLocked(o, old)
	}
	if !work.InProgress(t.Status) || len(o.tasks) >= h.cfg.MaxTracked {
		return
	}
	tr := &tracked{org: org, task: t}
	o.tasks[t.ID] = tr
	ak := [2]string{t.RoomID, t.AssigneeID}
	o.byActor[ak] = append(o.byActor[ak], tr)
	if !t.Stuck {
		h.due(t.LastActivity.Add(h.cfg.StuckAfter))
	}
}

func (h *Hub) untrackLocked(o *orgState, tr *tracked) {
	delete(o.tasks, tr.task.ID)
	ak := [2]string{tr.task.RoomID, tr.task.AssigneeID}
	list := slices.DeleteFunc(o.byActor[ak], func(x *tracked) bool { return x == tr })
	if len(list) == 0 {
		delete(o.byActor, ak)
	} else {
		o.byActor[ak] = list
	}
}

// Publish takes one live event (its organization resolved) and tells the subscribers
// what it changed.
func (h *Hub) Publish(ev *schema.Event) { h.apply(ev, false) }

// Replay takes an event the hub may have missed before it started (between what its
// seed read from ClickHouse and the newest offset): it updates what the hub follows
// and tells nobody.
func (h *Hub) Replay(ev *schema.Event) { h.apply(ev, true) }

func (h *Hub) apply(ev *schema.Event, quiet bool) {
	if ev.Type == schema.TypeKeyRevoked {
		h.revoke(ev) // a platform key's revocation has no organization
		return
	}
	if ev.OrgID == "" {
		return
	}
	org := ev.OrgID
	h.mu.Lock()
	defer h.mu.Unlock()
	publish := func(c *change) {
		if !quiet {
			h.publishLocked(org, c)
		}
	}
	o := h.org(org)
	now := h.cfg.Now().UTC()
	evID := ev.ID
	// Activity of an assignee keeps its tasks in the room from being stuck.
	if ev.RoomID != "" && ev.Actor.ID != "" && work.Active(string(ev.Actor.Type)) {
		for _, tr := range o.byActor[[2]string{ev.RoomID, ev.Actor.ID}] {
			tr.task.Touch(ev.Time)
			was := tr.task.Stuck
			tr.task.SetStuck(now, h.cfg.StuckAfter)
			if !tr.task.Stuck {
				h.due(tr.task.LastActivity.Add(h.cfg.StuckAfter))
			}
			if was && !tr.task.Stuck {
				publish(&change{work: &model.WorkStatusChange{Kind: model.WorkChangeKindTask, RoomID: ev.RoomID,
					Time: ev.Time, EventID: &evID, Task: h.taskModel(org, tr.task)}})
			}
		}
	}
	switch ev.Type {
	case schema.TypeTaskCreated, schema.TypeTaskUpdated, schema.TypeTaskDeleted:
		t, ok := work.TaskOf(ev.Type, ev.Time, ev.RoomID, ev.Data)
		if !ok {
			return
		}
		if s, ok := o.seen[t.ID]; ok && (ev.Time.Before(s.time) || ev.Time.Equal(s.time) && ev.ID == s.id) {
			return // older than what was applied, or the same event again
		}
		if len(o.seen) < 4*h.cfg.MaxTracked {
			o.seen[t.ID] = taskSeen{time: ev.Time, id: ev.ID}
		}
		if t.Deleted {
			t.Status = "deleted"
		}
		t.SetStuck(now, h.cfg.StuckAfter)
		h.trackLocked(org, o, t)
		publish(&change{work: &model.WorkStatusChange{Kind: model.WorkChangeKindTask, RoomID: ev.RoomID,
			Time: ev.Time, EventID: &evID, Task: h.taskModel(org, t)}})
		h.closeLocked(org, o, ev, func(a *work.Attention) bool { return a.Resumes(t.AssigneeID, ev.Time) }, publish)
	case schema.TypeAttention:
		if _, seen := o.asked[ev.ID]; seen {
			return
		}
		asked, ok := work.AttentionOf(ev.ID, ev.RoomID, ev.Actor.ID, ev.Actor.Handle, ev.Time, ev.Data)
		if !ok {
			return
		}
		a := &asked
		a.Address(func(id string) bool { _, person, ok := h.handle(org, id); return ok && person })
		if len(o.asked) < 4*h.cfg.MaxTracked {
			o.attention[ev.RoomID] = append(o.attention[ev.RoomID], a)
			o.asked[ev.ID] = ev.Time
		}
		m := h.attentionModel(org, a, now)
		publish(&change{attention: m, work: &model.WorkStatusChange{Kind: model.WorkChangeKindAttentionOpened,
			RoomID: ev.RoomID, Time: ev.Time, EventID: &evID, Attention: m}})
	case schema.TypeMessageCreated:
		if ev.Actor.Type == schema.ActorUser {
			h.closeLocked(org, o, ev, func(a *work.Attention) bool { return a.Answers(ev.Actor.ID, ev.Time) }, publish)
		}
		if ev.Actor.Type == schema.ActorAgent && ev.RoomID != "" {
			id := ev.Actor.ID
			w := &model.WorkStatusChange{Kind: model.WorkChangeKindAgentActive, RoomID: ev.RoomID, Time: ev.Time, EventID: &evID, AgentID: &id}
			if handle, _, ok := h.handle(org, id); ok {
				w.AgentHandle = &handle
			}
			publish(&change{work: w})
		}
	case schema.TypePolicyDecided:
		if quiet {
			return
		}
		if st, ok := work.StopOf(ev.Time, ev.Data); ok && ev.RoomID != "" && ev.Actor.ID != "" && schema.OwnSource(ev.Source) {
			id := ev.Actor.ID
			w := &model.WorkStatusChange{Kind: model.WorkChangeKindAgentStopped, RoomID: ev.RoomID, Time: ev.Time, EventID: &evID,
				AgentID: &id, Stopped: &st.Kind, StopReason: &st.Reason}
			if handle, _, ok := h.handle(org, id); ok {
				w.AgentHandle = &handle
			}
			publish(&change{work: w})
		}
		var d struct {
			Allow bool `json:"allow"`
		}
		if json.Unmarshal(ev.Data, &d) != nil || d.Allow {
			return
		}
		dec, err := query.DecisionOf(auditEventOf(ev))
		if err != nil {
			h.log.Debug("live: cannot read a policy decision", "event", ev.ID, "err", err)
			return
		}
		m := decisionModel(dec, nil)
		if handle, _, ok := h.handle(org, dec.AgentID); ok {
			m.AgentHandle = &handle
		}
		publish(&change{denial: &model.PolicyDenial{Decision: &m}})
	case schema.TypeBudgetCrossed:
		if quiet || !schema.OwnSource(ev.Source) {
			return
		}
		var x policy.Crossing
		if schema.DecodeData(ev.Data, &x) != nil || x.Budget.Org != org {
			return
		}
		st := policy.BudgetStatus{Budget: x.Budget, PeriodStart: x.PeriodStart, PeriodEnd: policy.PeriodEnd(x.Budget.Period, x.PeriodStart),
			SpentTokens: x.SpentTokens, SpentCost: x.SpentCost, ReservedTokens: x.ReservedTokens, ReservedCost: x.ReservedCost,
			ProjectedTokens: x.SpentTokens, ProjectedCost: x.SpentCost}
		b := budgetModel(st, h.cfg.Currency)
		if x.Budget.Scope == policy.ScopeOwner || x.Budget.Scope == policy.ScopeAgent || x.Budget.Scope == policy.ScopeInitiator {
			if handle, _, ok := h.handle(org, x.Budget.ScopeID); ok {
				b.ScopeName = &handle
			}
		}
		publish(&change{budget: &model.BudgetCrossing{Budget: &b, Threshold: x.Threshold, At: x.At, EventID: ev.ID}})
	}
}

// closeLocked closes the room's open requests that ev closes (match).
func (h *Hub) closeLocked(org string, o *orgState, ev *schema.Event, match func(*work.Attention) bool, publish func(*change)) {
	list := o.attention[ev.RoomID]
	kept := list[:0]
	now := h.cfg.Now().UTC()
	for _, a := range list {
		if match(a) {
			evID := ev.ID
			publish(&change{work: &model.WorkStatusChange{Kind: model.WorkChangeKindAttentionClosed, RoomID: ev.RoomID,
				Time: ev.Time, EventID: &evID, Attention: h.attentionModel(org, a, now)}})
			continue
		}
		kept = append(kept, a)
	}
	if len(kept) == 0 {
		delete(o.attention, ev.RoomID)
	} else {
		o.attention[ev.RoomID] = kept
	}
}

func (h *Hub) handle(org, id string) (string, bool, bool) {
	if h.cfg.Handles == nil || id == "" {
		return "", false, false
	}
	return h.cfg.Handles.Handle(org, id)
}

func (h *Hub) taskModel(org string, t work.Task) *model.Task {
	m := taskModel(t, nil)
	if handle, _, ok := h.handle(org, t.AssigneeID); ok {
		m.AssigneeHandle = &handle
	}
	return &m
}

func (h *Hub) attentionModel(org string, a *work.Attention, now time.Time) *model.AttentionRequest {
	m := attentionModel(*a, nil, now)
	if handle, _, ok := h.handle(org, a.AskerID); ok {
		m.AskedByHandle = &handle
	} else if a.AskerHandle != "" {
		m.AskedByHandle = &a.AskerHandle
	}
	if handle, _, ok := h.handle(org, a.AddressedTo); ok {
		m.AddressedToHandle = &handle
	}
	return &m
}

// change is one thing to tell subscribers; each kind of subscription reads its part.
type change struct {
	work      *model.WorkStatusChange
	attention *model.AttentionRequest
	denial    *model.PolicyDenial
	budget    *model.BudgetCrossing
	// renders holds the change as each render group of the WebSocket transport
	// rendered it (*renderGroup → []byte).
	renders sync.Map
}

func (c *change) room() string {
	switch {
	case c.work != nil:
		return c.work.RoomID
	case c.attention != nil:
		return c.attention.RoomID
	}
	return ""
}

type sub struct {
	key, org, room string
	kind           subKind
	ch             chan *change
	ctx            context.Context
	valid          func() bool // whether the key still allows it (nil: always)
	closed         bool
}

type subKind int

const (
	subWork subKind = iota
	subAttention
	subDenied
	subBudget
)

func (s *sub) wants(c *change) bool {
	if s.room != "" && c.room() != s.room {
		return false
	}
	switch s.kind {
	case subWork:
		return c.work != nil
	case subAttention:
		return c.attention != nil
	case subDenied:
		return c.denial != nil
	case subBudget:
		return c.budget != nil
	}
	return false
}

// publishLocked offers c to every subscriber of org that wants it; one whose buffer
// is full is told and dropped.
func (h *Hub) publishLocked(org string, c *change) {
	for s := range h.subs[org] {
		if !s.wants(c) {
			continue
		}
		select {
		case s.ch <- c:
			h.delivered.Add(1)
		default:
			h.dropped.Add(1)
			h.log.Warn("dropping a subscriber that falls behind", "key", s.key, "org", org, "buffer", h.cfg.Buffer)
			endSubscription(s.ctx, &gqlerror.Error{
				Message:    fmt.Sprintf("this subscription fell %d changes behind and was dropped; subscribe again and refetch", h.cfg.Buffer),
				Extensions: map[string]any{"code": "SLOW_SUBSCRIBER"}})
			h.removeLocked(org, s)
		}
	}
}

func (h *Hub) removeLocked(org string, s *sub) {
	if s.closed {
		return
	}
	s.closed = true
	delete(h.subs[org], s)
	if len(h.subs[org]) == 0 {
		delete(h.subs, org)
	}
	h.perKey[s.key]--
	if h.perKey[s.key] <= 0 {
		delete(h.perKey, s.key)
	}
	close(s.ch)
}

// ErrTooManySubscriptions is a key with DefaultMaxSubscriptionsPerKey open.
var ErrTooManySubscriptions = errors.New("too many subscriptions")

// subscribe registers a subscriber until ctx ends; the returned channel closes then,
// or when the subscriber is dropped.
func (h *Hub) subscribe(ctx context.Context, key, org, room string, kind subKind, valid func() bool) (<-chan *change, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.perKey[key] >= h.cfg.MaxSubscriptionsPerKey {
		return nil, fmt.Errorf("key %s has %d subscriptions open, the most it may (--graphql-max-subscriptions-per-key): %w",
			key, h.perKey[key], ErrTooManySubscriptions)
	}
	s := &sub{key: key, org: org, room: room, kind: kind, ch: make(chan *change, h.cfg.Buffer), ctx: ctx, valid: valid}
	if h.subs[org] == nil {
		h.subs[org] = map[*sub]struct{}{}
	}
	h.subs[org][s] = struct{}{}
	h.perKey[key]++
	context.AfterFunc(ctx, func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		h.removeLocked(org, s)
	})
	return s.ch, nil
}

// Subscribers is the number of open subscriptions.
func (h *Hub) Subscribers() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, m := range h.subs {
		n += len(m)
	}
	return n
}

// forward turns a hub channel into the typed channel a subscription field returns;
// it ends when in closes (dropped) or ctx ends (the client left), whichever first. A
// nil in is a subscription its transport delivers itself (liveSlot): the field's
// channel is closed at once.
func forward[T any](ctx context.Context, in <-chan *change, pick func(*change) T) <-chan T {
	out := make(chan T)
	if in == nil {
		close(out)
		return out
	}
	go func() {
		defer close(out)
		for {
			var c *change
			select {
			case x, ok := <-in:
				if !ok {
					return
				}
				c = x
			case <-ctx.Done():
				return // in may never close (a render group's feed)
			}
			select {
			case out <- pick(c):
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}

// auditEventOf is the audit row of a live event, as query reads it back.
func auditEventOf(ev *schema.Event) query.Event {
	e := query.Event{ID: ev.ID, Type: ev.Type, Time: ev.Time, OrgID: ev.OrgID, RoomID: ev.RoomID,
		ActorID: ev.Actor.ID, ActorType: string(ev.Actor.Type), ActorHandle: ev.Actor.Handle,
		ExecutionID: ev.ExecutionID, Source: ev.Source, SchemaVersion: uint16(ev.SchemaVersion), Data: string(ev.Data)}
	if ev.Subject != nil {
		e.SubjectID, e.SubjectType, e.SubjectHandle = ev.Subject.ID, string(ev.Subject.Type), ev.Subject.Handle
	}
	return e
}
