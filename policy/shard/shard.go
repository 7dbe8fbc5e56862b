// Package shard assigns organizations to policy replicas. Every rate key and budget
// scope of send_message lives inside one organization, so a decision's state is held by
// exactly one replica when each organization has one owner: the replica with the highest
// rendezvous (highest random weight) score for it. Adding a replica to N moves about
// 1/(N+1) of the organizations, all of them to the new one; removing one moves only
// the organizations it owned.
//
// It may import schema/ and its own folder's packages only; ingest/, policy/ and query/
// stand side by side and never import each other (deploy/layers).
package shard

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// MaxPeers bounds the replicas of one deployment (a decision scores every one).
const MaxPeers = 256

// The answer of a replica to a decision of an organization it does not own (the
// policy API writes it, the policy client follows it): 421 Misdirected Request, the
// owner's base URL in OwnerHeader, and a JSON body {"code": CodeMisdirected, "owner",
// "message", "error"}. On a 200 of a stateful decision OwnerHeader names the replica
// that answered.
const (
	OwnerHeader     = "Bandplane-Policy-Owner"
	CodeMisdirected = "misdirected"
)

// Config is the peer list of a deployment and this replica's entry in it.
type Config struct {
	// Peers are the base URLs of every policy replica (http or https, with a host),
	// the same list on each replica; no duplicates.
	Peers []string
	// Self is this replica's own entry in Peers.
	Self string
}

// Validate reports every problem of the peer list, each naming the peer.
func (c *Config) Validate() error {
	var errs []error
	if len(c.Peers) == 0 {
		errs = append(errs, errors.New("no peers"))
	}
	if len(c.Peers) > MaxPeers {
		errs = append(errs, fmt.Errorf("%d peers, more than %d", len(c.Peers), MaxPeers))
	}
	seen := map[string]int{}
	for i, p := range c.Peers {
		n, err := Normalize(p)
		if err != nil {
			errs = append(errs, fmt.Errorf("peer %d: %w", i+1, err))
			continue
		}
		if j, dup := seen[n]; dup {
			errs = append(errs, fmt.Errorf("peer %d (%s) is peer %d again", i+1, p, j+1))
			continue
		}
		seen[n] = i
	}
	if c.Self == "" {
		errs = append(errs, errors.New("no self: this replica's own entry of the peer list is required"))
	} else if n, err := Normalize(c.Self); err != nil {
		errs = append(errs, fmt.Errorf("self: %w", err))
	} else if _, ok := seen[n]; !ok {
		errs = append(errs, fmt.Errorf("self %s is not in the peer list (%s)", c.Self, strings.Join(c.Peers, ",")))
	}
	return errors.Join(errs...)
}

// Normalize checks a replica's base URL and returns it in the one form peers are
// compared in: lowercase scheme and host, no trailing slash. It must be http or https
// with a host, without user info, query or fragment (a base URL, never a credential).
func Normalize(raw string) (string, error) {
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil {
		return "", fmt.Errorf("cannot parse %q as a URL: %w", raw, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return "", fmt.Errorf("%q is not an http(s) URL", raw)
	}
	if u.Host == "" || u.Hostname() == "" {
		return "", fmt.Errorf("%q has no host", raw)
	}
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" || u.Opaque != "" {
		return "", fmt.Errorf("%q must be a plain base URL (no user info, query or fragment)", raw)
	}
	path := strings.TrimRight(u.EscapedPath(), "/")
	return strings.ToLower(u.Scheme) + "://" + strings.ToLower(u.Host) + path, nil
}

// Shards is the assignment of organizations to replicas. A nil *Shards is a single
// replica that owns every organization. Safe for concurrent use (immutable).
type Shards struct {
	peers []string // normalized, in the configured order
	seeds []uint64
	self  int
}

// New validates cfg and returns its assignment.
func New(cfg Config) (*Shards, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Shards{peers: make([]string, len(cfg.Peers)), seeds: make([]uint64, len(cfg.Peers))}
	self, _ := Normalize(cfg.Self)
	for i, p := range cfg.Peers {
		s.peers[i], _ = Normalize(p)
		s.seeds[i] = hash(s.peers[i])
		if s.peers[i] == self {
			s.self = i
		}
	}
	return s, nil
}

// Owner is the base URL of the replica that decides org's stateful decisions.
func (s *Shards) Owner(org string) string {
	if s == nil {
		return ""
	}
	return s.peers[s.owner(org)]
}

// Owns says whether this replica owns org (always, for a nil *Shards).
func (s *Shards) Owns(org string) bool {
	return s == nil || len(s.peers) == 1 || s.owner(org) == s.self
}

// Self is this replica's base URL ("" for a nil *Shards).
func (s *Shards) Self() string {
	if s == nil {
		return ""
	}
	return s.peers[s.self]
}

// Peers are the replicas' base URLs, normalized, in the configured order.
func (s *Shards) Peers() []string {
	if s == nil {
		return nil
	}
	return append([]string(nil), s.peers...)
}

// owner is the index of the peer with the highest score for org; a tie (2^-64 per
// pair) goes to the earlier peer of the list, the same on every replica.
func (s *Shards) owner(org string) int {
	h := hash(org)
	best, bestScore := 0, uint64(0)
	for i, seed := range s.seeds {
		if sc := mix(h ^ seed); i == 0 || sc > bestScore {
			best, bestScore = i, sc
		}
	}
	return best
}

// hash is FNV-1a (64 bits) of s, without hash/fnv's allocations (it runs on every
// send_message).
func hash(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

// mix is SplitMix64's finalizer: FNV of similar strings (peer URLs differing in a
// port digit) is close in its high bits, and the score compares whole words.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
