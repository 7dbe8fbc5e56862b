package trail

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/ext"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/transparency-dev/merkle/compact"

	"github.com/bandplane/bandplane/schema/chdb"
	"github.com/bandplane/bandplane/schema/store"
	"github.com/bandplane/bandplane/schema/tlog"
)

// logDB reads and writes the log's tables in one database (schema/chdb/migrations,
// 007_log.sql): log_leaves (the leaves by event key), log_index (by index: time and
// inner digest), log_tree (interior nodes), checkpoints and key_rotations. Nothing it
// reads is trusted: callers check it against signed checkpoints.
type logDB struct {
	conn driver.Conn
	db   string
}

// IndexedLeaf is a leaf with its index in its organization's log.
type IndexedLeaf struct {
	tlog.Leaf
	Index uint64
}

func hexOf(b []byte) string { return hex.EncodeToString(b) }

func parseHash(s string) ([sha256.Size]byte, bool) {
	var h [sha256.Size]byte
	if len(s) != 2*sha256.Size {
		return h, false
	}
	_, err := hex.Decode(h[:], []byte(s))
	return h, err == nil
}

// idTable is an external table of node coordinates for an IN lookup whose query text
// does not grow with the number of nodes.
func idTable(levels []uint8, idx []uint64) (*ext.Table, error) {
	tbl, err := ext.NewTable("_bandplane_nodes", ext.Column("level", "UInt8"), ext.Column("idx", "UInt64"))
	if err != nil {
		return nil, err
	}
	for i, col := range []any{levels, idx} {
		if _, err := tbl.Block().Columns[i].Append(col); err != nil {
			return nil, err
		}
	}
	return tbl, nil
}

