package main

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"golang.org/x/mod/sumdb/note"

	"github.com/bandplane/bandplane/query/trail"
	"github.com/bandplane/bandplane/schema/tlog"
)

// `bandplane audit witness` keeps, outside the deployment, the newest checkpoint of
// every organization it may see: each new one must extend the one it kept (a
// consistency proof from bandplane serve, checked against both signed roots), and is
// then cosigned with the witness's own key (C2SP tlog-cosignature/v1) and kept. A
// smaller log (a truncation, a database restored from an older copy) or another root
// (a fork) is refused: the kept checkpoint stays, the command says so on stderr. The
// first checkpoint of an organization is taken as it is (trust on first use).
//
// Each organization is checked on its own: one refused, or one the server cannot
// serve, is reported and the others are still watched. A one-shot pass exits 1 when any
// organization had a problem; with --every, a pass that cannot reach the server is
// reported and tried again at the next interval.
//
// The key ring starts at --audit-key and follows the rotation records serve lists
// (GET /v1/audit/rotations), so the witness keeps working across a key rotation; a
// record must be signed by both its keys, so one forged in ClickHouse links nothing.
//
// The state folder holds witness.key (the signer key, 0600), witness.vkey (its verifier
// key, for auditors) and logs/org-<name>-<hash>.checkpoint: <hash> is of the
// organization id (a file name of bounded length, whatever the id), <name> the id's
// plain characters, for people; the checkpoint inside names the organization.

// witnessOutcome is one organization's result of a pass.
type witnessOutcome struct {
	Org  string `json:"org"`
	Size uint64 `json:"size"`
	From uint64 `json:"from"`
	// Status is first, extended or unchanged (kept); refused (the served checkpoint does
	// not extend the kept one, or does not verify), missing (the server no longer lists
	// an organization the witness keeps) or error (it could not be checked: the server's
	// reason).
	Status string `json:"status"`
	Reason string `json:"reason,omitempty"`
}

type witnessReport struct {
	WitnessKey string           `json:"witness_key"`
	Orgs       []witnessOutcome `json:"orgs"`
	Refused    int              `json:"refused"` // refused and missing
	Errors     int              `json:"errors"`
	// KeyProblems are the rotation records the key ring refused (tlog.KeyRing.Problems).
	KeyProblems []string `json:"key_problems,omitempty"`
}

// Bounds of what the witness reads from serve.
const (
	maxWitnessList      = 64 << 20 // every organization's checkpoint
	maxWitnessRotations = 4 << 20  // the rotation records
	maxWitnessProof     = 1 << 20  // a consistency proof
	maxWitnessRecords   = 2000     // rotation records
	maxWitnessKept      = 2 * tlog.MaxNoteBytes
	maxWitnessOrgs      = 10_000 // --org values
)

