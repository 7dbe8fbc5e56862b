package ingest_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/ingest"
	"github.com/bandplane/bandplane/schema/store"
)

// causeStorage is a fakeStorage that keeps cause links too (ingest.Causes): the
// stored batches' rows and the rewrites, latest version winning as FINAL reads them.
type causeStorage struct {
	fakeStorage
	cmu       sync.Mutex
	warm      []store.CauseRow // what RecentCauses answers
	rewritten []store.UsageRow
	relinked  []store.CauseRow
}

func (s *causeStorage) RecentCauses(context.Context, time.Time, int) ([]store.CauseRow, error) {
	return s.warm, nil
}

func (s *causeStorage) CausesOfEvents(_ context.Context, ids []string, _, _ time.Time) ([]store.CauseRow, error) {
	var out []store.CauseRow
	for _, r := range s.all().Causes {
		if slices.Contains(ids, r.EventID) {
			out = append(out, r)
		}
	}
	return out, nil
}

func (s *causeStorage) UsageOfEvents(_ context.Context, ids []string, _, _ time.Time) ([]store.UsageRow, error) {
	var out []store.UsageRow
	for _, r := range s.all().Usage {
		if slices.Contains(ids, r.EventID) {
			out = append(out, r)
		}
	}
	return out, nil
}

func (s *causeStorage) InsertUsage(_ context.Context, rows []store.UsageRow) error {
	s.cmu.Lock()
	defer s.cmu.Unlock()
	s.rewritten = append(s.rewritten, rows...)
	return nil
}

func (s *causeStorage) InsertCauses(_ context.Context, rows []store.CauseRow) error {
	s.cmu.Lock()
	defer s.cmu.Unlock()
	s.relinked = append(s.relinked, rows...)
	return nil
}

func (s *causeStorage) rewrites() ([]store.UsageRow, []store.CauseRow) {
	s.cmu.Lock()
	defer s.cmu.Unlock()
	return slices.Clone(s.rewritten), slices.Clone(s.relinked)
}

// chatLine is an event in room-1 at 10:00 plus sec seconds.
func chatLine(id, typ, actor, actorType string, sec int, data string) string {
	return fmt.Sprintf(`{"id":%q,"type":%q,"time":"2026-11-02T10:00:%02d.000Z","org_id":"org-1","room_id":"room-1","actor":{"id":%q,"type":%q},"source":"test","schema_version":1,"data":%s}`,
		id, typ, sec, actor, actorType, data)
}

func mentionData(msgID string, agents ...string) string {
	m := ""
	for i, a := range agents {
		if i > 0 {
			m += ","
		}
		m += fmt.Sprintf(`{"id":%q,"handle":"@%s"}`, a, a)
	}
	return fmt.Sprintf(`{"message_id":%q,"content":"please","mentions":[%s]}`, msgID, m)
}

func usageBy(t *testing.T, rows []store.UsageRow, id string) store.UsageRow {
	t.Helper()
	for _, r := range rows {
		if r.EventID == id {
			return r
		}
	}
	require.Failf(t, "no usage row", "event %s", id)
	return store.UsageRow{}
}

func TestConsumerLinksADelegationChainToItsInitiator(t *testing.T) {
	st := &causeStorage{}
	h := startWith(t, st, func(c *ingest.Config) { c.BatchSize, c.Causes = 6, st })
	h.send(0, chatLine("m1", "message.created", "alice", "user", 1, mentionData("pm-1", "coder")))
	h.send(0, chatLine("u1", "usage.reported", "coder", "agent", 2, usageData))
	h.send(0, chatLine("m2", "message.created", "coder", "agent", 3, mentionData("pm-2", "reviewer")))
	h.send(0, chatLine("u2", "usage.reported", "reviewer", "agent", 4, usageData))
	h.send(0, chatLine("u3", "usage.reported", "loner", "agent", 5, usageData))
	h.send(0, chatLine("u4", "usage.reported", "coder", "agent", 6,
		`{"input_tokens":1,"output_tokens":1,"cache_read_tokens":0,"cache_write_tokens":0,"trigger":{"source":"schedule"}}`))
	require.Eventually(t, func() bool { return h.reader.commit(0) == 6 }, 5*time.Second, 5*time.Millisecond)
	all := st.all()
	assert.Len(t, all.Causes, 6, "every message and usage event of a person or an agent has its link")

	u1 := usageBy(t, all.Usage, "u1")
	assert.Equal(t, store.Chain{TriggerID: "pm-1", TriggerEventID: "m1", InitiatorID: "alice", InitiatorType: "user",
		InitiatorOwner: "alice", Depth: 1, Link: "inferred"}, u1.Chain)
	u2 := usageBy(t, all.Usage, "u2")
	assert.Equal(t, "alice", u2.Chain.InitiatorID, "the reviewer's spend was set going by alice, through the coder")
	assert.Equal(t, uint16(2), u2.Chain.Depth)
	assert.Equal(t, "pm-2", u2.Chain.TriggerID)
	u3 := usageBy(t, all.Usage, "u3")
	assert.Equal(t, store.Chain{InitiatorID: "loner", InitiatorType: "agent", Link: "inferred"}, u3.Chain, "nobody mentioned it: its own root")
	u4 := usageBy(t, all.Usage, "u4")
	assert.Equal(t, store.Chain{InitiatorID: "schedule", InitiatorType: "system", Depth: 1, Link: "explicit"}, u4.Chain)
	for _, c := range all.Causes {
		if c.EventID == "m1" {
			assert.Equal(t, "pm-1", c.MessageID)
			assert.Equal(t, []string{"coder"}, c.Mentions)
		}
		assert.NotZero(t, c.Version, "stamped with the insert attempt")
	}
}

