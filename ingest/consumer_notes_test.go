package ingest_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/ingest"
	"github.com/bandplane/bandplane/schema/store"
	"github.com/bandplane/bandplane/schema/tlog"
)

// fakeNotes keeps the notes it is given; fail makes that many writes fail first.
type fakeNotes struct {
	mu     sync.Mutex
	leaves []tlog.Leaf
	fail   int
}

func (n *fakeNotes) WriteNotes(_ context.Context, leaves []tlog.Leaf) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.fail > 0 {
		n.fail--
		return errors.New("kafka: broker not available")
	}
	n.leaves = append(n.leaves, leaves...)
	return nil
}

func (n *fakeNotes) all() []tlog.Leaf {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]tlog.Leaf(nil), n.leaves...)
}

// Every stored row is noted with the ingested_at and Kafka record it was stored with,
// before the batch's offsets are committed; a note that Kafka does not take holds the
// commit back until it does.
func TestConsumerNotesWhatItStoredBeforeItCommits(t *testing.T) {
	st := &fakeStorage{}
	notes := &fakeNotes{fail: 3}
	h := startWith(t, st, func(c *ingest.Config) { c.BatchSize, c.Notes = 4, notes })
	for i := range 4 {
		h.send(i%2, eventLine(fmt.Sprintf("e%d", i), "message.created", "u1", "user", "org-1", `{"content":"hi"}`))
	}
	require.Eventually(t, func() bool { return h.reader.commit(0) == 2 && h.reader.commit(1) == 2 }, 5*time.Second, time.Millisecond)
	stored := st.events()
	got := notes.all()
	require.Len(t, got, 4)
	for i := range stored {
		assert.Contains(t, got, tlog.LeafOf(&stored[i]), "the note is the stored row's leaf")
	}
	assert.Equal(t, float64(3), counterValue(t, h.metrics.NoteErrors))
}

// A redelivered record is not written again, but its own stored copy (its Kafka
// record, the content and owner ingest writes for it) is noted again, with the
// ingested_at of the insert that stored it: the notes of that insert may never have
// left (a crash between the insert and the notes).
func TestConsumerNotesAReplaysStoredCopy(t *testing.T) {
	orig := eventLine("e1", "message.created", "u1", "user", "org-1", `{"content":"original"}`)
	stored := storedRow(t, orig, 0, 0)
	stored.OwnerID, stored.IngestedAt = "u1", time.Date(2026, 11, 2, 10, 0, 1, 0, time.UTC)
	st := &fakeStorage{preStored: []store.EventRow{stored}}
	notes := &fakeNotes{}
	h := startWith(t, st, func(c *ingest.Config) { c.BatchSize, c.Notes = 1, notes })
	h.send(0, orig)
	require.Eventually(t, func() bool { return h.reader.commit(0) == 1 }, 5*time.Second, time.Millisecond)
	assert.Empty(t, st.events(), "a replay is not written")
	got := notes.all()
	assert.Equal(t, []tlog.Leaf{tlog.LeafOf(&stored)}, got)
	require.Len(t, got, 1)
	assert.Equal(t, stored.IngestedAt, got[0].IngestedAt, "the stored copy's ingested_at: ingest cannot know it otherwise")

	// A reused id with other content is dead-lettered, and nothing of it is noted.
	h.send(0, eventLine("e1", "message.created", "u1", "user", "org-1", `{"content":"forged"}`))
	require.Eventually(t, func() bool { return h.reader.commit(0) == 2 }, 5*time.Second, time.Millisecond)
	assert.Len(t, notes.all(), 1)
}

