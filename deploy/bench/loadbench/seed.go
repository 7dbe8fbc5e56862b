package loadbench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/bandplane/bandplane/policy"
	"github.com/bandplane/bandplane/schema"
)

// The world: org-a, the legitimate tenant, with two people, eight agents and four
// rooms; org-h, the hostile one, with one of each. Every run makes it afresh in its own
// database, so the ids need no stamp.
const (
	orgA    = "org-a"
	orgH    = "org-h"
	peopleA = 2
	agentsA = 8
	roomsA  = 4
	model   = "gpt-5-mini" // in the built-in price catalog: the costs have figures
	source  = "bench-load"

	// seedEventsA are org-a's messages and usage reports before the phases, over the
	// 50 minutes before the seed: what its cost query and audit page read.
	seedEventsA = 3000
	seedPerPost = 500
	// largeEvents of largeBytes of message content are org-h's: what its hostile
	// pages read. A page holds as many as fit in serve's default
	// --graphql-max-response-bytes (16 MiB) with room for the rest of each row, so
	// that every hostile page costs the server its whole budget and is answered.
	largeEvents  = 96
	largeBytes   = 256 << 10
	largePerPost = 3
	responseCap  = 16 << 20
	auditLimit   = responseCap * 9 / 10 / largeBytes
)

func personA(i int) schema.Party {
	return schema.Party{ID: "usr-a-" + strconv.Itoa(i), Type: schema.ActorUser, Handle: "a-lead-" + strconv.Itoa(i)}
}

func agentA(i int) schema.Party {
	owner := personA(i % peopleA)
	return schema.Party{ID: "agt-a-" + strconv.Itoa(i), Type: schema.ActorAgent, Handle: owner.Handle + "/agent-" + strconv.Itoa(i)}
}

func roomA(i int) string { return "room-a-" + strconv.Itoa(i) }

var (
	personH = schema.Party{ID: "usr-h-0", Type: schema.ActorUser, Handle: "h-lead-0"}
	agentH  = schema.Party{ID: "agt-h-0", Type: schema.ActorAgent, Handle: "h-lead-0/agent-0"}
	roomH   = "room-h-0"
	system  = schema.Party{ID: "system", Type: schema.ActorSystem}
)

// event builds one canonical event; data is marshalled as it is.
func event(id, typ string, at time.Time, org, room string, actor schema.Party, subject *schema.Party, data any) schema.Event {
	raw, _ := json.Marshal(data) // the *Data types always marshal
	return schema.Event{ID: id, Type: typ, Time: at.UTC().Truncate(time.Millisecond), OrgID: org, RoomID: room,
		Actor: actor, Subject: subject, Source: source, SchemaVersion: schema.Version, Data: raw}
}

// directory is both organizations' people, agents, rooms and participants: platform
// types, which only a platform ingest key writes.
func directory(at time.Time) []schema.Event {
	var evs []schema.Event
	n := 0
	add := func(typ, org, room string, actor schema.Party, subject *schema.Party, data any) {
		n++
		evs = append(evs, event("bench-load-dir-"+strconv.Itoa(n), typ, at.Add(time.Duration(n)*time.Millisecond), org, room, actor, subject, data))
	}
	person := func(org string, p schema.Party) {
		add(schema.TypeUserRegistered, org, "", system, &p, schema.UserData{Handle: p.Handle, Name: "Bench " + p.Handle})
	}
	agent := func(org string, a, owner schema.Party, room string) {
		add(schema.TypeAgentRegistered, org, "", owner, &a, schema.AgentData{Handle: a.Handle, Name: "Bench " + a.Handle, OwnerID: owner.ID,
			Model: model, PersonalRegistryAccess: true, Listed: true})
		add(schema.TypeParticipantAdded, org, room, system, &a, schema.ParticipantData{ParticipantID: a.ID, ParticipantType: schema.ActorAgent})
	}
	for i := range peopleA {
		person(orgA, personA(i))
	}
	for i := range roomsA {
		add(schema.TypeRoomAdded, orgA, roomA(i), agentA(i), nil, schema.RoomData{Title: "Bench room " + strconv.Itoa(i)})
	}
	for i := range agentsA {
		agent(orgA, agentA(i), personA(i%peopleA), roomA(i%roomsA))
	}
	person(orgH, personH)
	add(schema.TypeRoomAdded, orgH, roomH, agentH, nil, schema.RoomData{Title: "Hostile room"})
	agent(orgH, agentH, personH, roomH)
	return evs
}

// content is n bytes of message text.
func content(n int, seed int) string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz "
	var b strings.Builder
	b.Grow(n)
	for i := range n {
		b.WriteByte(alphabet[(i*7+seed)%len(alphabet)])
	}
	return b.String()
}

