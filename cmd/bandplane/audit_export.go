package main

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/bandplane/bandplane/query/trail"
	"github.com/bandplane/bandplane/schema/keys"
	"github.com/bandplane/bandplane/schema/tlog"
)

// The compliance export (query/trail/README.md, "Compliance export"): GET /v1/audit/export streams a
// selection of one organization's trail pinned to a signed checkpoint of its log, with
// the proofs to check it offline (the format is query/trail's: trail.ExportFormat);
// `bandplane audit export` drives it and resumes an interrupted file; `bandplane audit
// verify --export FILE` checks one.

// newAuditExporter is the exporter of serve's --audit-key (nil without one): it signs
// the manifests, and its public half anchors the key ring the export's checkpoint is
// checked with (the rotation records in ClickHouse link the others). published reads
// the checkpoints topic's newest checkpoint of every organization (kafka.ReadLatest):
// an export pinned to the newest checkpoint is refused (409) when the topic's is
// larger, since ClickHouse was then rolled back; nil compares nothing.
func newAuditExporter(conn driver.Conn, db, prefix, keyFile string, published func(context.Context) (map[string][]byte, error), log *slog.Logger) (*trail.Exporter, error) {
	if keyFile == "" {
		return nil, nil
	}
	key, err := trail.LoadPrivateKey(keyFile)
	if err != nil {
		return nil, fmt.Errorf("cannot use --audit-key for the audit export: %w", err)
	}
	return trail.NewExporter(trail.ExportConfig{Conn: conn, Database: db, Prefix: prefix, Key: key, Logger: log, Published: published})
}

type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error {
	*l = append(*l, v)
	return nil
}

func runAuditExport(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "audit export", "--out FILE --from T --to T [flags]")
	out := fs.String("out", "", "file to write (required); it is written as FILE.part and renamed once complete")
	format := fs.String("format", trail.EncodingNDJSON, "ndjson or csv")
	from := fs.String("from", "", "events at or after this time, RFC 3339 or YYYY-MM-DD (required)")
	to := fs.String("to", "", "events before this time, RFC 3339 or YYYY-MM-DD (required)")
	org := fs.String("org", "", "the organization (required with a platform key; an organization's key exports its own)")
	asOf := fs.String("as-of", "", "the size of the checkpoint to pin the export to: the size of an earlier export's header gives the same export again (default: the newest checkpoint)")
	var types, actors, rooms, checkpoints listFlag
	fs.Var(&types, "type", "only events of this type (repeat it, or comma-separate)")
	fs.Var(&actors, "actor", "only events of this actor id (repeat it, or comma-separate)")
	fs.Var(&rooms, "room", "only events of this room id (repeat it, or comma-separate)")
	fs.Var(&checkpoints, "checkpoint", "a checkpoint you hold (bandplane audit checkpoint --out, a witness's state file): the export proves its log extends it (repeatable, at most 8)")
	server := fs.String("server", envOr("BANDPLANE_SERVER", "http://127.0.0.1:8080"), "bandplane serve's URL (env BANDPLANE_SERVER)")
	token := fs.String("key", "", "API key of role compliance or admin (default: env BANDPLANE_KEY)")
	resume := fs.Bool("resume", false, "continue FILE.part, an interrupted export, from its last complete event")
	quiet := fs.Bool("quiet", false, "no progress on stderr")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *out == "" {
		fs.Usage()
		return errors.New("--out is required")
	}
	if *token == "" {
		*token = os.Getenv("BANDPLANE_KEY")
	}
	if *token == "" {
		return errors.New("no API key: give --key or set BANDPLANE_KEY (a key of role compliance or admin)")
	}
	base, err := url.Parse(*server)
	if err != nil || (base.Scheme != "http" && base.Scheme != "https") || base.Host == "" {
		return fmt.Errorf("--server %q is not an http(s) URL", *server)
	}
	// What the flags ask for, checked here as the server would.
	q := url.Values{}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	for _, p := range []struct{ name, v string }{{"org", *org}, {"from", *from}, {"to", *to}, {"format", *format}, {"as_of", *asOf}} {
		if p.v != "" {
			q.Set(p.name, p.v)
		}
	}
	for _, l := range []struct {
		name string
		vals listFlag
	}{{"types", types}, {"actors", actors}, {"rooms", rooms}} {
		for _, v := range l.vals {
			q.Add(l.name, v)
		}
	}
	if len(checkpoints) > trail.MaxConsistency {
		return fmt.Errorf("--checkpoint: %d given; at most %d", len(checkpoints), trail.MaxConsistency)
	}
	for _, f := range checkpoints {
		size, err := heldCheckpointSize(f)
		if err != nil {
			return fmt.Errorf("--checkpoint: %w", err)
		}
		q.Add("consistency", strconv.FormatUint(size, 10))
	}
	selectionGiven := given["from"] || given["to"] || given["type"] || given["actor"] || given["room"] || given["org"] || given["as-of"] || given["checkpoint"]
	var want *trail.ExportRequest
	if !*resume || selectionGiven {
		req, err := trail.ParseExportRequest(q)
		if err != nil {
			msg := strings.ReplaceAll(err.Error(), "\n", "; ")
			msg = strings.NewReplacer("as_of:", "--as-of:", "consistency:", "--checkpoint:").Replace(msg)
			return errors.New(msg)
		}
		want = &req
	}
	x := &exporter{e: e, base: base, token: *token, out: *out, part: *out + ".part", quiet: *quiet,
		servedDefault: len(checkpoints) == 0 && *asOf == ""}
	if *resume {
		asked := ""
		if given["format"] {
			asked = *format
		}
		return x.resume(ctx, want, asked, given["checkpoint"])
	}
	return x.fresh(ctx, *want)
}

