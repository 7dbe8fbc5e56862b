package graph

import (
	"context"
	"encoding/base64"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/bandplane/bandplane/graph/model"
	"github.com/bandplane/bandplane/policy/replay"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/keys"
)

// PolicyReplays runs policy replays in the background (*replay.Jobs implements it):
// errors matching schema.ErrInvalid are the caller's mistakes, schema.ErrTooMany a
// share that is full.
type PolicyReplays interface {
	Start(by keys.Key, org string, tarball []byte, from, to time.Time) (replay.Job, error)
	Get(by keys.Key, org, id string) (replay.Job, bool)
}

// WithPolicyReplays serves startPolicyReplay and policyReplay through p.
func WithPolicyReplays(p PolicyReplays) Option { return func(c *config) { c.replays = p } }

// replayers may replay their organization's decisions with a candidate bundle: the
// bundle is code that runs in the process.
var replayers = []keys.Role{keys.RoleAdmin}

const replaysOff = "the policy replay service"

func (r *Resolver) startPolicyReplay(ctx context.Context, orgID *string, bundle string, from, to *time.Time) (*model.PolicyReplay, error) {
	k, org, err := r.authorize(ctx, orgID, replayers)
	if err != nil {
		return nil, r.fail(ctx, err)
	}
	if r.replays == nil {
		return nil, unavailable(ctx, replaysOff)
	}
	if n := base64.StdEncoding.DecodedLen(len(bundle)); n > replay.MaxTarballBytes+3 {
		return nil, r.fail(ctx, &schema.FieldError{Field: "bundle", Reason: fmt.Sprintf("%d bytes of base64 hold more than the %d bytes a bundle's tarball may have", len(bundle), replay.MaxTarballBytes)})
	}
	raw, err := base64.StdEncoding.DecodeString(bundle)
	if err != nil {
		return nil, r.fail(ctx, &schema.FieldError{Field: "bundle", Reason: "not base64 (standard, padded): " + err.Error()})
	}
	end := time.Now().UTC()
	if to != nil {
		end = *to
	}
	start := end.Add(-24 * time.Hour)
	if from != nil {
		start = *from
	}
	job, err := r.replays.Start(k, org, raw, start, end)
	if err != nil {
		return nil, r.fail(ctx, err)
	}
	return replayModel(job), nil
}

func (r *Resolver) policyReplay(ctx context.Context, orgID *string, id string) (*model.PolicyReplay, error) {
	k, org, err := r.authorize(ctx, orgID, replayers)
	if err != nil {
		return nil, r.fail(ctx, err)
	}
	if r.replays == nil {
		return nil, unavailable(ctx, replaysOff)
	}
	job, ok := r.replays.Get(k, org, id)
	if !ok {
		return nil, nil
	}
	return replayModel(job), nil
}

func replayModel(j replay.Job) *model.PolicyReplay {
	m := &model.PolicyReplay{ID: j.ID, State: model.JobState(strings.ToUpper(j.State)), Scoped: j.Scoped, From: j.From, To: j.To,
		Decisions: j.Progress.Decisions, Progress: j.Progress.Fraction, PerSecond: j.Progress.PerSecond, CreatedAt: j.CreatedAt,
		Digest: j.Digest}
	if j.Org != "" {
		m.OrgID = &j.Org
	}
	if j.RequestedBy != "" {
		m.RequestedBy = &j.RequestedBy
	}
	if !j.FinishedAt.IsZero() {
		m.FinishedAt = &j.FinishedAt
	}
	if j.Error != "" {
		m.Error = &j.Error
	}
	if res := j.Result; res != nil {
		m.Revision = &res.Bundle.Revision
		out := &model.PolicyReplayResult{Decisions: res.Decisions, Unchanged: res.Unchanged, AllowToDeny: res.AllowToDeny,
			DenyToAllow: res.DenyToAllow, ReasonChanged: res.ReasonChanged, Approximate: res.Approximate, OutOfScope: res.OutOfScope, Result: res,
			ByKind: []model.PolicyReplayCount{}}
		for _, kind := range slices.Sorted(maps.Keys(res.ByKind)) {
			c := res.ByKind[kind]
			out.ByKind = append(out.ByKind, model.PolicyReplayCount{Kind: kind, Decisions: c.Decisions, Unchanged: c.Unchanged,
				AllowToDeny: c.AllowToDeny, DenyToAllow: c.DenyToAllow, ReasonChanged: c.ReasonChanged})
		}
		m.Result = out
	}
	return m
}
