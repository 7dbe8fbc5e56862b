package dual

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bandplane/bandplane/deploy/stacktest"
)

// ServerHTTPAddr is the local 18.16's HTTP interface (deploy/local/clickhouse.sh).
func ServerHTTPAddr() string {
	if v := os.Getenv("BANDPLANE_CLICKHOUSE_HTTP"); v != "" {
		return v
	}
	return "127.0.0.1:18123"
}

// Server is the local ClickHouse server (18.16) over its HTTP interface. It skips t
// unless integration tests are enabled, like every test of the real stack.
func Server(t testing.TB) Engine {
	t.Helper()
	stacktest.Require(t)
	s := &server{base: "http://" + ServerHTTPAddr() + "/", client: &http.Client{Timeout: 120 * time.Second}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := s.Query(ctx, "SELECT version()")
	if err != nil {
		t.Fatalf("ClickHouse server at %s: %v (make up starts it)", ServerHTTPAddr(), err)
	}
	s.name = "clickhouse-server " + r.Rows[0][0]
	return s
}

type server struct {
	base   string
	client *http.Client
	name   string
}

func (s *server) Name() string { return s.name }

func (s *server) post(ctx context.Context, params url.Values, body string) ([]byte, error) {
	return s.send(ctx, params, "", strings.NewReader(body))
}

// send POSTs body (of contentType, "" for plain) with the URL parameters params and
// returns the response, or the server's error text.
func (s *server) send(ctx context.Context, params url.Values, contentType string, body io.Reader) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.base+"?"+params.Encode(), body)
	if err != nil {
		return nil, err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close() //nolint:errcheck // the body is read below; closing it loses nothing
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, errors.New(strings.TrimSpace(string(out)))
	}
	return out, nil
}

func (s *server) Exec(ctx context.Context, sql string) error {
	_, err := s.post(ctx, nil, sql)
	return err
}

func (s *server) Query(ctx context.Context, sql string, ext ...External) (*Result, error) {
	if len(ext) == 0 {
		out, err := s.post(ctx, url.Values{"default_format": {"TabSeparatedWithNamesAndTypes"}}, sql)
		if err != nil {
			return nil, err
		}
		return ParseTSV(out)
	}
	// External data over HTTP: the query in the URL, each table a multipart file with
	// its structure in <name>_structure.
	params := url.Values{"default_format": {"TabSeparatedWithNamesAndTypes"}, "query": {sql}}
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	for _, e := range ext {
		params.Set(e.Name+"_structure", e.Structure)
		params.Set(e.Name+"_format", "TabSeparated")
		w, err := mw.CreateFormFile(e.Name, e.Name+".tsv")
		if err != nil {
			return nil, err
		}
		_, _ = w.Write(e.TSV)
	}
	if err := mw.Close(); err != nil {
		return nil, err
	}
	out, err := s.send(ctx, params, mw.FormDataContentType(), &body)
	if err != nil {
		return nil, err
	}
	return ParseTSV(out)
}

func (s *server) Insert(ctx context.Context, insert string, tsv []byte) error {
	_, err := s.post(ctx, url.Values{"query": {insert + " FORMAT TabSeparated"}}, string(tsv))
	return err
}

