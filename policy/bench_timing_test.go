package policy

import (
	"context"
	"testing"
)

func BenchmarkAddParticipant(b *testing.B) {
	ctx := context.Background()
	e := exampleEngine(b)
	in := AddInput{Actor: "a-architect", Room: "room-webhook-retries", Participant: "a-reviewer"}
	b.ReportAllocs()
	for b.Loop() {
		if d, err := e.AddParticipant(ctx, in); err != nil || !d.Allow {
			b.Fatal(err, d)
		}
	}
}

func BenchmarkPeerList(b *testing.B) {
	ctx := context.Background()
	e := exampleEngine(b)
	in := PeerInput{Agent: "a-architect", Room: "room-webhook-retries"}
	b.ReportAllocs()
	for b.Loop() {
		if d, err := e.PeerVisible(ctx, in); err != nil || !d.Allow {
			b.Fatal(err, d)
		}
	}
}
