package tlog

import (
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/mod/sumdb/note"
)

// # Key rotation
//
// A rotation record is a signed note whose text is
//
//	<prefix> key rotation
//	old <verifier key of the old key>
//	new <verifier key of the new key>
//	from <Unix seconds>
//
// signed by both keys (the old one vouches for the new one; the new one's signature
// shows that whoever made the record holds it). From `from` on, checkpoints are signed
// by the new key; the old key is valid only for checkpoints signed before `from`, so
// whoever obtains a retired key cannot sign new history with it. A key is rotated at
// most once: two records rotating the same key are a conflict, and the ring trusts
// neither. A reader anchored at any key of the chain (the first or the current one)
// reaches the others.

// Rotation makes the record that hands the deployment's log over from old to next at
// from.
func Rotation(prefix string, old, next ed25519.PrivateKey, from time.Time) ([]byte, error) {
	if err := CheckPrefix(prefix); err != nil {
		return nil, fmt.Errorf("origin prefix: %w", err)
	}
	if old.Public().(ed25519.PublicKey).Equal(next.Public()) {
		return nil, errors.New("the new key is the old key")
	}
	oldV, err := note.NewEd25519VerifierKey(prefix, old.Public().(ed25519.PublicKey))
	if err != nil {
		return nil, err
	}
	newV, err := note.NewEd25519VerifierKey(prefix, next.Public().(ed25519.PublicKey))
	if err != nil {
		return nil, err
	}
	text := prefix + " key rotation\nold " + oldV + "\nnew " + newV + "\nfrom " + strconv.FormatInt(from.Unix(), 10) + "\n"
	var signers []note.Signer
	for _, k := range []ed25519.PrivateKey{old, next} {
		skey, err := signerKey(prefix, k)
		if err != nil {
			return nil, err
		}
		s, err := note.NewSigner(skey)
		if err != nil {
			return nil, err
		}
		signers = append(signers, s)
	}
	return note.Sign(&note.Note{Text: text}, signers...)
}

// RotationRecord is a rotation record whose two signatures verified.
type RotationRecord struct {
	Old, New ed25519.PublicKey
	From     time.Time
}

// OpenRotation checks a rotation record of the deployment with prefix.
func OpenRotation(prefix string, msg []byte) (RotationRecord, error) {
	if len(msg) > MaxNoteBytes {
		return RotationRecord{}, fmt.Errorf("the rotation record is %d bytes, more than %d", len(msg), MaxNoteBytes)
	}
	text, _, ok := strings.Cut(string(msg), "\n\n")
	if !ok {
		return RotationRecord{}, errors.New("not a signed note")
	}
	lines := strings.Split(text, "\n")
	if len(lines) != 4 || lines[0] != prefix+" key rotation" {
		return RotationRecord{}, fmt.Errorf("not a key rotation of %s", prefix)
	}
	var rec RotationRecord
	var vs []note.Verifier
	for i, want := range []string{"old ", "new "} {
		vkey, ok := strings.CutPrefix(lines[1+i], want)
		if !ok {
			return RotationRecord{}, fmt.Errorf("line %d does not start with %q", 2+i, want)
		}
		v, err := note.NewVerifier(vkey)
		if err != nil || v.Name() != prefix {
			return RotationRecord{}, fmt.Errorf("line %d is not a verifier key of %s", 2+i, prefix)
		}
		pub, err := vkeyPublic(vkey)
		if err != nil {
			return RotationRecord{}, fmt.Errorf("line %d: %w", 2+i, err)
		}
		if i == 0 {
			rec.Old = pub
		} else {
			rec.New = pub
		}
		vs = append(vs, v)
	}
	secs, ok := strings.CutPrefix(lines[3], "from ")
	sec, err := strconv.ParseInt(secs, 10, 64)
	if !ok || err != nil || strconv.FormatInt(sec, 10) != secs || sec < 0 {
		return RotationRecord{}, errors.New("line 4 is not \"from <Unix seconds>\"")
	}
	rec.From = time.Unix(sec, 0).UTC()
	n, err := note.Open(msg, note.VerifierList(vs...))
	if err != nil {
		return RotationRecord{}, fmt.Errorf("its signatures do not verify: %w", err)
	}
	if len(n.Sigs) != 2 {
		return RotationRecord{}, fmt.Errorf("signed by %d of its two keys; both must sign", len(n.Sigs))
	}
	if rec.Old.Equal(rec.New) {
		return RotationRecord{}, errors.New("it rotates a key to itself")
	}
	return rec, nil
}

