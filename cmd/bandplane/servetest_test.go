package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/stacktest"
	"github.com/bandplane/bandplane/schema/kafka"
	"github.com/bandplane/bandplane/schema/keys"
)

// The helpers below run the real `bandplane serve` binary against the real stack, with
// a database and a topic of the test's own, so that a test can attack it over HTTP and
// check afterwards that the process is still alive.

var (
	buildOnce sync.Once
	binDir    string
	binPath   string
	buildErr  error
)

// TestMain removes the binary the serve tests built (44 MB per run).
func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// bandplaneBinary builds the command once per test process.
func bandplaneBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "bandplane-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binDir = dir
		binPath = filepath.Join(dir, "bandplane")
		cmd := exec.Command("go", "build", "-o", binPath, ".")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %w\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// stack is one test's database, topic and keys.
type stack struct {
	conn   driver.Conn
	db     string
	topic  string
	group  string
	keys   *keys.Store
	tokens map[string]string // name -> token
	ids    map[string]string // name -> key id
	dir    string            // scratch folder (audit key, logs)
}

func newStack(t *testing.T) *stack {
	t.Helper()
	stacktest.Require(t)
	conn, db := stacktest.Database(t)
	topic := stacktest.Topic(t, 4)
	ctx := context.Background()
	require.NoError(t, kafka.EnsureTopic(ctx, stacktest.Brokers(), topic+".dlq", 1))
	p, err := kafka.NewProducer(kafka.ProducerConfig{Brokers: stacktest.Brokers(), Topic: topic, BatchSize: kafka.AuditBatchSize})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	s := &stack{conn: conn, db: db, topic: topic, group: stacktest.Name(t), keys: keys.NewStore(conn, db, p),
		tokens: map[string]string{}, ids: map[string]string{}, dir: t.TempDir()}
	return s
}

// key creates an API key and remembers its token under name.
func (s *stack) key(t *testing.T, name, org string, role keys.Role) string {
	t.Helper()
	k, token, err := s.keys.Create(context.Background(), org, role, name, "test")
	require.NoError(t, err)
	s.tokens[name], s.ids[name] = token, k.ID
	return token
}

// server is a running `bandplane serve`.
type server struct {
	t    *testing.T
	cmd  *exec.Cmd
	url  string
	log  *syncBuffer // the child's stdout and stderr, copied in by exec's goroutine
	done chan error
}

// syncBuffer is a bytes.Buffer that a writer (a child's output copier, a loop) and the
// test can share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}

// serve starts `bandplane serve` on the stack and waits until it is ready.
func (s *stack) serve(t *testing.T, extra ...string) *server {
	t.Helper()
	addr := freePort(t)
	args := append([]string{"serve", "--listen", addr, "--clickhouse", stacktest.ClickHouseAddr(), "--clickhouse-db", s.db,
		"--kafka", strings.Join(stacktest.Brokers(), ","), "--topic", s.topic, "--group", s.group, "--policy-group", s.group + "-policy",
		"--batch-age", "100ms", "--rollup-interval", "500ms", "--key-refresh", "1s", "--otlp-grpc-listen", ""}, extra...)
	cmd := exec.Command(bandplaneBinary(t), args...)
	var log syncBuffer
	cmd.Stdout, cmd.Stderr = &log, &log
	require.NoError(t, cmd.Start())
	srv := &server{t: t, cmd: cmd, url: "http://" + addr, log: &log, done: make(chan error, 1)}
	go func() { srv.done <- cmd.Wait() }()
	t.Cleanup(func() { srv.stop() })
	deadline := time.Now().Add(60 * time.Second)
	for {
		if resp, err := http.Get(srv.url + "/readyz"); err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return srv
			}
		}
		select {
		case err := <-srv.done:
			srv.done <- err
			t.Fatalf("bandplane serve exited (%v):\n%s", err, log.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("bandplane serve is not ready after 60 s:\n%s", log.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// alive fails the test if the process has exited.
func (srv *server) alive() {
	srv.t.Helper()
	select {
	case err := <-srv.done:
		srv.done <- err
		srv.t.Fatalf("bandplane serve died (%v); last output:\n%s", err, tail(srv.log.String(), 4000))
	default:
	}
	resp, err := http.Get(srv.url + "/healthz")
	require.NoError(srv.t, err, "serve does not answer /healthz")
	_ = resp.Body.Close()
	require.Equal(srv.t, http.StatusOK, resp.StatusCode)
}

// stop ends the process with SIGTERM (a clean stop: flush, commit, last seal).
func (srv *server) stop() {
	if srv.cmd.ProcessState != nil {
		return
	}
	_ = srv.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-srv.done:
		srv.done <- err
	case <-time.After(60 * time.Second):
		_ = srv.cmd.Process.Kill()
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// do sends a request with an API key ("" = none) and returns the status and body.
func (srv *server) do(method, path, token, contentType string, body []byte) (int, []byte) {
	srv.t.Helper()
	req, err := http.NewRequest(method, srv.url+path, bytes.NewReader(body))
	require.NoError(srv.t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(srv.t, err, "%s %s", method, path)
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	require.NoError(srv.t, err)
	return resp.StatusCode, b
}

// collectorAnswer is POST /v1/events's answer.
type collectorAnswer struct {
	Accepted int `json:"accepted"`
	Rejected int `json:"rejected"`
	Errors   []struct {
		Line   int    `json:"line"`
		Reason string `json:"reason"`
	} `json:"errors"`
	Error string `json:"error"`
	Code  string `json:"code"`
}

func (srv *server) post(token string, lines ...string) (int, collectorAnswer) {
	srv.t.Helper()
	code, b := srv.do(http.MethodPost, "/v1/events", token, "application/x-ndjson", []byte(strings.Join(lines, "\n")))
	var a collectorAnswer
	require.NoError(srv.t, json.Unmarshal(b, &a), "%d %s", code, b)
	return code, a
}
