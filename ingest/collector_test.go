package ingest_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	kafkago "github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/ingest"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/kafka"
	"github.com/bandplane/bandplane/schema/keys"
)

type fakeProducer struct {
	mu     sync.Mutex
	events []schema.Event
	err    error
}

func (p *fakeProducer) ProduceMessages(_ context.Context, msgs []kafkago.Message) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err != nil {
		return p.err
	}
	for _, m := range msgs {
		var ev schema.Event
		if err := json.Unmarshal(m.Value, &ev); err != nil {
			return err
		}
		if string(m.Key) != ev.Key() {
			return errors.New("message key is not the event's partition key")
		}
		p.events = append(p.events, ev)
	}
	return nil
}

// fakeKeys is a key store: a token maps to its key.
type fakeKeys map[string]keys.Key

func (f fakeKeys) Lookup(_ context.Context, token string) (keys.Key, bool) {
	k, ok := f[token]
	return k, ok
}

var collectorKeys = fakeKeys{
	"s3cret":     {ID: "k-platform", Org: keys.PlatformOrg, Role: keys.RoleIngest},
	"acme":       {ID: "k-acme", Org: "org-acme", Role: keys.RoleIngest},
	"acme-admin": {ID: "k-acme-admin", Org: "org-acme", Role: keys.RoleAdmin},
	"other":      {ID: "k-other", Org: "org-other", Role: keys.RoleIngest},
}

// registrations: agent-acme is registered in org-acme, agent-other in org-other.
type registrations map[string]string

func (r registrations) OrgOf(id string) (string, bool) {
	org, ok := r[id]
	return org, ok
}

// now is the collector's clock in these tests: the sample frames are from 2025-11 and
// 2026-02, inside the default window.
var now = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func newCollector(t *testing.T, prod *fakeProducer, mod func(*ingest.CollectorConfig)) *ingest.Collector {
	t.Helper()
	cfg := ingest.CollectorConfig{Producer: prod, Auth: collectorKeys, Now: func() time.Time { return now },
		Registrations: registrations{"agent-acme": "org-acme", "agent-other": "org-other"}}
	if mod != nil {
		mod(&cfg)
	}
	c, err := ingest.NewCollector(cfg)
	require.NoError(t, err)
	return c
}

func post(t *testing.T, c http.Handler, token, body string) (int, ingest.CollectorResponse) {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, "/v1/events", strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	rec := httptest.NewRecorder()
	c.ServeHTTP(rec, req)
	var resp ingest.CollectorResponse
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &resp), rec.Body.String())
	return rec.Code, resp
}

func collect(t *testing.T, prod *fakeProducer, maxBody int64, token, body string) (int, ingest.CollectorResponse) {
	t.Helper()
	return post(t, newCollector(t, prod, func(c *ingest.CollectorConfig) { c.MaxBodyBytes = maxBody }), token, body)
}

func sharedFrames(t *testing.T) []string {
	b, err := os.ReadFile("../schema/testdata/band/frames.ndjson")
	require.NoError(t, err)
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

// canonical is a message.created event of the given org and actor.
func canonical(id, org, actor string) string {
	ev := map[string]any{"id": id, "type": "message.created", "time": "2026-03-01T11:00:00Z", "room_id": "r1",
		"actor": map[string]any{"id": actor, "type": "agent"}, "source": "sdk", "data": map[string]any{"content": "hi"}}
	if org != "" {
		ev["org_id"] = org
	}
	b, _ := json.Marshal(ev)
	return string(b)
}

func TestCollectorAcceptsValidLinesAndReportsEachRejected(t *testing.T) {
	frames := sharedFrames(t)
	body := strings.Join([]string{
		frames[0],
		`{"topic":"chat_room:r1","event":"message_created"`, // line 2: malformed
		frames[5],
		``, // blank lines are skipped
		`{"id":"x","type":"usage.reported","time":"yesterday","actor":{"id":"a","type":"agent"},"source":"t","data":{}}`, // line 5
	}, "\n")
	prod := &fakeProducer{}
	code, resp := collect(t, prod, 0, "s3cret", body)
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, 2, resp.Accepted)
	assert.Equal(t, 2, resp.Rejected)
	require.Len(t, resp.Errors, 2)
	assert.Equal(t, 2, resp.Errors[0].Line)
	assert.Contains(t, resp.Errors[0].Reason, "invalid JSON")
	assert.Equal(t, 5, resp.Errors[1].Line)
	assert.Contains(t, resp.Errors[1].Reason, "time")
	require.Len(t, prod.events, 2)
	assert.Equal(t, "message.created", prod.events[0].Type)
	assert.Equal(t, "event.tool_call", prod.events[1].Type)
}