// withServed adds the size of the checkpoint the server serves of the organization
// (GET /v1/audit/checkpoint) to a new export's consistency sizes, unless --checkpoint
// or --as-of is given: the server then refuses to pin an older checkpoint than the
// one it serves, which is what a ClickHouse rolled back below the checkpoints topic
// gives, and the export proves its log extends that size.
func (x *exporter) withServed(ctx context.Context, req *trail.ExportRequest) error {
	if !x.servedDefault {
		return nil
	}
	size, err := x.servedSize(ctx, req.Selection.Org)
	if err != nil {
		return err
	}
	req.Consistency = []uint64{size}
	return nil
}

// servedSize reads the size of org's checkpoint as the server serves it (an empty
// org: the key's own organization).
func (x *exporter) servedSize(ctx context.Context, org string) (uint64, error) {
	const what = "the checkpoint the server serves (GET /v1/audit/checkpoint), which the export proves its log extends"
	u := *x.base
	u.Path = strings.TrimSuffix(u.Path, "/") + "/v1/audit/checkpoint"
	if org != "" {
		u.RawQuery = url.Values{"org": {org}}.Encode()
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	hreq, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return 0, err
	}
	hreq.Header.Set("Authorization", "Bearer "+x.token)
	resp, err := http.DefaultClient.Do(hreq)
	if err != nil {
		return 0, fmt.Errorf("cannot reach %s for %s: %w", x.base.Redacted(), what, err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		var eb keys.ErrorBody
		if json.Unmarshal(body, &eb) == nil && eb.Error != "" {
			return 0, fmt.Errorf("cannot read %s: the server answered %d (%s): %s", what, resp.StatusCode, eb.Code, eb.Error)
		}
		return 0, fmt.Errorf("cannot read %s: the server answered %d: %.200s", what, resp.StatusCode, body)
	}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		return 0, errors.New("--org: required with a platform key (the server lists every organization's checkpoint otherwise)")
	}
	note, err := io.ReadAll(io.LimitReader(resp.Body, tlog.MaxNoteBytes+1))
	if err != nil {
		return 0, fmt.Errorf("cannot read %s: %w", what, err)
	}
	if len(note) > tlog.MaxNoteBytes {
		return 0, fmt.Errorf("cannot read %s: the answer is larger than a checkpoint (%d bytes)", what, tlog.MaxNoteBytes)
	}
	size, err := checkpointSize(note, "the server's answer")
	if err != nil {
		return 0, fmt.Errorf("cannot read %s: %w", what, err)
	}
	return size, nil
}

// heldCheckpointSize reads the tree size of a checkpoint file (its second line); the
// server proves consistency with that size, and the verifier checks the proof against
// the file itself.
func heldCheckpointSize(path string) (uint64, error) {
	b, err := readBounded(path, tlog.MaxNoteBytes)
	if err != nil {
		return 0, err
	}
	return checkpointSize(b, path)
}

