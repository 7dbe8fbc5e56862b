package tlog

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"
	"unicode"

	fnote "github.com/transparency-dev/formats/note"

	"github.com/transparency-dev/formats/log"
	"golang.org/x/mod/sumdb/note"
)

// # Checkpoints
//
// A checkpoint is a C2SP tlog-checkpoint signed note: the origin line, the tree size,
// the base64 root hash, a blank line, and signature lines "— <name> <base64>". The
// audit key signs every checkpoint twice under the key name (the deployment's prefix):
// once as the log (a plain Ed25519 note signature, what witnesses and other tlog
// tools check), and once with a C2SP tlog-cosignature/v1, whose signed timestamp says
// when the sealer signed it. The timestamp places a checkpoint in its key's validity
// (KeyRing), tells how fresh an organization's head is, and bounds which rows must be
// sealed by now. No extension lines: C2SP does not recommend them.
//
// Each organization has its own log and origin: <prefix>/org/<organization,
// path-escaped>, and <prefix>/unattributed for the events stored without one. The
// prefix names the deployment (serve's --audit-origin, "bandplane/<database>" by
// default), so a checkpoint or a retention cut of one deployment is refused by another.

// MaxPrefixBytes bounds an origin prefix.
const MaxPrefixBytes = 200

// CheckPrefix says what is wrong with an origin prefix, which is also the audit key's
// note key name: non-empty, at most MaxPrefixBytes, printable, no space and no '+'.
func CheckPrefix(prefix string) error {
	switch {
	case prefix == "":
		return errors.New("empty")
	case len(prefix) > MaxPrefixBytes:
		return fmt.Errorf("%d bytes, more than %d", len(prefix), MaxPrefixBytes)
	case strings.ContainsAny(prefix, "+"):
		return fmt.Errorf("%q holds a '+' (a note key name cannot)", prefix)
	}
	for i, r := range prefix {
		if unicode.IsSpace(r) || !unicode.IsPrint(r) {
			return fmt.Errorf("%q has a space or a control character at byte %d", prefix, i)
		}
	}
	return nil
}

// DefaultPrefix is the origin prefix of a deployment whose database is db.
func DefaultPrefix(db string) string { return "bandplane/" + db }

const (
	orgPath          = "/org/"
	unattributedPath = "/unattributed"
)

// Origin is the origin line of org's log.
func Origin(prefix, org string) string {
	if org == "" {
		return prefix + unattributedPath
	}
	return prefix + orgPath + url.PathEscape(org)
}

// OrgOf reads the organization back from an origin of the deployment with prefix.
func OrgOf(prefix, origin string) (string, bool) {
	if origin == prefix+unattributedPath {
		return "", true
	}
	rest, ok := strings.CutPrefix(origin, prefix+orgPath)
	if !ok || rest == "" {
		return "", false
	}
	org, err := url.PathUnescape(rest)
	if err != nil || url.PathEscape(org) != rest {
		return "", false
	}
	return org, true
}

// KeyID is how bandplane names an audit key: the first 16 bytes of the SHA-256 of the
// raw Ed25519 public key, in hex.
func KeyID(pub ed25519.PublicKey) string {
	h := sha256.Sum256(pub)
	return hex.EncodeToString(h[:16])
}

// VerifierKey is the note verifier key of an audit key under the prefix's key name
// (what witnesses and other tlog tools are configured with).
func VerifierKey(prefix string, pub ed25519.PublicKey) (string, error) {
	if err := CheckPrefix(prefix); err != nil {
		return "", fmt.Errorf("origin prefix: %w", err)
	}
	return note.NewEd25519VerifierKey(prefix, pub)
}

// signerKey encodes an Ed25519 private key as a note signer key under name.
func signerKey(name string, priv ed25519.PrivateKey) (string, error) {
	vkey, err := note.NewEd25519VerifierKey(name, priv.Public().(ed25519.PublicKey))
	if err != nil {
		return "", err
	}
	_, rest, _ := strings.Cut(vkey, "+")
	hash, _, _ := strings.Cut(rest, "+")
	return "PRIVATE+KEY+" + name + "+" + hash + "+" + base64.StdEncoding.EncodeToString(append([]byte{1}, priv.Seed()...)), nil
}

// Signer signs checkpoints and key rotations with the audit key.
type Signer struct {
	prefix string
	key    ed25519.PrivateKey
	id     string
	log    note.Signer // the log's signature
	ts     note.Signer // the timestamped cosignature
}

// NewSigner returns the signer of the deployment with prefix.
func NewSigner(prefix string, key ed25519.PrivateKey) (*Signer, error) {
	if err := CheckPrefix(prefix); err != nil {
		return nil, fmt.Errorf("origin prefix: %w", err)
	}
	if len(key) != ed25519.PrivateKeySize {
		return nil, errors.New("no Ed25519 private key")
	}
	skey, err := signerKey(prefix, key)
	if err != nil {
		return nil, err
	}
	ls, err := note.NewSigner(skey)
	if err != nil {
		return nil, fmt.Errorf("cannot make the log signer: %w", err)
	}
	ts, err := fnote.NewSignerForCosignatureV1(skey)
	if err != nil {
		return nil, fmt.Errorf("cannot make the timestamp signer: %w", err)
	}
	return &Signer{prefix: prefix, key: key, id: KeyID(key.Public().(ed25519.PublicKey)), log: ls, ts: ts}, nil
}