func TestCollectorAcceptsAJSONArray(t *testing.T) {
	frames := sharedFrames(t)
	prod := &fakeProducer{}
	code, resp := collect(t, prod, 0, "s3cret", " [ "+strings.Join(frames, " ,\n")+" ] ")
	assert.Equal(t, http.StatusOK, code, "%+v", resp)
	assert.Equal(t, len(frames), resp.Accepted)
	assert.Zero(t, resp.Rejected)
}

func TestCollectorErrors(t *testing.T) {
	frames := sharedFrames(t)
	for _, tc := range []struct {
		name, token, body string
		maxBody           int64
		prodErr           error
		code              int
		contains          string
	}{
		{"no key", "", frames[0], 0, nil, http.StatusUnauthorized, "API key"},
		{"unknown key", "nope", frames[0], 0, nil, http.StatusUnauthorized, "unknown"},
		{"wrong role", "acme-admin", frames[0], 0, nil, http.StatusForbidden, "ingest"},
		{"too large", "s3cret", frames[0], 10, nil, http.StatusRequestEntityTooLarge, "larger than 10 bytes"},
		{"all invalid", "s3cret", "{}\n[1]", 0, nil, http.StatusBadRequest, ""},
		{"empty", "s3cret", "\n\n", 0, nil, http.StatusBadRequest, "no events"},
		{"empty array", "s3cret", "[]", 0, nil, http.StatusBadRequest, "no events"},
		{"kafka down", "s3cret", frames[0], 0, errors.New("broker unreachable"), http.StatusServiceUnavailable, "broker unreachable"},
		{"bad array", "s3cret", "[1,", 0, nil, http.StatusBadRequest, "not a JSON array"},
		{"array trailing comma", "s3cret", "[" + frames[0] + ",]", 0, nil, http.StatusBadRequest, "trailing ','"},
		{"array empty element", "s3cret", "[," + frames[0] + "]", 0, nil, http.StatusBadRequest, "empty element"},
		{"array then data", "s3cret", "[" + frames[0] + "] x", 0, nil, http.StatusBadRequest, "after the array"},
		{"array unbalanced", "s3cret", "[" + frames[0] + "}]", 0, nil, http.StatusBadRequest, "unbalanced"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prod := &fakeProducer{err: tc.prodErr}
			code, resp := collect(t, prod, tc.maxBody, tc.token, tc.body)
			assert.Equal(t, tc.code, code, "%+v", resp)
			assert.Contains(t, resp.Error, tc.contains)
			assert.NotEmpty(t, resp.Code, "every error carries a code")
			assert.Empty(t, prod.events)
		})
	}
}

func TestCollectorMethod(t *testing.T) {
	c := newCollector(t, &fakeProducer{}, nil)
	req := httptest.NewRequest(http.MethodGet, "/v1/events", nil)
	rec := httptest.NewRecorder()
	c.ServeHTTP(rec, req)
	assert.Equal(t, http.StatusMethodNotAllowed, rec.Code)
	assert.Equal(t, http.MethodPost, rec.Header().Get("Allow"))
}

