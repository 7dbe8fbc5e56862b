package policy

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/fstest"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/require"
)

// bundleWithCrossOrg returns the default bundle with
// governance.cross_org_add_requires_contact set to v.
func bundleWithCrossOrg(t testing.TB, v bool) fs.FS {
	t.Helper()
	m := fstest.MapFS{}
	require.NoError(t, fs.WalkDir(DefaultBundle(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(DefaultBundle(), p)
		if err != nil {
			return err
		}
		if p == "data.json" {
			require.Contains(t, string(b), `"cross_org_add_requires_contact": true`)
			b = []byte(strings.Replace(string(b), `"cross_org_add_requires_contact": true`, fmt.Sprintf(`"cross_org_add_requires_contact": %v`, v), 1))
		}
		m[p] = &fstest.MapFile{Data: b}
		return nil
	}))
	return m
}

// randomDirectory makes a small directory with every flag and relation in play.
func randomDirectory(rng *rand.Rand) Snapshot {
	var s Snapshot
	nPeople, nAgents := 3+rng.IntN(10), 3+rng.IntN(10)
	nOrgs := 1 + rng.IntN(3)
	org := func() string { return fmt.Sprintf("o%d", rng.IntN(nOrgs)) }
	for i := range nPeople {
		s.People = append(s.People, Person{ID: fmt.Sprintf("p%d", i), Handle: fmt.Sprintf("hp%d", i), Org: org()})
	}
	owners := 1 + rng.IntN(min(4, nPeople))
	for i := range nAgents {
		owner := s.People[rng.IntN(owners)]
		a := Agent{
			ID: fmt.Sprintf("a%d", i), Owner: owner.ID, Org: owner.Org,
			Handle:         fmt.Sprintf("%s/a%d", owner.Handle, i),
			RegistryAccess: rng.Float64() < 0.7, SharedWithOrg: rng.Float64() < 0.3,
			Global: rng.Float64() < 0.15, Listed: rng.Float64() < 0.85, Suspended: rng.Float64() < 0.05, OperatorSuspended: rng.Float64() < 0.05,
		}
		if rng.Float64() < 0.1 {
			a.Org = org()
		}
		if rng.Float64() < 0.05 {
			a.Owner = "ghost-owner" // an owner the directory has not seen yet
		}
		s.Agents = append(s.Agents, a)
	}
	ids := allIDs(s)
	seen := map[[2]string]bool{}
	for range rng.IntN(len(ids) * 2) {
		a, b := ids[rng.IntN(len(ids))], ids[rng.IntN(len(ids))]
		if rng.Float64() < 0.05 {
			b = "ghost"
		}
		if a == b {
			continue
		}
		if a > b {
			a, b = b, a
		}
		if !seen[[2]string{a, b}] {
			seen[[2]string{a, b}] = true
			s.Contacts = append(s.Contacts, [2]string{a, b})
		}
	}
	for i := range rng.IntN(3) {
		a, b := ids[rng.IntN(len(ids))], ids[rng.IntN(len(ids))]
		if a != b {
			s.Pending = append(s.Pending, PendingRequest{ID: fmt.Sprintf("req%d", i), From: a, To: b})
		}
	}
	s.Rooms = map[string][]string{}
	for r := range 1 + rng.IntN(3) {
		room := fmt.Sprintf("r%d", r)
		for _, id := range ids {
			if rng.Float64() < 0.35 {
				s.Rooms[room] = append(s.Rooms[room], id)
			}
		}
	}
	return s
}

func allIDs(s Snapshot) []string {
	var ids []string
	for _, p := range s.People {
		ids = append(ids, p.ID)
	}
	for _, a := range s.Agents {
		ids = append(ids, a.ID)
	}
	return ids
}