// checkpointSize reads the tree size of a checkpoint note (its second line); source
// names the note in errors.
func checkpointSize(b []byte, source string) (uint64, error) {
	lines := strings.SplitN(string(b), "\n", 3)
	if len(lines) < 3 {
		return 0, fmt.Errorf("%s is not a checkpoint (origin, size and root lines, then signatures)", source)
	}
	size, err := strconv.ParseUint(lines[1], 10, 64)
	if err != nil || size == 0 || strconv.FormatUint(size, 10) != lines[1] {
		return 0, fmt.Errorf("%s is not a checkpoint: its second line %q is not a tree size", source, clipString(lines[1]))
	}
	return size, nil
}

func clipString(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}

// exporter is one run of `bandplane audit export`.
type exporter struct {
	e           *env
	base        *url.URL
	token       string
	out, part   string
	quiet       bool
	resumed     bool
	priorEvents uint64
	// servedDefault: a new export proves consistency with the server's checkpoint
	// (no --checkpoint, no --as-of).
	servedDefault bool
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

func (x *exporter) fresh(ctx context.Context, req trail.ExportRequest) error {
	if exists(x.out) {
		return fmt.Errorf("%s exists: remove it or choose another --out", x.out)
	}
	if exists(x.part) {
		return fmt.Errorf("%s holds an interrupted export: --resume continues it (or remove it to start over)", x.part)
	}
	if err := x.withServed(ctx, &req); err != nil {
		return err
	}
	f, err := os.OpenFile(x.part, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("cannot create %s: %w", x.part, err)
	}
	defer func() { _ = f.Close() }()
	done, err := x.fetch(ctx, f, req, 0)
	if err != nil && !done {
		if info, serr := f.Stat(); serr == nil && info.Size() == 0 {
			_ = f.Close()
			_ = os.Remove(x.part) // nothing came: nothing to resume
		}
	}
	return err
}

// resume continues x.part. want is the selection the flags give (nil: none given),
// format the --format given ("" when not), held whether --checkpoint was given.
func (x *exporter) resume(ctx context.Context, want *trail.ExportRequest, format string, held bool) error {
	if !exists(x.part) {
		if exists(x.out) {
			fmt.Fprintf(x.e.stderr, "audit export: %s is complete: nothing to resume\n", x.out)
			return nil
		}
		return fmt.Errorf("no interrupted export %s to resume (run without --resume to start one)", x.part)
	}
	f, err := os.OpenFile(x.part, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("cannot open %s: %w", x.part, err)
	}
	defer func() { _ = f.Close() }()
	first := make([]byte, 1)
	n, _ := f.ReadAt(first, 0)
	enc := trail.EncodingNDJSON
	if n == 1 && first[0] == 'k' {
		enc = trail.EncodingCSV
	}
	if format != "" && n == 1 && format != enc {
		return fmt.Errorf("%s is a %s export, not %s: --resume continues it as it is (drop --format)", x.part, enc, format)
	}
	sc := trail.NewExportScanner(enc)
	if _, err := io.Copy(sc, io.NewSectionReader(f, 0, 1<<62)); err != nil {
		return fmt.Errorf("cannot read %s: %w", x.part, err)
	}
	if sc.Complete() {
		return x.finish(f, sc.Manifest, enc)
	}
	if sc.Header == nil {
		// Cut before its header was whole: nothing of it is worth keeping.
		if want == nil {
			return fmt.Errorf("%s holds no complete header, so its selection is unknown: give the selection again (--from, --to, …) with --resume, or remove it", x.part)
		}
		req := *want
		if err := x.withServed(ctx, &req); err != nil {
			return err
		}
		if err := f.Truncate(0); err != nil {
			return fmt.Errorf("cannot truncate %s: %w", x.part, err)
		}
		_, err := x.fetch(ctx, f, req, 0)
		return err
	}
	h, err := trail.ParseExportHeader(enc, sc.Header)
	if err != nil {
		return fmt.Errorf("%s: %w (remove it and start over)", x.part, err)
	}
	cut, events := sc.HeaderEnd, sc.Events
	var c trail.Cursor
	if events > 0 {
		last, err := trail.ExportEventKey(enc, sc.LastEvent)
		if err != nil {
			return fmt.Errorf("%s: %w (remove it and start over)", x.part, err)
		}
		cut = sc.LastEventEnd
		c, err = trail.NewCursor(&h, events, last.Time, last.ID)
		if err != nil {
			return fmt.Errorf("%s: %w", x.part, err)
		}
	} else if c, err = trail.NewCursor(&h, 0, time.Time{}, ""); err != nil {
		return fmt.Errorf("%s: %w", x.part, err)
	}
	req, err := h.Request(&c)
	if err != nil {
		return fmt.Errorf("%s: %w", x.part, err)
	}
	if want != nil && !sameSelection(want, &req, format != "", held) {
		return fmt.Errorf("%s is an export of another selection (%s, %s to %s, at checkpoint size %d, consistency %v): --resume takes the selection from the file; drop the selection flags or give the same ones",
			x.part, req.Selection.Org, h.From, h.To, h.Size, h.Consistency)
	}
	if err := f.Truncate(cut); err != nil {
		return fmt.Errorf("cannot truncate %s to its last complete event: %w", x.part, err)
	}
	x.resumed, x.priorEvents = true, events
	fmt.Fprintf(x.e.stderr, "audit export: resuming %s after %d events (checkpoint size %d)\n", x.part, events, h.Size)
	_, err = x.fetch(ctx, f, req, cut)
	return err
}

// sameSelection says whether the flags given with --resume ask for the file's export.
func sameSelection(want, got *trail.ExportRequest, formatGiven, heldGiven bool) bool {
	w, g := want.Selection, got.Selection
	if w.Org != "" && w.Org != g.Org || !w.From.Equal(g.From) || !w.To.Equal(g.To) ||
		strings.Join(w.Types, "\x00") != strings.Join(g.Types, "\x00") ||
		strings.Join(w.Actors, "\x00") != strings.Join(g.Actors, "\x00") ||
		strings.Join(w.Rooms, "\x00") != strings.Join(g.Rooms, "\x00") {
		return false
	}
	if formatGiven && want.Encoding != got.Encoding {
		return false
	}
	if heldGiven && !slices.Equal(want.Consistency, got.Consistency) {
		return false
	}
	return want.AsOf == 0 || want.AsOf == got.AsOf
}

// exportBusyWait bounds how long fetch asks a busy server again.
var exportBusyWait = time.Minute

// retryAfter is a Retry-After of whole seconds, bounded to 1–30 s (1 s when absent or
// not a number of seconds).
func retryAfter(v string) time.Duration {
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || n < 1 {
		return time.Second
	}
	return time.Duration(min(n, 30)) * time.Second
}

// fetch runs one request and appends its body to f at offset at. done says whether
// the export is complete (and renamed).
func (x *exporter) fetch(ctx context.Context, f *os.File, req trail.ExportRequest, at int64) (bool, error) {
	if _, err := f.Seek(at, io.SeekStart); err != nil {
		return false, fmt.Errorf("cannot write %s: %w", x.part, err)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	u := *x.base
	u.Path = strings.TrimSuffix(u.Path, "/") + "/v1/audit/export"
	u.RawQuery = req.Values().Encode()
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.ResponseHeaderTimeout = 5 * time.Minute // Prepare scans the log; a resume counts what the file holds
	client := &http.Client{Transport: tr}
	// A busy server (429: this key's export still running, or every slot taken) is
	// asked again after its Retry-After, for up to exportBusyWait: an export killed a
	// moment ago holds its key's slot until the server notices its client is gone.
	deadline := time.Now().Add(exportBusyWait)
	var resp *http.Response
	for {
		hreq, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
		if err != nil {
			return false, err
		}
		hreq.Header.Set("Authorization", "Bearer "+x.token)
		if resp, err = client.Do(hreq); err != nil {
			return false, fmt.Errorf("cannot reach %s: %w", x.base.Redacted(), err)
		}
		wait := min(retryAfter(resp.Header.Get("Retry-After")), time.Until(deadline))
		if resp.StatusCode != http.StatusTooManyRequests || wait <= 0 {
			break
		}
		_ = resp.Body.Close()
		fmt.Fprintf(x.e.stderr, "audit export: the server is busy (429); asking again in %s\n", wait.Round(100*time.Millisecond))
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(wait):
		}
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		var eb keys.ErrorBody
		if json.Unmarshal(body, &eb) == nil && eb.Error != "" {
			return false, fmt.Errorf("the server answered %d (%s): %s", resp.StatusCode, eb.Code, eb.Error)
		}
		return false, fmt.Errorf("the server answered %d: %.200s", resp.StatusCode, body)
	}
	expected, _ := strconv.ParseUint(resp.Header.Get(trail.HeaderExportExpected), 10, 64)
	p := newExportProgress(x.e.stderr, x.quiet, expected, x.priorEvents)
	defer p.stop()

	// A stalled connection ends the request: the file resumes later.
	var alive atomic.Int64
	alive.Store(time.Now().UnixNano())
	go func() {
		t := time.NewTicker(5 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if time.Since(time.Unix(0, alive.Load())) > 2*time.Minute {
					cancel(errors.New("no data from the server for 2 minutes"))
					return
				}
			}
		}
	}()
	sc := trail.NewExportScanner(req.Encoding)
	buf := make([]byte, 256<<10)
	var rerr error
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			alive.Store(time.Now().UnixNano())
			// Written as it comes, unbuffered: a process killed now leaves whole
			// records and at most one cut, which --resume drops.
			if _, werr := f.Write(buf[:n]); werr != nil {
				return false, fmt.Errorf("cannot write %s: %w", x.part, werr)
			}
			_, _ = sc.Write(buf[:n])
			p.update(sc.Events, sc.Offset())
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				rerr = err
				if c := context.Cause(ctx); c != nil && !errors.Is(c, context.Canceled) {
					rerr = c
				}
			}
			break
		}
	}
	p.stop()
	switch {
	case sc.Error != nil:
		// Keep the records before the server's error, not the error itself.
		_ = f.Truncate(at + sc.ErrorStart)
		return false, fmt.Errorf("the server stopped the export after %d events: %s; run again with --resume to continue %s",
			x.priorEvents+sc.Events, trail.ParseExportError(req.Encoding, sc.Error), x.part)
	case sc.Complete():
		return true, x.finish(f, sc.Manifest, req.Encoding)
	case rerr != nil:
		return false, fmt.Errorf("the export stopped after %d events (%w): run again with --resume to continue %s", x.priorEvents+sc.Events, rerr, x.part)
	}
	return false, fmt.Errorf("the export ended before its manifest after %d events: run again with --resume to continue %s", x.priorEvents+sc.Events, x.part)
}

