package ingest_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/ingest"
	"github.com/bandplane/bandplane/schema/keys"
)

var uploadKeys = fakeKeys{
	"platform": {ID: "k-platform", Org: keys.PlatformOrg, Role: keys.RoleIngest},
	"acme-1":   {ID: "k-acme-1", Org: "org-acme", Role: keys.RoleIngest},
	"acme-2":   {ID: "k-acme-2", Org: "org-acme", Role: keys.RoleIngest},
	"acme-3":   {ID: "k-acme-3", Org: "org-acme", Role: keys.RoleIngest},
	"other-1":  {ID: "k-other-1", Org: "org-other", Role: keys.RoleIngest},
	"other-2":  {ID: "k-other-2", Org: "org-other", Role: keys.RoleIngest},
	"third":    {ID: "k-third", Org: "org-third", Role: keys.RoleIngest},
}

// slowBody is a request body that trickles: it tells when it is first read, and ends
// once finish is called.
type slowBody struct {
	r       *io.PipeReader
	w       *io.PipeWriter
	started chan struct{}
	once    sync.Once
}

func newSlowBody() *slowBody {
	r, w := io.Pipe()
	return &slowBody{r: r, w: w, started: make(chan struct{})}
}

func (b *slowBody) Read(p []byte) (int, error) {
	b.once.Do(func() { close(b.started) })
	return b.r.Read(p)
}

func (b *slowBody) finish(t *testing.T, line string) {
	t.Helper()
	go func() {
		_, _ = b.w.Write([]byte(line))
		_ = b.w.Close()
	}()
}

// slowPost starts a post whose body trickles, and returns once the collector reads it
// (it holds an upload place then); done gets the status code.
func slowPost(t *testing.T, c http.Handler, token string) (*slowBody, <-chan int) {
	t.Helper()
	body := newSlowBody()
	req := httptest.NewRequest(http.MethodPost, "/v1/events", body)
	req.Header.Set("Authorization", "Bearer "+token)
	done := make(chan int, 1)
	go func() {
		rec := httptest.NewRecorder()
		c.ServeHTTP(rec, req)
		done <- rec.Code
	}()
	select {
	case <-body.started:
	case <-time.After(10 * time.Second):
		t.Fatalf("the collector never read the body of %s", token)
	}
	return body, done
}

// One key's, one organization's, or the tenants' slow uploads never hold what another
// tenant or the platform needs: over its share a request is refused at once (429),
// naming the flag, while the others go on.
func TestCollectorUploadShares(t *testing.T) {
	prod := &fakeProducer{}
	c, err := ingest.NewCollector(ingest.CollectorConfig{Producer: prod, Auth: uploadKeys, Registrations: registrations{}, Now: func() time.Time { return now },
		MaxUploads: 4, MaxUploadsPerOrg: 2, MaxUploadsPerKey: 1})
	require.NoError(t, err)
	refused := func(token, flag string) {
		t.Helper()
		code, resp := post(t, c, token, canonical("e-"+token, "", "a"))
		assert.Equal(t, http.StatusTooManyRequests, code, token)
		assert.Equal(t, "too_many_requests", resp.Code, token)
		assert.Contains(t, resp.Error, flag, token)
	}

	var slow []*slowBody
	var done []<-chan int
	hold := func(token string) {
		b, d := slowPost(t, c, token)
		slow, done = append(slow, b), append(done, d)
	}
	hold("acme-1")
	refused("acme-1", "(--max-uploads-per-key)")
	hold("acme-2")
	refused("acme-3", "(--max-uploads-per-org)")
	hold("other-1")
	refused("third", "(--max-uploads)")

	code, resp := post(t, c, "platform", canonical("e-platform", "org-third", "a"))
	assert.Equal(t, http.StatusOK, code, "the platform's reserved place: %+v", resp)

	for i, b := range slow {
		b.finish(t, canonical(fmt.Sprintf("e-slow-%d", i), "", "a"))
	}
	for _, d := range done {
		assert.Equal(t, http.StatusOK, <-d)
	}
	code, resp = post(t, c, "acme-1", canonical("e-again", "", "a"))
	assert.Equal(t, http.StatusOK, code, "the places are given back: %+v", resp)
	assert.Len(t, prod.events, 5)
}

// A refused upload costs nothing: its body is never read.
func TestCollectorRefusedUploadIsNotRead(t *testing.T) {
	c, err := ingest.NewCollector(ingest.CollectorConfig{Producer: &fakeProducer{}, Auth: uploadKeys, Registrations: registrations{}, Now: func() time.Time { return now },
		MaxUploadsPerKey: 1})
	require.NoError(t, err)
	b, done := slowPost(t, c, "acme-1")
	second := newSlowBody()
	req := httptest.NewRequest(http.MethodPost, "/v1/events", second)
	req.Header.Set("Authorization", "Bearer acme-1")
	rec := httptest.NewRecorder()
	c.ServeHTTP(rec, req)
	assert.Equal(t, http.StatusTooManyRequests, rec.Code)
	assert.Equal(t, "1", rec.Header().Get("Retry-After"))
	var resp ingest.CollectorResponse
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &resp))
	assert.True(t, strings.HasPrefix(resp.Error, "key k-acme-1 is already sending 1 request bodies"), resp.Error)
	select {
	case <-second.started:
		t.Fatal("the refused request's body was read")
	default:
	}
	b.finish(t, canonical("e-1", "", "a"))
	assert.Equal(t, http.StatusOK, <-done)
}

func TestCollectorUploadLimitsAreValidated(t *testing.T) {
	_, err := ingest.NewCollector(ingest.CollectorConfig{Producer: &fakeProducer{}, Auth: uploadKeys, MaxUploadsPerOrg: -1})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--max-uploads-per-org must be > 0")
}
