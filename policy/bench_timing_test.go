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

func BenchmarkSendMessage(b *testing.B) {
	ctx := context.Background()
	e := exampleEngine(b)
	in := MessageInput{Agent: "a-coder", Room: "room-webhook-retries", Tokens: 10, CostMicros: 10}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := e.SendMessage(ctx, in); err != nil {
			b.Fatal(err)
		}
	}
}