// TestCollectorWriteRights: each line is held to the key's rights, and the good lines
// of the same request land.
func TestCollectorWriteRights(t *testing.T) {
	agentReg := `{"id":"reg1","type":"agent.registered","time":"2026-03-01T10:00:00Z","org_id":"org-acme","actor":{"id":"u1","type":"user"},"subject":{"id":"agent-acme","type":"agent"},"source":"platform","data":{"handle":"alice/bot","owner_id":"u1"}}`
	own := func(typ string) string {
		return `{"id":"o-` + typ + `","type":"` + typ + `","time":"2026-03-01T10:00:00Z","org_id":"org-acme","actor":{"id":"x","type":"system"},"source":"platform","data":{}}`
	}
	for _, tc := range []struct {
		name, token, line string
		reason            string // "" = accepted
	}{
		{"platform writes a registration", "s3cret", agentReg, ""},
		{"org key writes no registration", "acme", agentReg, "needs a platform ingest key"},
		{"org key writes no contact", "acme", `{"topic":"agent_contacts:agent-acme","event":"contact_added","payload":{"id":"c1","handle":"bob/bot","type":"Agent","inserted_at":"2026-02-09T10:35:00Z"}}`, "needs a platform ingest key"},
		{"org key writes no participant", "acme", `{"topic":"room_participants:r1","event":"participant_added","payload":{"id":"agent-acme","name":"x","type":"Agent"}}`, "needs a platform ingest key"},
		{"org key adds itself to no room", "acme", `{"topic":"agent_rooms:agent-acme","event":"room_added","payload":{"id":"r9","title":"t","inserted_at":"2026-02-09T10:35:00Z"}}`, "needs a platform ingest key"},
		{"nobody writes policy.decided", "s3cret", own("policy.decided"), "written only by bandplane"},
		{"nobody writes agent.control", "s3cret", own("agent.control"), "written only by bandplane"},
		{"nobody writes agent.suspended", "s3cret", own("agent.suspended"), "written only by bandplane"},
		{"nobody writes agent.resumed", "s3cret", own("agent.resumed"), "written only by bandplane"},
		{"nobody writes key.created", "s3cret", own("key.created"), "written only by bandplane"},
		{"nobody writes audit.sealed", "s3cret", own("audit.sealed"), "written only by bandplane"},
		{"nobody writes budget.set", "acme", own("budget.set"), "written only by bandplane"},
		{"agent_control frames are bandplane's", "s3cret", `{"topic":"agent_control:agent-acme","event":"agent.control","payload":{"action":"stop","inserted_at":"2026-02-09T10:35:00Z"}}`, "written only by bandplane"},
		{"nobody uses bandplane's sources", "s3cret", strings.Replace(canonical("e1", "org-acme", "agent-acme"), `"source":"sdk"`, `"source":"bandplane-policy"`, 1), "reserved"},
		{"org key writes its org", "acme", canonical("e2", "org-acme", "agent-acme"), ""},
		{"org key writes no other org", "acme", canonical("e3", "org-other", "agent-other"), `org_id: "org-other" is not the organization`},
		{"org key writes no other org's agent", "acme", canonical("e4", "", "agent-other"), `actor.id: "agent-other" is registered in another organization`},
		{"org key writes an unknown agent", "acme", canonical("e5", "", "agent-new"), ""},
		{"org key names no frame id", "acme", canonical("3ba7e9dc-b023-88a6-9f64-80f34307b6fa", "org-acme", "agent-acme"), "has the form of a frame's id"},
		{"platform key may name a frame id", "s3cret", canonical("3ba7e9dc-b023-88a6-9f64-80f34307b6fa", "org-acme", "agent-acme"), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prod := &fakeProducer{}
			good := canonical("good-"+tc.name, "org-acme", "agent-acme")
			code, resp := post(t, newCollector(t, prod, nil), tc.token, good+"\n"+tc.line)
			assert.Equal(t, http.StatusOK, code, "%+v", resp)
			if tc.reason == "" {
				assert.Equal(t, 2, resp.Accepted, "%+v", resp)
				return
			}
			assert.Equal(t, 1, resp.Accepted, "the good line beside it lands: %+v", resp)
			require.Len(t, resp.Errors, 1)
			assert.Equal(t, 2, resp.Errors[0].Line)
			assert.Contains(t, resp.Errors[0].Reason, tc.reason)
		})
	}
}

func TestCollectorStampsTheKeysOrganization(t *testing.T) {
	prod := &fakeProducer{}
	frames := sharedFrames(t)
	code, resp := post(t, newCollector(t, prod, nil), "acme", canonical("e1", "", "agent-new")+"\n"+frames[0])
	require.Equal(t, http.StatusOK, code, "%+v", resp)
	require.Len(t, prod.events, 2)
	for _, ev := range prod.events {
		assert.Equal(t, "org-acme", ev.OrgID, "an organization's event without org_id is its key's")
	}
}

