package main

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	kafkago "github.com/segmentio/kafka-go"

	"github.com/bandplane/bandplane/query/trail"
	"github.com/bandplane/bandplane/schema/kafka"
	"github.com/bandplane/bandplane/schema/keys"
	"github.com/bandplane/bandplane/schema/tlog"
)

// auditClient is the CLI's side of the endpoints above.
type auditClient struct {
	base  *url.URL
	token string
	http  *http.Client
}

// auditClientFlags are the flags of a command that talks to serve's audit endpoints.
func auditClientFlags(fs *flag.FlagSet) (server, token *string) {
	server = fs.String("server", envOr("BANDPLANE_SERVER", "http://127.0.0.1:8080"), "bandplane serve's URL (env BANDPLANE_SERVER)")
	token = fs.String("key", "", "API key of role compliance or admin (default: env BANDPLANE_KEY)")
	return server, token
}

// newAuditClient checks the flags of auditClientFlags (token given, or from the
// environment by the caller).
func newAuditClient(server, token string) (*auditClient, error) {
	if token == "" {
		return nil, errors.New("no API key: give --key or set BANDPLANE_KEY (a key of role compliance or admin)")
	}
	base, err := url.Parse(server)
	if err != nil || (base.Scheme != "http" && base.Scheme != "https") || base.Host == "" {
		return nil, fmt.Errorf("--server %q is not an http(s) URL", server)
	}
	return &auditClient{base: base, token: token, http: &http.Client{Timeout: time.Minute}}, nil
}

// get fetches path?q and returns the body of a 200, or an error with the server's.
func (c *auditClient) get(ctx context.Context, path string, q url.Values, max int64) ([]byte, error) {
	u := *c.base
	u.Path = strings.TrimSuffix(u.Path, "/") + path
	u.RawQuery = q.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("cannot reach bandplane serve at %s: %w", c.base, err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(io.LimitReader(resp.Body, max+1))
	if err != nil {
		return nil, fmt.Errorf("cannot read the answer of %s: %w", path, err)
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("the answer of %s is larger than %d bytes", path, max)
	}
	if resp.StatusCode != http.StatusOK {
		ae := &apiError{path: path, status: resp.StatusCode}
		var eb keys.ErrorBody
		if json.Unmarshal(b, &eb) == nil && eb.Error != "" {
			ae.msg = eb.Error
		}
		return nil, ae
	}
	return b, nil
}

// apiError is an answer of serve other than 200: its status and what it said.
type apiError struct {
	path   string
	status int
	msg    string
}

func (e *apiError) Error() string {
	if e.msg == "" {
		return fmt.Sprintf("%s: HTTP %d", e.path, e.status)
	}
	return fmt.Sprintf("%s: %s (HTTP %d)", e.path, e.msg, e.status)
}

func orgQuery(org string, given bool) url.Values {
	q := url.Values{}
	if given {
		q.Set("org", org)
	}
	return q
}

func runAuditCheckpoint(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "audit checkpoint", "[--org ORG] [--out FILE] [flags]")
	org := fs.String("org", "", `the organization (required with a platform key; "" is the log of events stored without one)`)
	out := fs.String("out", "", "write the checkpoint to this file (default: stdout)")
	server, token := auditClientFlags(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	if *token == "" {
		*token = os.Getenv("BANDPLANE_KEY")
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == "org" })
	c, err := newAuditClient(*server, *token)
	if err != nil {
		return err
	}
	note, err := c.get(ctx, "/v1/audit/checkpoint", orgQuery(*org, given), tlog.MaxNoteBytes)
	if err != nil {
		return err
	}
	if !given && strings.HasPrefix(string(note), "[") {
		return errors.New("--org: required with a platform key (the server lists every organization's checkpoint otherwise)")
	}
	if *out == "" {
		_, err := e.stdout.Write(note)
		return err
	}
	return writeFileAtomic(*out, note, 0o644)
}

// writeFileAtomic writes data to path through a synced temporary file in its folder.
func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("cannot write %s: %w", path, err)
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	_, err = tmp.Write(data)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), mode)
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("cannot write %s: %w", path, err)
	}
	return nil
}

// rotateGrace is how far ahead of now `audit rotate` hands over by default: time to
// restart serve with the new key before the old one stops signing.
const rotateGrace = 5 * time.Minute

// rotateKafkaWait bounds how long `audit rotate` tries the checkpoints topic before it
// goes on with ClickHouse alone (and says so).
const rotateKafkaWait = 30 * time.Second

