// Package simulate generates seeded, realistic traffic of the multi-agent chat
// platform: a directory of people and agents in canonical form, then room traffic as the
// platform's own frames (messages with @mentions, tool calls and results, thoughts,
// errors, token usage, participants, contact requests, tasks, requests for a person's
// attention), and hands it to a Sink at a chosen pace. Agents act only when a message
// mentions them or a schedule starts them, in delegation chains whose initiators the
// simulator knows. Its Summary is what the audit trail must reconcile with, and
// Config.Truth what the links ingest derives must.
//
// The same Config, Start included, always yields byte-identical lines.
//
// It may import any folder but cmd/ (deploy/layers).
package simulate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/pricing"
)

// Summary counts what a run sent, by canonical event (every line is run through
// schema.Decode). Only batches the Sink accepted are counted.
type Summary struct {
	Seed  int64     `json:"seed"`
	Start time.Time `json:"start"` // the first event's timestamp, to reproduce the run
	// Events is the number of lines sent, each a distinct event id.
	Events int `json:"events"`
	// ByType counts events by canonical type.
	ByType map[string]int `json:"by_type"`
	// Messages counts message.created events.
	Messages int `json:"messages"`
	// Token sums over usage.reported events.
	UsageEvents      int   `json:"usage_events"`
	InputTokens      int64 `json:"input_tokens"`
	OutputTokens     int64 `json:"output_tokens"`
	CacheReadTokens  int64 `json:"cache_read_tokens"`
	CacheWriteTokens int64 `json:"cache_write_tokens"`
	ReasoningTokens  int64 `json:"reasoning_tokens"`
	// CostMicros sums pricing.Default().Cost(model, usage) over the priced usage events,
	// the model being the agent's registered one; in millionths of Currency.
	CostMicros     int64  `json:"cost_micros"`
	Currency       string `json:"currency"`
	PriceVersion   string `json:"price_version"`
	UnpricedEvents int    `json:"unpriced_events"`
	// ByAgent is keyed by the agent's handle (owner/slug); only agents that posted a
	// message or reported usage appear.
	ByAgent map[string]AgentSummary `json:"by_agent"`
	// ChattyAgent is the handle of the agent that talks far too much, ChattyShare its
	// share of Messages.
	ChattyAgent string  `json:"chatty_agent"`
	ChattyShare float64 `json:"chatty_share"`
	// ContactOutcomes counts contact.request_updated events by status.
	ContactOutcomes map[string]int `json:"contact_outcomes"`
}

// AgentSummary is one agent's part of a Summary.
type AgentSummary struct {
	ID               string `json:"id"`
	Model            string `json:"model"`
	Messages         int    `json:"messages"`
	UsageEvents      int    `json:"usage_events"`
	InputTokens      int64  `json:"input_tokens"`
	OutputTokens     int64  `json:"output_tokens"`
	CacheReadTokens  int64  `json:"cache_read_tokens"`
	CacheWriteTokens int64  `json:"cache_write_tokens"`
	ReasoningTokens  int64  `json:"reasoning_tokens"`
	CostMicros       int64  `json:"cost_micros"`
}

// String is the summary as one JSON line (keys sorted within maps).
func (s Summary) String() string {
	b, err := json.Marshal(s)
	if err != nil {
		return fmt.Sprintf("summary: %v", err)
	}
	return string(b)
}

// Clone returns a deep copy.
func (s Summary) Clone() Summary {
	s.ByType = maps.Clone(s.ByType)
	s.ByAgent = maps.Clone(s.ByAgent)
	s.ContactOutcomes = maps.Clone(s.ContactOutcomes)
	return s
}

func newSummary(cfg Config, start time.Time, cat *pricing.Catalog) Summary {
	return Summary{
		Seed: cfg.Seed, Start: start, ByType: map[string]int{}, ByAgent: map[string]AgentSummary{},
		ContactOutcomes: map[string]int{}, Currency: cat.Currency(), PriceVersion: cat.Version(),
	}
}

// registered is what the directory says about an agent.
type registered struct{ handle, model string }