// TestCollectorScopesFrameIDsByWriter: the same frame posted again by the same key's
// organization has the same id (a retry is a replay); posted by an organization's key it
// never has the id the platform's copy has, whether the platform posts it or produces it
// to Kafka directly, nor another organization's.
func TestCollectorScopesFrameIDsByWriter(t *testing.T) {
	require.Equal(t, keys.PlatformOrg, schema.PlatformWriter, "a platform key's organization is the platform's scope")
	frame := sharedFrames(t)[0]
	send := func(token string) schema.Event {
		t.Helper()
		prod := &fakeProducer{}
		c := newCollector(t, prod, nil)
		code, resp := post(t, c, token, frame)
		require.Equal(t, http.StatusOK, code, "%+v", resp)
		require.Len(t, prod.events, 1)
		return prod.events[0]
	}

	platform := send("s3cret")
	assert.Equal(t, platform.ID, send("s3cret").ID, "the platform's frame again")
	direct, err := schema.Decode([]byte(frame))
	require.NoError(t, err)
	assert.Equal(t, direct.ID, platform.ID, "a platform key's frame has the id it has when produced to Kafka directly")
	sink := &eventsProducer{}
	require.NoError(t, ingest.ProducerSink{Producer: sink}.Send(context.Background(), [][]byte{[]byte(frame)}))
	require.Len(t, sink.events, 1)
	assert.Equal(t, platform.ID, sink.events[0].ID, "ProducerSink writes with the platform's rights")

	acme := send("acme")
	assert.Equal(t, acme.ID, send("acme").ID, "the organization's frame again")
	assert.Equal(t, "org-acme", acme.OrgID)
	assert.NotEqual(t, platform.ID, acme.ID, "an organization's copy never has the platform's id")
	other := send("other")
	assert.Equal(t, "org-other", other.OrgID)
	assert.NotEqual(t, platform.ID, other.ID)
	assert.NotEqual(t, acme.ID, other.ID, "nor another organization's")

	// A canonical event keeps its id whoever posts it: the scope is for frame ids.
	line := canonical("evt-kept", "org-acme", "agent-acme")
	for _, token := range []string{"s3cret", "acme"} {
		prod := &fakeProducer{}
		code, resp := post(t, newCollector(t, prod, nil), token, line)
		require.Equal(t, http.StatusOK, code, "%+v", resp)
		require.Len(t, prod.events, 1)
		assert.Equal(t, "evt-kept", prod.events[0].ID, token)
	}
}

// eventsProducer is a Producer that keeps what it is given.
type eventsProducer struct{ events []schema.Event }

func (p *eventsProducer) Produce(_ context.Context, events []schema.Event) error {
	p.events = append(p.events, events...)
	return nil
}

func TestCollectorTimeWindow(t *testing.T) {
	at := func(ts string) string {
		return strings.Replace(canonical("t-"+ts, "", "a"), "2026-03-01T11:00:00Z", ts, 1)
	}
	for _, tc := range []struct {
		time, reason string
	}{
		{"2026-03-01T12:59:59Z", ""},                      // within the skew
		{"2026-03-01T13:00:01Z", "--max-clock-skew"},      // beyond it
		{"2025-02-01T00:00:00Z", ""},                      // 393 days old
		{"2025-01-01T00:00:00Z", "--max-event-age"},       // over 400 days
		{"9999-01-01T00:00:00Z", "time"},                  // DateTime cannot hold it
		{"1971-01-01T00:00:00Z", "--max-event-age"},       // far too old
		{"2026-03-01T17:30:00+05:00", ""},                 // 12:30Z: the zone is honoured
		{"2026-03-01T19:00:00+05:00", "--max-clock-skew"}, // 14:00Z
	} {
		prod := &fakeProducer{}
		code, resp := post(t, newCollector(t, prod, nil), "s3cret", at(tc.time))
		if tc.reason == "" {
			assert.Equal(t, http.StatusOK, code, "%s: %+v", tc.time, resp)
			continue
		}
		assert.Equal(t, http.StatusBadRequest, code, tc.time)
		require.Len(t, resp.Errors, 1, tc.time)
		assert.Contains(t, resp.Errors[0].Reason, tc.reason, tc.time)
	}
}

func TestCollectorEventSizeIsALineError(t *testing.T) {
	prod := &fakeProducer{}
	c := newCollector(t, prod, func(c *ingest.CollectorConfig) { c.MaxEventBytes = 2000 })
	big := strings.Replace(canonical("big", "", "a"), `"content":"hi"`, `"content":"`+strings.Repeat("x", 3000)+`"`, 1)
	// < > & are escaped when encoded: a line under the limit can encode over it.
	escaped := strings.Replace(canonical("esc", "", "a"), `"content":"hi"`, `"content":"`+strings.Repeat("<", 400)+`"`, 1)
	code, resp := post(t, c, "s3cret", canonical("ok", "", "a")+"\n"+big+"\n"+escaped)
	assert.Equal(t, http.StatusOK, code, "one oversized line is never a request-wide 503")
	assert.Equal(t, 1, resp.Accepted)
	require.Len(t, resp.Errors, 2)
	for _, e := range resp.Errors {
		assert.Contains(t, e.Reason, "more than the 2000 bytes")
	}
	_, err := ingest.NewCollector(ingest.CollectorConfig{Producer: prod, Auth: collectorKeys, MaxEventBytes: kafka.MaxEventBytes + 1})
	assert.ErrorContains(t, err, "Kafka's message limit")
}