// finish makes the complete file durable and gives it its name.
func (x *exporter) finish(f *os.File, manifest []byte, enc string) error {
	if err := f.Sync(); err != nil {
		return fmt.Errorf("cannot sync %s: %w", x.part, err)
	}
	info, err := f.Stat()
	if err != nil {
		return err
	}
	if exists(x.out) {
		return fmt.Errorf("%s is complete, but %s exists: rename it yourself", x.part, x.out)
	}
	if err := os.Rename(x.part, x.out); err != nil {
		return fmt.Errorf("cannot rename %s to %s: %w", x.part, x.out, err)
	}
	if d, err := os.Open(filepath.Dir(x.out)); err == nil {
		_ = d.Sync() // the rename itself
		_ = d.Close()
	}
	m, err := trail.ParseExportManifest(enc, manifest)
	if err != nil {
		return fmt.Errorf("%s: %w", x.out, err)
	}
	return printJSON(x.e.stdout, map[string]any{"file": x.out, "format": enc, "events": m.Events, "gaps": m.Gaps, "size": m.Size,
		"key_id": m.KeyID, "bytes": info.Size(), "resumed": x.resumed})
}

// exportProgress shows events/s and an ETA on stderr: redrawn in place on a terminal,
// a line every few seconds otherwise.
type exportProgress struct {
	w        io.Writer
	tty      bool
	start    time.Time
	expected uint64
	prior    uint64
	events   atomic.Uint64
	bytes    atomic.Int64
	done     chan struct{}
	once     sync.Once
	wg       sync.WaitGroup
}

