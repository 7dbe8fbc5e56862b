package seal

import (
	"context"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/bandplane/bandplane/ingest/store"
)

// The tables (schema/chdb/migrations): events (the trail), seals, seal_entries,
// retention_cuts. Every statement names its tables as db.table.

func serverNow(ctx context.Context, conn driver.Conn) (time.Time, error) {
	var now time.Time
	if err := conn.QueryRow(ctx, "SELECT now()").Scan(&now); err != nil {
		return time.Time{}, fmt.Errorf("cannot read the clickhouse clock: %w", err)
	}
	return now.UTC(), nil
}

const sealCols = "org_id, seq, sealed_at, through, events, first_time, last_time, root, prev, hash, key_id, signature"

func scanSeal(rows driver.Rows) (Seal, error) {
	var s Seal
	err := rows.Scan(&s.OrgID, &s.Seq, &s.SealedAt, &s.Through, &s.Events, &s.FirstTime, &s.LastTime,
		&s.Root, &s.Prev, &s.Hash, &s.KeyID, &s.Signature)
	s.SealedAt, s.Through, s.FirstTime, s.LastTime = s.SealedAt.UTC(), s.Through.UTC(), s.FirstTime.UTC(), s.LastTime.UTC()
	return s, err
}

// loadSeals reads every seal (of org, when one is given).
func loadSeals(ctx context.Context, conn driver.Conn, db string, orgs []string) ([]Seal, error) {
	q := "SELECT " + sealCols + " FROM " + db + ".seals FINAL"
	var args []any
	if orgs != nil {
		q += " WHERE has(?, org_id)" // a bound []string is an array literal, which IN refuses on 18.16
		args = append(args, orgs)
	}
	rows, err := conn.Query(ctx, q+" ORDER BY org_id, seq, hash", args...)
	if err != nil {
		return nil, fmt.Errorf("cannot read %s.seals: %w", db, err)
	}
	defer rows.Close()
	var out []Seal
	for rows.Next() {
		s, err := scanSeal(rows)
		if err != nil {
			return nil, fmt.Errorf("cannot read a row of %s.seals: %w", db, err)
		}
		out = append(out, s)
	}
	return out, rows.Err()
}

// head is the seal a new seal of an organization links to.
type head struct {
	seq  uint64
	hash string
}

// heads reads each organization's chain head: its highest seq and, when two seals were
// made at once with that seq, the smaller hash. Every sealer picks the same one, so
// concurrent sealers converge on one chain at their next seal. It also returns the
// watermark of the trail: the latest through of any seal.
func heads(ctx context.Context, conn driver.Conn, db string) (map[string]head, time.Time, error) {
	rows, err := conn.Query(ctx, `SELECT org_id, seq, min(hash) FROM `+db+`.seals
		WHERE (org_id, seq) IN (SELECT org_id, max(seq) FROM `+db+`.seals GROUP BY org_id)
		GROUP BY org_id, seq`)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("cannot read the chain heads of %s.seals: %w", db, err)
	}
	defer rows.Close()
	out := map[string]head{}
	for rows.Next() {
		var org string
		var h head
		if err := rows.Scan(&org, &h.seq, &h.hash); err != nil {
			return nil, time.Time{}, fmt.Errorf("cannot read a chain head of %s.seals: %w", db, err)
		}
		out[org] = h
	}
	if err := rows.Err(); err != nil {
		return nil, time.Time{}, err
	}
	var w time.Time
	if len(out) > 0 {
		if err := conn.QueryRow(ctx, "SELECT max(through) FROM "+db+".seals").Scan(&w); err != nil {
			return nil, time.Time{}, fmt.Errorf("cannot read the watermark of %s.seals: %w", db, err)
		}
	}
	return out, w.UTC(), nil
}

// orgHead re-reads one organization's head just before a seal is written.
func orgHead(ctx context.Context, conn driver.Conn, db, org string) (head, error) {
	rows, err := conn.Query(ctx, "SELECT seq, hash FROM "+db+".seals WHERE org_id = ? ORDER BY seq DESC, hash ASC LIMIT 1", org)
	if err != nil {
		return head{}, fmt.Errorf("cannot read the chain head of org %q in %s.seals: %w", org, db, err)
	}
	defer rows.Close()
	var h head
	if rows.Next() {
		if err := rows.Scan(&h.seq, &h.hash); err != nil {
			return head{}, err
		}
	}
	return h, rows.Err()
}