func runAuditWitness(ctx context.Context, e *env, args []string) error {
	fset := newFlagSet(e, "audit witness", "--state DIR --audit-key FILE.pub [flags]")
	state := fset.String("state", "", "the witness's folder: its key and the newest checkpoint of each organization (required; created if missing)")
	var keyFiles listFlag
	fset.Var(&keyFiles, "audit-key", "the deployment's audit public key (repeatable, or env BANDPLANE_AUDIT_KEY); the rotation records serve lists lead to the others")
	origin := fset.String("audit-origin", envOr("BANDPLANE_AUDIT_ORIGIN", tlog.DefaultPrefix("bandplane")), "the deployment's origin prefix (serve's --audit-origin)")
	var orgs listFlag
	fset.Var(&orgs, "org", "witness only this organization (repeatable; default: every organization the key may see)")
	name := fset.String("name", "bandplane-witness", "the witness key's name, when the state folder has no key yet")
	every := fset.Duration("every", 0, "check again at this interval until stopped (0: one pass)")
	server, token := auditClientFlags(fset)
	if err := parse(fset, args); err != nil {
		return err
	}
	if *token == "" {
		*token = os.Getenv("BANDPLANE_KEY")
	}
	if *state == "" {
		fset.Usage()
		return errors.New("--state is required")
	}
	if fset.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fset.Args())
	}
	if *every < 0 {
		return fmt.Errorf("--every: %s is negative", *every)
	}
	anchors, err := auditAnchors(keyFiles, os.Getenv("BANDPLANE_AUDIT_KEY"))
	if err != nil {
		return err
	}
	if err := tlog.CheckPrefix(*origin); err != nil {
		return fmt.Errorf("--audit-origin: %w", err)
	}
	given := false
	fset.Visit(func(f *flag.Flag) { given = given || f.Name == "org" })
	if len(orgs) > maxWitnessOrgs {
		return fmt.Errorf("--org: given %d times, more than %d (without --org every organization the key may see is witnessed)", len(orgs), maxWitnessOrgs)
	}
	for _, org := range orgs {
		if err := trail.CheckOrgParam(org, true); err != nil {
			return fmt.Errorf("--%w", err)
		}
	}
	w, err := openWitness(*state, *name)
	if err != nil {
		return err
	}
	w.prefix, w.anchors = *origin, anchors
	c, err := newAuditClient(*server, *token)
	if err != nil {
		return err
	}
	for {
		rep, err := w.pass(ctx, c, orgs, given)
		switch {
		case err != nil && ctx.Err() != nil && *every > 0:
			return nil
		case err != nil && *every <= 0:
			return err
		case err != nil:
			fmt.Fprintf(e.stderr, "audit witness: this pass failed, trying again in %s: %v\n", *every, err)
		default:
			if perr := printJSON(e.stdout, rep); perr != nil {
				return perr
			}
			for _, p := range rep.KeyProblems {
				fmt.Fprintf(e.stderr, "audit witness: key ring: %s\n", p)
			}
			for _, o := range rep.Orgs {
				switch o.Status {
				case "refused", "missing":
					fmt.Fprintf(e.stderr, "audit witness: REFUSED the checkpoint of organization %q: %s\n", o.Org, o.Reason)
				case "error":
					fmt.Fprintf(e.stderr, "audit witness: cannot check organization %q: %s\n", o.Org, o.Reason)
				}
			}
			if *every <= 0 {
				if rep.Refused+rep.Errors > 0 {
					return exitError{code: 1}
				}
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(*every):
		}
	}
}

type witness struct {
	dir    string
	signer note.Signer
	vkey   string
	// prefix and anchors start the key ring, which each pass builds anew with the
	// rotation records serve lists.
	prefix  string
	anchors []ed25519.PublicKey
}

// openWitness reads the witness's key from dir, making one (and dir) the first time.
func openWitness(dir, name string) (*witness, error) {
	if err := os.MkdirAll(filepath.Join(dir, "logs"), 0o700); err != nil {
		return nil, fmt.Errorf("--state: %w", err)
	}
	keyFile, vkeyFile := filepath.Join(dir, "witness.key"), filepath.Join(dir, "witness.vkey")
	skey, err := os.ReadFile(keyFile)
	if errors.Is(err, fs.ErrNotExist) {
		s, v, gerr := tlog.NewWitnessKey(name)
		if gerr != nil {
			return nil, fmt.Errorf("--name: cannot make a witness key named %q: %w", name, gerr)
		}
		if err := writeFileAtomic(keyFile, []byte(s+"\n"), 0o600); err != nil {
			return nil, err
		}
		if err := writeFileAtomic(vkeyFile, []byte(v+"\n"), 0o644); err != nil {
			return nil, err
		}
		skey, err = []byte(s), nil
	}
	if err != nil {
		return nil, fmt.Errorf("cannot read the witness key: %w", err)
	}
	signer, err := tlog.WitnessSigner(strings.TrimSpace(string(skey)))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", keyFile, err)
	}
	vkey, err := os.ReadFile(vkeyFile)
	if err != nil {
		return nil, fmt.Errorf("cannot read the witness's verifier key: %w", err)
	}
	return &witness{dir: dir, signer: signer, vkey: strings.TrimSpace(string(vkey))}, nil
}