func TestConsumerRelinksWhatALateTriggerResolves(t *testing.T) {
	st := &causeStorage{}
	var mu sync.Mutex
	var hours []store.HourKey
	h := startWith(t, st, func(c *ingest.Config) {
		c.BatchSize, c.Causes = 1, st
		c.AfterFlush = func(hk []store.HourKey, _ []ingest.AgentKey) { mu.Lock(); hours = append(hours, hk...); mu.Unlock() }
	})
	h.send(0, chatLine("u1", "usage.reported", "coder", "agent", 2,
		`{"input_tokens":1000,"output_tokens":100,"cache_read_tokens":0,"cache_write_tokens":0,"trigger":{"message_id":"pm-late"}}`))
	require.Eventually(t, func() bool { return h.reader.commit(0) == 1 }, 5*time.Second, 5*time.Millisecond)
	assert.Equal(t, "pending", usageBy(t, st.all().Usage, "u1").Chain.Link)

	h.send(0, chatLine("m1", "message.created", "alice", "user", 1, mentionData("pm-late", "coder")))
	require.Eventually(t, func() bool { return h.reader.commit(0) == 2 }, 5*time.Second, 5*time.Millisecond)
	usage, causes := st.rewrites()
	require.Len(t, usage, 1)
	require.Len(t, causes, 1)
	stored := usageBy(t, st.all().Usage, "u1")
	assert.Equal(t, store.Chain{TriggerID: "pm-late", TriggerEventID: "m1", InitiatorID: "alice", InitiatorType: "user",
		InitiatorOwner: "alice", Depth: 1, Link: "explicit"}, usage[0].Chain)
	assert.Greater(t, usage[0].Version, stored.Version, "the rewrite replaces the stored row")
	assert.Equal(t, stored.CostMicros, usage[0].CostMicros, "only the chain changes")
	assert.Equal(t, usage[0].Chain, causes[0].Chain)
	mu.Lock()
	defer mu.Unlock()
	assert.Contains(t, hours, store.HourKey{OrgID: "org-1", Hour: time.Date(2026, 11, 2, 10, 0, 0, 0, time.UTC)}, "the rollups rebuild the rewritten hour")
	assert.Equal(t, float64(1), counterValue(t, h.metrics.Links.WithLabelValues("resolved")))
}

func TestConsumerWarmsItsLinksFromWhatItStored(t *testing.T) {
	at := time.Now().UTC().Add(-time.Minute).Truncate(time.Millisecond)
	st := &causeStorage{warm: []store.CauseRow{
		{EventID: "u0", Time: at, Type: "usage.reported", OrgID: "org-1", RoomID: "room-1", ActorID: "coder",
			Chain: store.Chain{TriggerID: "pm-0", Depth: 1, Link: "pending"}},
		{EventID: "m0", Time: at, Type: "message.created", OrgID: "org-1", RoomID: "room-1", ActorID: "alice", MessageID: "pm-0",
			Mentions: []string{"coder"}, Chain: store.Chain{InitiatorID: "alice", InitiatorType: "user", InitiatorOwner: "alice", Link: "explicit"}},
	}}
	st.batches = []store.Batch{{Usage: []store.UsageRow{{EventID: "u0", Time: at, OrgID: "org-1", AgentID: "coder", Version: 1,
		Chain: store.Chain{TriggerID: "pm-0", Depth: 1, Link: "pending"}}}}}
	h := startWith(t, st, func(c *ingest.Config) { c.BatchSize, c.Causes = 1, st })
	line := fmt.Sprintf(`{"id":"u1","type":"usage.reported","time":%q,"org_id":"org-1","room_id":"room-1","actor":{"id":"coder","type":"agent"},"source":"test","schema_version":1,"data":%s}`,
		at.Add(time.Second).Format(time.RFC3339Nano), usageData)
	h.send(0, line)
	require.Eventually(t, func() bool { return h.reader.commit(0) == 1 }, 5*time.Second, 5*time.Millisecond)
	assert.Equal(t, "alice", usageBy(t, st.all().Usage, "u1").Chain.InitiatorID, "inferred from a mention stored before the start")
	usage, _ := st.rewrites()
	require.Len(t, usage, 1, "a pending link whose trigger was stored is resolved at start")
	assert.Equal(t, "alice", usage[0].Chain.InitiatorID)
}

