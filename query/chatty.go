package query

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/shopspring/decimal"

	"github.com/bandplane/bandplane/schema"
)

// Chatty agent list sizes.
const (
	DefaultChattyLimit = 10
	MaxChattyLimit     = 100
)

// defaultChattyRange is the range of a ChattyQuery without From.
const defaultChattyRange = time.Hour

// throttleCodes are the reason codes of a send_message denial that is throttling: the
// Go side of the policy engine adds them when it enforces the quota the policy returned
// (policy.CodeRateLimited: the message rate per agent, or per agent and room, is used
// up; policy.CodeBudgetExceeded: the day's token or cost budget of the agent, its owner
// or its organization is spent). The policy's own send_message denials (unknown_agent,
// suspended, not_participant, invalid_input) and eval_error / undefined are not a
// throttle; they count in Denied only.
var throttleCodes = []string{"rate_limited", "budget_exceeded"}

// ChattyQuery asks for the agents of one organization that posted the most messages in
// [From, To). Zero From/To: the last hour (To: now, From: To less an hour).
type ChattyQuery struct {
	OrgID    string
	From, To time.Time
	Limit    int // 0: DefaultChattyLimit
}

// ChattyAgent is one agent's activity in the range.
type ChattyAgent struct {
	AgentID string
	OwnerID string // as ingest attributed the agent's latest message in the range
	// Messages counts its message.created events, a replayed event once.
	Messages uint64
	// Tokens and Cost come from the hourly rollup, so they cover the whole hours the
	// range touches (From rounded down, To up to the hour). Cost is in Currency; an
	// agent priced in several currencies in the range gets the one of most usage
	// events (costs in different currencies cannot be added).
	Tokens   Tokens
	Cost     decimal.Decimal
	Currency string
	// Throttled counts its send_message decisions denied for a rate limit or a budget
	// (throttleCodes), Denied all its denied decisions, in the range.
	Throttled, Denied uint64
	// Suspended is the operator's suspension now (the latest of its agent.suspended and
	// agent.resumed events, whenever it was), not the platform's own flag.
	Suspended bool
}

// Validate reports every problem of the query at once, each naming its field.
func (q ChattyQuery) Validate() error {
	var errs []error
	errs = checkOrg(errs, q.OrgID)
	errs = checkRange(errs, q.From, q.To)
	errs = checkLimit(errs, q.Limit, MaxChattyLimit)
	return errors.Join(errs...)
}

// chattyMessagesSQL ranks the agents by messages. Messages are counted without FINAL,
// by distinct (id, time): a replay is the same key, and FINAL over a long range would
// cost more than the count.
type chattyMessagesSQL struct {
	db       string
	org      string
	from, to time.Time
	limit    int
}

func (s chattyMessagesSQL) toSQL() (string, []any) {
	w := &where{}
	w.add("org_id = ?", s.org)
	addRange(w, s.from, s.to)
	w.add("type = ?", schema.TypeMessageCreated)
	w.add("actor_type = 'agent'")
	return "SELECT actor_id, argMax(owner_id, time) AS last_owner, uniqExact(id, time) AS total_messages" +
		" FROM " + s.db + ".events WHERE " + w.String() +
		" GROUP BY actor_id ORDER BY total_messages DESC, actor_id" +
		fmt.Sprintf(" LIMIT %d", s.limit), w.args
}

// chattyUsageSQL sums the agents' usage from the hourly rollup (FINAL: a rebuilt hour
// replaces its rows), per currency.
type chattyUsageSQL struct {
	db       string
	org      string
	from, to time.Time
	agents   []string
}

func (s chattyUsageSQL) toSQL() (string, []any) {
	w := &where{}
	w.add("org_id = ?", s.org)
	w.add("hour >= ?", s.from.UTC().Truncate(time.Hour))
	w.add("hour < ?", ceilHour(s.to))
	w.add("has(?, agent_id)", s.agents)
	// Aliases unlike the columns (see costsSQL); a group a rebuild zeroed is dropped.
	return "SELECT agent_id, currency, sum(events) AS total_events," +
		" sum(input_tokens) AS total_input, sum(output_tokens) AS total_output," +
		" sum(cache_read_tokens) AS total_cache_read, sum(cache_write_tokens) AS total_cache_write," +
		" sum(reasoning_tokens) AS total_reasoning, sum(cost) AS total_cost" +
		" FROM " + s.db + ".usage_hourly FINAL WHERE " + w.String() +
		" GROUP BY agent_id, currency HAVING total_events > 0", w.args
}

// chattyDecisionsSQL counts the agents' denied decisions (the agent is the event's
// actor), each decision once by (id, time). visitParam* read the first matching key:
// "decision" and "allow" are DecidedData's first fields, and "code" is the first
// reason's (a throttle is the only reason of its denial, see policy.Engine.deny).
type chattyDecisionsSQL struct {
	db       string
	org      string
	from, to time.Time
	agents   []string
}