// file is where org's checkpoint is kept: a name of bounded length (an id of 256 bytes
// path-escaped may exceed a file name's limit), unique by the hash of the id.
func (w *witness) file(org string) string {
	sum := sha256.Sum256([]byte(org))
	var plain strings.Builder
	for _, r := range org {
		if plain.Len() >= 40 {
			break
		}
		if r < utf8.RuneSelf && (r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r)) {
			plain.WriteRune(r)
		}
	}
	return filepath.Join(w.dir, "logs", "org-"+plain.String()+"-"+hex.EncodeToString(sum[:16])+".checkpoint")
}

// rotations are the rotation records serve lists.
func (c *auditClient) rotations(ctx context.Context) ([][]byte, error) {
	b, err := c.get(ctx, "/v1/audit/rotations", url.Values{}, maxWitnessRotations)
	if err != nil {
		return nil, err
	}
	var ans trail.RotationsAnswer
	if err := json.Unmarshal(b, &ans); err != nil {
		return nil, fmt.Errorf("cannot read the rotation records: %w", err)
	}
	if len(ans.Rotations) > maxWitnessRecords {
		return nil, fmt.Errorf("the server lists %d rotation records, more than %d", len(ans.Rotations), maxWitnessRecords)
	}
	out := make([][]byte, len(ans.Rotations))
	for i, r := range ans.Rotations {
		out[i] = []byte(r.Record)
	}
	return out, nil
}

// pass checks the newest checkpoint of every organization (or of orgs), each on its
// own. Its error is the pass's: the rotation records or the listing could not be read.
func (w *witness) pass(ctx context.Context, c *auditClient, orgs []string, given bool) (witnessReport, error) {
	rep := witnessReport{WitnessKey: w.vkey, Orgs: []witnessOutcome{}}
	rots, err := c.rotations(ctx)
	if err != nil {
		return rep, err
	}
	ring, err := tlog.NewKeyRing(w.prefix, w.anchors, rots)
	if err != nil {
		return rep, err
	}
	rep.KeyProblems = ring.Problems()
	add := func(o witnessOutcome) {
		switch o.Status {
		case "refused", "missing":
			rep.Refused++
		case "error":
			rep.Errors++
		}
		rep.Orgs = append(rep.Orgs, o)
	}
	if given {
		for _, org := range orgs {
			b, err := c.get(ctx, "/v1/audit/checkpoint", orgQuery(org, true), tlog.MaxNoteBytes)
			if err != nil {
				add(witnessOutcome{Org: org, Status: "error", Reason: err.Error()})
				continue
			}
			add(w.check(ctx, c, ring, b, org, true))
		}
		return rep, nil
	}
	b, err := c.get(ctx, "/v1/audit/checkpoint", url.Values{}, maxWitnessList)
	if err != nil {
		return rep, err
	}
	if !strings.HasPrefix(string(b), "[") {
		// A key of one organization: its checkpoint.
		add(w.check(ctx, c, ring, b, "", false))
		return rep, nil
	}
	var list []trail.CheckpointEntry
	if err := json.Unmarshal(b, &list); err != nil {
		return rep, fmt.Errorf("cannot read the list of checkpoints: %w", err)
	}
	listed := map[string]bool{}
	for _, e := range list {
		listed[e.Org] = true
		if e.Error != "" || e.Checkpoint == "" {
			add(witnessOutcome{Org: e.Org, Status: "error", Reason: "the server cannot serve its newest checkpoint: " + clipReason(e.Error)})
			continue
		}
		add(w.check(ctx, c, ring, []byte(e.Checkpoint), e.Org, true))
	}
	// Every organization is listed, so one the witness keeps and the listing lacks has
	// lost its checkpoints both in ClickHouse and on the topic.
	kept, err := w.keptOrgs()
	if err != nil {
		return rep, err
	}
	for _, k := range kept {
		if !listed[k.org] {
			add(witnessOutcome{Org: k.org, Size: k.size, From: k.size, Status: "missing",
				Reason: fmt.Sprintf("the server no longer lists this organization's log, of which a checkpoint of %d leaves is kept", k.size)})
		}
	}
	return rep, nil
}

// clipReason bounds a reason the server gave.
func clipReason(s string) string {
	if len(s) > 1000 {
		return s[:1000] + "…"
	}
	return s
}

