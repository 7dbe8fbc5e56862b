package main

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/mod/sumdb/note"

	"github.com/bandplane/bandplane/ingest/seal"
	"github.com/bandplane/bandplane/ingest/seal/tlog"
)

// `bandplane audit witness` keeps, outside the deployment, the newest checkpoint of
// every organization it may see: each new one must extend the one it kept (a
// consistency proof from bandplane serve, checked against both signed roots), and is
// then cosigned with the witness's own key (C2SP tlog-cosignature/v1) and kept. A
// smaller log (a truncation, a database restored from an older copy) or another root
// (a fork) is refused: the kept checkpoint stays, the command says so on stderr and
// exits 1. The first checkpoint of an organization is taken as it is (trust on first
// use). The state folder holds witness.key (the signer key, 0600), witness.vkey (its
// verifier key, for auditors) and logs/org-<organization>.checkpoint.

// witnessOutcome is one organization's result of a pass.
type witnessOutcome struct {
	Org    string `json:"org"`
	Size   uint64 `json:"size"`
	From   uint64 `json:"from"`
	Status string `json:"status"` // first, extended, unchanged, refused
	Reason string `json:"reason,omitempty"`
}

type witnessReport struct {
	WitnessKey string           `json:"witness_key"`
	Orgs       []witnessOutcome `json:"orgs"`
	Refused    int              `json:"refused"`
}

// maxWitnessList bounds the answer listing every organization's checkpoint.
const maxWitnessList = 64 << 20

func runAuditWitness(ctx context.Context, e *env, args []string) error {
	fset := newFlagSet(e, "audit witness", "--state DIR --audit-key FILE.pub [flags]")
	state := fset.String("state", "", "the witness's folder: its key and the newest checkpoint of each organization (required; created if missing)")
	var keyFiles listFlag
	fset.Var(&keyFiles, "audit-key", "the deployment's audit public key (repeatable, or env BANDPLANE_AUDIT_KEY)")
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
	if len(keyFiles) == 0 {
		if v := os.Getenv("BANDPLANE_AUDIT_KEY"); v != "" {
			keyFiles = listFlag{v}
		}
	}
	var anchors []ed25519.PublicKey
	for _, f := range keyFiles {
		pub, err := seal.LoadPublicKey(f)
		if err != nil {
			return fmt.Errorf("--audit-key: %w", err)
		}
		anchors = append(anchors, pub)
	}
	if len(anchors) == 0 {
		return errors.New("--audit-key: the deployment's audit public key is required")
	}
	ring, err := tlog.NewKeyRing(*origin, anchors, nil)
	if err != nil {
		return fmt.Errorf("--audit-origin: %w", err)
	}
	given := false
	fset.Visit(func(f *flag.Flag) { given = given || f.Name == "org" })
	w, err := openWitness(*state, *name)
	if err != nil {
		return err
	}
	c, err := newAuditClient(*server, *token)
	if err != nil {
		return err
	}
	for {
		rep, err := w.pass(ctx, c, ring, orgs, given)
		if err != nil {
			return err
		}
		if perr := printJSON(e.stdout, rep); perr != nil {
			return perr
		}
		for _, o := range rep.Orgs {
			if o.Status == "refused" {
				fmt.Fprintf(e.stderr, "audit witness: REFUSED the checkpoint of organization %q: %s\n", o.Org, o.Reason)
			}
		}
		if *every <= 0 {
			if rep.Refused > 0 {
				return exitError{code: 1}
			}
			return nil
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

func (w *witness) file(org string) string {
	return filepath.Join(w.dir, "logs", "org-"+url.PathEscape(org)+".checkpoint")
}

// pass checks the newest checkpoint of every organization (or of orgs).
func (w *witness) pass(ctx context.Context, c *auditClient, ring *tlog.KeyRing, orgs []string, given bool) (witnessReport, error) {
	rep := witnessReport{WitnessKey: w.vkey, Orgs: []witnessOutcome{}}
	var notes [][]byte
	if given {
		for _, org := range orgs {
			b, err := c.get(ctx, "/v1/audit/checkpoint", orgQuery(org, true), tlog.MaxNoteBytes)
			if err != nil {
				return rep, err
			}
			notes = append(notes, b)
		}
	} else {
		b, err := c.get(ctx, "/v1/audit/checkpoint", url.Values{}, maxWitnessList)
		if err != nil {
			return rep, err
		}
		if strings.HasPrefix(string(b), "[") {
			var list []checkpointEntry
			if err := json.Unmarshal(b, &list); err != nil {
				return rep, fmt.Errorf("cannot read the list of checkpoints: %w", err)
			}
			for _, e := range list {
				notes = append(notes, []byte(e.Checkpoint))
			}
		} else {
			notes = append(notes, b)
		}
	}
	for _, n := range notes {
		o := w.check(ctx, c, ring, n)
		if o.Status == "refused" {
			rep.Refused++
		}
		rep.Orgs = append(rep.Orgs, o)
	}
	return rep, nil
}

// check takes one new checkpoint: it must verify, and extend the one kept.
func (w *witness) check(ctx context.Context, c *auditClient, ring *tlog.KeyRing, msg []byte) witnessOutcome {
	next, err := ring.Open(msg)
	if err != nil {
		return witnessOutcome{Status: "refused", Reason: "the checkpoint served does not verify with the audit key: " + err.Error()}
	}
	o := witnessOutcome{Org: next.Org, Size: next.Size}
	kept, err := os.ReadFile(w.file(next.Org))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		o.Status = "first"
	case err != nil:
		o.Status, o.Reason = "refused", fmt.Sprintf("cannot read the kept checkpoint: %v", err)
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
			b, err := c.get(ctx, "/v1/audit/proof", q, 1<<20)
			if err != nil {
				o.Status, o.Reason = "refused", "no consistency proof: "+err.Error()
				return o
			}
			var ans proofAnswer
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
		o.Status, o.Reason = "refused", "cannot keep the checkpoint: "+err.Error()
	}
	return o
}