// writeSeal stores the entries, then the seal. In that order a crash in between leaves
// entries under a seal that does not exist, which nothing refers to: verify ignores
// them and the events are sealed again. The other order would leave a seal whose
// entries do not match its root, which is what tampering looks like.
func writeSeal(ctx context.Context, conn driver.Conn, db string, s *Seal, entries []Entry) error {
	if err := writeEntries(ctx, conn, db, s, entries); err != nil {
		return err
	}
	b, err := conn.PrepareBatch(ctx, "INSERT INTO "+db+".seals ("+sealCols+")")
	if err != nil {
		return fmt.Errorf("cannot prepare insert into %s.seals: %w", db, err)
	}
	defer b.Abort()
	if err := b.Append(s.OrgID, s.Seq, s.SealedAt, s.Through, s.Events, s.FirstTime, s.LastTime,
		s.Root, s.Prev, s.Hash, s.KeyID, s.Signature); err != nil {
		return fmt.Errorf("cannot append %s to %s.seals: %w", s.ID(), db, err)
	}
	if err := b.Send(); err != nil {
		return fmt.Errorf("cannot insert %s into %s.seals: %w", s.ID(), db, err)
	}
	return nil
}

// writeEntries stores a seal's entries in one insert (one block: all or nothing).
func writeEntries(ctx context.Context, conn driver.Conn, db string, s *Seal, entries []Entry) error {
	if len(entries) == 0 {
		return nil
	}
	b, err := conn.PrepareBatch(ctx, "INSERT INTO "+db+".seal_entries (org_id, seq, seal, time, time_ms, id, digest)")
	if err != nil {
		return fmt.Errorf("cannot prepare insert into %s.seal_entries: %w", db, err)
	}
	defer b.Abort()
	n := len(entries)
	org, seq, sl, ids, digests := make([]string, n), make([]uint64, n), make([]string, n), make([]string, n), make([]string, n)
	times, millis := make([]time.Time, n), make([]uint16, n)
	for i := range entries {
		e := &entries[i]
		org[i], seq[i], sl[i], ids[i], digests[i] = s.OrgID, s.Seq, s.Hash, e.ID, hex.EncodeToString(e.Digest[:])
		times[i], millis[i] = e.Time.Truncate(time.Second), uint16(e.Time.Nanosecond()/1e6)
	}
	for i, col := range []any{org, seq, sl, times, millis, ids, digests} {
		if err := b.Column(i).Append(col); err != nil {
			return fmt.Errorf("cannot append column %d of %s.seal_entries: %w", i, db, err)
		}
	}
	if err := b.Send(); err != nil {
		return fmt.Errorf("cannot insert %d entries of %s into %s.seal_entries: %w", n, s.ID(), db, err)
	}
	return nil
}

// rowKey is an events row's key in the table's ORDER BY: (org_id, time, id), time in
// seconds. Two rows with the same key are one row to FINAL.
type rowKey struct {
	org, id string
	sec     int64
}

// eventCols are the columns a row's SealDigest is computed from, and ingested_at.
const eventCols = "id, type, time, time_ms, org_id, room_id, actor_id, actor_type, actor_handle, owner_id, " +
	"subject_id, subject_type, subject_handle, execution_id, source, schema_version, data, ingested_at"

// scanEvent reads one events row into r (reused between rows: the digest is what is
// kept, not the row).
func scanEvent(rows driver.Rows, r *store.EventRow) error {
	var sec time.Time
	var millis uint16
	if err := rows.Scan(&r.ID, &r.Type, &sec, &millis, &r.OrgID, &r.RoomID, &r.ActorID, &r.ActorType, &r.ActorHandle,
		&r.OwnerID, &r.SubjectID, &r.SubjectType, &r.SubjectHandle, &r.ExecutionID, &r.Source, &r.SchemaVersion,
		&r.Data, &r.IngestedAt); err != nil {
		return err
	}
	r.Time = sec.UTC().Add(time.Duration(millis) * time.Millisecond)
	r.IngestedAt = r.IngestedAt.UTC()
	return nil
}

func keyOf(r *store.EventRow) rowKey { return rowKey{org: r.OrgID, id: r.ID, sec: r.Time.Unix()} }

func parseDigest(s string) (store.Digest, bool) {
	var d store.Digest
	if len(s) != 2*len(d) {
		return d, false
	}
	_, err := hex.Decode(d[:], []byte(s))
	return d, err == nil
}
