package main

import (
	"io"
	"testing"
	"testing/fstest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/policy"
)

func TestPolicyPeersFlags(t *testing.T) {
	for _, tc := range []struct {
		name, peers, self string
		want              string // substring of the error; "" = valid
	}{
		{"one replica", "", "", ""},
		{"two", "http://10.0.0.1:8080, http://10.0.0.2:8080", "http://10.0.0.2:8080", ""},
		{"self without peers", "", "http://10.0.0.1:8080", "--policy-self \"http://10.0.0.1:8080\" needs --policy-peers"},
		{"peers without self", "http://10.0.0.1:8080", "", "--policy-peers needs --policy-self"},
		{"self not listed", "http://10.0.0.1:8080,http://10.0.0.2:8080", "http://10.0.0.3:8080", "not in the peer list"},
		{"not http", "10.0.0.1:8080,http://10.0.0.2:8080", "http://10.0.0.2:8080", "invalid --policy-peers"},
		{"duplicate", "http://a:1,http://a:1/", "http://a:1", "peer 2 (http://a:1/) is peer 1 again"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := policyFlags{peers: tc.peers, self: tc.self}
			s, err := p.shards()
			if tc.want == "" {
				require.NoError(t, err)
				if tc.peers == "" {
					assert.Nil(t, s)
				} else {
					assert.Equal(t, tc.self, s.Self())
				}
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestPolicyPeersFromTheEnvironment(t *testing.T) {
	t.Setenv("BANDPLANE_POLICY_PEERS", "http://a:1,http://b:1")
	t.Setenv("BANDPLANE_POLICY_SELF", "http://b:1")
	var p policyFlags
	fs := newFlagSet(&env{stderr: io.Discard}, "serve", "")
	p.register(fs)
	require.NoError(t, fs.Parse(nil))
	s, err := p.shards()
	require.NoError(t, err)
	assert.Equal(t, []string{"http://a:1", "http://b:1"}, s.Peers())
}

func TestMaxWindowOfThePolicyData(t *testing.T) {
	w, err := maxWindow(policy.DefaultBundle())
	require.NoError(t, err)
	assert.Equal(t, time.Minute, w, "the built-in bundle's window")
	w, err = maxWindow(fstest.MapFS{"data.json": {Data: []byte(`{"quotas":{"defaults":{"window_seconds":60},
		"orgs":{"o":{"window_seconds":3600}},"agents":{"a":{"window_seconds":600}}}}`)}})
	require.NoError(t, err)
	assert.Equal(t, time.Hour, w)
	w, err = maxWindow(fstest.MapFS{})
	require.NoError(t, err)
	assert.Zero(t, w, "no policy data: the replica's default")
	_, err = maxWindow(fstest.MapFS{"data.json": {Data: []byte(`{`)}})
	assert.Error(t, err)
}
