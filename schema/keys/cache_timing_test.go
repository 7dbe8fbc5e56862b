package keys

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// BenchmarkLookup is the cost of authenticating one request among 10,000 keys: one
// SHA-256 and one map lookup.
func BenchmarkLookup(b *testing.B) {
	src := &fakeSource{}
	var tok string
	for i := range 10000 {
		tok = src.add(fmt.Sprintf("k%d", i), "acme", RoleIngest)
	}
	c, err := NewCache(CacheConfig{source: src})
	if err != nil {
		b.Fatal(err)
	}
	if err := c.Load(context.Background()); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.Run("known", func(b *testing.B) {
		for b.Loop() {
			if _, ok := c.Lookup(ctx, tok); !ok {
				b.Fatal("not found")
			}
		}
	})
	// Unknown tokens within MinInterval of the last read: refused without a read.
	c.cfg.MinInterval = time.Hour
	unknown := newToken()
	b.Run("unknown", func(b *testing.B) {
		for b.Loop() {
			if _, ok := c.Lookup(ctx, unknown); ok {
				b.Fatal("found")
			}
		}
	})
}
