package graph

import (
	"fmt"

	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/keys"
	"github.com/bandplane/bandplane/schema/share"
)

// readSlots is the pool of ClickHouse reads GraphQL fields run at once: one key holds
// at most Limits.MaxConcurrentPerKey, one organization's keys Limits.MaxConcurrentPerOrg,
// and tenants together all but a quarter of Limits.MaxConcurrent, which the platform's
// keys keep. A field over its share fails at once (TOO_MANY_REQUESTS) rather than wait.
type readSlots struct {
	pool *share.Pool
}

func newReadSlots(l Limits) readSlots {
	return readSlots{pool: share.New(share.Limits{Total: l.MaxConcurrent, PerGroup: l.MaxConcurrentPerOrg,
		PerClient: l.MaxConcurrentPerKey, Reserved: l.MaxConcurrent / 4}, keys.PlatformOrg)}
}

// acquire takes a slot for key k, or fails at once with schema.ErrTooMany; release
// gives it back.
func (s readSlots) acquire(k keys.Key) (release func(), err error) {
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