// Chdb starts a fresh ClickHouse 26.9 (chdb-core, deploy/local/chdb/engine.py) in a
// session folder of t's own, stopped and removed at cleanup. It skips t unless
// integration tests are enabled; a missing virtual environment fails t with the command
// that creates it.
func Chdb(t testing.TB) Engine {
	t.Helper()
	stacktest.Require(t)
	root := stacktest.RepoRoot()
	py, err := exec.Command(filepath.Join(root, "deploy/local/chdb.sh"), "python").Output()
	if err != nil {
		t.Fatalf("ClickHouse 26.9 (chdb-core) is not installed: run deploy/local/chdb.sh install (make test does): %v", err)
	}
	cmd := exec.Command(strings.TrimSpace(string(py)), filepath.Join(root, "deploy/local/chdb/engine.py"), t.TempDir())
	cmd.Env = append(os.Environ(), "TZ=UTC")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	outp, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("cannot start the chdb engine: %v", err)
	}
	c := &chdbEngine{in: in, out: bufio.NewReaderSize(outp, 1<<20), cmd: cmd, stderr: &stderr}
	t.Cleanup(func() {
		_ = in.Close()
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	version, err := c.read()
	if err != nil {
		t.Fatalf("the chdb engine did not start: %v", err)
	}
	c.name = "chdb-core " + version
	return c
}

// chdbEngine talks to one engine.py process; one request at a time.
type chdbEngine struct {
	mu     sync.Mutex
	in     io.WriteCloser
	out    *bufio.Reader
	cmd    *exec.Cmd
	stderr *bytes.Buffer
	name   string
	dead   error // set when the engine was killed
}

func (c *chdbEngine) Name() string { return c.name }

type chdbReply struct {
	OK    bool   `json:"ok"`
	Out   string `json:"out"`
	Error string `json:"error"`
}

func (c *chdbEngine) read() (string, error) {
	line, err := c.out.ReadBytes('\n')
	if err != nil {
		return "", fmt.Errorf("chdb engine exited: %w; stderr: %s", err, c.stderr.String())
	}
	var r chdbReply
	if err := json.Unmarshal(line, &r); err != nil {
		return "", fmt.Errorf("chdb engine replied %q: %w", line, err)
	}
	if !r.OK {
		return "", errors.New(r.Error)
	}
	return r.Out, nil
}

// do sends one request and waits for its reply, or for ctx: a statement the engine
// never finishes (say, a mutation on a table whose merges are stopped) kills the engine,
// and every later request fails at once instead of hanging the test.
func (c *chdbEngine) do(ctx context.Context, req map[string]string) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	b, err := json.Marshal(req)
	if err != nil {
		return "", err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dead != nil {
		return "", c.dead
	}
	if _, err := c.in.Write(append(b, '\n')); err != nil {
		return "", fmt.Errorf("chdb engine: %w; stderr: %s", err, c.stderr.String())
	}
	type reply struct {
		out string
		err error
	}
	done := make(chan reply, 1)
	go func() { out, err := c.read(); done <- reply{out, err} }()
	select {
	case r := <-done:
		return r.out, r.err
	case <-ctx.Done():
		// Text, not wrapped: every later statement fails with this error, and under its own
		// context it is not a cancellation.
		c.dead = fmt.Errorf("chdb engine killed: a statement outlived its context (%v): %.300s", ctx.Err(), req["sql"]) //nolint:errorlint // see above
		_ = c.cmd.Process.Kill()
		<-done
		return "", c.dead
	}
}

func (c *chdbEngine) Exec(ctx context.Context, sql string) error {
	_, err := c.do(ctx, map[string]string{"op": "exec", "sql": sql})
	return err
}

func (c *chdbEngine) Query(ctx context.Context, sql string, ext ...External) (*Result, error) {
	// The engine has no external data: the tables are made in the session's current
	// database (where the query's unqualified names resolve) for this one query.
	for _, e := range ext {
		if err := c.Exec(ctx, "CREATE TABLE "+e.Name+" ("+e.Structure+") ENGINE = Memory"); err != nil {
			return nil, fmt.Errorf("external table %s: %w", e.Name, err)
		}
		defer func() { _ = c.Exec(context.Background(), "DROP TABLE IF EXISTS "+e.Name) }()
		if len(e.TSV) > 0 {
			if err := c.Insert(ctx, "INSERT INTO "+e.Name, e.TSV); err != nil {
				return nil, fmt.Errorf("external table %s: %w", e.Name, err)
			}
		}
	}
	out, err := c.do(ctx, map[string]string{"op": "query", "sql": sql})
	if err != nil {
		return nil, err
	}
	return ParseTSV([]byte(out))
}

func (c *chdbEngine) Insert(ctx context.Context, insert string, tsv []byte) error {
	_, err := c.do(ctx, map[string]string{"op": "insert", "sql": insert, "data": string(tsv)})
	return err
}

// Null is how a Result holds NULL: no text ClickHouse writes unescaped (the string \N
// is written \\N and read back as \N).
const Null = "\x00NULL\x00"

// ParseTSV reads TabSeparatedWithNamesAndTypes: a line of names, a line of types, then
// rows; values are unescaped, NULL is Null.
func ParseTSV(b []byte) (*Result, error) {
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	if len(lines) < 2 {
		return nil, fmt.Errorf("not TabSeparatedWithNamesAndTypes (%d lines): %.200q", len(lines), b)
	}
	names, types := splitTSV(lines[0]), splitTSV(lines[1])
	if len(names) != len(types) {
		return nil, fmt.Errorf("%d names but %d types", len(names), len(types))
	}
	r := &Result{Columns: make([]Column, len(names))}
	for i := range names {
		r.Columns[i] = Column{Name: names[i], Type: types[i]}
	}
	for n, l := range lines[2:] {
		row := splitTSV(l)
		if len(row) != len(names) {
			return nil, fmt.Errorf("row %d has %d values, want %d: %.200q", n+1, len(row), len(names), l)
		}
		r.Rows = append(r.Rows, row)
	}
	return r, nil
}

func splitTSV(line string) []string {
	fields := strings.Split(line, "\t")
	for i, f := range fields {
		switch {
		case f == `\N`:
			fields[i] = Null
		case strings.IndexByte(f, '\\') >= 0:
			fields[i] = unescapeTSV(f)
		}
	}
	return fields
}

func unescapeTSV(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '\\' || i+1 == len(s) {
			b.WriteByte(c)
			continue
		}
		i++
		switch s[i] {
		case 'n':
			b.WriteByte('\n')
		case 't':
			b.WriteByte('\t')
		case 'r':
			b.WriteByte('\r')
		case '0':
			b.WriteByte(0)
		case 'b':
			b.WriteByte('\b')
		case 'f':
			b.WriteByte('\f')
		default: // \\ \' and anything else: the character itself
			b.WriteByte(s[i])
		}
	}
	return b.String()
}

// EscapeTSV writes s as a TabSeparated value.
func EscapeTSV(s string) string {
	if !strings.ContainsAny(s, "\\\t\n\r\x00\b\f") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '\\':
			b.WriteString(`\\`)
		case '\t':
			b.WriteString(`\t`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case 0:
			b.WriteString(`\0`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}
