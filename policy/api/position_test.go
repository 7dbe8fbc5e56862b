package api_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/policy"
	"github.com/bandplane/bandplane/policy/api"
	"github.com/bandplane/bandplane/schema"
)

// newClockedAPI is newAPI with the engine's clock at at.
func newClockedAPI(t *testing.T, aud *fakeAuditor, at time.Time) (*api.API, *policy.Engine) {
	t.Helper()
	ctx := context.Background()
	snap, err := policy.LoadDirectoryFile("../testdata/directory.json")
	require.NoError(t, err)
	dir := policy.NewDirectory()
	require.NoError(t, dir.Load(ctx, snap))
	eng, err := policy.New(ctx, policy.Config{Directory: dir, Now: func() time.Time { return at }})
	require.NoError(t, err)
	a, err := api.New(api.Config{Engine: eng, Auth: testKeys, Auditor: aud})
	require.NoError(t, err)
	return a, eng
}

// The audit event records what a replay needs: the directory's position and the
// engine's clock at the decision. The answer does not carry them.
func TestDecidedEventRecordsPositionAndClock(t *testing.T) {
	aud := &fakeAuditor{}
	at := time.Date(2026, 3, 1, 12, 0, 0, 123456789, time.UTC)
	a, eng := newClockedAPI(t, aud, at)
	eng.Directory().SetPosition(policy.Position{0: 1_234_567, 3: 89})

	for _, c := range []struct{ name, body string }{
		{policy.AddParticipant, `{"actor":"a-architect","room":"room-webhook-retries","participant":"a-reviewer"}`},
		{policy.SendMessage, `{"agent":"a-coder","room":"room-webhook-retries","tokens":10}`},
	} {
		code, answer := call(t, a, "POST", "/v1/decisions/"+c.name, "t", c.body)
		require.Equal(t, http.StatusOK, code, "%v", answer)
		require.Equal(t, true, answer["allow"], "%v", answer)
		assert.NotContains(t, answer, "position", "the answer is the caller's, the position the trail's")
		assert.NotContains(t, answer, "decided_at")
		assert.NotContains(t, answer, "Position")
		assert.NotContains(t, answer, "DecidedAt")

		evs := aud.eventsOf(schema.TypePolicyDecided)
		require.NotEmpty(t, evs)
		ev := evs[len(evs)-1]
		require.Equal(t, answer["decision_id"], ev.ID)
		assert.NoError(t, ev.Validate())
		var data api.DecidedData
		require.NoError(t, json.Unmarshal(ev.Data, &data))
		assert.Equal(t, policy.Position{0: 1_234_567, 3: 89}, data.Position, c.name)
		assert.True(t, at.Equal(data.DecidedAt), "%s: decided_at %v, want %v", c.name, data.DecidedAt, at)

		var raw map[string]json.RawMessage
		require.NoError(t, json.Unmarshal(ev.Data, &raw))
		assert.JSONEq(t, `{"0":1234567,"3":89}`, string(raw["position"]))
		assert.Equal(t, `"2026-03-01T12:00:00.123456789Z"`, string(raw["decided_at"]), "RFC 3339 with nanoseconds, UTC")
	}
	// Taken.At stays the API's own reading, taken before the engine decides.
	evs := aud.eventsOf(schema.TypePolicyDecided)
	var data api.DecidedData
	require.NoError(t, json.Unmarshal(evs[len(evs)-1].Data, &data))
	require.NotNil(t, data.Taken)
	assert.False(t, data.Taken.At.Equal(data.DecidedAt), "taken.at is not the engine's clock here")
}

func TestDecidedEventWithoutAReplicaHasNoPosition(t *testing.T) {
	aud := &fakeAuditor{}
	a, _ := newClockedAPI(t, aud, time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	_, err := a.Decide(context.Background(), policy.PeerVisible, &policy.PeerInput{Agent: "a-architect"})
	require.NoError(t, err)
	evs := aud.eventsOf(schema.TypePolicyDecided)
	require.Len(t, evs, 1)
	var raw map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(evs[0].Data, &raw))
	assert.NotContains(t, raw, "position", "a directory not kept from the topic has no position to record")
	assert.Equal(t, `"2026-03-01T12:00:00Z"`, string(raw["decided_at"]))
}
