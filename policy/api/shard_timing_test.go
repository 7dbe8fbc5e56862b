package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/bandplane/bandplane/deploy/bench/policybench"
	"github.com/bandplane/bandplane/policy"
	"github.com/bandplane/bandplane/policy/api"
	"github.com/bandplane/bandplane/policy/shard"
)

// shardBench is bench policy's directory (10,000 agents in 50 organizations) with an
// engine whose message rates no benchmark reaches, the shards of a two-replica
// deployment seen from one of them, and send_message bodies of the organizations it
// owns and of those it does not.
type shardBench struct {
	eng             *policy.Engine
	shards          *shard.Shards
	owned, notOwned [][]byte
}

var shardBenchOnce = sync.OnceValues(func() (*shardBench, error) {
	ctx := context.Background()
	setup, err := policybench.NewSetup(ctx, 10_000, 50_000)
	if err != nil {
		return nil, err
	}
	bundle := fstest.MapFS{}
	src := policy.DefaultBundle()
	if err := fs.WalkDir(src, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(src, p)
		if p == "data.json" {
			b = []byte(strings.NewReplacer(`"messages_per_window_agent": 30`, `"messages_per_window_agent": 1000000000`,
				`"messages_per_window_agent_room": 12`, `"messages_per_window_agent_room": 1000000000`,
				`"messages_per_window_agent": 60`, `"messages_per_window_agent": 1000000000`).Replace(string(b)))
		}
		bundle[p] = &fstest.MapFile{Data: b}
		return err
	}); err != nil {
		return nil, err
	}
	eng, err := policy.New(ctx, policy.Config{Directory: setup.Engine.Directory(), Bundle: bundle})
	if err != nil {
		return nil, err
	}
	peers := []string{"http://policy-1:8080", "http://policy-2:8080"}
	s, err := shard.New(shard.Config{Peers: peers, Self: peers[0]})
	if err != nil {
		return nil, err
	}
	sb := &shardBench{eng: eng, shards: s}
	for _, in := range setup.AddInputs(8192) {
		ag, ok := eng.Directory().Agent(in.Actor)
		if !ok {
			continue // a person in the room: only agents post through send_message
		}
		org := ag.Org
		body, _ := json.Marshal(policy.MessageInput{Agent: in.Actor, Room: in.Room})
		if s.Owns(org) {
			sb.owned = append(sb.owned, body)
		} else {
			sb.notOwned = append(sb.notOwned, body)
		}
	}
	return sb, nil
})

// BenchmarkSendMessageSharding is one send_message through the decision API's handler
// (authentication, decoding, the shard check, the decision; no audit, no network) on a
// single replica, on the owner of a two-replica deployment (the same decisions), and
// the other replica's 421. Each iteration runs one of each, in turn (the first of them
// rotating), each timed on its own, so that the three see the same machine (a busy 2-vCPU VM here); ns/op is the sum,
// <name>_ns the mean and <name>_p50_ns the median of each:
//
//	go test -run x -bench SendMessageSharding -benchtime 20000x ./policy/api/
func BenchmarkSendMessageSharding(b *testing.B) {
	sb, err := shardBenchOnce()
	if err != nil {
		b.Fatal(err)
	}
	type config struct {
		name   string
		api    *api.API
		bodies [][]byte
		status int
		lat    []time.Duration
	}
	cs := []*config{
		{name: "one_replica", bodies: sb.owned, status: http.StatusOK},
		{name: "owner_of_two", bodies: sb.owned, status: http.StatusOK},
		{name: "misdirected", bodies: sb.notOwned, status: http.StatusMisdirectedRequest},
	}
	for i, c := range cs {
		var s *shard.Shards
		if i > 0 {
			s = sb.shards
		}
		if c.api, err = api.New(api.Config{Engine: sb.eng, Auth: testKeys, Shards: s}); err != nil {
			b.Fatal(err)
		}
	}
	i := 0
	for b.Loop() {
		for k := range cs {
			c := cs[(i+k)%len(cs)] // each goes first in turn: the next one finds the agent's data warm
			req := httptest.NewRequest(http.MethodPost, "/v1/decisions/send_message", bytes.NewReader(c.bodies[i%len(c.bodies)]))
			req.Header.Set("Authorization", "Bearer t")
			rec := httptest.NewRecorder()
			t0 := time.Now()
			c.api.ServeHTTP(rec, req)
			c.lat = append(c.lat, time.Since(t0))
			if rec.Code != c.status {
				b.Fatalf("%s: %d %s", c.name, rec.Code, rec.Body.String())
			}
		}
		i++
	}
	for _, c := range cs {
		var sum time.Duration
		for _, l := range c.lat {
			sum += l
		}
		slices.Sort(c.lat)
		b.ReportMetric(float64(sum.Nanoseconds())/float64(len(c.lat)), c.name+"_ns")
		b.ReportMetric(float64(c.lat[len(c.lat)/2].Nanoseconds()), c.name+"_p50_ns")
	}
}
