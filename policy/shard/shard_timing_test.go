package shard_test

import (
	"fmt"
	"testing"

	"github.com/bandplane/bandplane/policy/shard"
)

// BenchmarkOwns is the shard check of every send_message of a sharded deployment.
func BenchmarkOwns(b *testing.B) {
	orgs := make([]string, 1024)
	for i := range orgs {
		orgs[i] = fmt.Sprintf("org-%d", i)
	}
	for _, n := range []int{2, 8, 256} {
		b.Run(fmt.Sprint(n, "_peers"), func(b *testing.B) {
			s, err := shard.New(shard.Config{Peers: peers(n), Self: peers(n)[0]})
			if err != nil {
				b.Fatal(err)
			}
			owned, i := 0, 0
			for b.Loop() {
				if s.Owns(orgs[i%len(orgs)]) {
					owned++
				}
				i++
			}
			if owned == 0 {
				b.Fatal("owns nothing")
			}
		})
	}
}