// activityA is org-a's i-th event of a kind the collector takes from an organization's
// key: a usage report of an agent, or a message of a person. People's messages change
// no subscriber's work status, so the collector's load stays apart from the
// subscribers' figure.
func activityA(id string, i int, at time.Time) schema.Event {
	room := roomA(i % roomsA)
	if i%2 == 0 {
		a := agentA(i % agentsA)
		return event(id, schema.TypeUsageReported, at, orgA, room, a, nil,
			schema.UsageData{InputTokens: int64(1000 + i%500), OutputTokens: int64(100 + i%50), CacheReadTokens: 10, CacheWriteTokens: 5, Model: model})
	}
	return event(id, schema.TypeMessageCreated, at, orgA, room, personA(i%peopleA), nil, schema.MessageData{Content: content(200, i)})
}

// seedA is org-a's history. Half of it is agents' messages: the audit page's rows carry
// their names.
func seedA(end time.Time) []schema.Event {
	evs := make([]schema.Event, 0, seedEventsA)
	start := end.Add(-50 * time.Minute)
	step := 50 * time.Minute / seedEventsA
	for i := range seedEventsA {
		id, at := "bench-load-a-seed-"+strconv.Itoa(i), start.Add(time.Duration(i)*step)
		if i%4 == 1 {
			evs = append(evs, event(id, schema.TypeMessageCreated, at, orgA, roomA(i%roomsA), agentA(i%agentsA), nil, schema.MessageData{Content: content(200, i)}))
			continue
		}
		evs = append(evs, activityA(id, i, at))
	}
	return evs
}

// seedH is org-h's large messages.
func seedH(end time.Time) []schema.Event {
	evs := make([]schema.Event, 0, largeEvents)
	for i := range largeEvents {
		evs = append(evs, event("bench-load-h-large-"+strconv.Itoa(i), schema.TypeMessageCreated, end.Add(time.Duration(i-largeEvents)*time.Second),
			orgH, roomH, agentH, nil, schema.MessageData{Content: content(largeBytes, i)}))
	}
	return evs
}

// ndjson encodes events one a line.
func ndjson(evs []schema.Event) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	for i := range evs {
		_ = enc.Encode(&evs[i]) // a schema.Event always encodes
	}
	return b.Bytes()
}

// collectorAnswer is POST /v1/events's answer.
type collectorAnswer struct {
	Accepted int `json:"accepted"`
	Rejected int `json:"rejected"`
	Errors   []struct {
		Line   int    `json:"line"`
		Reason string `json:"reason"`
	} `json:"errors"`
	Error string `json:"error"`
	Code  string `json:"code"`
}

// postEvents posts one body and fails unless every line was accepted.
func postEvents(ctx context.Context, c *http.Client, url, token string, body []byte, lines int) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/events", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/x-ndjson")
	resp, err := c.Do(req)
	if err != nil {
		return transportRefusal(err)
	}
	defer resp.Body.Close() //nolint:errcheck // read to the end below
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return transportRefusal(err)
	}
	var a collectorAnswer
	_ = json.Unmarshal(raw, &a) // an answer that is not JSON is reported with its status
	if resp.StatusCode != http.StatusOK {
		return &refusal{reason: "HTTP " + strconv.Itoa(resp.StatusCode), detail: fmt.Sprintf("%s: %.300s", resp.Status, raw)}
	}
	if a.Accepted != lines {
		first := ""
		if len(a.Errors) > 0 {
			first = fmt.Sprintf(": line %d: %s", a.Errors[0].Line, a.Errors[0].Reason)
		}
		return &refusal{reason: "lines rejected", detail: fmt.Sprintf("%d of %d lines accepted%s", a.Accepted, lines, first)}
	}
	return nil
}

// postSeed posts body, again after a refusal that asks to retry (503 while the policy
// directory loads, 429), for up to two minutes.
func postSeed(ctx context.Context, c *http.Client, url, token string, body []byte, lines int) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		err := postEvents(ctx, c, url, token, body, lines)
		var r *refusal
		if err == nil || !errors.As(err, &r) || (r.reason != "HTTP 503" && r.reason != "HTTP 429") || time.Now().After(deadline) {
			return err
		}
		if err := sleep(ctx, 500*time.Millisecond); err != nil {
			return err
		}
	}
}