// Prefix is the deployment's origin prefix.
func (s *Signer) Prefix() string { return s.prefix }

// KeyID names the key.
func (s *Signer) KeyID() string { return s.id }

// Public is the key's public half.
func (s *Signer) Public() ed25519.PublicKey { return s.key.Public().(ed25519.PublicKey) }

// Sign makes the checkpoint of org's log at size with root, signed now.
func (s *Signer) Sign(org string, size uint64, root []byte) (Checkpoint, error) {
	origin := Origin(s.prefix, org)
	body := log.Checkpoint{Origin: origin, Size: size, Hash: root}.Marshal()
	msg, err := note.Sign(&note.Note{Text: string(body)}, s.log, s.ts)
	if err != nil {
		return Checkpoint{}, fmt.Errorf("cannot sign the checkpoint of org %q at size %d: %w", org, size, err)
	}
	ring := &KeyRing{prefix: s.prefix}
	ring.add(s.Public(), time.Time{}, time.Time{})
	c, err := ring.Open(msg)
	if err != nil { // the signer's own note: a bug, never the data
		return Checkpoint{}, fmt.Errorf("cannot read back the checkpoint just signed: %w", err)
	}
	return c, nil
}

// Checkpoint is a checkpoint whose signatures a KeyRing checked.
type Checkpoint struct {
	Origin   string
	Org      string
	Size     uint64
	Root     []byte
	SignedAt time.Time // the timestamp of the audit key's cosignature
	KeyID    string    // the ring key that signed it
	Note     []byte    // the signed note, as signed (witness cosignatures may follow)
}

// Same says whether two checkpoints state the same tree.
func (c *Checkpoint) Same(o *Checkpoint) bool {
	return c.Origin == o.Origin && c.Size == o.Size && bytes.Equal(c.Root, o.Root)
}

// MaxNoteBytes bounds a checkpoint or rotation note: a few lines and signatures.
const MaxNoteBytes = 16 << 10

// ringKey is an audit key the ring trusts for checkpoints signed in [from, until)
// (zero: unbounded).
type ringKey struct {
	pub         ed25519.PublicKey
	id          string
	from, until time.Time
	log, ts     note.Verifier
}

func (k *ringKey) valid(t time.Time) bool {
	return (k.from.IsZero() || !t.Before(k.from)) && (k.until.IsZero() || t.Before(k.until))
}

// KeyRing is the set of audit keys whose checkpoints a reader accepts: the keys it
// was given (anchors), and every key a rotation record links to one of those, each
// for its validity period (see Rotation).
type KeyRing struct {
	prefix   string
	keys     []*ringKey
	problems []string
}

// NewKeyRing trusts anchors for all time and follows the rotation notes (what
// Rotation makes) from them. A rotation that does not verify, or that rotates a key a
// second time, is refused and listed in Problems.
func NewKeyRing(prefix string, anchors []ed25519.PublicKey, rotations [][]byte) (*KeyRing, error) {
	if err := CheckPrefix(prefix); err != nil {
		return nil, fmt.Errorf("origin prefix: %w", err)
	}
	r := &KeyRing{prefix: prefix}
	for _, pub := range anchors {
		if len(pub) != ed25519.PublicKeySize {
			return nil, errors.New("an anchor is not an Ed25519 public key")
		}
		r.add(pub, time.Time{}, time.Time{})
	}
	r.follow(rotations)
	return r, nil
}

func (r *KeyRing) key(id string) *ringKey {
	for _, k := range r.keys {
		if k.id == id {
			return k
		}
	}
	return nil
}

func (r *KeyRing) add(pub ed25519.PublicKey, from, until time.Time) *ringKey {
	if k := r.key(KeyID(pub)); k != nil {
		return k
	}
	vkey, err := note.NewEd25519VerifierKey(r.prefix, pub)
	if err != nil {
		panic(fmt.Sprintf("tlog: verifier key of a checked prefix: %v", err))
	}
	lv, err := note.NewVerifier(vkey)
	if err != nil {
		panic(fmt.Sprintf("tlog: verifier of a key just encoded: %v", err))
	}
	tv, err := fnote.NewVerifierForCosignatureV1(vkey)
	if err != nil {
		panic(fmt.Sprintf("tlog: cosignature verifier of a key just encoded: %v", err))
	}
	k := &ringKey{pub: pub, id: KeyID(pub), from: from, until: until, log: lv, ts: tv}
	r.keys = append(r.keys, k)
	return k
}