// ReadNodes reads nodes of org's tree (tlog.NodeReader): level 0 from log_index (the
// leaf hash follows from the time and inner digest), the others from log_tree. Two
// different rows for one node (an edit, or two sealers at once), a node it lacks and a
// hash that is not one are errors naming it, wrapping ErrLogDamaged; others are the
// database's.
func (l logDB) ReadNodes(ctx context.Context, org string, ids []compact.NodeID) ([][]byte, error) {
	var leafIdx, nodeIdx []uint64
	var nodeLevels []uint8
	for _, id := range ids {
		if id.Level == 0 {
			leafIdx = append(leafIdx, id.Index)
		} else {
			nodeLevels, nodeIdx = append(nodeLevels, uint8(id.Level)), append(nodeIdx, id.Index)
		}
	}
	got := make(map[compact.NodeID][]byte, len(ids))
	put := func(id compact.NodeID, h []byte) error {
		if prev, ok := got[id]; ok && string(prev) != string(h) {
			return fmt.Errorf("%w: org %q's log holds two different rows for node %d/%d in %s", ErrLogDamaged, org, id.Level, id.Index, l.db)
		}
		got[id] = h
		return nil
	}
	if len(leafIdx) > 0 {
		levels := make([]uint8, len(leafIdx))
		tbl, err := idTable(levels, leafIdx)
		if err != nil {
			return nil, err
		}
		rows, err := l.conn.Query(chdb.WithExternalTable(ctx, tbl), "SELECT idx, time_ms, inner FROM "+l.db+
			".log_index WHERE org_id = ? AND idx IN (SELECT idx FROM _bandplane_nodes)", org)
		if err != nil {
			return nil, fmt.Errorf("cannot read %d leaves of org %q from %s.log_index: %w", len(leafIdx), org, l.db, err)
		}
		for rows.Next() {
			row, err := scanIndexRow(rows, l.db)
			if err != nil {
				rows.Close()
				return nil, err
			}
			idx, ms, in, ok := row.idx, row.ms, row.inner, row.ok
			if !ok {
				rows.Close()
				return nil, fmt.Errorf("%w: org %q's leaf %d in %s.log_index holds no valid digest", ErrLogDamaged, org, idx, l.db)
			}
			if err := put(compact.NewNodeID(0, idx), tlog.LeafHash(ms, in)); err != nil {
				rows.Close()
				return nil, err
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("cannot read %s.log_index: %w", l.db, err)
		}
	}
	if len(nodeIdx) > 0 {
		tbl, err := idTable(nodeLevels, nodeIdx)
		if err != nil {
			return nil, err
		}
		rows, err := l.conn.Query(chdb.WithExternalTable(ctx, tbl), "SELECT level, idx, hash FROM "+l.db+
			".log_tree WHERE org_id = ? AND (level, idx) IN (SELECT level, idx FROM _bandplane_nodes)", org)
		if err != nil {
			return nil, fmt.Errorf("cannot read %d nodes of org %q from %s.log_tree: %w", len(nodeIdx), org, l.db, err)
		}
		for rows.Next() {
			var level uint8
			var idx uint64
			var hash string
			if err := rows.Scan(&level, &idx, &hash); err != nil {
				rows.Close()
				return nil, fmt.Errorf("cannot read a row of %s.log_tree: %w", l.db, err)
			}
			h, ok := parseHash(hash)
			if !ok {
				rows.Close()
				return nil, fmt.Errorf("%w: org %q's node %d/%d in %s.log_tree holds no valid hash", ErrLogDamaged, org, level, idx, l.db)
			}
			if err := put(compact.NewNodeID(uint(level), idx), h[:]); err != nil {
				rows.Close()
				return nil, err
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("cannot read %s.log_tree: %w", l.db, err)
		}
	}
	out := make([][]byte, len(ids))
	for i, id := range ids {
		h, ok := got[id]
		if !ok {
			return nil, fmt.Errorf("%w: org %q's log in %s has no node %d/%d", ErrLogDamaged, org, l.db, id.Level, id.Index)
		}
		out[i] = h
	}
	return out, nil
}

// node is an interior node an append made.
type node struct {
	id   compact.NodeID
	hash []byte
}

// appendLeaves stores leaves (with their inner digests) at start, start+1, … of org's
// log and the interior nodes the appends completed: log_leaves, log_index and log_tree,
// one insert each, at once. A crash part-way leaves rows past the last checkpoint,
// which nothing trusts; the sealer writes the same rows again from the same notes
// (they are uncommitted).
func (l logDB) appendLeaves(ctx context.Context, org string, start uint64, leaves []tlog.Leaf, inner [][32]byte, nodes []node) error {
	n := len(leaves)
	if n == 0 {
		return nil
	}
	orgs, times, millis, ids, idx := make([]string, n), make([]time.Time, n), make([]uint16, n), make([]string, n), make([]uint64, n)
	digests, ingested, parts, offsets := make([]string, n), make([]time.Time, n), make([]int32, n), make([]int64, n)
	ms, inners := make([]int64, n), make([]string, n)
	for i := range leaves {
		lf := &leaves[i]
		orgs[i], times[i], millis[i], ids[i], idx[i] = org, lf.Time.Truncate(time.Second), uint16(lf.Time.Nanosecond()/1e6), lf.ID, start+uint64(i)
		digests[i], ingested[i], parts[i], offsets[i] = hexOf(lf.Digest[:]), lf.IngestedAt, lf.Partition, lf.Offset
		ms[i], inners[i] = lf.Time.UnixMilli(), hexOf(inner[i][:])
	}
	k := len(nodes)
	norgs, levels, nidx, hashes := make([]string, k), make([]uint8, k), make([]uint64, k), make([]string, k)
	for i, nd := range nodes {
		norgs[i], levels[i], nidx[i], hashes[i] = org, uint8(nd.id.Level), nd.id.Index, hexOf(nd.hash)
	}
	inserts := []func() error{
		func() error {
			return l.insert(ctx, "log_leaves", "org_id, time, time_ms, id, idx, digest, ingested_at, kafka_partition, kafka_offset",
				orgs, times, millis, ids, idx, digests, ingested, parts, offsets)
		},
		func() error { return l.insert(ctx, "log_index", "org_id, idx, time_ms, inner", orgs, idx, ms, inners) },
	}
	if k > 0 {
		inserts = append(inserts, func() error {
			return l.insert(ctx, "log_tree", "org_id, level, idx, hash", norgs, levels, nidx, hashes)
		})
	}
	errs := make([]error, len(inserts))
	var wg sync.WaitGroup
	for i, f := range inserts {
		wg.Go(func() { errs[i] = f() })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// insert writes columns (one slice each, in cols' order) in one block.
func (l logDB) insert(ctx context.Context, table, cols string, columns ...any) error {
	b, err := l.conn.PrepareBatch(ctx, "INSERT INTO "+l.db+"."+table+" ("+cols+")")
	if err != nil {
		return fmt.Errorf("cannot prepare insert into %s.%s: %w", l.db, table, err)
	}
	defer b.Abort()
	for i, col := range columns {
		if err := b.Column(i).Append(col); err != nil {
			return fmt.Errorf("cannot append column %d of %s.%s: %w", i, l.db, table, err)
		}
	}
	if err := b.Send(); err != nil {
		return fmt.Errorf("cannot insert into %s.%s: %w", l.db, table, err)
	}
	return nil
}

// writeCheckpoint stores a checkpoint of a size the log just reached.
func (l logDB) writeCheckpoint(ctx context.Context, c *tlog.Checkpoint) error {
	return l.insert(ctx, "checkpoints", "org_id, size, root, signed_at, key_id, note",
		[]string{c.Org}, []uint64{c.Size}, []string{hexOf(c.Root)}, []time.Time{c.SignedAt}, []string{c.KeyID}, []string{string(c.Note)})
}

// storedCheckpoint is a row of checkpoints, unchecked.
type storedCheckpoint struct {
	Org  string
	Size uint64
	Note []byte
}

// checkpointRows reads every row of checkpoints (of orgs, when given), by organization
// and size.
func (l logDB) checkpointRows(ctx context.Context, orgs []string) ([]storedCheckpoint, error) {
	q := "SELECT org_id, size, note FROM " + l.db + ".checkpoints"
	var args []any
	if orgs != nil {
		q += " WHERE has(?, org_id)" // a bound []string is an array literal, which IN refuses on 18.16
		args = append(args, orgs)
	}
	rows, err := l.conn.Query(ctx, q+" ORDER BY org_id, size", args...)
	if err != nil {
		return nil, fmt.Errorf("cannot read %s.checkpoints: %w", l.db, err)
	}
	defer rows.Close()
	var out []storedCheckpoint
	for rows.Next() {
		var c storedCheckpoint
		var note string
		if err := rows.Scan(&c.Org, &c.Size, &note); err != nil {
			return nil, fmt.Errorf("cannot read a row of %s.checkpoints: %w", l.db, err)
		}
		c.Note = []byte(note)
		out = append(out, c)
	}
	return out, rows.Err()
}

// maxRotations bounds the rotation records a key ring is built from: a deployment
// rotates its key a few times.
const maxRotations = 1000

// errTooManyRotations says key_rotations holds more records than a key ring is built
// from (maxRotations).
var errTooManyRotations = errors.New("too many rotation records")

// rotations reads the distinct key rotation records no larger than a note can be, at
// most maxRotations; more is an error (rows planted by hand: audit verify names them),
// as a ring built from a part of them could leave a genuine record out.
func (l logDB) rotations(ctx context.Context) ([][]byte, error) {
	rows, err := l.conn.Query(ctx, fmt.Sprintf("SELECT DISTINCT note FROM %s.key_rotations WHERE length(note) <= %d ORDER BY note LIMIT %d",
		l.db, tlog.MaxNoteBytes, maxRotations+1))
	if err != nil {
		return nil, fmt.Errorf("cannot read %s.key_rotations: %w", l.db, err)
	}
	defer rows.Close()
	var out [][]byte
	for rows.Next() {
		var note string
		if err := rows.Scan(&note); err != nil {
			return nil, fmt.Errorf("cannot read a row of %s.key_rotations: %w", l.db, err)
		}
		out = append(out, []byte(note))
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("cannot read %s.key_rotations: %w", l.db, err)
	}
	if len(out) > maxRotations {
		return nil, fmt.Errorf("%w: %s.key_rotations holds more than %d distinct records (a deployment rotates its key a few times)", errTooManyRotations, l.db, maxRotations)
	}
	return out, nil
}

func (l logDB) writeRotation(ctx context.Context, at time.Time, note []byte) error {
	return l.insert(ctx, "key_rotations", "recorded_at, note", []time.Time{at.UTC()}, []string{string(note)})
}

const leafCols = "org_id, time, time_ms, id, idx, digest, ingested_at, kafka_partition, kafka_offset"

// readLeaves reads every row of a query of leafCols from log_leaves, and closes it.
func readLeaves(rows driver.Rows, db string) ([]IndexedLeaf, error) {
	defer rows.Close()
	var out []IndexedLeaf
	for rows.Next() {
		var lf IndexedLeaf
		if err := scanLeaf(rows, &lf); err != nil {
			return nil, fmt.Errorf("cannot read a row of %s.log_leaves: %w", db, err)
		}
		out = append(out, lf)
	}
	return out, rows.Err()
}

func scanLeaf(rows driver.Rows, lf *IndexedLeaf) error {
	var sec time.Time
	var ms uint16
	var digest string
	if err := rows.Scan(&lf.Org, &sec, &ms, &lf.ID, &lf.Index, &digest, &lf.IngestedAt, &lf.Partition, &lf.Offset); err != nil {
		return err
	}
	lf.Time = sec.UTC().Add(time.Duration(ms) * time.Millisecond)
	lf.IngestedAt = lf.IngestedAt.UTC()
	d, ok := parseHash(digest)
	if !ok {
		return fmt.Errorf("leaf %d of org %q holds no valid digest", lf.Index, lf.Org)
	}
	lf.Digest = store.Digest(d)
	return nil
}

// leavesOf reads org's leaves whose key is one of keys, with an index below size, at
// most maxHeldRows rows of each key: beyond a few (a leaf, a copy of its row before a
// merge, a second note of the row) they are planted, and every caller proves what it
// relies on against a checkpoint, so a genuine row they crowd out is only not found.
func (l logDB) leavesOf(ctx context.Context, org string, keys []store.EventKey, size uint64) ([]IndexedLeaf, error) {
	if len(keys) == 0 || size == 0 {
		return nil, nil
	}
	tbl, err := ext.NewTable("_bandplane_keys", ext.Column("time", "UInt32"), ext.Column("id", "String"))
	if err != nil {
		return nil, err
	}
	times, ids := make([]uint32, len(keys)), make([]string, len(keys))
	for i, k := range keys {
		times[i], ids[i] = uint32(k.Time), k.ID
	}
	for i, col := range []any{times, ids} {
		if _, err := tbl.Block().Columns[i].Append(col); err != nil {
			return nil, err
		}
	}
	rows, err := l.conn.Query(chdb.WithExternalTable(ctx, tbl), "SELECT "+leafCols+" FROM "+l.db+
		".log_leaves PREWHERE id IN (SELECT id FROM _bandplane_keys) WHERE org_id = ? AND idx < ? AND (time, id) IN (SELECT toDateTime(time), id FROM _bandplane_keys) LIMIT ? BY time, id",
		org, size, uint64(maxHeldRows))
	if err != nil {
		return nil, fmt.Errorf("cannot look up %d leaves of org %q in %s.log_leaves: %w", len(keys), org, l.db, err)
	}
	return readLeaves(rows, l.db)
}

// checkpointOrgs lists the organizations that have a checkpoint row.
func (l logDB) checkpointOrgs(ctx context.Context) ([]string, error) {
	rows, err := l.conn.Query(ctx, "SELECT DISTINCT org_id FROM "+l.db+".checkpoints ORDER BY org_id")
	if err != nil {
		return nil, fmt.Errorf("cannot list the organizations of %s.checkpoints: %w", l.db, err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var org string
		if err := rows.Scan(&org); err != nil {
			return nil, fmt.Errorf("cannot read a row of %s.checkpoints: %w", l.db, err)
		}
		out = append(out, org)
	}
	return out, rows.Err()
}

// topCheckpoints reads org's checkpoint rows of the largest sizes, at most n, largest
// first (a forged row among them is skipped by the caller).
func (l logDB) topCheckpoints(ctx context.Context, org string, n int) ([]storedCheckpoint, error) {
	rows, err := l.conn.Query(ctx, "SELECT org_id, size, note FROM "+l.db+".checkpoints WHERE org_id = ? ORDER BY size DESC, note LIMIT ?", org, uint64(n))
	if err != nil {
		return nil, fmt.Errorf("cannot read the checkpoints of org %q from %s.checkpoints: %w", org, l.db, err)
	}
	return scanCheckpoints(rows, l.db)
}

// newestCheckpointRows reads every organization's checkpoint rows of its n largest
// sizes, at most n rows an organization, by organization and largest size first. The
// inner query reads only the key columns, so the table's notes are read for those rows
// alone; a row that does not verify takes one of the n places, and the caller says so
// when all n are taken that way.
func (l logDB) newestCheckpointRows(ctx context.Context, n int) ([]storedCheckpoint, error) {
	q := fmt.Sprintf("SELECT org_id, size, note FROM %[1]s.checkpoints WHERE (org_id, size) IN "+
		"(SELECT org_id, size FROM %[1]s.checkpoints GROUP BY org_id, size ORDER BY org_id, size DESC LIMIT %[2]d BY org_id) "+
		"ORDER BY org_id, size DESC, note LIMIT %[2]d BY org_id", l.db, n)
	rows, err := l.conn.Query(ctx, q)
	if err != nil {
		return nil, fmt.Errorf("cannot read the newest checkpoints of every organization from %s.checkpoints: %w", l.db, err)
	}
	return scanCheckpoints(rows, l.db)
}
