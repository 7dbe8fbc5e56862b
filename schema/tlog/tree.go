package tlog

import (
	"context"
	"fmt"

	"github.com/transparency-dev/merkle/compact"
	"github.com/transparency-dev/merkle/proof"
	"github.com/transparency-dev/merkle/rfc6962"
)

// NodeReader reads the stored nodes of an organization's tree: the perfect subtrees'
// hashes, level 0 being the leaves' hashes. ReadNodes returns the hashes of ids in
// their order; a node it does not hold is an error naming it. What it reads is
// untrusted: every proof built from it is checked against a signed root before anyone
// relies on it.
type NodeReader interface {
	ReadNodes(ctx context.Context, org string, ids []compact.NodeID) ([][]byte, error)
}

var rangeFactory = &compact.RangeFactory{Hash: HashChildren}

// NewRange is an empty compact range at 0: a log with no leaves yet.
func NewRange() *compact.Range { return rangeFactory.NewEmptyRange(0) }

// LoadRange builds the compact range [0, size) of org's tree from the nodes r holds:
// the right edge, at most one node per level.
func LoadRange(ctx context.Context, r NodeReader, org string, size uint64) (*compact.Range, error) {
	if size == 0 {
		return NewRange(), nil
	}
	ids := compact.RangeNodes(0, size, nil)
	hashes, err := r.ReadNodes(ctx, org, ids)
	if err != nil {
		return nil, err
	}
	rng, err := rangeFactory.NewRange(0, size, hashes)
	if err != nil {
		return nil, fmt.Errorf("cannot build the compact range of org %q at size %d: %w", org, size, err)
	}
	return rng, nil
}

// CloneRange copies a compact range, so that appending to the copy leaves r as it is.
func CloneRange(r *compact.Range) *compact.Range {
	hs := r.Hashes()
	cp := make([][]byte, len(hs))
	for i, h := range hs {
		cp[i] = append([]byte(nil), h...)
	}
	out, err := rangeFactory.NewRange(r.Begin(), r.End(), cp)
	if err != nil { // the hashes of a valid range
		panic(fmt.Sprintf("tlog: clone of the range [%d, %d): %v", r.Begin(), r.End(), err))
	}
	return out
}

// Root is the root hash of the tree a compact range [0, n) describes (the RFC 6962
// empty root for n = 0).
func Root(rng *compact.Range) []byte {
	if rng.End() == 0 {
		return rfc6962.DefaultHasher.EmptyRoot()
	}
	h, err := rng.GetRootHash(nil)
	if err != nil { // only for a range that does not start at 0, which no caller makes
		panic(fmt.Sprintf("tlog: root of a range [%d, %d): %v", rng.Begin(), rng.End(), err))
	}
	return h
}

// InclusionProofs builds the inclusion proof of each leaf at indexes in the tree of
// org at size, reading every node the proofs need in one ReadNodes call.
func InclusionProofs(ctx context.Context, r NodeReader, org string, indexes []uint64, size uint64) ([][][]byte, error) {
	plans := make([]proof.Nodes, len(indexes))
	var ids []compact.NodeID
	for i, idx := range indexes {
		p, err := proof.Inclusion(idx, size)
		if err != nil {
			return nil, fmt.Errorf("cannot plan the inclusion proof of leaf %d in org %q's tree of size %d: %w", idx, org, size, err)
		}
		plans[i] = p
		ids = append(ids, p.IDs...)
	}
	return rehash(ctx, r, org, plans, ids)
}

// ConsistencyProof builds the proof that org's tree at size2 extends its tree at size1.
func ConsistencyProof(ctx context.Context, r NodeReader, org string, size1, size2 uint64) ([][]byte, error) {
	p, err := proof.Consistency(size1, size2)
	if err != nil {
		return nil, fmt.Errorf("cannot plan the consistency proof of org %q from size %d to %d: %w", org, size1, size2, err)
	}
	out, err := rehash(ctx, r, org, []proof.Nodes{p}, p.IDs)
	if err != nil {
		return nil, err
	}
	return out[0], nil
}

// rehash reads the nodes of several proofs at once (ids: their IDs one after the
// other, duplicates read once) and assembles each proof.
func rehash(ctx context.Context, r NodeReader, org string, plans []proof.Nodes, ids []compact.NodeID) ([][][]byte, error) {
	uniq := make([]compact.NodeID, 0, len(ids))
	at := make(map[compact.NodeID]int, len(ids))
	for _, id := range ids {
		if _, ok := at[id]; !ok {
			at[id] = len(uniq)
			uniq = append(uniq, id)
		}
	}
	var hashes [][]byte
	if len(uniq) > 0 {
		var err error
		if hashes, err = r.ReadNodes(ctx, org, uniq); err != nil {
			return nil, err
		}
		if len(hashes) != len(uniq) {
			return nil, fmt.Errorf("read %d nodes of org %q's tree, asked for %d", len(hashes), org, len(uniq))
		}
	}
	out := make([][][]byte, len(plans))
	for i, p := range plans {
		hs := make([][]byte, len(p.IDs))
		for j, id := range p.IDs {
			hs[j] = hashes[at[id]]
		}
		pr, err := p.Rehash(hs, HashChildren)
		if err != nil {
			return nil, fmt.Errorf("cannot assemble a proof of org %q's tree: %w", org, err)
		}
		out[i] = pr
	}
	return out, nil
}

// VerifyInclusion checks that leafHash is the leaf at index of the tree of size whose
// root is root.
func VerifyInclusion(index, size uint64, leafHash []byte, pr [][]byte, root []byte) error {
	return proof.VerifyInclusion(rfc6962.DefaultHasher, index, size, leafHash, pr, root)
}

// VerifyConsistency checks that the tree of size2 with root2 extends the tree of size1
// with root1.
func VerifyConsistency(size1, size2 uint64, pr [][]byte, root1, root2 []byte) error {
	return proof.VerifyConsistency(rfc6962.DefaultHasher, size1, size2, pr, root1, root2)
}
