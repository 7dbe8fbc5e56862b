package ingest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/ingest"
	"github.com/bandplane/bandplane/schema"
)

// collectorPipeline is a collector that produces to the pipeline's topic, with the
// test keys (s3cret: the platform's, acme: org-acme's) and agent-acme registered in
// org-acme, for the collector's checks and, by a registration the platform posts a day
// before at, for ingest's attribution.
func collectorPipeline(t *testing.T, at time.Time) (*pipeline, *ingest.Collector) {
	p := newPipeline(t)
	c, err := ingest.NewCollector(ingest.CollectorConfig{Producer: p.producer, Auth: collectorKeys,
		Registrations: registrations{"agent-acme": "org-acme"}})
	require.NoError(t, err)
	p.start("ingest")
	reg := fmt.Sprintf(`{"id":"reg-agent-acme","type":"agent.registered","time":%q,"org_id":"org-acme","actor":{"id":"u-acme","type":"user"},"subject":{"id":"agent-acme","type":"agent","handle":"acme/bot"},"source":"test","data":{"handle":"acme/bot","owner_id":"u-acme","model":"gpt-5-mini"}}`,
		at.Add(-24*time.Hour).UTC().Format(time.RFC3339Nano))
	code, resp := post(t, c, "s3cret", reg)
	require.Equal(t, http.StatusOK, code, "%+v", resp)
	require.Equal(t, 1, resp.Accepted, "%+v", resp)
	p.waitLag("ingest", 30*time.Second)
	return p, c
}

// agentFrames are a message and a usage report of agent-acme in its room, at at: the
// frames the platform sends, whose content (and so, unscoped, whose id) anyone can tell
// in advance.
func agentFrames(at time.Time) []string {
	ts := at.UTC().Format(time.RFC3339Nano)
	return []string{
		fmt.Sprintf(`{"topic":"chat_room:room-acme","event":"message_created","payload":{"id":"msg-1","content":"deploying","message_type":"text","sender_id":"agent-acme","sender_type":"Agent","chat_room_id":"room-acme","inserted_at":%q}}`, ts),
		fmt.Sprintf(`{"topic":"chat_room:room-acme","event":"event_created","payload":{"id":"evt-1","content":"usage","message_type":"task","metadata":{"band_usage":{"input_tokens":1200,"output_tokens":340}},"sender_id":"agent-acme","sender_type":"Agent","chat_room_id":"room-acme","inserted_at":%q}}`, ts),
	}
}

type storedEvent struct{ ID, OrgID, Type string }

func (p *pipeline) bandEvents() map[string]storedEvent {
	p.t.Helper()
	rows, err := p.conn.Query(context.Background(), "SELECT id, org_id, type FROM "+p.db+".events FINAL WHERE source = 'band'")
	require.NoError(p.t, err)
	defer rows.Close()
	out := map[string]storedEvent{}
	for rows.Next() {
		var e storedEvent
		require.NoError(p.t, rows.Scan(&e.ID, &e.OrgID, &e.Type))
		out[e.ID] = e
	}
	require.NoError(p.t, rows.Err())
	return out
}

func (p *pipeline) usageEvents() map[string]string {
	p.t.Helper()
	rows, err := p.conn.Query(context.Background(), "SELECT event_id, org_id FROM "+p.db+".usage FINAL")
	require.NoError(p.t, err)
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var id, org string
		require.NoError(p.t, rows.Scan(&id, &org))
		out[id] = org
	}
	require.NoError(p.t, rows.Err())
	return out
}

func frameIDs(t *testing.T, frames []string, writer string) []string {
	t.Helper()
	ids := make([]string, len(frames))
	for i, f := range frames {
		ev, err := schema.DecodeFrom([]byte(f), time.Time{}, writer)
		require.NoError(t, err)
		ids[i] = ev.ID
	}
	return ids
}

