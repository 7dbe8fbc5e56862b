package graph

import (
	"fmt"
	"github.com/bandplane/bandplane/schema"
	"sync"
)

// keySlots counts the ClickHouse reads each API key runs at once. An entry exists only
// while its key runs one, so the map is bounded by what runs, not by the keys seen.
type keySlots struct {
	mu      sync.Mutex
	max     int
	running map[string]int // key id -> reads running
}

func newKeySlots(max int) *keySlots { return &keySlots{max: max, running: map[string]int{}} }

// acquire takes a slot of key id, or fails at once with schema.ErrTooMany; release gives it back.
func (s *keySlots) acquire(id string) (release func(), err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.running[id] >= s.max {
		return nil, fmt.Errorf("key %s already runs %d queries at once (--graphql-max-concurrent-per-key); retry when one has finished: %w",
			id, s.max, schema.ErrTooMany)
	}
	s.running[id]++
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			if s.running[id]--; s.running[id] <= 0 {
				delete(s.running, id)
			}
		})
	}, nil
}
