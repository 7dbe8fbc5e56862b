package cause_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/cause"
)

// A late trigger resolves the events that named it, and the events of the executions
// their messages started in turn: a hand-over from an execution whose trigger is late
// has the trigger's initiator too, once the trigger comes, whether the hand-over's
// trigger is inferred from the mention or named.
func TestLateTriggerResolvesTheHandOversItsExecutionStarted(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	alice := schema.Party{ID: "alice", Type: schema.ActorUser}
	coder := schema.Party{ID: "coder", Type: schema.ActorAgent}
	reviewer := schema.Party{ID: "reviewer", Type: schema.ActorAgent}
	for _, named := range []bool{false, true} {
		tr := cause.New(nil, 0, 0)
		n := 0
		ev := func(actor schema.Party, typ string, at time.Duration, data map[string]any) *schema.Event {
			n++
			b, err := json.Marshal(data)
			require.NoError(t, err)
			return &schema.Event{ID: "e" + string(rune('0'+n)), Type: typ, Time: t0.Add(at), RoomID: "room-1", Actor: actor, Data: b}
		}
		links := map[string]cause.Link{}
		observe := func(e *schema.Event) {
			o, ok := tr.Observe(e, nil)
			require.True(t, ok)
			links[e.ID] = o.Link
			for _, r := range o.Resolved {
				links[r.EventID] = r.Link
			}
		}
		late := map[string]any{"message_id": "m-late"}
		// The coder's execution names m-late, which has not come yet; its message hands
		// over to the reviewer, whose execution runs before m-late comes too.
		observe(ev(coder, schema.TypeUsageReported, 2*time.Second, map[string]any{"input_tokens": 1, "output_tokens": 1, "trigger": late}))
		observe(ev(coder, schema.TypeMessageCreated, 3*time.Second, map[string]any{"message_id": "m2", "content": "over to you",
			"mentions": []map[string]string{{"id": "reviewer"}}, "trigger": late}))
		rdata := map[string]any{"input_tokens": 1, "output_tokens": 1}
		if named {
			rdata["trigger"] = map[string]any{"message_id": "m2"}
		}
		reviewed := ev(reviewer, schema.TypeUsageReported, 4*time.Second, rdata)
		observe(reviewed)
		observe(ev(alice, schema.TypeMessageCreated, time.Second, map[string]any{"message_id": "m-late", "content": "go",
			"mentions": []map[string]string{{"id": "coder"}}}))
		// The reviewer's next event, after the trigger came.
		after := ev(reviewer, schema.TypeUsageReported, 5*time.Second, rdata)
		observe(after)

		for _, id := range []string{"e1", "e2"} {
			assert.Equal(t, alice, links[id].Initiator, "named %v: the coder's event %s", named, id)
		}
		for _, id := range []string{reviewed.ID, after.ID} {
			l := links[id]
			assert.False(t, l.Pending, "named %v: the reviewer's event %s is still pending after the trigger came: %+v", named, id, l)
			assert.Equal(t, alice, l.Initiator, "named %v: the reviewer's event %s", named, id)
			assert.Equal(t, 2, l.Depth, "named %v: the reviewer's event %s", named, id)
			assert.Equal(t, "m2", l.Trigger, "named %v: the reviewer's event %s", named, id)
		}
	}
}
