package graph

import (
	"context"
	"fmt"
	"time"

	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/keys"
	"github.com/bandplane/bandplane/schema/share"
)

// readSlots is the pool of ClickHouse reads GraphQL fields run at once: one key holds
// at most Limits.MaxConcurrentPerKey, one organization's keys Limits.MaxConcurrentPerOrg,
// and tenants together all but a quarter of Limits.MaxConcurrent, which the platform's
// keys keep. And one organization's keys together read at most
// Limits.MaxReadBytesPerOrg a second from ClickHouse (bytes), in bursts of up to
// Limits.MaxResponseBytes: bounding reads at once does not bound a loop of large
// pages, which takes the CPU of ClickHouse and of the process from every other
// tenant. A field over the slots fails at once (TOO_MANY_REQUESTS) rather than wait.
// One over the byte rate waits for the share to refill holding its slot, and when the
// wait would pass its deadline it waits until then and fails: a client that asks
// again at once gets no faster answers, and costs nothing meanwhile.
type readSlots struct {
	pool *share.Pool
	rate *share.Rate // bytes read, by the organization of the key that read them
	lim  Limits
}

func newReadSlots(l Limits) readSlots {
	return readSlots{pool: share.New(share.Limits{Total: l.MaxConcurrent, PerGroup: l.MaxConcurrentPerOrg,
		PerClient: l.MaxConcurrentPerKey, Reserved: l.MaxConcurrent / 4}, keys.PlatformOrg),
		rate: share.NewRate(l.MaxReadBytesPerOrg, max(l.MaxResponseBytes, l.MaxReadBytesPerOrg), l.now), lim: l}
}

// charge counts bytes a response of key k read against its organization's rate.
func (s readSlots) charge(k keys.Key, bytes int64) { s.rate.Charge(k.Org, bytes) }

// acquire takes a slot for key k, waits for its organization's byte rate (see
// readSlots), or fails with schema.ErrTooMany; release gives the slot back.
func (s readSlots) acquire(ctx context.Context, k keys.Key) (release func(), err error) {
	release, err = s.take(k)
	if err != nil {
		return nil, err
	}
	wait := s.rate.Wait(k.Org)
	if wait <= 0 {
		return release, nil
	}
	nap, refuse := wait, false
	if deadline, ok := ctx.Deadline(); ok && s.lim.now().Add(wait).After(deadline) {
		nap, refuse = max(deadline.Sub(s.lim.now())-time.Millisecond, 0), true
	}
	if err := s.lim.sleep(ctx, nap); err != nil && !refuse {
		release()
		return nil, err
	}
	if refuse {
		release()
		return nil, fmt.Errorf("organization %s read more than its %d bytes a second from ClickHouse (--graphql-max-read-bytes-per-org); retry in %s: %w",
			k.Org, s.lim.MaxReadBytesPerOrg, (wait - nap).Round(time.Millisecond), schema.ErrTooMany)
	}
	return release, nil
}

// take takes a slot of the pool for key k.
func (s readSlots) take(k keys.Key) (release func(), err error) {
	release, refused := s.pool.Take(k.Org, k.ID)
	if refused == nil {
		return release, nil
	}
	lim := s.pool.Limits()
	switch refused.Bound {
	case share.BoundClient:
		return nil, fmt.Errorf("key %s already runs %d queries at once (--graphql-max-concurrent-per-key); retry when one has finished: %w",
			k.ID, lim.PerClient, schema.ErrTooMany)
	case share.BoundGroup:
		return nil, fmt.Errorf("organization %s already runs %d queries at once (--graphql-max-concurrent-per-org); retry when one has finished: %w",
			k.Org, lim.PerGroup, schema.ErrTooMany)
	default:
		return nil, fmt.Errorf("the server already runs %d GraphQL queries of organizations at once (--graphql-max-concurrent); retry when one has finished: %w",
			refused.Limit, schema.ErrTooMany)
	}
}