func newExportProgress(w io.Writer, quiet bool, expected, prior uint64) *exportProgress {
	p := &exportProgress{w: w, start: time.Now(), expected: expected, prior: prior, done: make(chan struct{})}
	if quiet {
		close(p.done)
		p.once.Do(func() {})
		return p
	}
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			p.tty = true
		}
	}
	every := 5 * time.Second
	if p.tty {
		every = 250 * time.Millisecond
	}
	p.wg.Go(func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-p.done:
				return
			case <-t.C:
				p.draw(false)
			}
		}
	})
	return p
}

func (p *exportProgress) update(events uint64, bytes int64) {
	p.events.Store(events)
	p.bytes.Store(bytes)
}

func (p *exportProgress) stop() {
	p.once.Do(func() {
		close(p.done)
		p.wg.Wait()
		p.draw(true)
	})
}

func (p *exportProgress) draw(last bool) {
	n := p.events.Load()
	total := p.prior + n
	secs := time.Since(p.start).Seconds()
	rate := 0.0
	if secs > 0 {
		rate = float64(n) / secs
	}
	line := fmt.Sprintf("audit export: %d", total)
	if p.expected > 0 {
		line += fmt.Sprintf("/~%d events (%d%%)", p.expected, min(100, total*100/max(1, p.expected)))
	} else {
		line += " events"
	}
	line += fmt.Sprintf(", %.0f events/s, %.1f MB", rate, float64(p.bytes.Load())/1e6)
	if !last && p.expected > total && rate > 0 {
		line += ", ETA " + (time.Duration(float64(p.expected-total)/rate) * time.Second).Round(time.Second).String()
	}
	if last {
		line += fmt.Sprintf(" in %s", time.Since(p.start).Round(time.Millisecond))
	}
	switch {
	case p.tty && last:
		fmt.Fprintf(p.w, "\r\033[K%s\n", line)
	case p.tty:
		fmt.Fprintf(p.w, "\r\033[K%s", line)
	default:
		fmt.Fprintln(p.w, line)
	}
}

