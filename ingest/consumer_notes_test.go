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
	"github.com/bandplane/bandplane/ingest/seal/tlog"
	"github.com/bandplane/bandplane/ingest/store"
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

// A replay is not written again, but its stored copy is noted again: the notes of the
// first insert may never have left (a crash between the insert and the notes).
func TestConsumerNotesAReplaysStoredCopy(t *testing.T) {
	orig := eventLine("e1", "message.created", "u1", "user", "org-1", `{"content":"original"}`)
	stored := storedRow(t, orig, 0, 0)
	stored.IngestedAt = time.Date(2026, 11, 2, 10, 0, 1, 0, time.UTC)
	st := &fakeStorage{preStored: []store.EventRow{stored}}
	notes := &fakeNotes{}
	h := startWith(t, st, func(c *ingest.Config) { c.BatchSize, c.Notes = 1, notes })
	h.send(0, orig)
	require.Eventually(t, func() bool { return h.reader.commit(0) == 1 }, 5*time.Second, time.Millisecond)
	assert.Empty(t, st.events(), "a replay is not written")
	assert.Equal(t, []tlog.Leaf{tlog.LeafOf(&stored)}, notes.all())

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