// TestCollectorBoundsWhatOneRequestCosts: a body full of lines, bad or blank, costs a
// bounded amount of memory and time — the review's 14 MB array of 7,000,000 elements
// took 2.5 GB before.
func TestCollectorBoundsWhatOneRequestCosts(t *testing.T) {
	prod := &fakeProducer{}
	c := newCollector(t, prod, nil)
	for _, tc := range []struct {
		name, body string
		status     int
		contains   string
	}{
		{"7M array elements", "[" + strings.Repeat("1,", 7_000_000) + "1]", http.StatusRequestEntityTooLarge, "more than 100000 events"},
		{"16M blank lines", strings.Repeat("\n", 16_000_000), http.StatusBadRequest, "no events"},
		{"100k bad lines", strings.Repeat("{}\n", 100_000), http.StatusBadRequest, "all 100000 lines were refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			start := time.Now()
			code, resp := post(t, c, "s3cret", tc.body)
			took := time.Since(start)
			runtime.ReadMemStats(&after)
			assert.Equal(t, tc.status, code, "%s", resp.Error)
			assert.Contains(t, resp.Error, tc.contains)
			assert.LessOrEqual(t, len(resp.Errors), 1000, "only the first 1,000 reasons are listed")
			alloc := after.TotalAlloc - before.TotalAlloc
			t.Logf("%s: %s, %d MB allocated", tc.name, took.Round(time.Millisecond), alloc>>20)
			assert.Less(t, alloc, uint64(200<<20), "allocated %d MB", alloc>>20)
		})
	}
	// 100,000 lines is the most one request may hold; the count of refused lines is exact.
	code, resp := post(t, c, "s3cret", strings.Repeat("{}\n", 1500))
	assert.Equal(t, http.StatusBadRequest, code)
	assert.Equal(t, 1500, resp.Rejected)
	assert.Len(t, resp.Errors, 1000)
}

// TestCollectorLimitsConcurrentRequests runs in a synctest bubble: synctest.Wait returns
// once every request is blocked, in the producer or waiting for a slot, so the count in
// the producer is final when it is read.
func TestCollectorLimitsConcurrentRequests(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		block := make(chan struct{})
		prod := &blockingProducer{release: block}
		c, err := ingest.NewCollector(ingest.CollectorConfig{Producer: prod, Auth: collectorKeys, Now: func() time.Time { return now }, MaxConcurrent: 2})
		require.NoError(t, err)
		var wg sync.WaitGroup
		for i := range 3 {
			wg.Go(func() { post(t, c, "s3cret", canonical(fmt.Sprint("e", i), "", "a")) })
		}
		synctest.Wait()
		assert.Equal(t, int64(2), prod.inFlight.Load(), "the third request waits for a slot")
		close(block)
		wg.Wait()
		assert.Equal(t, int64(3), prod.done.Load())
	})
}

// blockingProducer holds every produce until release is closed.
type blockingProducer struct {
	release        chan struct{}
	inFlight, done atomic.Int64
}

func (p *blockingProducer) ProduceMessages(ctx context.Context, _ []kafkago.Message) error {
	p.inFlight.Add(1)
	defer p.inFlight.Add(-1)
	select {
	case <-p.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	p.done.Add(1)
	return nil
}

func TestCollectorChecksOrganizationsOnlyAgainstALoadedDirectory(t *testing.T) {
	line := canonical("e1", "", "agent-new")
	// No directory at all (serve --no-policy): organizations' keys may not write.
	c := newCollector(t, &fakeProducer{}, func(c *ingest.CollectorConfig) { c.Registrations = nil })
	code, resp := post(t, c, "acme", line)
	assert.Equal(t, http.StatusBadRequest, code)
	require.Len(t, resp.Errors, 1)
	assert.Contains(t, resp.Errors[0].Reason, "only platform keys may write here")
	code, _ = post(t, c, "s3cret", line)
	assert.Equal(t, http.StatusOK, code, "platform keys still write")

	// A directory still loading: 503 for organizations, platform keys go on.
	var ready atomic.Bool
	c = newCollector(t, &fakeProducer{}, func(c *ingest.CollectorConfig) { c.RegistrationsReady = ready.Load })
	code, resp = post(t, c, "acme", line)
	assert.Equal(t, http.StatusServiceUnavailable, code)
	assert.Contains(t, resp.Error, "still loading")
	code, _ = post(t, c, "s3cret", line)
	assert.Equal(t, http.StatusOK, code)
	ready.Store(true)
	code, _ = post(t, c, "acme", line)
	assert.Equal(t, http.StatusOK, code)
}