// buildByMutations reaches s through the mutation methods, with detours that are undone
// (other owners, orgs, handles and flags; contacts, rooms and requests added and
// removed), so the store patches and indexes are exercised, not only Load.
func buildByMutations(ctx context.Context, rng *rand.Rand, d *Directory, s Snapshot) error {
	var errs []error
	must := func(err error) { errs = append(errs, err) }
	must(d.Load(ctx, Snapshot{}))
	for _, p := range s.People {
		must(d.UpsertPerson(ctx, Person{ID: p.ID, Handle: "tmp-" + p.Handle, Org: "o-tmp"}))
	}
	for _, p := range s.People {
		must(d.UpsertPerson(ctx, p))
	}
	ids := allIDs(s)
	for _, a := range s.Agents {
		detour := Agent{ID: a.ID, Handle: "tmp-" + a.ID, Owner: s.People[rng.IntN(len(s.People))].ID, Org: fmt.Sprintf("o%d", rng.IntN(3)),
			RegistryAccess: rng.IntN(2) == 0, SharedWithOrg: rng.IntN(2) == 0, Global: rng.IntN(2) == 0, Listed: rng.IntN(2) == 0}
		if rng.IntN(2) == 0 {
			must(d.UpsertAgent(ctx, detour))
		}
		// The operator's suspension is applied before or after the registration, and an
		// update claiming otherwise never changes it.
		final := a
		final.OperatorSuspended = !a.OperatorSuspended
		early := rng.IntN(2) == 0
		if early {
			must(d.Suspend(ctx, a.ID, a.OperatorSuspended))
		}
		must(d.UpsertAgent(ctx, final))
		if !early {
			must(d.Suspend(ctx, a.ID, a.OperatorSuspended))
		}
		if !a.OperatorSuspended && rng.IntN(4) == 0 {
			must(d.Suspend(ctx, a.ID, true))
			must(d.Suspend(ctx, a.ID, false))
		}
	}
	for _, c := range s.Contacts {
		must(d.AddContact(ctx, c[0], c[1]))
	}
	for range 3 {
		a, b := ids[rng.IntN(len(ids))], ids[rng.IntN(len(ids))]
		if a == b || slices.Contains(s.Contacts, [2]string{min(a, b), max(a, b)}) {
			continue
		}
		must(d.AddContact(ctx, a, b))
		must(d.RemoveContact(ctx, b, a))
	}
	for _, p := range s.Pending {
		must(d.SetPending(ctx, PendingRequest{ID: p.ID + "-old", From: p.From, To: p.To}))
		must(d.SetPending(ctx, p))
	}
	must(d.SetPending(ctx, PendingRequest{ID: "gone", From: "x1", To: "x2"}))
	must(d.ClearPending(ctx, "x1", "x2"))
	for room, members := range s.Rooms {
		for _, id := range members {
			must(d.JoinRoom(ctx, room, id))
		}
		extra := ids[rng.IntN(len(ids))]
		if !slices.Contains(members, extra) {
			must(d.JoinRoom(ctx, room, extra))
			must(d.LeaveRoom(ctx, room, extra))
		}
	}
	return errors.Join(errs...)
}

// normalized is s as Directory.Snapshot returns it.
func normalized(s Snapshot) Snapshot {
	d := NewDirectory()
	if err := d.Load(context.Background(), s); err != nil {
		panic(err)
	}
	return d.Snapshot()
}

func reasonCodes(rs []Reason) []string {
	out := make([]string, 0, len(rs))
	for _, r := range rs {
		out = append(out, r.Code)
	}
	slices.Sort(out)
	return out
}

type outcome struct {
	Allow     bool
	IsContact bool
	Via       string
	Codes     []string
	Peers     []Peer
}

func outcomeOf(d Decision) outcome {
	return outcome{Allow: d.Allow, IsContact: d.IsContact, Via: d.Via, Codes: reasonCodes(d.Reasons), Peers: d.Peers}
}

