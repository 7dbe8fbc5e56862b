package policy

import (
	"context"
	"encoding/json"
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

// BenchmarkSendMessageChained is BenchmarkSendMessage with the chain the routing core
// sends, typed (checked in Go, as the HTTP API's) and as raw JSON (checked by the policy).
func BenchmarkSendMessageChained(b *testing.B) {
	ctx := context.Background()
	e := exampleEngine(b)
	in := MessageInput{Agent: "a-coder", Room: "room-webhook-retries", Tokens: 10, CostMicros: 10,
		Chain: &Chain{Depth: 3, Handoffs: 1, Initiator: "u-alice", InitiatorType: "user"}}
	raw, err := json.Marshal(in)
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name string
		in   any
	}{{"typed", in}, {"raw", json.RawMessage(raw)}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := e.Decide(ctx, SendMessage, c.in); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
