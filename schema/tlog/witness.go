package tlog

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"

	fnote "github.com/transparency-dev/formats/note"
	"golang.org/x/mod/sumdb/note"
)

// Errors of Extends: what a witness or an auditor holding an older checkpoint refuses.
var (
	ErrRollback = errors.New("rolled back")
	ErrFork     = errors.New("forked")
)

// Extends checks that next is the same log as prev, at least as large, and consistent
// with it: pr is the consistency proof from prev.Size to next.Size. A smaller log is
// ErrRollback (truncated, or an older copy of the database); another root at the same
// size, or a proof that fails, is ErrFork.
func Extends(prev, next *Checkpoint, pr [][]byte) error {
	switch {
	case prev.Origin != next.Origin:
		return fmt.Errorf("checkpoint of %s, not of %s", clip(next.Origin), clip(prev.Origin))
	case next.Size < prev.Size:
		return fmt.Errorf("%w: the log of %s has %d leaves, a checkpoint of %d leaves was seen before", ErrRollback, clip(prev.Origin), next.Size, prev.Size)
	case next.Size == prev.Size:
		if !bytes.Equal(next.Root, prev.Root) {
			return fmt.Errorf("%w: the log of %s has two roots at size %d", ErrFork, clip(prev.Origin), next.Size)
		}
		return nil
	}
	if err := VerifyConsistency(prev.Size, next.Size, pr, prev.Root, next.Root); err != nil {
		return fmt.Errorf("%w: the log of %s at size %d does not extend its checkpoint of size %d: %v", ErrFork, clip(prev.Origin), next.Size, prev.Size, err) //nolint:errorlint // the cause is text: ErrFork is the one kind callers see
	}
	return nil
}

// NewWitnessKey makes a witness key named name: the note signer key (secret) and its
// verifier key.
func NewWitnessKey(name string) (skey, vkey string, err error) {
	return note.GenerateKey(rand.Reader, name)
}

// WitnessSigner is a witness's C2SP tlog-cosignature/v1 signer from its signer key.
func WitnessSigner(skey string) (note.Signer, error) {
	s, err := fnote.NewSignerForCosignatureV1(skey)
	if err != nil {
		return nil, fmt.Errorf("not a witness signer key: %w", err)
	}
	return s, nil
}

// WitnessVerifier checks a witness's cosignatures, from its verifier key.
func WitnessVerifier(vkey string) (note.Verifier, error) {
	v, err := fnote.NewVerifierForCosignatureV1(vkey)
	if err != nil {
		return nil, fmt.Errorf("not a witness verifier key: %w", err)
	}
	return v, nil
}

// Cosign adds signer's cosignature to a checkpoint (replacing an earlier one of the
// same signer); the other signatures stay as they are.
func Cosign(msg []byte, signer note.Signer) ([]byte, error) {
	_, err := note.Open(msg, note.VerifierList())
	var unverified *note.UnverifiedNoteError
	if !errors.As(err, &unverified) {
		return nil, fmt.Errorf("cannot read the checkpoint to cosign: %w", err)
	}
	return note.Sign(unverified.Note, signer)
}

// Cosigned says whether the checkpoint carries a valid cosignature of v.
func Cosigned(msg []byte, v note.Verifier) bool {
	n, err := note.Open(msg, note.VerifierList(v))
	return err == nil && len(n.Sigs) == 1
}