// vkeyPublic is the Ed25519 public key of a verifier key "name+hash+base64(0x01||key)".
func vkeyPublic(vkey string) (ed25519.PublicKey, error) {
	_, rest, _ := strings.Cut(vkey, "+") // a name holds no '+'; base64 may
	_, key64, _ := strings.Cut(rest, "+")
	raw, err := base64.StdEncoding.DecodeString(key64)
	if err != nil || len(raw) != 1+ed25519.PublicKeySize || raw[0] != 1 {
		return nil, errors.New("not an Ed25519 verifier key")
	}
	return ed25519.PublicKey(raw[1:]), nil
}

// follow extends the ring along the rotation records until nothing changes.
func (r *KeyRing) follow(msgs [][]byte) {
	var recs []RotationRecord
	for i, m := range msgs {
		rec, err := OpenRotation(r.prefix, m)
		if err != nil {
			r.problems = append(r.problems, fmt.Sprintf("rotation record %d refused: %v", i+1, err))
			continue
		}
		recs = append(recs, rec)
	}
	// A key rotated twice: a conflict; neither record is followed.
	byOld := map[string][]RotationRecord{}
	for _, rec := range recs {
		id := KeyID(rec.Old)
		if !slices.ContainsFunc(byOld[id], func(o RotationRecord) bool { return o.New.Equal(rec.New) && o.From.Equal(rec.From) }) {
			byOld[id] = append(byOld[id], rec)
		}
	}
	var usable []RotationRecord
	for id, list := range byOld {
		if len(list) > 1 {
			var to []string
			for _, rec := range list {
				to = append(to, fmt.Sprintf("%s at %s", KeyID(rec.New), rec.From.Format(time.RFC3339)))
			}
			slices.Sort(to)
			r.problems = append(r.problems, fmt.Sprintf("key %s is rotated twice (to %s): neither rotation is trusted", id, strings.Join(to, " and ")))
			continue
		}
		usable = append(usable, list[0])
	}
	slices.SortFunc(usable, func(a, b RotationRecord) int { return a.From.Compare(b.From) })
	for changed := true; changed; {
		changed = false
		for i := 0; i < len(usable); i++ {
			rec := usable[i]
			oldK, newK := r.key(KeyID(rec.Old)), r.key(KeyID(rec.New))
			switch {
			case oldK == nil && newK == nil:
				continue
			case oldK != nil && newK == nil:
				if !oldK.valid(rec.From) {
					r.problems = append(r.problems, fmt.Sprintf("key %s hands over to %s at %s, outside its own validity", oldK.id, KeyID(rec.New), rec.From.Format(time.RFC3339)))
				} else {
					r.add(rec.New, rec.From, time.Time{})
					oldK.until = rec.From
				}
			case oldK == nil && newK != nil:
				r.add(rec.Old, time.Time{}, rec.From)
				if newK.from.IsZero() || rec.From.After(newK.from) {
					newK.from = rec.From
				}
			default:
				if oldK.until.IsZero() || rec.From.Before(oldK.until) {
					oldK.until = rec.From
				}
				if newK.from.IsZero() || rec.From.After(newK.from) {
					newK.from = rec.From
				}
			}
			usable = slices.Delete(usable, i, i+1)
			i--
			changed = true
		}
	}
}
