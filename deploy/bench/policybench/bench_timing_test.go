package policybench

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/bandplane/bandplane/policy"
)

// BenchmarkPolicy reports Run on the directory: 10,000 agents, 50,000
// contacts. Run: go test -run x -bench Policy ./deploy/bench/policybench/
func BenchmarkPolicy(b *testing.B) {
	for b.Loop() {
		res, err := Run(context.Background(), 10_000, 50_000, 20_000)
		if err != nil {
			b.Fatal(err)
		}
		out, _ := json.Marshal(res)
		b.Logf("%s", out)
		b.ReportMetric(res.AddParticipant.P99Us, "add_p99_us")
		b.ReportMetric(res.SendMessage.P99Us, "send_p99_us")
		b.ReportMetric(res.BareOPA.P99Us, "bare_p99_us")
		b.ReportMetric(res.OverheadRatio, "overhead")
	}
}

// BenchmarkAddParticipantLarge is add_participant on the directory (10,000
// agents, 50,000 contacts) with varied inputs, for profiling:
// go test -run x -bench AddParticipantLarge -cpuprofile cpu.out ./deploy/bench/policybench/
func BenchmarkAddParticipantLarge(b *testing.B) {
	ctx := context.Background()
	s, err := NewSetup(ctx, 10_000, 50_000)
	if err != nil {
		b.Fatal(err)
	}
	ins := s.AddInputs(4096)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, err := s.Engine.AddParticipant(ctx, ins[i%len(ins)]); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// BenchmarkSendMessage and BenchmarkSendMessageReserving are send_message on the
// issue's directory without and with budgets and reservations, side by side, for
// profiling: go test -run x -bench SendMessage -cpuprofile cpu.out ./deploy/bench/policybench/
func BenchmarkSendMessage(b *testing.B) {
	benchmarkSend(b, false)
}

func BenchmarkSendMessageReserving(b *testing.B) {
	benchmarkSend(b, true)
}

func benchmarkSend(b *testing.B, reserving bool) {
	ctx := context.Background()
	s, err := NewSetup(ctx, 10_000, 50_000)
	if err != nil {
		b.Fatal(err)
	}
	e, pairs, _, err := s.sendEngine(ctx, reserving)
	if err != nil {
		b.Fatal(err)
	}
	now := time.Now()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		in := pairs[i%len(pairs)]
		if reserving {
			in.ExecutionID = "x" + strconv.Itoa(i)
		}
		d, err := e.SendMessage(ctx, in)
		if err != nil {
			b.Fatal(err)
		}
		if reserving && d.Allow { // settled, as a usage report would
			e.Ledger().Spend(policy.Charge{Org: d.Org, Owner: d.Owner, Agent: d.Agent, Room: in.Room, Tokens: 450, CostMicros: 900},
				in.ExecutionID, now, now)
		}
		i++
	}
}