func (s chattyDecisionsSQL) toSQL() (string, []any) {
	w := &where{}
	w.add("org_id = ?", s.org)
	addRange(w, s.from, s.to)
	w.add("type = ?", schema.TypePolicyDecided)
	w.add("has(?, actor_id)", s.agents)
	w.add("visitParamExtractBool(data, 'allow') = 0")
	args := append([]any{"send_message", throttleCodes}, w.args...)
	return "SELECT actor_id, uniqExact(id, time) AS total_denied," +
		" uniqExactIf(id, time, visitParamExtractString(data, 'decision') = ? AND has(?, visitParamExtractString(data, 'code'))) AS total_throttled" +
		" FROM " + s.db + ".events WHERE " + w.String() +
		" GROUP BY actor_id", args
}

// chattySuspendedSQL finds each agent's latest operator action, in the order the
// policy replica replays them (time, then Kafka position). An operator's action has the
// agent as subject and the operator's key as actor (policy/api).
type chattySuspendedSQL struct {
	db     string
	org    string
	agents []string
}

func (s chattySuspendedSQL) toSQL() (string, []any) {
	w := &where{}
	w.add("org_id = ?", s.org)
	w.add("has(?, type)", []string{schema.TypeAgentSuspended, schema.TypeAgentResumed})
	w.add("has(?, subject_id)", s.agents)
	return "SELECT subject_id, argMax(type, (time, time_ms, kafka_partition, kafka_offset)) AS last_action" +
		" FROM " + s.db + ".events WHERE " + w.String() +
		" GROUP BY subject_id", w.args
}

// ChattyAgents lists q.OrgID's agents by messages posted in the range, most first
// (then by agent id), with their usage, throttled and denied decisions and whether an
// operator suspended them. Agents that posted nothing are not listed.
func (qr *Querier) ChattyAgents(ctx context.Context, q ChattyQuery) ([]ChattyAgent, error) {
	if err := q.Validate(); err != nil {
		return nil, err
	}
	from, to, err := window(q.From, q.To, qr.now(), defaultChattyRange)
	if err != nil {
		return nil, err
	}
	limit := q.Limit
	if limit == 0 {
		limit = DefaultChattyLimit
	}
	what := func(verb string) string { return fmt.Sprintf("cannot %s chatty agents of org %q", verb, q.OrgID) }

	out := []ChattyAgent{}
	byID := map[string]*ChattyAgent{}
	sql, args := chattyMessagesSQL{db: qr.db, org: q.OrgID, from: from, to: to, limit: limit}.toSQL()
	err = qr.each(ctx, what("count messages of"), sql, args, func(scan func(...any) error) error {
		var a ChattyAgent
		if err := scan(&a.AgentID, &a.OwnerID, &a.Messages); err != nil {
			return err
		}
		a.Cost = decimal.Zero
		out = append(out, a)
		return nil
	})
	if err != nil || len(out) == 0 {
		return out, err
	}
	agents := make([]string, len(out))
	for i := range out {
		agents[i] = out[i].AgentID
		byID[out[i].AgentID] = &out[i]
	}

	events := map[string]uint64{} // usage events of the currency kept, by agent
	sql, args = chattyUsageSQL{db: qr.db, org: q.OrgID, from: from, to: to, agents: agents}.toSQL()
	err = qr.each(ctx, what("sum usage of"), sql, args, func(scan func(...any) error) error {
		var id, currency string
		var n uint64
		var t Tokens
		var cost decimal.Decimal
		if err := scan(&id, &currency, &n, &t.Input, &t.Output, &t.CacheRead, &t.CacheWrite, &t.Reasoning, &cost); err != nil {
			return err
		}
		a := byID[id]
		if a == nil {
			return nil
		}
		a.Tokens = a.Tokens.Add(t)
		if n > events[id] || n == events[id] && currency < a.Currency {
			events[id], a.Cost, a.Currency = n, cost, currency
		}
		return nil
	})
	if err != nil {
		return nil, err
	}

	sql, args = chattyDecisionsSQL{db: qr.db, org: q.OrgID, from: from, to: to, agents: agents}.toSQL()
	err = qr.each(ctx, what("count decisions of"), sql, args, func(scan func(...any) error) error {
		var id string
		var denied, throttled uint64
		if err := scan(&id, &denied, &throttled); err != nil {
			return err
		}
		if a := byID[id]; a != nil {
			a.Denied, a.Throttled = denied, throttled
		}
		return nil
	})
	if err != nil {
		return nil, err
	}

	sql, args = chattySuspendedSQL{db: qr.db, org: q.OrgID, agents: agents}.toSQL()
	err = qr.each(ctx, what("read suspensions of"), sql, args, func(scan func(...any) error) error {
		var id, last string
		if err := scan(&id, &last); err != nil {
			return err
		}
		if a := byID[id]; a != nil {
			a.Suspended = last == schema.TypeAgentSuspended
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// each runs sql and calls row for every row with the row's Scan. what describes the
// query for its errors.
func (qr *Querier) each(ctx context.Context, what, sql string, args []any, row func(scan func(...any) error) error) error {
	rows, err := qr.conn.Query(ctx, sql, args...)
	if err != nil {
		return queryErr(ctx, err, what+" from "+qr.db)
	}
	defer rows.Close()
	for rows.Next() {
		if err := row(rows.Scan); err != nil {
			return fmt.Errorf("%s from %s: %w", what, qr.db, err)
		}
	}
	if err := rows.Err(); err != nil {
		return queryErr(ctx, err, what+" from "+qr.db)
	}
	return nil
}