// runAuditVerifyExport checks an export file offline (no database) against the audit
// keys anchors (the first or the current key: the export's rotation records link the
// others) and the checkpoints an auditor holds.
func runAuditVerifyExport(ctx context.Context, e *env, file string, anchors []ed25519.PublicKey, held []trail.External) error {
	f, err := os.Open(file)
	if err != nil {
		return fmt.Errorf("--export: %w", err)
	}
	defer func() { _ = f.Close() }()
	info, err := f.Stat()
	if err != nil {
		return fmt.Errorf("--export: %w", err)
	}
	if !info.Mode().IsRegular() {
		return fmt.Errorf("--export: %s is not a regular file", file)
	}
	start := time.Now()
	rep, err := trail.VerifyExport(ctx, f, info.Size(), trail.ExportVerifyOptions{Anchors: anchors, Checkpoints: held})
	if err != nil {
		return err
	}
	const shown = 20
	for i, p := range rep.Problems {
		if i == shown {
			fmt.Fprintf(e.stderr, "audit verify: … and %d more problems (the report on stdout lists up to %d)\n", len(rep.Problems)-shown+int(rep.MoreProblems), trail.MaxExportProblems)
			break
		}
		where := "file"
		if p.Line > 0 {
			where = fmt.Sprintf("line %d", p.Line)
		}
		fmt.Fprintf(e.stderr, "audit verify: %s: %s: %s\n", where, p.Kind, p.Reason)
	}
	verdict := "OK: every line and gap is a leaf of the signed checkpoint, and the export is whole"
	if !rep.OK() {
		verdict = fmt.Sprintf("%d problems", len(rep.Problems)+int(rep.MoreProblems))
	}
	consistent := ""
	if len(rep.Consistent) > 0 {
		consistent = ", extends " + strings.Join(rep.Consistent, ", ")
	}
	fmt.Fprintf(e.stderr, "audit verify: export %s: org %q, %s to %s, checkpoint of size %d signed at %s by key %s (%s)%s: %d events, %d gaps (%d expired) in %s: %s\n",
		file, rep.Org, rep.From, rep.To, rep.Size, rep.SignedAt.Format(time.RFC3339), rep.CheckpointKey, rep.OriginPrefix, consistent,
		rep.Events, rep.Gaps, rep.Expired, time.Since(start).Round(time.Millisecond), verdict)
	if err := printJSON(e.stdout, rep); err != nil {
		return err
	}
	if !rep.OK() {
		return exitError{code: 1}
	}
	return nil
}