// tally decodes lines and counts them into summaries.
type tally struct {
	cat    *pricing.Catalog
	agents map[string]registered // agent id → directory entry
	seen   map[string]struct{}   // event ids
}

// decoded is one line's contribution, applied once its batch is accepted.
type decoded struct {
	ev     schema.Event
	usage  *schema.UsageData
	cost   int64
	priced bool
	model  string
	status string
	truth  *Truth // how the event came to be, when the generator knows
}

func (t *tally) decode(line []byte) (decoded, error) {
	ev, err := schema.Decode(line)
	if err != nil {
		return decoded{}, fmt.Errorf("simulate: emitted a line schema.Decode rejects (a bug): %w\n%s", err, line)
	}
	if _, dup := t.seen[ev.ID]; dup {
		return decoded{}, fmt.Errorf("simulate: emitted a duplicate event id %q (a bug)\n%s", ev.ID, line)
	}
	t.seen[ev.ID] = struct{}{}
	d := decoded{ev: ev}
	switch ev.Type {
	case schema.TypeAgentRegistered, schema.TypeAgentUpdated:
		var a schema.AgentData
		if err := json.Unmarshal(ev.Data, &a); err != nil {
			return decoded{}, fmt.Errorf("simulate: agent data: %w", err)
		}
		if ev.Subject != nil {
			t.agents[ev.Subject.ID] = registered{handle: a.Handle, model: a.Model}
		}
	case schema.TypeUsageReported:
		var u schema.UsageData
		if err := json.Unmarshal(ev.Data, &u); err != nil {
			return decoded{}, fmt.Errorf("simulate: usage data: %w", err)
		}
		d.usage = &u
		d.model = u.Model
		if d.model == "" {
			d.model = t.agents[ev.Actor.ID].model
		}
		d.cost, d.priced = t.cat.Cost(d.model, u)
	case schema.TypeContactRequestUpdated:
		var c schema.ContactData
		if err := json.Unmarshal(ev.Data, &c); err != nil {
			return decoded{}, fmt.Errorf("simulate: contact data: %w", err)
		}
		d.status = c.Status
	}
	return d, nil
}

func (t *tally) apply(s *Summary, d decoded) {
	s.Events++
	s.ByType[d.ev.Type]++
	reg, isAgent := t.agents[d.ev.Actor.ID]
	var as AgentSummary
	if isAgent {
		as = s.ByAgent[reg.handle]
		as.ID, as.Model = d.ev.Actor.ID, reg.model
	}
	switch d.ev.Type {
	case schema.TypeMessageCreated:
		s.Messages++
		if isAgent {
			as.Messages++
			s.ByAgent[reg.handle] = as
		}
	case schema.TypeUsageReported:
		u := d.usage
		s.UsageEvents++
		s.InputTokens += u.InputTokens
		s.OutputTokens += u.OutputTokens
		s.CacheReadTokens += u.CacheReadTokens
		s.CacheWriteTokens += u.CacheWriteTokens
		var rt int64
		if u.ReasoningTokens != nil {
			rt = *u.ReasoningTokens
		}
		s.ReasoningTokens += rt
		if d.priced {
			s.CostMicros += d.cost
		} else {
			s.UnpricedEvents++
		}
		if isAgent {
			as.UsageEvents++
			as.InputTokens += u.InputTokens
			as.OutputTokens += u.OutputTokens
			as.CacheReadTokens += u.CacheReadTokens
			as.CacheWriteTokens += u.CacheWriteTokens
			as.ReasoningTokens += rt
			as.CostMicros += d.cost
			s.ByAgent[reg.handle] = as
		}
	case schema.TypeContactRequestUpdated:
		s.ContactOutcomes[d.status]++
	}
	if s.Messages > 0 {
		s.ChattyShare = float64(s.ByAgent[s.ChattyAgent].Messages) / float64(s.Messages)
	}
}

