package shard_test

import (
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/policy/shard"
)

func peers(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("http://10.0.0.%d:8080", i+1)
	}
	return out
}

func TestConfigValidate(t *testing.T) {
	many := peers(300)
	for _, tc := range []struct {
		name  string
		cfg   shard.Config
		wants []string // substrings of the error; none = valid
	}{
		{"valid", shard.Config{Peers: []string{"http://a:1", "https://b:2/policy"}, Self: "https://b:2/policy/"}, nil},
		{"self differs in case and slash", shard.Config{Peers: []string{"http://A:1/"}, Self: "HTTP://a:1"}, nil},
		{"no peers", shard.Config{Self: "http://a:1"}, []string{"no peers", "not in the peer list"}},
		{"no self", shard.Config{Peers: []string{"http://a:1"}}, []string{"no self"}},
		{"self not listed", shard.Config{Peers: []string{"http://a:1"}, Self: "http://b:1"}, []string{"self http://b:1 is not in the peer list"}},
		{"scheme", shard.Config{Peers: []string{"ftp://a:1", "a:1", "//a:1"}, Self: "http://a:1"}, []string{`peer 1: "ftp://a:1" is not an http(s) URL`, "peer 2", "peer 3"}},
		{"no host", shard.Config{Peers: []string{"http://", "http://:80"}, Self: "http://"}, []string{"peer 1", "no host", "peer 2"}},
		{"credentials", shard.Config{Peers: []string{"http://u:p@a:1", "http://a:1?x=1", "http://a:1#f"}, Self: "http://a:1"}, []string{"peer 1", "peer 2", "peer 3", "plain base URL"}},
		{"duplicate", shard.Config{Peers: []string{"http://a:1", "http://A:1/"}, Self: "http://a:1"}, []string{"peer 2 (http://A:1/) is peer 1 again"}},
		{"too many", shard.Config{Peers: many, Self: many[0]}, []string{"300 peers, more than 256"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if len(tc.wants) == 0 {
				require.NoError(t, err)
				_, err = shard.New(tc.cfg)
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			for _, w := range tc.wants {
				assert.Contains(t, err.Error(), w)
			}
			_, err = shard.New(tc.cfg)
			assert.Error(t, err, "New refuses what Validate refuses")
		})
	}
}

func TestEveryReplicaAgreesOnTheOwner(t *testing.T) {
	list := peers(5)
	var all []*shard.Shards
	for _, self := range list {
		s, err := shard.New(shard.Config{Peers: list, Self: self})
		require.NoError(t, err)
		all = append(all, s)
	}
	// The order of the list changes nothing (rendezvous), nor the URL's spelling.
	rev := slices.Clone(list)
	slices.Reverse(rev)
	for i := range rev {
		rev[i] = strings.ToUpper(rev[i][:4]) + rev[i][4:] + "/"
	}
	other, err := shard.New(shard.Config{Peers: rev, Self: rev[0]})
	require.NoError(t, err)
	for i := range 2000 {
		org := fmt.Sprintf("org-%d", i)
		owner := all[0].Owner(org)
		owners := 0
		for _, s := range all {
			assert.Equal(t, owner, s.Owner(org))
			if s.Owns(org) {
				owners++
				assert.Equal(t, owner, s.Self())
			}
		}
		assert.Equal(t, 1, owners, "exactly one replica owns %s", org)
		assert.Equal(t, owner, other.Owner(org))
	}
}

func TestOrganizationsSpreadEvenlyAndMoveLittle(t *testing.T) {
	const orgs = 20000
	for _, n := range []int{2, 3, 8} {
		before, err := shard.New(shard.Config{Peers: peers(n), Self: peers(n)[0]})
		require.NoError(t, err)
		after, err := shard.New(shard.Config{Peers: peers(n + 1), Self: peers(n + 1)[0]})
		require.NoError(t, err)
		per := map[string]int{}
		moved := 0
		for i := range orgs {
			org := fmt.Sprintf("org-%08x", i*2654435761)
			b, a := before.Owner(org), after.Owner(org)
			per[b]++
			if a != b {
				moved++
				assert.Equal(t, peers(n + 1)[n], a, "an organization moves only to the new replica")
			}
		}
		for p, c := range per {
			assert.InDelta(t, float64(orgs)/float64(n), float64(c), 0.06*orgs/float64(n), "replica %s of %d holds %d organizations", p, n, c)
		}
		assert.InDelta(t, float64(orgs)/float64(n+1), float64(moved), 0.06*orgs/float64(n+1), "from %d to %d replicas", n, n+1)
	}
}

func TestNilShardsOwnEverything(t *testing.T) {
	var s *shard.Shards
	assert.True(t, s.Owns("org-anything"))
	assert.Equal(t, "", s.Owner("org-anything"))
	assert.Nil(t, s.Peers())
	one, err := shard.New(shard.Config{Peers: []string{"http://a:1"}, Self: "http://a:1"})
	require.NoError(t, err)
	assert.True(t, one.Owns("org-x"))
	assert.Equal(t, "http://a:1", one.Owner("org-x"))
}

func TestHashIsFNV1a(t *testing.T) {
	// The owner of an organization must never change between versions: the score is
	// pinned to FNV-1a, checked against hash/fnv through Owner's choice.
	s, err := shard.New(shard.Config{Peers: []string{"http://a:1", "http://b:1", "http://c:1"}, Self: "http://a:1"})
	require.NoError(t, err)
	got := map[string]string{}
	for _, org := range []string{"org-acme", "org-partner", "org-band", "", "org-ünïcode"} {
		got[org] = s.Owner(org)
	}
	assert.Equal(t, ownersFromStdlib(t, []string{"http://a:1", "http://b:1", "http://c:1"}, got), got)
}

// ownersFromStdlib recomputes the owners of the orgs of got with hash/fnv.
func ownersFromStdlib(t *testing.T, peers []string, got map[string]string) map[string]string {
	t.Helper()
	h := func(s string) uint64 {
		f := fnv.New64a()
		f.Write([]byte(s))
		return f.Sum64()
	}
	want := map[string]string{}
	for org := range got {
		best, score := "", uint64(0)
		for i, p := range peers {
			if sc := shard.Mix(h(org) ^ h(p)); i == 0 || sc > score {
				best, score = p, sc
			}
		}
		want[org] = best
	}
	return want
}