type keptLog struct {
	org  string
	size uint64
}

// keptOrgs lists the organizations of the kept checkpoints, by their origin line (a
// kept checkpoint is opened with the ring when its organization comes to be checked).
func (w *witness) keptOrgs() ([]keptLog, error) {
	dir := filepath.Join(w.dir, "logs")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("cannot list the kept checkpoints: %w", err)
	}
	var out []keptLog
	for _, ent := range ents {
		if !ent.Type().IsRegular() || !strings.HasPrefix(ent.Name(), "org-") || !strings.HasSuffix(ent.Name(), ".checkpoint") {
			continue
		}
		b, err := readBounded(filepath.Join(dir, ent.Name()), maxWitnessKept)
		if err != nil {
			continue
		}
		lines := strings.SplitN(string(b), "\n", 3)
		if len(lines) < 3 {
			continue
		}
		org, ok := tlog.OrgOf(w.prefix, lines[0])
		size, err := strconv.ParseUint(lines[1], 10, 64)
		if ok && err == nil && w.file(org) == filepath.Join(dir, ent.Name()) {
			out = append(out, keptLog{org: org, size: size})
		}
	}
	return out, nil
}

// check takes one new checkpoint: it must verify, be of the organization it was served
// for (want, when known), and extend the one kept.
func (w *witness) check(ctx context.Context, c *auditClient, ring *tlog.KeyRing, msg []byte, want string, known bool) witnessOutcome {
	next, err := ring.Open(msg)
	if err != nil {
		return witnessOutcome{Org: want, Status: "refused", Reason: "the checkpoint served does not verify with the audit key ring: " + err.Error()}
	}
	if known && next.Org != want {
		return witnessOutcome{Org: want, Status: "refused", Reason: fmt.Sprintf("the server answered with the checkpoint of organization %q", next.Org)}
	}
	o := witnessOutcome{Org: next.Org, Size: next.Size}
	kept, err := readBounded(w.file(next.Org), maxWitnessKept)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		o.Status = "first"
	case err != nil:
		o.Status, o.Reason = "error", fmt.Sprintf("cannot read the kept checkpoint: %v", err)
		return o
	default:
		prev, err := ring.Open(kept)
		if err != nil {
			o.Status, o.Reason = "refused", fmt.Sprintf("the kept checkpoint %s does not verify: %v", w.file(next.Org), err)
			return o
		}
		o.From = prev.Size
		var pr [][]byte
		if next.Size > prev.Size {
			q := orgQuery(next.Org, true)
			q.Set("from", strconv.FormatUint(prev.Size, 10))
			q.Set("to", strconv.FormatUint(next.Size, 10))
			b, err := c.get(ctx, "/v1/audit/proof", q, maxWitnessProof)
			var ae *apiError
			switch {
			case errors.As(err, &ae) && ae.status == http.StatusConflict:
				// The stored log does not give a proof to its own checkpoint.
				o.Status, o.Reason = "refused", "no consistency proof: "+err.Error()
				return o
			case err != nil:
				o.Status, o.Reason = "error", "no consistency proof: "+err.Error()
				return o
			}
			var ans trail.ProofAnswer
			if err := json.Unmarshal(b, &ans); err != nil {
				o.Status, o.Reason = "refused", "the consistency proof cannot be read: "+err.Error()
				return o
			}
			for _, h := range ans.Proof {
				raw, err := base64.StdEncoding.DecodeString(h)
				if err != nil {
					o.Status, o.Reason = "refused", "the consistency proof holds a hash that is not base64"
					return o
				}
				pr = append(pr, raw)
			}
		}
		if err := tlog.Extends(&prev, &next, pr); err != nil {
			o.Status, o.Reason = "refused", err.Error()
			return o
		}
		o.Status = "extended"
		if next.Size == prev.Size {
			o.Status = "unchanged"
		}
	}
	cosigned, err := tlog.Cosign(next.Note, w.signer)
	if err == nil {
		err = writeFileAtomic(w.file(next.Org), cosigned, 0o644)
	}
	if err != nil {
		o.Status, o.Reason = "error", "cannot keep the checkpoint: "+err.Error()
	}
	return o
}