// Run generates cfg's traffic and sends it to sink in batches of at most
// cfg.BatchSize lines, paced to cfg.Rate. It stops after cfg.Events lines, or when
// cfg.Duration of wall-clock time has passed, whichever comes first; with neither set
// it runs until ctx is cancelled, which then is the normal end (nil error). Otherwise a
// cancelled ctx ends the run with ctx's error. progress, if not nil, gets a copy of the
// summary about once a second, from Run's goroutine.
//
// Every line is decoded with schema.Decode before it is sent; a line it rejects, or a
// repeated event id, is a bug of the simulator and ends the run with an error. The
// returned Summary counts the batches the sink accepted, also on error.
func Run(ctx context.Context, cfg Config, sink Sink, progress func(Summary)) (Summary, error) {
	if err := cfg.Validate(); err != nil {
		return Summary{}, err
	}
	if sink == nil {
		return Summary{}, errors.New("simulate: no sink")
	}
	start := cfg.Start
	live := start.IsZero()
	if live {
		start = time.Now().UTC().Truncate(time.Second)
	}
	cat := pricing.Default()
	g := newGenerator(cfg, cat, start)
	if live && cfg.Rate > 0 {
		g.wall = time.Now
	}
	sum := newSummary(cfg, start.UTC(), cat)
	sum.ChattyAgent = g.w.cast.chatty.Handle
	t := &tally{cat: cat, agents: map[string]registered{}, seen: map[string]struct{}{}}

	unbounded := cfg.Events == 0 && cfg.Duration == 0
	endErr := func(err error) error {
		if unbounded && errors.Is(err, ctx.Err()) && ctx.Err() != nil {
			return nil //nolint:nilerr // a run without a bound ends only when its context does: that is its success
		}
		return err
	}
	wallStart := time.Now()
	var deadline time.Time
	if cfg.Duration > 0 {
		deadline = wallStart.Add(cfg.Duration)
	}
	batchMax := cfg.BatchSize
	if cfg.Rate > 0 {
		batchMax = min(batchMax, max(1, int(cfg.Rate/10)))
	}
	lastProgress := wallStart
	lines := make([][]byte, 0, batchMax)
	evs := make([]decoded, 0, batchMax)
	for cfg.Events <= 0 || sum.Events < cfg.Events {
		if err := ctx.Err(); err != nil {
			return sum, endErr(err)
		}
		if !deadline.IsZero() && !time.Now().Before(deadline) {
			break
		}
		if cfg.Rate > 0 {
			due := wallStart.Add(time.Duration(float64(sum.Events) / cfg.Rate * float64(time.Second)))
			if !deadline.IsZero() && due.After(deadline) {
				if err := sleepUntil(ctx, deadline); err != nil {
					return sum, endErr(err)
				}
				break
			}
			if err := sleepUntil(ctx, due); err != nil {
				return sum, endErr(err)
			}
		}
		n := batchMax
		if cfg.Events > 0 {
			n = min(n, cfg.Events-sum.Events)
		}
		lines, evs = lines[:0], evs[:0]
		for range n {
			l, truth := g.next()
			d, err := t.decode(l)
			if err != nil {
				return sum, err
			}
			d.truth = truth
			lines = append(lines, l)
			evs = append(evs, d)
		}
		if err := sink.Send(ctx, lines); err != nil {
			if ctx.Err() != nil {
				return sum, endErr(ctx.Err())
			}
			return sum, fmt.Errorf("simulate: sending %d lines after %d: %w", len(lines), sum.Events, err)
		}
		lines = make([][]byte, 0, batchMax) // the sink may keep the slice
		for _, d := range evs {
			t.apply(&sum, d)
			if cfg.Truth != nil && d.truth != nil {
				truth := *d.truth
				truth.EventID = d.ev.ID
				cfg.Truth(truth)
			}
		}
		if progress != nil && time.Since(lastProgress) >= time.Second {
			lastProgress = time.Now()
			progress(sum.Clone())
		}
	}
	return sum, nil
}

// sleepUntil waits for t or ctx, whichever comes first.
func sleepUntil(ctx context.Context, t time.Time) error {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err()
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return nil
	}
}
