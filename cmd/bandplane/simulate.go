package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/bandplane/bandplane/deploy/simulate"
	"github.com/bandplane/bandplane/ingest"
	"github.com/bandplane/bandplane/schema/kafka"
)

func init() {
	register("simulate", "send seeded, realistic platform traffic to Kafka or a collector", runSimulate)
}

func runSimulate(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "simulate", "[flags]")
	var st stackFlags
	st.register(fs)
	cfg := simulate.DefaultConfig()
	fs.Int64Var(&cfg.Seed, "seed", cfg.Seed, "random seed; the same flags (with --start) give the same events")
	fs.IntVar(&cfg.Orgs, "orgs", cfg.Orgs, "organizations")
	fs.IntVar(&cfg.OwnersPerOrg, "owners-per-org", cfg.OwnersPerOrg, "human accounts per organization")
	fs.IntVar(&cfg.AgentsPerOwner, "agents-per-owner", cfg.AgentsPerOwner, "agents per owner")
	fs.IntVar(&cfg.Rooms, "rooms", cfg.Rooms, "chat rooms")
	fs.IntVar(&cfg.Events, "events", cfg.Events, "events to send, directory included (0 = until --duration or Ctrl-C)")
	fs.Float64Var(&cfg.Rate, "rate", cfg.Rate, "events per second (0 = as fast as the destination accepts)")
	fs.DurationVar(&cfg.Duration, "duration", cfg.Duration, "stop after this long (0 = no limit)")
	fs.IntVar(&cfg.BatchSize, "batch-size", cfg.BatchSize, "events per produce call or HTTP request")
	fs.Float64Var(&cfg.Loops, "loops", cfg.Loops, "share of conversations in which two agents hand over to each other 8 to 20 times, in [0, 1]")
	fs.Float64Var(&cfg.ExplicitTriggers, "explicit-triggers", cfg.ExplicitTriggers, "share of agent executions whose frames name the message that started them (metadata.trigger_message_id), in [0, 1]")
	fs.Float64Var(&cfg.LateTriggers, "late-triggers", cfg.LateTriggers, "share of the executions a person's message starts that name it, the message coming after the events it caused, in [0, 1]; with --explicit-triggers at most 1 (the rest are inferred from mentions)")
	fs.Float64Var(&cfg.Overlap, "overlap", cfg.Overlap, "share of executions during which a person mentions the agent again (inference from mentions gets those wrong), in [0, 1]")
	start := fs.String("start", "", "timestamp of the first event, RFC 3339 (default: now)")
	collector := fs.String("collector", "", "send to this collector base URL (e.g. http://127.0.0.1:8080) instead of Kafka")
	token := fs.String("key", envOr("BANDPLANE_API_KEY", ""), "API key (ingest role) for --collector (env BANDPLANE_API_KEY); a platform key (bandplane keys create --org '*' --role ingest) is needed for the directory events the simulation starts with")
	quiet := fs.Bool("quiet", false, "no progress lines on stderr")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *start != "" {
		t, err := time.Parse(time.RFC3339, *start)
		if err != nil {
			return fmt.Errorf("--start %q is not an RFC 3339 time: %w", *start, err)
		}
		cfg.Start = t
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	var sink simulate.Sink
	var dest string
	if *collector != "" {
		sink = simulate.NewHTTPSink(*collector, *token)
		dest = *collector + "/v1/events"
	} else {
		if err := kafka.EnsureTopic(ctx, st.brokers(), st.topic, 4); err != nil {
			return err
		}
		p, err := kafka.NewProducer(kafka.ProducerConfig{Brokers: st.brokers(), Topic: st.topic})
		if err != nil {
			return err
		}
		defer func() { _ = p.Close() }()
		sink = ingest.ProducerSink{Producer: p}
		dest = "kafka " + st.kafka + " topic " + st.topic
	}
	fmt.Fprintf(e.stderr, "simulate: sending to %s\n", dest)
	began := time.Now()
	var progress func(simulate.Summary)
	if !*quiet {
		progress = func(s simulate.Summary) {
			el := time.Since(began).Seconds()
			fmt.Fprintf(e.stderr, "simulate: %d events in %.0fs (%.0f/s), %d usage reports, cost %.4f %s\n",
				s.Events, el, float64(s.Events)/max(el, 0.001), s.UsageEvents, float64(s.CostMicros)/1e6, s.Currency)
		}
	}
	sum, err := simulate.Run(ctx, cfg, sink, progress)
	if jerr := printJSON(e.stdout, sum); jerr != nil {
		return jerr
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("stopped after %d events: %w", sum.Events, err)
	}
	return nil
}
