// Package share divides a shared resource (WebSocket connections, collector uploads,
// GraphQL reads, exports, jobs) between the clients that use it: one key, one
// organization or one remote address holds at most its share, and the platform keeps
// places no tenant may take, so that no client can hold what the others need.
//
// A Pool counts places; what a place is (a connection, a request in flight) is its
// user's. Taking never waits: a client over its share is told at once which bound
// refused it, and retries.
//
// It may import the standard library, third-party modules and the other schema/
// packages only: schema/ is the basement every other folder builds on (deploy/layers).
package share

import (
	"fmt"
	"sync"
)

// Limits are a pool's bounds; a zero bound is no bound at that level (Total aside,
// which must be set).
type Limits struct {
	// Total is the places of the pool.
	Total int
	// PerGroup bounds what one group (an organization, or a remote address) holds.
	PerGroup int
	// PerClient bounds what one client (an API key) holds.
	PerClient int
	// Reserved places of Total are for the reserved group only (Pool's reserved, the
	// platform's organization): tenants together hold at most Total - Reserved.
	Reserved int
}

// Pool is a resource of Limits.Total places. Safe for concurrent use.
type Pool struct {
	lim      Limits
	reserved string // the group that may take the reserved places

	mu      sync.Mutex
	held    int
	tenants int // places held by groups other than reserved
	groups  map[string]int
	clients map[string]int
}

// Few returns the pool of a resource of few places (exports, background jobs): total
// places, perGroup of one group, perClient of one client, and one of them kept for
// reserved unless there is only one.
func Few(total, perGroup, perClient int, reserved string) *Pool {
	return New(Limits{Total: total, PerGroup: perGroup, PerClient: perClient, Reserved: min(1, total-1)}, reserved)
}

// New returns a pool; reserved names the group Limits.Reserved is kept for.
func New(lim Limits, reserved string) *Pool {
	return &Pool{lim: lim, reserved: reserved, groups: map[string]int{}, clients: map[string]int{}}
}

// Limits returns the pool's bounds.
func (p *Pool) Limits() Limits { return p.lim }

// Bound names the bound that refused a Take.
type Bound string

const (
	BoundClient Bound = "client" // Limits.PerClient
	BoundGroup  Bound = "group"  // Limits.PerGroup
	BoundTotal  Bound = "total"  // Limits.Total, or what tenants may hold of it
)

// Refusal is a Take over a bound.
type Refusal struct {
	Bound Bound
	Limit int // the bound's value
	Held  int // what the client, the group or the pool held
}

func (r *Refusal) Error() string {
	return fmt.Sprintf("%s share full: %d of %d held", r.Bound, r.Held, r.Limit)
}

// Take takes one place for client of group, and returns the func (safe to call more
// than once) that gives it back; or which bound refused it. An entry of a group or a
// client exists only while it holds a place: the pool's memory is bounded by what is
// held, not by the clients seen.
func (p *Pool) Take(group, client string) (release func(), refused *Refusal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n := p.clients[client]; p.lim.PerClient > 0 && n >= p.lim.PerClient {
		return nil, &Refusal{Bound: BoundClient, Limit: p.lim.PerClient, Held: n}
	}
	if n := p.groups[group]; p.lim.PerGroup > 0 && n >= p.lim.PerGroup {
		return nil, &Refusal{Bound: BoundGroup, Limit: p.lim.PerGroup, Held: n}
	}
	if p.held >= p.lim.Total {
		return nil, &Refusal{Bound: BoundTotal, Limit: p.lim.Total, Held: p.held}
	}
	tenant := group != p.reserved || p.reserved == ""
	if tenant && p.tenants >= p.lim.Total-p.lim.Reserved {
		return nil, &Refusal{Bound: BoundTotal, Limit: p.lim.Total - p.lim.Reserved, Held: p.tenants}
	}
	p.held++
	p.groups[group]++
	p.clients[client]++
	if tenant {
		p.tenants++
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			p.mu.Lock()
			defer p.mu.Unlock()
			p.held--
			if tenant {
				p.tenants--
			}
			if p.groups[group]--; p.groups[group] <= 0 {
				delete(p.groups, group)
			}
			if p.clients[client]--; p.clients[client] <= 0 {
				delete(p.clients, client)
			}
		})
	}, nil
}

// Held returns the places held in all.
func (p *Pool) Held() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.held
}
