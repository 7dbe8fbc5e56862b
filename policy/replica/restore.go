package replica

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"sync"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/bandplane/bandplane/policy"
	"github.com/bandplane/bandplane/policy/api"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/store"
)

// Rebuilding the limiter after a restart. A restarted process's limiter is empty, so
// every agent would get a fresh burst. Each allowed send_message is a policy.decided
// event, acknowledged by Kafka before the decision is answered, whose data records what
// it took (api.TakenData): its quota and the theoretical arrival times (TATs) it left
// on the agent's rate and on the agent's rate in the room. A TAT is at most one window
// ahead of the decision, so the decisions of the last RestoreWindow (the largest quota
// window) hold every TAT still ahead: raising each key to the latest TAT recorded
// (Limiter.Restore) gives the state the live limiter had, exactly, whatever came before
// the window. Replaying the window's decisions by GCRA alone would not: a sender kept
// at its limit for longer than the window (the chatty agent) carries its first burst
// in its TAT, which the window's events do not show. An event that recorded no TAT for
// a limited rate (none is written so) is replayed at its time (Limiter.Replay).
//
// The open reservations of those decisions are restored too when they can be exactly:
// a decision with an estimate and an execution id, whose reservation has not expired
// and which no usage.reported of its agent and execution settled (the trail says so:
// such a report settles every reservation of its execution, whenever it is read). It is
// reserved again at the decision's time (Ledger.Reserve: the same expiry). A reservation
// without an execution id is not: a report without one settles the agent's oldest open
// reservation when the replica reads it, an order the trail does not keep.
//
// The decisions are read from ClickHouse (what ingest stored) and then from the topic,
// from where ClickHouse ends up to where the topic ended at start (what it has not
// stored yet), before the replica reports ready. Only decisions of the organizations
// this replica owns count, whichever replica took them (after a change of the peer
// list the new owner starts from the old owner's decisions), and only those taken
// before this process started: later ones are its own.

// restoreState is what Bootstrap and Run restored.
type restoreState struct {
	mu      sync.Mutex
	seen    map[uint64]struct{} // decision ids restored (nil once caught up)
	fromCH  int
	fromTop int
	// settled is, per agent and execution id, the time of the latest usage report
	// stored in ClickHouse (those of the tail settle through Apply, in stream order).
	settled      map[[2]string]time.Time
	reservations int // restored
	refused      int // refused by Ledger.Reserve on restore (spend grew past the budget)
}

