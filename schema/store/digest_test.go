package store

import (
	"encoding/hex"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestDigests(t *testing.T) {
	base := EventRow{ID: "e1", Type: "message.created", Time: time.Date(2026, 11, 2, 10, 0, 0, 250e6, time.UTC), OrgID: "o",
		RoomID: "r", ActorID: "u", ActorType: "user", OwnerID: "u", Source: "s", SchemaVersion: 1, Data: `{"content":"hi"}`,
		IngestedAt: time.Date(2026, 11, 2, 10, 0, 1, 0, time.UTC), Partition: 1, Offset: 7}
	same := base
	same.IngestedAt, same.Partition, same.Offset, same.OwnerID = base.IngestedAt.Add(time.Hour), 3, 99, "other-owner"
	assert.Equal(t, base.ContentDigest(), same.ContentDigest(), "ingest's own columns are not content")
	assert.NotEqual(t, base.SealDigest(), same.SealDigest(), "a seal covers the owner")
	same.OwnerID = base.OwnerID
	assert.Equal(t, base.SealDigest(), same.SealDigest())

	for name, change := range map[string]func(r *EventRow){
		"data":        func(r *EventRow) { r.Data = `{"content":"ho"}` },
		"millisecond": func(r *EventRow) { r.Time = r.Time.Add(time.Millisecond) },
		"org":         func(r *EventRow) { r.OrgID = "o2" },
		"room":        func(r *EventRow) { r.RoomID = "r2" },
		"actor type":  func(r *EventRow) { r.ActorType = "agent" },
		"subject":     func(r *EventRow) { r.SubjectID = "x" },
		"version":     func(r *EventRow) { r.SchemaVersion = 2 },
		// Length prefixes: moving bytes from one field to the next changes the digest.
		"field boundary": func(r *EventRow) { r.RoomID, r.ActorID = "ru", "" },
	} {
		r := base
		change(&r)
		assert.NotEqual(t, base.ContentDigest(), r.ContentDigest(), name)
	}
	sys := base
	sys.ActorType = ""
	stored := base
	stored.ActorType = "system"
	assert.Equal(t, stored.ContentDigest(), sys.ContentDigest(), "an empty actor type is stored as system")
}

// The digest's encoding is part of the trail's format: a fixed row has a fixed digest.
func TestDigestIsStable(t *testing.T) {
	r := EventRow{ID: "e-1", Type: "message.created", Time: time.Date(2026, 11, 2, 10, 0, 0, 250_000_000, time.UTC), OrgID: "org-1",
		RoomID: "room-1", ActorID: "agent-1", ActorType: "agent", ActorHandle: "ann/bot", OwnerID: "user-1", SubjectID: "s",
		SubjectType: "agent", SubjectHandle: "x/y", ExecutionID: "ex", Source: "band", SchemaVersion: 1, Data: `{"content":"hi"}`}
	c, s := r.ContentDigest(), r.SealDigest()
	assert.Equal(t, "e4eb8d0fa8671f1434f15cf5819e6b3166a062b7a98d9886a95f685ae2bad4d7", hex.EncodeToString(c[:]))
	assert.Equal(t, "faefd37819355a15baf2faf7408c20c8d98e2aa5dc90678925d824a23717b88b", hex.EncodeToString(s[:]))
}
