package share_test

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/schema/share"
)

func TestBoundsAndRelease(t *testing.T) {
	p := share.New(share.Limits{Total: 4, PerGroup: 3, PerClient: 2}, "")
	r1, err := p.Take("org-a", "k1")
	require.Nil(t, err)
	_, err = p.Take("org-a", "k1")
	require.Nil(t, err)
	_, err = p.Take("org-a", "k1")
	require.NotNil(t, err)
	assert.Equal(t, share.Refusal{Bound: share.BoundClient, Limit: 2, Held: 2}, *err)

	_, err = p.Take("org-a", "k2")
	require.Nil(t, err)
	_, err = p.Take("org-a", "k3")
	require.NotNil(t, err, "the organization holds 3")
	assert.Equal(t, share.BoundGroup, err.Bound)

	_, err = p.Take("org-b", "k4")
	require.Nil(t, err)
	_, err = p.Take("org-c", "k5")
	require.NotNil(t, err, "the pool holds 4")
	assert.Equal(t, share.Refusal{Bound: share.BoundTotal, Limit: 4, Held: 4}, *err)
	assert.Contains(t, err.Error(), "total share full: 4 of 4 held")

	r1()
	r1() // twice gives back once
	assert.Equal(t, 3, p.Held())
	_, err = p.Take("org-c", "k5")
	require.Nil(t, err)
	_, err = p.Take("org-c", "k6")
	require.NotNil(t, err)
}

func TestReservedPlacesAreThePlatformsOnly(t *testing.T) {
	p := share.New(share.Limits{Total: 3, Reserved: 1}, "*")
	for _, org := range []string{"org-a", "org-b"} {
		_, err := p.Take(org, org+"-key")
		require.Nil(t, err, org)
	}
	_, err := p.Take("org-c", "k")
	require.NotNil(t, err, "tenants hold at most 2 of 3")
	assert.Equal(t, share.Refusal{Bound: share.BoundTotal, Limit: 2, Held: 2}, *err)
	release, err := p.Take("*", "platform")
	require.Nil(t, err, "the platform takes the reserved place")
	_, err = p.Take("*", "platform")
	require.NotNil(t, err, "and nothing past the total")
	release()

	// The platform may hold tenants' places too while they are free.
	q := share.New(share.Limits{Total: 2, Reserved: 1}, "*")
	for range 2 {
		_, err := q.Take("*", "platform")
		require.Nil(t, err)
	}
}

func TestForgetsWhatIsGivenBack(t *testing.T) {
	p := share.New(share.Limits{Total: 1000, PerGroup: 10, PerClient: 1}, "")
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := range 1000 {
				release, err := p.Take("org", string(rune('a'+i))+string(rune(j)))
				if err == nil {
					release()
				}
			}
		})
	}
	wg.Wait()
	assert.Zero(t, p.Held())
	_, err := p.Take("org", "x")
	assert.Nil(t, err)
}

// A pool of few places keeps one for the reserved group, unless it has only one.
func TestFewKeepsOnePlaceForTheReservedGroup(t *testing.T) {
	p := share.Few(2, 2, 2, "platform")
	_, refused := p.Take("acme", "k1")
	require.Nil(t, refused)
	_, refused = p.Take("acme", "k1")
	require.NotNil(t, refused, "the second place is the platform's")
	assert.Equal(t, share.BoundTotal, refused.Bound)
	_, refused = p.Take("platform", "ops")
	assert.Nil(t, refused)

	one := share.Few(1, 1, 1, "platform")
	_, refused = one.Take("acme", "k1")
	assert.Nil(t, refused, "a pool of one place keeps none back")
}