// A redelivered event keeps the link it got when it first came: its usage and cause
// rows are not written again, even where its room's later messages would link it
// otherwise now.
func TestConsumerReplayKeepsItsFirstLink(t *testing.T) {
	st := &causeStorage{}
	h := startWith(t, st, func(c *ingest.Config) { c.BatchSize, c.Causes = 1, st })
	u1 := chatLine("u1", "usage.reported", "coder", "agent", 2, usageData)
	h.send(0, chatLine("m1", "message.created", "alice", "user", 1, mentionData("pm-1", "coder")))
	h.send(0, u1)
	h.send(0, chatLine("m2", "message.created", "bob", "user", 3, mentionData("pm-2", "coder")))
	h.send(0, u1)
	require.Eventually(t, func() bool { return h.reader.commit(0) == 4 }, 5*time.Second, 5*time.Millisecond)
	all := st.all()
	var links []string
	for _, c := range all.Causes {
		if c.EventID == "u1" {
			links = append(links, c.Chain.TriggerID)
		}
	}
	assert.Equal(t, []string{"pm-1"}, links, "one cause row, the first")
	n := 0
	for _, u := range all.Usage {
		if u.EventID == "u1" {
			n++
			assert.Equal(t, "alice", u.Chain.InitiatorID)
		}
	}
	assert.Equal(t, 1, n, "one usage row, the first")
}

// An event of a party ingest does not know yet waits for the end of its batch (its
// registration may be on another partition); the events of its room after it wait
// too, so that the tracker sees the room in stream order.
func TestConsumerKeepsARoomsOrderAroundAParkedEvent(t *testing.T) {
	st := &causeStorage{}
	h := startWith(t, st, func(c *ingest.Config) { c.BatchSize, c.Causes = 2, st })
	unknown := strings.Replace(chatLine("m1", "message.created", "newcomer", "user", 1, mentionData("pm-1", "coder")), `"org_id":"org-1",`, "", 1)
	h.send(0, unknown)
	h.send(0, chatLine("u1", "usage.reported", "coder", "agent", 2, usageData))
	require.Eventually(t, func() bool { return h.reader.commit(0) == 2 }, 5*time.Second, 5*time.Millisecond)
	u1 := usageBy(t, st.all().Usage, "u1")
	assert.Equal(t, "newcomer", u1.Chain.InitiatorID, "the newcomer's message came first in the room")
	assert.Equal(t, "pm-1", u1.Chain.TriggerID)
}

// A late trigger rewrites the rows of the events it resolved, in their organization
// only: another organization's event of the same id keeps its own.
func TestConsumerRelinksOnlyTheResolvedOrganization(t *testing.T) {
	st := &causeStorage{}
	h := startWith(t, st, func(c *ingest.Config) { c.BatchSize, c.Causes = 1, st })
	h.send(0, chatLine("u1", "usage.reported", "coder", "agent", 2,
		`{"input_tokens":1000,"output_tokens":100,"cache_read_tokens":0,"cache_write_tokens":0,"trigger":{"message_id":"pm-late"}}`))
	h.send(1, strings.Replace(chatLine("u1", "usage.reported", "other-bot", "agent", 2, usageData), `"org_id":"org-1"`, `"org_id":"org-2"`, 1))
	require.Eventually(t, func() bool { return h.reader.commit(0) == 1 && h.reader.commit(1) == 1 }, 5*time.Second, 5*time.Millisecond)
	h.send(0, chatLine("m1", "message.created", "alice", "user", 1, mentionData("pm-late", "coder")))
	require.Eventually(t, func() bool { return h.reader.commit(0) == 2 }, 5*time.Second, 5*time.Millisecond)
	usage, causes := st.rewrites()
	require.Len(t, usage, 1)
	require.Len(t, causes, 1)
	assert.Equal(t, "org-1", usage[0].OrgID)
	assert.Equal(t, "org-1", causes[0].OrgID)
	assert.Equal(t, "alice", usage[0].Chain.InitiatorID)
}

// A late trigger in the same batch as the events it resolves gives their rows the
// resolved link before they are written: nothing is read back nor rewritten.
func TestConsumerResolvesItsOwnBatchBeforeWriting(t *testing.T) {
	st := &causeStorage{}
	h := startWith(t, st, func(c *ingest.Config) { c.BatchSize, c.Causes = 2, st })
	h.send(0, chatLine("u1", "usage.reported", "coder", "agent", 2,
		`{"input_tokens":1000,"output_tokens":100,"cache_read_tokens":0,"cache_write_tokens":0,"trigger":{"message_id":"pm-late"}}`))
	h.send(0, chatLine("m1", "message.created", "alice", "user", 1, mentionData("pm-late", "coder")))
	require.Eventually(t, func() bool { return h.reader.commit(0) == 2 }, 5*time.Second, 5*time.Millisecond)
	usage, causes := st.rewrites()
	assert.Empty(t, usage)
	assert.Empty(t, causes)
	want := store.Chain{TriggerID: "pm-late", TriggerEventID: "m1", InitiatorID: "alice", InitiatorType: "user",
		InitiatorOwner: "alice", Depth: 1, Link: "explicit"}
	assert.Equal(t, want, usageBy(t, st.all().Usage, "u1").Chain)
	for _, c := range st.all().Causes {
		if c.EventID == "u1" {
			assert.Equal(t, want, c.Chain)
		}
	}
}