// A record ClickHouse refuses is noted only if its event row is stored (a later table
// refused it), never from the batch's own rows.
func TestConsumerNotesARefusedRecordOnlyWhenItsRowIsStored(t *testing.T) {
	st := &fakeStorage{refuse: func(b *store.Batch) error {
		for _, e := range b.Events {
			if strings.Contains(e.Data, "poison") {
				return refuseRoom(&store.Batch{Events: []store.EventRow{{RoomID: "poison-room"}}})
			}
		}
		return nil
	}}
	notes := &fakeNotes{}
	h := startWith(t, st, func(c *ingest.Config) { c.BatchSize, c.BatchAge, c.Notes = 8, 50*time.Millisecond, notes })
	for i := range 8 {
		data := `{"content":"hi"}`
		if i == 3 {
			data = `{"content":"poison"}`
		}
		h.send(0, eventLine(fmt.Sprintf("e%d", i), "message.created", "u1", "user", "org-1", data))
	}
	require.Eventually(t, func() bool { return h.reader.commit(0) == 8 }, 5*time.Second, time.Millisecond)
	got := notes.all()
	assert.Len(t, got, 7)
	for _, l := range got {
		assert.NotEqual(t, "e3", l.ID, "the refused record's row is not stored: not noted")
	}
}

// Hostile: an attacker with ClickHouse write access edits a sealed row in what the
// content digest leaves out (owner_id, ingested_at, the Kafka record) and waits for a
// redelivery of its record. The edited copy has the record's content but is not the
// record's own, so nothing is noted: the sealer never gets a leaf for the edit, and
// verify keeps reporting the row modified. A platform resend (another record with the
// same content) is not noted either: the copy's own record was noted when it was
// stored. Nor is the record's own copy whose ingested_at was moved out of the span an
// insert attempt can have stamped it in (the record's Kafka time to now).
func TestConsumerNotesNoEditedOrForeignCopyOnRedelivery(t *testing.T) {
	orig := eventLine("e1", "message.created", "u1", "user", "org-1", `{"content":"original"}`)
	sealed := storedRow(t, orig, 0, 0) // as ingest stored it from partition 0, offset 0
	sealed.OwnerID, sealed.IngestedAt = "u1", time.Date(2026, 11, 2, 10, 0, 1, 0, time.UTC)
	for _, tc := range []struct {
		name string
		edit func(r *store.EventRow)
		at   int64 // the offset the record is delivered at
	}{
		{"owner_id, ingested_at and kafka_offset", func(r *store.EventRow) {
			r.OwnerID, r.IngestedAt, r.Offset = "mallory", r.IngestedAt.Add(time.Hour), r.Offset+100000
		}, 0},
		{"owner_id", func(r *store.EventRow) { r.OwnerID = "mallory" }, 0},
		{"owner_id and ingested_at", func(r *store.EventRow) { r.OwnerID, r.IngestedAt = "mallory", r.IngestedAt.Add(time.Hour) }, 0},
		{"kafka_offset", func(r *store.EventRow) { r.Offset += 100000 }, 0},
		{"kafka_partition", func(r *store.EventRow) { r.Partition = 1 }, 0},
		{"a platform resend, not an edit", func(*store.EventRow) {}, 8},
		// The record's own copy, but stamped where no attempt can have stamped it.
		{"ingested_at moved to the far future", func(r *store.EventRow) {
			r.IngestedAt = time.Date(2105, 1, 1, 0, 0, 0, 0, time.UTC)
		}, 0},
		{"ingested_at moved before its Kafka record", func(r *store.EventRow) {
			r.IngestedAt = time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
		}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			edited := sealed
			tc.edit(&edited)
			st := &fakeStorage{preStored: []store.EventRow{edited}}
			notes := &fakeNotes{}
			h := startWith(t, st, func(c *ingest.Config) { c.BatchSize, c.Notes = 1, notes })
			h.offset[0] = tc.at
			h.send(0, orig)
			require.Eventually(t, func() bool { return h.reader.commit(0) == tc.at+1 }, 5*time.Second, time.Millisecond)
			assert.Empty(t, st.events(), "same content: a replay, not written")
			assert.Empty(t, notes.all(), "not the record's own copy: nothing noted")
			assert.Equal(t, float64(1), counterValue(t, h.metrics.Records.WithLabelValues("replayed")))
		})
	}
}

