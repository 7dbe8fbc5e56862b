package prices

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/keys"
)

// Source is the source of the price.* and job.* events (bandplane's own: the collector
// refuses both the types and the source from clients).
const Source = schema.SourceBandplane + "-prices"

// The audit events of prices and jobs.
const (
	TypePriceSet    = "price.set"    // an upsert: one model's prices, a new catalog version
	TypePriceSeeded = "price.seeded" // the empty table seeded with the built-in or --catalog catalog
	TypeJobQueued   = "job.queued"   // a job was asked for (actor: who asked)
	TypeJobStarted  = "job.started"  // a runner started or resumed a job (actor: the runner)
	TypeJobFinished = "job.finished" // done, failed or cancelled (data.state; actor: the runner, or who cancelled)
)

// Producer writes bandplane's own audit events (kafka.Producer implements it). Produce
// blocks until every in-sync replica has acknowledged all events, or returns an error.
type Producer interface {
	Produce(ctx context.Context, events []schema.Event) error
}

// PriceEventData is the data of price.set: the entry set and the one it replaces (the
// model's entry in effect at the same effective time in the previous version; nil for
// a model's first price).
type PriceEventData struct {
	CatalogVersion uint64        `json:"catalog_version"`
	Price          PriceVersion  `json:"price"`
	Previous       *PriceVersion `json:"previous"`
}

// SeedEventData is the data of price.seeded.
type SeedEventData struct {
	CatalogVersion uint64 `json:"catalog_version"`
	SeedVersion    string `json:"seed_version"` // the seed catalog's own version string
	Currency       string `json:"currency"`
	Entries        int    `json:"entries"`
}

// JobEventData is the data of job.* events.
type JobEventData struct {
	Job     Job  `json:"job"`
	Resumed bool `json:"resumed,omitempty"` // job.started of a job interrupted before
}

func (s *Service) audit(ctx context.Context, ev schema.Event) error {
	if s.cfg.Auditor == nil {
		return errors.New("the price service has no audit producer: it cannot change prices or jobs")
	}
	if err := ev.Validate(); err != nil { // a bug, not an input error: inputs are checked before
		return fmt.Errorf("cannot build %s event: %w", ev.Type, err)
	}
	if err := s.cfg.Auditor.Produce(ctx, []schema.Event{ev}); err != nil {
		return fmt.Errorf("cannot write the %s audit event: %w", ev.Type, err)
	}
	return nil
}

// event is one of the service's audit events by actor about subject. Prices are
// platform-wide and a job of every organization is too: their events have no org_id
// ('*' is reserved in events), like a platform key's.
func event(typ, org, actor, subject string, at time.Time, data any) schema.Event {
	b, _ := json.Marshal(data)
	if org == keys.PlatformOrg {
		org = ""
	}
	return schema.Event{
		ID: schema.NewID(), Type: typ, Time: at.UTC(), OrgID: org,
		Actor:         schema.Party{ID: actor, Type: schema.ActorSystem},
		Subject:       &schema.Party{ID: subject, Type: schema.ActorSystem},
		Source:        Source,
		SchemaVersion: schema.Version,
		Data:          b,
	}
}