// TestDifferential holds the Rego policies to the Go reference on random directories:
// allow, is_contact, the grant, the reason codes and the peer lists must agree.
func TestDifferential(t *testing.T) {
	const queriesPerDirectory = 50
	directories := 2000 // 100,000 cases
	if testing.Short() {
		directories = 200
	}
	ctx := context.Background()
	workers := 2
	var cases, mismatches, allowed, listed atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for w := range workers {
		dir := NewDirectory()
		engines := map[bool]*Engine{}
		for _, v := range []bool{false, true} {
			e, err := New(ctx, Config{Directory: dir, Bundle: bundleWithCrossOrg(t, v)})
			require.NoError(t, err)
			engines[v] = e
		}
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 42))
			for i := w; i < directories; i += workers {
				snap := randomDirectory(rng)
				if i%2 == 0 {
					if err := dir.Load(ctx, snap); err != nil {
						t.Error(err)
						return
					}
				} else {
					if err := buildByMutations(ctx, rng, dir, snap); err != nil {
						t.Error(err)
						return
					}
					if diff := cmp.Diff(normalized(snap), dir.Snapshot()); diff != "" {
						t.Errorf("directory %d built by mutations differs (-want +got):\n%s", i, diff)
						return
					}
				}
				crossOrg := rng.IntN(2) == 0
				ref, eng := NewReference(snap, crossOrg), engines[crossOrg]
				ids := append(allIDs(snap), "ghost", "ghost-owner")
				pick := func() string { return ids[rng.IntN(len(ids))] }
				// near picks, half the time, someone likely to be a peer of id, so
				// allowed outcomes are common too.
				near := func(id string) string {
					if rng.IntN(2) == 0 {
						return pick()
					}
					var pool []string
					for _, c := range snap.Contacts {
						if c[0] == id {
							pool = append(pool, c[1])
						} else if c[1] == id {
							pool = append(pool, c[0])
						}
					}
					for _, a := range snap.Agents {
						if a.ID == id {
							pool = append(pool, a.Owner)
						}
						if a.Global || a.SharedWithOrg || a.Owner == id || (strings.HasPrefix(id, "a") && a.Owner == ref.agents[id].Owner) {
							pool = append(pool, a.ID)
						}
					}
					if len(pool) == 0 {
						return pick()
					}
					return pool[rng.IntN(len(pool))]
				}
				rooms := []string{"r0", "r1", "r2", "r9", ""}
				for range queriesPerDirectory {
					var want, got Decision
					var err error
					var q any
					switch k := rng.IntN(10); {
					case k < 4:
						in := PeerInput{Agent: pick(), Room: rooms[rng.IntN(len(rooms))]}
						in.Candidate = near(in.Agent)
						q, want = in, ref.PeerVisible(in)
						got, err = eng.PeerVisible(ctx, in)
					case k < 5:
						in := PeerInput{Agent: pick(), Room: rooms[rng.IntN(len(rooms))]}
						q, want = in, ref.PeerVisible(in)
						got, err = eng.PeerVisible(ctx, in)
						listed.Add(1)
					default:
						in := AddInput{Actor: pick(), Room: rooms[rng.IntN(len(rooms))], Participant: pick()}
						if members := snap.Rooms[in.Room]; len(members) > 0 && rng.IntN(2) == 0 {
							in.Actor = members[rng.IntN(len(members))] // adds come from the room
						}
						in.Participant = near(in.Actor)
						if rng.IntN(50) == 0 {
							in.Participant = ""
						}
						q, want = in, ref.AddParticipant(in)
						got, err = eng.AddParticipant(ctx, in)
					}
					if err != nil {
						t.Error(err)
						return
					}
					cases.Add(1)
					if got.Allow {
						allowed.Add(1)
					}
					if diff := cmp.Diff(outcomeOf(want), outcomeOf(got)); diff != "" {
						if mismatches.Add(1) <= 5 {
							t.Errorf("mismatch on directory %d (cross_org=%v) for %+v (-reference +rego):\n%s\ndirectory: %+v", i, crossOrg, q, diff, snap)
						}
					}
				}
			}
		})
	}
	wg.Wait()
	t.Logf("differential: %d cases (%d allowed, %d peer lists), %d mismatches, %s",
		cases.Load(), allowed.Load(), listed.Load(), mismatches.Load(), time.Since(start).Round(time.Millisecond))
	require.Zero(t, mismatches.Load())
	if !testing.Short() {
		require.GreaterOrEqual(t, cases.Load(), int64(100_000))
	}
	// The random directories must exercise both outcomes.
	require.Greater(t, allowed.Load(), cases.Load()/10)
	require.Less(t, allowed.Load(), cases.Load()*9/10)
}