// A record ClickHouse refuses may leave its event row stored (the events table took
// it, a later table refused the record). That row is noted only if it is the record's
// own, as ingest wrote it; a copy edited since is not.
func TestConsumerNotesARefusedRecordsStoredRowOnlyIfItIsItsOwn(t *testing.T) {
	line := strings.Replace(eventLine("e1", "message.created", "u1", "user", "org-1", `{"content":"hi"}`), "room-1", "poison-room", 1)
	for _, tc := range []struct {
		name  string
		edit  func(r *store.EventRow)
		noted bool
	}{
		{"as ingest wrote it", func(*store.EventRow) {}, true},
		{"owner_id edited", func(r *store.EventRow) { r.OwnerID = "mallory" }, false},
		{"kafka_offset edited", func(r *store.EventRow) { r.Offset += 100000 }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := &fakeStorage{}
			var left store.EventRow
			st.refuse = func(b *store.Batch) error {
				for _, e := range b.Events { // called with st.mu held
					if e.RoomID == "poison-room" {
						left = e
						left.IngestedAt = b.IngestedAt
						tc.edit(&left)
						st.preStored = append(st.preStored, left)
					}
				}
				return refuseRoom(b)
			}
			notes := &fakeNotes{}
			h := startWith(t, st, func(c *ingest.Config) { c.BatchSize, c.Notes = 1, notes })
			h.send(0, line)
			require.Eventually(t, func() bool { return h.reader.commit(0) == 1 }, 5*time.Second, time.Millisecond)
			require.Len(t, st.all().DeadLetters, 1, "the record is dead-lettered")
			if !tc.noted {
				assert.Empty(t, notes.all())
				return
			}
			st.mu.Lock()
			want := tlog.LeafOf(&left)
			st.mu.Unlock()
			assert.Equal(t, []tlog.Leaf{want}, notes.all())
			assert.Equal(t, "u1", left.OwnerID)
		})
	}
}

// A replay of an event stored without an organization, redelivered once its agent has
// registered, keeps org "": its stored copy is noted again only with the owner ingest
// stored for an agent it did not know (none). An owner_id written into that copy
// since is not taken for the record's.
func TestConsumerNotesALateAttributedReplayOnlyWithTheOwnerIngestStored(t *testing.T) {
	u1 := eventLine("u1", "usage.reported", "agent-7", "agent", "", usageData)
	for _, tc := range []struct {
		name  string
		owner string // the stored copy's owner_id
		noted bool
	}{
		{"as ingest wrote it", "", true},
		{"owner_id edited", "mallory", false},
		{"owner_id set to the agent's owner", "owner-1", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stored := storedRow(t, u1, 1, 0)
			stored.OwnerID, stored.IngestedAt = tc.owner, time.Date(2026, 11, 2, 10, 0, 1, 0, time.UTC)
			st := &fakeStorage{preStored: []store.EventRow{stored}}
			notes := &fakeNotes{}
			h := startWith(t, st, func(c *ingest.Config) {
				c.BatchSize, c.Notes = 2, notes
				c.LateParties = map[string]time.Time{"agent-7": time.Now()}
			})
			h.send(0, registration("agent-7", "owner-1", "org-9", "gpt-5-mini"))
			h.send(1, u1) // redelivered at the offset it was stored from
			require.Eventually(t, func() bool { return h.reader.commit(0) == 1 && h.reader.commit(1) == 1 }, 5*time.Second, time.Millisecond)
			for _, e := range st.events() {
				assert.NotEqual(t, "u1", e.ID, "a replay is not written again")
			}
			var got []tlog.Leaf
			for _, l := range notes.all() {
				if l.ID == "u1" {
					got = append(got, l)
				}
			}
			if !tc.noted {
				assert.Empty(t, got)
				return
			}
			assert.Equal(t, []tlog.Leaf{tlog.LeafOf(&stored)}, got)
			assert.Equal(t, "", got[0].Org)
		})
	}
}