// Problems lists the rotation records the ring refused, each naming why.
func (r *KeyRing) Problems() []string { return r.problems }

// KeyIDs lists the trusted keys with their validity.
func (r *KeyRing) KeyIDs() []string {
	out := make([]string, 0, len(r.keys))
	for _, k := range r.keys {
		s := k.id
		if !k.from.IsZero() {
			s += " from " + k.from.UTC().Format(time.RFC3339)
		}
		if !k.until.IsZero() {
			s += " until " + k.until.UTC().Format(time.RFC3339)
		}
		out = append(out, s)
	}
	return out
}

func (r *KeyRing) verifiers() note.Verifiers {
	var vs []note.Verifier
	for _, k := range r.keys {
		vs = append(vs, k.log, k.ts)
	}
	return note.VerifierList(vs...)
}

// Open checks a checkpoint note: it must be a well-formed C2SP checkpoint of this
// deployment, signed as the log and timestamped by one key of the ring, at a time
// within that key's validity. Other signatures (witnesses') are kept, unchecked.
func (r *KeyRing) Open(msg []byte) (Checkpoint, error) {
	if len(msg) > MaxNoteBytes {
		return Checkpoint{}, fmt.Errorf("the checkpoint is %d bytes, more than %d", len(msg), MaxNoteBytes)
	}
	n, err := note.Open(msg, r.verifiers())
	if err != nil {
		var unverified *note.UnverifiedNoteError
		if errors.As(err, &unverified) {
			return Checkpoint{}, fmt.Errorf("no key of the ring (%s) signed it", strings.Join(r.KeyIDs(), ", "))
		}
		return Checkpoint{}, fmt.Errorf("its signatures do not verify: %w", err)
	}
	var c log.Checkpoint
	rest, err := c.Unmarshal([]byte(n.Text))
	if err != nil {
		return Checkpoint{}, fmt.Errorf("not a checkpoint: %w", err)
	}
	if len(rest) > 0 {
		return Checkpoint{}, errors.New("not a bandplane checkpoint: it has extension lines")
	}
	if len(c.Hash) != sha256.Size {
		return Checkpoint{}, fmt.Errorf("its root hash is %d bytes, want %d", len(c.Hash), sha256.Size)
	}
	org, ok := OrgOf(r.prefix, c.Origin)
	if !ok {
		return Checkpoint{}, fmt.Errorf("origin %q is not a log of this deployment (%s)", clip(c.Origin), r.prefix)
	}
	var signer *ringKey
	var at time.Time
	for _, k := range r.keys {
		var logSig, tsSig *note.Signature
		for i := range n.Sigs {
			s := &n.Sigs[i]
			switch {
			case s.Name == k.log.Name() && s.Hash == k.log.KeyHash():
				logSig = s
			case s.Name == k.ts.Name() && s.Hash == k.ts.KeyHash():
				tsSig = s
			}
		}
		if logSig == nil {
			continue
		}
		if tsSig == nil {
			return Checkpoint{}, fmt.Errorf("key %s signed it without its timestamp cosignature", k.id)
		}
		t, err := fnote.CoSigV1Timestamp(*tsSig)
		if err != nil {
			return Checkpoint{}, fmt.Errorf("its timestamp cannot be read: %w", err)
		}
		if !k.valid(t) {
			return Checkpoint{}, fmt.Errorf("key %s signed it at %s, outside the key's validity (%s)", k.id, t.UTC().Format(time.RFC3339), r.validity(k))
		}
		signer, at = k, t.UTC()
		break
	}
	if signer == nil {
		return Checkpoint{}, errors.New("it carries only a timestamp, not the log's signature")
	}
	return Checkpoint{Origin: c.Origin, Org: org, Size: c.Size, Root: c.Hash, SignedAt: at, KeyID: signer.id, Note: msg}, nil
}

func (r *KeyRing) validity(k *ringKey) string {
	switch {
	case k.from.IsZero() && k.until.IsZero():
		return "always"
	case k.from.IsZero():
		return "until " + k.until.UTC().Format(time.RFC3339)
	case k.until.IsZero():
		return "from " + k.from.UTC().Format(time.RFC3339)
	}
	return k.from.UTC().Format(time.RFC3339) + " to " + k.until.UTC().Format(time.RFC3339)
}

func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}

// Trusted returns the ring's key with that KeyID if it was valid at t, or why not.
func (r *KeyRing) Trusted(id string, t time.Time) (ed25519.PublicKey, string) {
	k := r.key(id)
	if k == nil {
		return nil, fmt.Sprintf("key %s is not in the key ring (%s)", id, strings.Join(r.KeyIDs(), ", "))
	}
	if !k.valid(t) {
		return nil, fmt.Sprintf("key %s was not valid at %s (%s)", id, t.UTC().Format(time.RFC3339), r.validity(k))
	}
	return k.pub, ""
}

// Prefix is the origin prefix of the deployment the ring belongs to.
func (r *KeyRing) Prefix() string { return r.prefix }