func runAuditRotate(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "audit rotate", "--audit-key OLD --new-key NEW [--from T] [flags]")
	var st stackFlags
	st.register(fs)
	oldFile := auditKeyFlag(fs, "the audit key in use now (private)")
	newFile := fs.String("new-key", "", "the audit key to hand over to (private; bandplane audit keygen makes one)")
	fromFlag := fs.String("from", "", "when the new key takes over, RFC 3339, after every organization's newest checkpoint (default: 5 minutes from now). "+
		"The old key signs nothing from then on and the new key nothing before: restart serve with --audit-key NEW before or after that time "+
		"(a sealer with the new key waits for it)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	old, err := trail.LoadPrivateKey(*oldFile)
	if err != nil {
		return fmt.Errorf("--audit-key: %w", err)
	}
	next, err := trail.LoadPrivateKey(*newFile)
	if err != nil {
		return fmt.Errorf("--new-key: %w", err)
	}
	// Rounded up: the record holds whole seconds, and the grace is at least the default.
	from := time.Now().UTC().Add(rotateGrace + time.Second - 1).Truncate(time.Second)
	if *fromFlag != "" {
		if from, err = time.Parse(time.RFC3339, *fromFlag); err != nil {
			return fmt.Errorf("--from: %q is not RFC 3339", *fromFlag)
		}
		if from.Unix() < 0 {
			return fmt.Errorf("--from: %s is before 1970", *fromFlag)
		}
	}
	prefix, err := st.prefix()
	if err != nil {
		return err
	}
	note, err := tlog.Rotation(prefix, old, next, from)
	if err != nil {
		return err
	}
	conn, err := st.openDB(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	l, err := trail.NewLog(conn, st.ch.Database, prefix, []ed25519.PublicKey{old.Public().(ed25519.PublicKey)})
	if err != nil {
		return err
	}
	// The topic's rotation records and newest checkpoints count as much as ClickHouse's;
	// without Kafka the record goes to ClickHouse, and running the command again once
	// Kafka is back publishes the same record.
	t := st.auditTopics(sealerPriorityOperator)
	kctx, cancel := context.WithTimeout(ctx, rotateKafkaWait)
	published, kerr := func() (map[string][]byte, error) {
		if err := trail.EnsureTopics(kctx, t, 4); err != nil {
			return nil, err
		}
		return kafka.ReadLatest(kctx, t.Brokers, t.Checkpoints)
	}()
	cancel()
	if kerr != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		fmt.Fprintf(e.stderr, "audit rotate: cannot read the checkpoints topic %s (%v): checking against ClickHouse alone\n", t.Checkpoints, kerr)
	}
	out, err := l.RecordRotation(ctx, note, published)
	if err != nil {
		return err
	}
	oldID, newID := tlog.KeyID(out.Record.Old), tlog.KeyID(out.Record.New)
	at := out.Record.From.Format(time.RFC3339)
	if out.Reused {
		msg := fmt.Sprintf("audit rotate: key %s is rotated to key %s from %s already: publishing that record again", oldID, newID, at)
		if *fromFlag != "" && !out.Record.From.Equal(from) {
			msg += " (--from is not used)"
		}
		fmt.Fprintln(e.stderr, msg)
	}
	if kerr != nil {
		return fmt.Errorf("the rotation record is in ClickHouse, not yet on the checkpoints topic %s (%w): run the same audit rotate again once Kafka is reachable; it publishes the same record",
			t.Checkpoints, kerr)
	}
	// The checkpoints topic keeps it outside ClickHouse too, where a reader anchored at
	// either key finds it; the stored-events topic hands it to the running sealer in
	// order with the notes, so that a deletion from ClickHouse cannot hide it from the
	// sealer, which then signs nothing with a retired key.
	msg := []kafkago.Message{{Key: []byte(trail.RotationKeyPrefix + newID), Value: out.Note}}
	for _, topic := range []string{t.Checkpoints, t.Stored} {
		p, err := kafka.NewProducer(kafka.ProducerConfig{Brokers: t.Brokers, Topic: topic})
		if err != nil {
			return err
		}
		err = p.ProduceMessages(ctx, msg)
		_ = p.Close()
		if err != nil {
			return fmt.Errorf("the rotation record is in ClickHouse, not on the topic %s (%w): run the same audit rotate again; it publishes the same record",
				topic, err)
		}
	}
	return printJSON(e.stdout, map[string]any{"old_key_id": oldID, "new_key_id": newID, "from": at, "reused": out.Reused, "record": string(out.Note)})
}
