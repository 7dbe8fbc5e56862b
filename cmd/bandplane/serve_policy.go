package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bandplane/bandplane/policy/replica"
	"github.com/bandplane/bandplane/schema/keys"
)

// policyPart is serve's policy side: the engine, its API (decisions, peers, policy,
// agents) and the replica that feeds it from the trail. Until the replica has loaded
// the directory, a decision would be taken on an empty one (deny everything), and an
// organization's events could not be checked against it: both answer 503 until then,
// and /readyz says so.
type policyPart struct {
	*policyServer
	loaded atomic.Bool
}

// newPolicyPart builds the policy side, nil with --no-policy. With --audit-key the
// replica restores from ClickHouse only what the audit log seals.
func newPolicyPart(ctx context.Context, d *serveDeps) (*policyPart, error) {
	var sealed replica.Trail
	if d.auditLog != nil {
		sealed = replicaTrail{log: d.auditLog, topic: d.c.stack.topic, group: d.c.group, latest: d.latestCheckpoints}
	}
	ps, err := d.c.policy.build(ctx, d.log, d.reg, d.conn, d.c.stack, d.prices.Live, d.auditor, d.keys, sealed, d.dir)
	if err != nil || ps == nil {
		return nil, err
	}
	return &policyPart{policyServer: ps}, nil
}

// isReady says whether the directory has loaded; false without policy.
func (p *policyPart) isReady() bool { return p != nil && p.loaded.Load() }

// handler serves the policy API once the directory has loaded, and 503 before.
func (p *policyPart) handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !p.loaded.Load() {
			w.Header().Set("Retry-After", "1")
			keys.WriteError(w, http.StatusServiceUnavailable, "unavailable", "the policy directory is still loading from ClickHouse; retry")
			return
		}
		p.api.ServeHTTP(w, r)
	})
}

// component runs the replica and the engine's jobs (nil without policy). The replica
// failing before the directory has loaded stops the process.
func (p *policyPart) component(log *slog.Logger) *component {
	if p == nil {
		return nil
	}
	return &component{name: "policy", stage: stageIngest,
		run: func(ctx context.Context) error {
			var jobs sync.WaitGroup
			defer jobs.Wait()
			jobs.Go(func() { p.api.Watch(ctx, 2*time.Second) })
			jobs.Go(func() { p.engine.Limiter().Run(ctx, time.Minute) })
			jobs.Go(func() { p.engine.Ledger().Run(ctx, 5*time.Second) })
			jobs.Go(func() { p.api.RunCrossings(ctx) })
			ready := make(chan struct{})
			jobs.Go(func() {
				select {
				case <-ready:
					p.loaded.Store(true)
					log.Info("policy directory ready", "policy_revision", p.api.Revision())
				case <-ctx.Done():
				}
			})
			err := p.replica.Run(ctx, ready)
			select {
			case <-ready: // loaded: later failures are the replica's to log
				return nil
			default:
			}
			if err != nil && ctx.Err() == nil {
				return fmt.Errorf("cannot start the policy replica: %w", err)
			}
			return nil
		},
		ready: func() string {
			if !p.loaded.Load() {
				return "the directory is still loading"
			}
			return ""
		}}
}