// bootstrapRates restores the limiter from the decisions stored in ClickHouse.
func (r *Replica) bootstrapRates(ctx context.Context, st start) error {
	if r.cfg.Limiter == nil {
		return nil
	}
	r.restored.mu.Lock()
	r.restored.seen = map[uint64]struct{}{}
	r.restored.mu.Unlock()
	if err := r.settledExecutions(ctx); err != nil {
		return err
	}
	// A decision can weigh on a rate for a window, on a budget for the reservation TTL.
	from := r.cfg.Started.Add(-max(r.cfg.RestoreWindow, r.cfg.Ledger.TTL()) - time.Second).UTC()
	// visitParam* read the first "decision" and "allow" keys: api.DecidedData writes
	// them first (query/audit.go reads them the same way). The data is decoded and
	// checked again below; this only spares reading every other decision.
	rows, err := r.cfg.Conn.Query(ctx, `SELECT `+governanceCols+` FROM `+r.cfg.Database+`.events
		WHERE type = ? AND time >= ? AND time <= ?
		AND visitParamExtractString(data, 'decision') = ? AND visitParamExtractBool(data, 'allow') = 1
		ORDER BY time, time_ms`, schema.TypePolicyDecided, from, r.cfg.Started.Add(time.Minute).UTC(), policy.SendMessage)
	if err != nil {
		return fmt.Errorf("cannot read the allowed send_message decisions since %s from %s.events: %w", from.Format(time.RFC3339), r.cfg.Database, err)
	}
	var decisions []store.EventRow
	for rows.Next() {
		var row store.EventRow
		var ms uint16
		if err := rows.Scan(&row.ID, &row.Type, &row.Time, &ms, &row.OrgID, &row.RoomID, &row.ActorID, &row.ActorType, &row.ActorHandle,
			&row.OwnerID, &row.SubjectID, &row.SubjectType, &row.SubjectHandle, &row.ExecutionID, &row.Source, &row.SchemaVersion,
			&row.Data, &row.IngestedAt, &row.Partition, &row.Offset); err != nil {
			rows.Close()
			return fmt.Errorf("cannot read the allowed send_message decisions from %s.events: %w", r.cfg.Database, err)
		}
		row.Time = row.Time.UTC().Add(time.Duration(ms) * time.Millisecond)
		row.IngestedAt = row.IngestedAt.UTC()
		decisions = append(decisions, row)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	keep, err := r.keep(ctx, st, decisions, "send_message decisions")
	if err != nil {
		return err
	}
	for i := range decisions {
		if !keep[i] {
			continue
		}
		// Every organization's: their executions' usage counts against initiators here.
		r.chains.remember([]byte(decisions[i].Data))
		if r.restoreDecision(decisions[i].ID, decisions[i].OrgID, []byte(decisions[i].Data)) {
			r.restored.count(false)
		}
	}
	return nil
}

// settledExecutions reads which executions' usage ClickHouse holds since the oldest
// reservation that can still be open.
func (r *Replica) settledExecutions(ctx context.Context) error {
	from := r.cfg.Started.Add(-r.cfg.Ledger.TTL() - time.Minute).UTC()
	rows, err := r.cfg.Conn.Query(ctx, `SELECT actor_id, execution_id, max(time) FROM `+r.cfg.Database+`.events
		WHERE type = ? AND time >= ? AND execution_id != '' GROUP BY actor_id, execution_id`, schema.TypeUsageReported, from)
	if err != nil {
		return fmt.Errorf("cannot read the usage reports since %s from %s.events: %w", from.Format(time.RFC3339), r.cfg.Database, err)
	}
	defer rows.Close()
	settled := map[[2]string]time.Time{}
	for rows.Next() {
		var agent, execution string
		var at time.Time
		if err := rows.Scan(&agent, &execution, &at); err != nil {
			return fmt.Errorf("cannot read the usage reports from %s.events: %w", r.cfg.Database, err)
		}
		settled[[2]string{agent, execution}] = at
	}
	r.restored.mu.Lock()
	r.restored.settled = settled
	r.restored.mu.Unlock()
	return rows.Err()
}

// restoreDecision puts what one allowed send_message took back into the limiter (and,
// until caught up, the ledger); it reports whether the decision counted (this
// replica's organization, taken before it started, not seen before).
func (r *Replica) restoreDecision(id, org string, data []byte) bool {
	if !r.cfg.Owns(org) {
		return false
	}
	var d api.DecidedData
	if err := json.Unmarshal(data, &d); err != nil || d.Decision != policy.SendMessage || !d.Allow || d.Taken == nil {
		// Decisions of versions that did not record what they took are not restored.
		return false
	}
	t := d.Taken
	if !t.At.Before(r.cfg.Started) {
		return false
	}
	var in policy.MessageInput
	if err := json.Unmarshal(d.Input, &in); err != nil || in.Agent == "" {
		return false
	}
	if r.restored.seenBefore(id) {
		return false
	}
	window := time.Duration(t.Quota.WindowSeconds) * time.Second
	now := r.cfg.Now()
	r.restoreReservation(id, org, &in, t, now)
	for _, k := range []struct {
		key  string
		rate int64
		tat  time.Time
	}{
		{policy.AgentRateKey(in.Agent), t.Quota.MessagesPerWindowAgent, t.AgentTAT},
		{policy.RoomRateKey(in.Agent, in.Room), t.Quota.MessagesPerWindowAgentRoom, t.RoomTAT},
	} {
		switch {
		case k.rate <= 0 || window <= 0:
		case !k.tat.IsZero():
			if k.tat.After(now) { // a TAT behind now is an idle key: nothing to hold
				r.cfg.Limiter.Restore(k.key, k.tat)
			}
		case t.At.After(now.Add(-window)): // an older one weighs on nothing now
			r.cfg.Limiter.Replay(k.key, int(k.rate), window, t.At)
		}
	}
	return true
}

func (s *restoreState) count(fromTopic bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if fromTopic {
		s.fromTop++
	} else {
		s.fromCH++
	}
}

// restoreReservation reserves again the estimate of decision id if it is still open:
// not expired, and no usage report of its execution read yet (ClickHouse's; the tail's
// settle it through Apply after this). Only while catching up (no decision is served
// yet, so the ledger reports no crossing for it: it was reported when it happened).
func (r *Replica) restoreReservation(id, org string, in *policy.MessageInput, t *api.TakenData, now time.Time) {
	if in.ExecutionID == "" || in.Tokens <= 0 && in.CostMicros <= 0 || !t.ReservationExpires.After(now) {
		return
	}
	r.restored.mu.Lock()
	defer r.restored.mu.Unlock()
	if r.restored.seen == nil {
		return
	}
	// A report stamped a little before the decision (the platform's clock) still settles.
	if at, ok := r.restored.settled[[2]string{in.Agent, in.ExecutionID}]; ok && !at.Before(t.At.Add(-time.Minute)) {
		return
	}
	ag, _ := r.cfg.Directory.Agent(in.Agent)
	q := t.Quota
	at := t.ReservationExpires.Add(-r.cfg.Ledger.TTL())
	if at.After(t.At.Add(time.Minute)) || at.Before(t.At.Add(-time.Minute)) {
		at = t.At // the old process had another --reservation-ttl: its expiry, not ours
	}
	ch := policy.Charge{Org: org, Owner: ag.Owner, Agent: in.Agent, Room: in.Room, Tokens: in.Tokens, CostMicros: in.CostMicros}
	if c := in.Chain; c != nil {
		if iorg, ok := r.cfg.Directory.InitiatorOrg(c.Initiator, c.InitiatorType, org); ok {
			ch.Initiator, ch.InitiatorOrg = c.Initiator, iorg
		}
	}
	r.cfg.Ledger.Quiet(true)
	res, denied := r.cfg.Ledger.Reserve(id, ch,
		in.ExecutionID, policy.DefaultLimits{AgentTokens: q.TokensPerDayAgent, OwnerTokens: q.TokensPerDayOwner, OrgTokens: q.TokensPerDayOrg,
			AgentCost: q.CostMicrosPerDayAgent, OwnerCost: q.CostMicrosPerDayOwner, OrgCost: q.CostMicrosPerDayOrg}, at)
	r.cfg.Ledger.Quiet(false)
	switch {
	case denied != nil:
		r.restored.refused++
	case res != nil:
		r.restored.reservations++
	}
}

// seenBefore reports whether id was restored already (ClickHouse and the topic's tail may
// both hold a decision; a redelivery repeats one). Once caught up, nothing is tracked:
// a decision read again then is restored again, which Restore makes harmless.
func (s *restoreState) seenBefore(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.seen == nil {
		return false
	}
	h := fnv.New64a()
	h.Write([]byte(id))
	k := h.Sum64()
	if _, ok := s.seen[k]; ok {
		return true
	}
	s.seen[k] = struct{}{}
	return false
}

// catchUp is the topic's tail Run reads before it reports ready: per partition, from
// where ClickHouse ends to where the topic ended at start.
type catchUp struct {
	ends     map[int]int64 // partition -> offset after its last record at start
	left     map[int]bool  // partitions not read up to their end yet
	deadline time.Time
	start    time.Time
}

func (r *Replica) newCatchUp(ctx context.Context, from map[int]int64) (*catchUp, error) {
	c := &kafkago.Client{Addr: kafkago.TCP(r.cfg.Brokers...), Timeout: 10 * time.Second}
	md, err := c.Metadata(ctx, &kafkago.MetadataRequest{Topics: []string{r.cfg.Topic}})
	if err != nil {
		return nil, fmt.Errorf("cannot read metadata of topic %s: %w", r.cfg.Topic, err)
	}
	if len(md.Topics) == 0 {
		return nil, fmt.Errorf("cannot read metadata of topic %s: the broker returned no topic", r.cfg.Topic)
	}
	var reqs []kafkago.OffsetRequest
	for _, p := range md.Topics[0].Partitions {
		reqs = append(reqs, kafkago.LastOffsetOf(p.ID))
	}
	resp, err := c.ListOffsets(ctx, &kafkago.ListOffsetsRequest{Topics: map[string][]kafkago.OffsetRequest{r.cfg.Topic: reqs}})
	if err != nil {
		return nil, fmt.Errorf("cannot list the end offsets of topic %s: %w", r.cfg.Topic, err)
	}
	tail := &catchUp{ends: map[int]int64{}, left: map[int]bool{}, start: time.Now()}
	tail.deadline = tail.start.Add(r.cfg.CatchUpTimeout)
	for _, p := range resp.Topics[r.cfg.Topic] {
		if p.Error != nil {
			return nil, fmt.Errorf("cannot list the end offset of partition %d of topic %s: %w", p.Partition, r.cfg.Topic, p.Error)
		}
		tail.ends[p.Partition] = p.LastOffset
		if p.LastOffset > from[p.Partition] {
			tail.left[p.Partition] = true
		}
	}
	return tail, nil
}

// done says whether nothing is left to read (true for a nil tail: no limiter).
func (t *catchUp) done() bool { return t == nil || len(t.left) == 0 }

// read notes the record at offset of partition; it reports whether the tail is done.
func (t *catchUp) read(partition int, offset int64) bool {
	if offset+1 >= t.ends[partition] {
		delete(t.left, partition)
	}
	return t.done()
}

// caughtUp reports ready once the tail is read (or its time is up).
func (r *Replica) caughtUp(t *catchUp, ready chan<- struct{}) {
	if t != nil {
		r.restored.mu.Lock()
		r.restored.seen, r.restored.settled = nil, nil
		fromCH, fromTop, reservations, refused := r.restored.fromCH, r.restored.fromTop, r.restored.reservations, r.restored.refused
		r.restored.mu.Unlock()
		if !t.done() {
			r.log.Warn("the topic's tail was not read within the catch-up time: serving now; decisions of the previous process still unread weigh on the rates only once read",
				"partitions_left", fmt.Sprint(t.left), "catch_up_timeout", r.cfg.CatchUpTimeout.String())
		}
		r.log.Info("message rates restored from the trail", "decisions_from_clickhouse", fromCH, "decisions_from_topic", fromTop,
			"rate_keys", r.cfg.Limiter.Len(), "window", r.cfg.RestoreWindow.String(),
			"reservations", reservations, "reservations_refused", refused, "took", time.Since(t.start).String())
		if refused > 0 {
			r.log.Warn("open reservations refused on restore: their budgets' spend grew past them since; until their usage arrives those budgets count less reserved than before the restart",
				"reservations_refused", refused)
		}
	}
	if ready != nil {
		close(ready)
	}
}
