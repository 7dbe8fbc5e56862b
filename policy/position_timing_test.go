package policy

import (
	"context"
	"testing"
)

// BenchmarkSendMessagePositioned is BenchmarkSendMessage on a directory kept from a
// topic of four partitions: each decision copies the position.
func BenchmarkSendMessagePositioned(b *testing.B) {
	ctx := context.Background()
	e := exampleEngine(b)
	e.Directory().SetPosition(Position{0: 1_234_567, 1: 1_198_004, 2: 1_240_913, 3: 1_201_377})
	in := MessageInput{Agent: "a-coder", Room: "room-webhook-retries", Tokens: 10, CostMicros: 10}
	b.ReportAllocs()
	for b.Loop() {
		if d, err := e.SendMessage(ctx, in); err != nil || len(d.Position) != 4 {
			b.Fatal(err, d)
		}
	}
}

// BenchmarkSendMessageWhileApplying is parallel send_message decisions while a replica
// applies one record per decision (its own policy.decided events come back on the
// topic): each Applying waits for the decisions in flight and holds the next ones.
// "idle" is the same load without records.
func BenchmarkSendMessageWhileApplying(b *testing.B) {
	for _, applying := range []bool{false, true} {
		name := "idle"
		if applying {
			name = "applying"
		}
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			e := exampleEngine(b)
			dir := e.Directory()
			dir.SetPosition(Position{0: 1, 1: 1, 2: 1, 3: 1})
			records := make(chan struct{}, 1024)
			done := make(chan struct{})
			go func() {
				defer close(done)
				var next int64 = 1
				for range records {
					next++
					dir.Applying(int(next%4), next, func() {})
				}
			}()
			in := MessageInput{Agent: "a-coder", Room: "room-webhook-retries"}
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := e.SendMessage(ctx, in); err != nil {
						b.Error(err)
						return
					}
					if applying {
						records <- struct{}{}
					}
				}
			})
			close(records)
			<-done
		})
	}
}