// TestIntegrationPlatformFramesPostedTwiceAreStoredOnce: the platform's frames posted
// again (a retry) are replays: stored once, under the ids they have when produced to
// Kafka directly, attributed to the agent's organization, with nothing dead-lettered.
func TestIntegrationPlatformFramesPostedTwiceAreStoredOnce(t *testing.T) {
	at := time.Now().Add(-time.Hour).Truncate(time.Millisecond)
	p, c := collectorPipeline(t, at)
	frames := agentFrames(at)
	platformIDs := frameIDs(t, frames, schema.PlatformWriter)
	for range 2 {
		code, resp := post(t, c, "s3cret", frames[0]+"\n"+frames[1])
		require.Equal(t, http.StatusOK, code, "%+v", resp)
		require.Equal(t, 2, resp.Accepted, "%+v", resp)
		p.waitLag("ingest", 30*time.Second)
	}
	assert.Equal(t, map[string]storedEvent{
		platformIDs[0]: {platformIDs[0], "org-acme", schema.TypeMessageCreated},
		platformIDs[1]: {platformIDs[1], "org-acme", schema.TypeUsageReported},
	}, p.bandEvents())
	assert.Equal(t, uint64(2), p.count("SELECT count() FROM "+p.db+".events WHERE source = 'band'"), "the replays were not written again")
	assert.Equal(t, map[string]string{platformIDs[1]: "org-acme"}, p.usageEvents())
	assert.Empty(t, p.deadLetters())
}

// TestIntegrationTenantCannotTakeAPlatformFramesID: an organization's key posts the
// exact content of frames the platform is about to send, first (and tries a canonical
// copy under the platform's id, which is refused); then the platform sends them. Both
// are stored as distinct events: the platform's under its own ids, nothing of it
// dropped as a replay or dead-lettered as a reused id, and the tenant's copy under the
// tenant's organization and ids of its own.
func TestIntegrationTenantCannotTakeAPlatformFramesID(t *testing.T) {
	at := time.Now().Add(-time.Hour).Truncate(time.Millisecond)
	p, c := collectorPipeline(t, at)
	frames := agentFrames(at)
	platformIDs := frameIDs(t, frames, schema.PlatformWriter)
	tenantIDs := frameIDs(t, frames, "org-acme")

	code, resp := post(t, c, "acme", frames[0]+"\n"+frames[1])
	require.Equal(t, http.StatusOK, code, "%+v", resp)
	require.Equal(t, 2, resp.Accepted, "an organization may post frames of its own agent: %+v", resp)
	p.waitLag("ingest", 30*time.Second)
	require.Len(t, p.bandEvents(), 2, "the tenant's copies are stored first")

	// Nor can it name the platform's id in a canonical copy: the id is predictable too.
	plat, err := schema.Decode([]byte(frames[0]))
	require.NoError(t, err)
	plat.OrgID = "org-acme"
	copied, err := json.Marshal(plat)
	require.NoError(t, err)
	code, resp = post(t, c, "acme", string(copied))
	require.Equal(t, http.StatusBadRequest, code, "%+v", resp)
	require.Len(t, resp.Errors, 1, "%+v", resp)
	assert.Contains(t, resp.Errors[0].Reason, "has the form of a frame's id")

	code, resp = post(t, c, "s3cret", frames[0]+"\n"+frames[1])
	require.Equal(t, http.StatusOK, code, "%+v", resp)
	require.Equal(t, 2, resp.Accepted, "%+v", resp)
	p.waitLag("ingest", 30*time.Second)

	assert.Equal(t, map[string]storedEvent{
		platformIDs[0]: {platformIDs[0], "org-acme", schema.TypeMessageCreated},
		platformIDs[1]: {platformIDs[1], "org-acme", schema.TypeUsageReported},
		tenantIDs[0]:   {tenantIDs[0], "org-acme", schema.TypeMessageCreated},
		tenantIDs[1]:   {tenantIDs[1], "org-acme", schema.TypeUsageReported},
	}, p.bandEvents(), "four distinct events")
	assert.Equal(t, uint64(4), p.count("SELECT count() FROM "+p.db+".events WHERE source = 'band'"),
		"nothing was dropped as a replay, nothing written twice")
	assert.Equal(t, map[string]string{platformIDs[1]: "org-acme", tenantIDs[1]: "org-acme"}, p.usageEvents(),
		"the platform's usage is counted under its own id")
	assert.Empty(t, p.deadLetters(), "no platform frame was taken for a reused id")
}
