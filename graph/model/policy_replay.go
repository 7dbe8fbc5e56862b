package model

import (
	"fmt"

	"github.com/bandplane/bandplane/policy"
	"github.com/bandplane/bandplane/policy/replay"
	"github.com/bandplane/bandplane/schema"
)

// PolicyReplayResult is a replay's outcome; its examples are paged from the whole
// result the job keeps.
type PolicyReplayResult struct {
	Decisions, Unchanged, AllowToDeny, DenyToAllow, ReasonChanged, Approximate, OutOfScope int
	ByKind                                                                                 []PolicyReplayCount
	Result                                                                                 *replay.Result `json:"-"`
}

// The page of examples: default and most.
const (
	DefaultExamplesLimit = 20
	MaxExamplesLimit     = 100
)

// Examples is a page of the examples of one flip class, earliest first.
func (r PolicyReplayResult) Examples(class PolicyReplayClass, offset *int, limit *int) ([]PolicyReplayExample, error) {
	from, n := 0, DefaultExamplesLimit
	if offset != nil {
		from = *offset
	}
	if limit != nil {
		n = *limit
	}
	if from < 0 {
		return nil, &schema.FieldError{Field: "offset", Reason: fmt.Sprintf("must be >= 0, got %d", from)}
	}
	if n < 1 || n > MaxExamplesLimit {
		return nil, &schema.FieldError{Field: "limit", Reason: fmt.Sprintf("must be between 1 and %d", MaxExamplesLimit)}
	}
	if r.Result == nil {
		return []PolicyReplayExample{}, nil
	}
	var list []replay.Example
	switch class {
	case PolicyReplayClassAllowToDeny:
		list = r.Result.Examples.AllowToDeny
	case PolicyReplayClassDenyToAllow:
		list = r.Result.Examples.DenyToAllow
	default:
		list = r.Result.Examples.ReasonChanged
	}
	out := []PolicyReplayExample{}
	for _, ex := range list[min(from, len(list)):min(from+n, len(list))] {
		e := PolicyReplayExample{DecisionID: ex.DecisionID, Time: ex.Time, Kind: ex.Kind, ActorID: ex.Actor.ID, ActorHandle: orNil(ex.Actor.Handle),
			RoomID: orNil(ex.Room), LiveAllow: ex.Live.Allow, LiveReasons: reasonCodes(ex.Live.Reasons),
			CandidateAllow: ex.Candidate.Allow, CandidateReasons: reasonCodes(ex.Candidate.Reasons)}
		if ex.Other != nil {
			e.OtherID, e.OtherHandle = orNil(ex.Other.ID), orNil(ex.Other.Handle)
		}
		out = append(out, e)
	}
	return out, nil
}

func reasonCodes(rs []policy.Reason) []string {
	out := make([]string, 0, len(rs))
	for _, r := range rs {
		out = append(out, r.Code)
	}
	return out
}

func orNil(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