// seed posts the directory and both organizations' events through the collector, each
// with its organization's ingest key, and waits until the reads the phases make
// answer in full.
func (s *stack) seed(ctx context.Context) (Seeded, error) {
	c := &http.Client{Timeout: time.Minute}
	now := time.Now()
	dir := directory(now.Add(-time.Hour))
	s.cfg.Progress("seed: the directory (%d events), %d events of %s, %d messages of %d KiB of %s", len(dir), seedEventsA, orgA, largeEvents, largeBytes>>10, orgH)
	if err := postSeed(ctx, c, s.url, s.tokens.platformIngest, ndjson(dir), len(dir)); err != nil {
		return Seeded{}, fmt.Errorf("cannot post the directory: %w", err)
	}
	a := seedA(now)
	for i := 0; i < len(a); i += seedPerPost {
		part := a[i:min(i+seedPerPost, len(a))]
		if err := postSeed(ctx, c, s.url, s.tokens.aIngest, ndjson(part), len(part)); err != nil {
			return Seeded{}, fmt.Errorf("cannot post %s's events: %w", orgA, err)
		}
	}
	h := seedH(now)
	for i := 0; i < len(h); i += largePerPost {
		part := h[i:min(i+largePerPost, len(h))]
		if err := postSeed(ctx, c, s.url, s.tokens.hIngest, ndjson(part), len(part)); err != nil {
			return Seeded{}, fmt.Errorf("cannot post %s's large events: %w", orgH, err)
		}
	}
	seeded := Seeded{EventsA: len(a), LargeEvents: len(h), LargeBytes: largeBytes, AuditLimit: auditLimit}
	start := time.Now()
	if err := s.waitSeeded(ctx, len(a), len(h)); err != nil {
		return seeded, err
	}
	s.cfg.Progress("seed: stored and queryable after %s", time.Since(start).Round(100*time.Millisecond))
	return seeded, nil
}

// waitSeeded polls until ClickHouse holds every seeded event, the cost rollup has
// rows, a hostile page is answered whole and the policy directory knows org-a's
// agents: the reads the phases make then measure the server, not the seed landing.
func (s *stack) waitSeeded(ctx context.Context, nA, nH int) error {
	c := &http.Client{Timeout: 30 * time.Second}
	deadline := time.Now().Add(3 * time.Minute)
	var last error
	for step := 0; ; step++ {
		last = s.seededCheck(ctx, c, nA, nH)
		if last == nil {
			return nil
		}
		if !s.alive() {
			return fmt.Errorf("serve exited while the seed was stored (%s); its output:\n%s", s.exitStatus(), s.logTail(4000))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the seed is not queryable after 3 minutes: %w", last)
		}
		if step%25 == 24 {
			s.cfg.Progress("seed: waiting (%v)", last)
		}
		if err := sleep(ctx, 400*time.Millisecond); err != nil {
			return err
		}
	}
}

func (s *stack) seededCheck(ctx context.Context, c *http.Client, nA, nH int) error {
	var a, h uint64
	q := "SELECT countIf(org_id = ? AND id LIKE 'bench-load-a-seed-%'), countIf(org_id = ? AND id LIKE 'bench-load-h-large-%') FROM " + s.names.db + ".events"
	if err := s.conn.QueryRow(ctx, q, orgA, orgH).Scan(&a, &h); err != nil {
		return fmt.Errorf("cannot count the stored events: %w", err)
	}
	if int(a) < nA || int(h) < nH {
		return fmt.Errorf("%d of %d events of %s and %d of %d of %s stored", a, nA, orgA, h, nH, orgH)
	}
	from, to := costWindow(time.Now())
	var costs costsData
	if err := postGraphQL(ctx, c, s.url, s.tokens.aViewer, costsQuery, map[string]any{"from": from, "to": to}, &costs); err != nil {
		return fmt.Errorf("costs: %w", err)
	}
	if len(costs.Costs.Rows) == 0 {
		return errors.New("costs: no rows yet (the rollup is rebuilt every --rollup-interval)")
	}
	var page auditData
	if err := postGraphQL(ctx, c, s.url, s.tokens.hCompliance, hostileAuditQuery, map[string]any{"limit": auditLimit}, &page); err != nil {
		return fmt.Errorf("the hostile page: %w", err)
	}
	if len(page.AuditEvents.Events) != auditLimit {
		return fmt.Errorf("the hostile page has %d of %d events", len(page.AuditEvents.Events), auditLimit)
	}
	if err := postDecision(ctx, c, s.url, s.tokens.router, decisionBody(0)); err != nil {
		return fmt.Errorf("policy decision: %w", err)
	}
	return nil
}

// costWindow is what the cost query covers: the seed's hour and the phases'.
func costWindow(now time.Time) (from, to string) {
	t := now.UTC().Truncate(time.Hour)
	return t.Add(-2 * time.Hour).Format(time.RFC3339), t.Add(2 * time.Hour).Format(time.RFC3339)
}

// decisionBody is the i-th peer_visible question: may one of org-a's agents see
// another of the same owner.
func decisionBody(i int) []byte {
	b, _ := json.Marshal(policy.PeerInput{Agent: agentA(i % agentsA).ID, Candidate: agentA((i + peopleA) % agentsA).ID})
	return b
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
