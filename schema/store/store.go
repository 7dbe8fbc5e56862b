// Package store writes ingest's batches into ClickHouse: the audit trail, usage facts,
// dead letters and the directory snapshot, and keeps the hourly cost rollup rebuilt
// from usage facts. Every write is idempotent, so a batch retried after a partial
// failure or a replay never adds twice to what queries read (they read FINAL).
//
// It may import the standard library, third-party modules and the other schema/
// packages only: schema/ is the basement every other folder builds on (deploy/layers).
package store

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/shopspring/decimal"
	"golang.org/x/sync/errgroup"
)

// EventRow is one audit-trail row.
type EventRow struct {
	ID, Type                                 string
	Time                                     time.Time
	OrgID, RoomID                            string
	ActorID, ActorType, ActorHandle, OwnerID string
	SubjectID, SubjectType, SubjectHandle    string
	ExecutionID, Source                      string
	SchemaVersion                            uint16
	Data                                     string
	IngestedAt                               time.Time
	Partition                                int32
	Offset                                   int64
}

// UsageRow is one usage fact; CostMicros is the cost in millionths of Currency.
type UsageRow struct {
	EventID                                      string
	Time                                         time.Time
	OrgID, OwnerID, AgentID, RoomID, ExecutionID string
	Model                                        string
	InputTokens, OutputTokens                    uint64
	CacheReadTokens, CacheWriteTokens, Reasoning uint64
	CostMicros                                   int64
	Currency                                     string
	Priced                                       bool
	CatalogVersion                               string
	Version                                      uint64
	Chain                                        Chain // who set it going (schema/cause)
}

// Chain is a usage fact's or a cause row's link (schema/cause.Link as stored): the
// trigger, the initiator with its organization and accountable person, the depth and
// how the link was made.
type Chain struct {
	TriggerID, TriggerEventID                                string
	InitiatorID, InitiatorType, InitiatorOrg, InitiatorOwner string
	Depth                                                    uint16
	Link                                                     string // explicit | inferred | pending; "" stored before chains were
}

// DeadLetter is a record that could not be decoded, validated or stored.
type DeadLetter struct {
	Time                    time.Time // the Kafka record's timestamp, within DateTime's range
	Topic                   string
	Partition               int32
	Offset                  int64
	Key, Raw, Stage, Reason string
	RawBytes                uint64 // the raw record's full size
	RawTruncated            bool   // Raw holds only the start of the record
	ReceivedAt              time.Time
}

// DirectoryRow is the latest registration of an agent or a person.
type DirectoryRow struct {
	Kind                                          string // "agent" | "user"
	ID, OrgID, Handle, Name, OwnerID, Model, Desc string
	PersonalRegistryAccess, SharedWithOrg, Global bool
	Listed, Suspended                             bool
	EventID                                       string
	UpdatedAt                                     time.Time
	Version                                       uint64
}

// Batch is what one flush writes.
type Batch struct {
	Events []EventRow
	// IngestedAt, when set, is stored as the ingested_at of every event row instead of
	// each row's own: the write time of one insert attempt, set without touching the
	// rows (which another goroutine may be reading).
	IngestedAt  time.Time
	Usage       []UsageRow
	DeadLetters []DeadLetter
	Directory   []DirectoryRow
	Causes      []CauseRow
}

// Store writes to one database.
type Store struct {
	conn driver.Conn
	db   string
}

func New(conn driver.Conn, db string) *Store { return &Store{conn: conn, db: db} }

// BatchInsert writes every table of the batch, the work-status tables derived from its
// events included (WorkOf), and returns once ClickHouse has acknowledged all of them.
// The tables a reader joins to the events are written before them, and the cause
// links after the usage they attribute (delegation reads a hop, then its spend); the
// work status, which no reader joins to either, is written meanwhile. So a batch waits
// for its slowest chain of inserts rather than for their sum. If one fails the caller
// retries the whole batch, which the replacing tables make harmless.
func (s *Store) BatchInsert(ctx context.Context, b *Batch) error {
	if err := s.insertDirectory(ctx, b.Directory); err != nil {
		return err
	}
	// Budgets before the events: a policy replica starting in between reads the budget
	// and then the event again from the stream (harmless), never the event without it.
	if err := s.insertBudgets(ctx, BudgetsOf(b.Events)); err != nil {
		return err
	}
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		// Usage before the events too: a policy replica bootstrapping in between sums
		// the usage of stored events only, and reads the rest from the stream.
		if err := s.InsertUsage(gctx, b.Usage); err != nil {
			return err
		}
		g.Go(func() error { return s.InsertCauses(gctx, b.Causes) })
		return s.insertEvents(gctx, b.Events, b.IngestedAt)
	})
	g.Go(func() error { return s.insertWork(gctx, WorkOf(b.Events)) })
	if err := g.Wait(); err != nil {
		return err
	}
	return s.insertDeadLetters(ctx, b.DeadLetters)
}

func ms(t time.Time) uint16 { return uint16(t.Nanosecond() / 1e6) }

func micros(m int64) decimal.Decimal { return decimal.New(m, -6) }

func b2u(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}

// send inserts n rows into table, one INSERT per block of at most
// MaxPartitionsPerBlock partitions (partition gives a row's; nil for an unpartitioned
// table).
func (s *Store) send(ctx context.Context, table, cols string, n int, partition func(i int) uint32, appendRow func(driver.Batch, int) error) error {
	if n == 0 {
		return nil
	}
	var blocks [][]int
	if partition != nil {
		blocks = PartitionBlocks(n, partition, MaxPartitionsPerBlock)
	}
	if blocks == nil {
		return s.sendBlock(ctx, table, cols, n, appendRow)
	}
	for _, idx := range blocks {
		if err := s.sendBlock(ctx, table, cols, len(idx), func(b driver.Batch, i int) error { return appendRow(b, idx[i]) }); err != nil {
			return err
		}
	}
	return nil
}

func (s *Store) sendBlock(ctx context.Context, table, cols string, n int, appendRow func(driver.Batch, int) error) error {
	batch, err := s.conn.PrepareBatch(ctx, "INSERT INTO "+s.db+"."+table+" ("+cols+")")
	if err != nil {
		return fmt.Errorf("cannot prepare insert into %s.%s: %w", s.db, table, err)
	}
	defer batch.Abort()
	for i := 0; i < n; i++ {
		if err := appendRow(batch, i); err != nil {
			return fmt.Errorf("cannot append row %d to %s.%s: %w", i, s.db, table, &ValueError{Table: s.db + "." + table, Err: err})
		}
	}
	if err := batch.Send(); err != nil {
		return fmt.Errorf("cannot insert %d rows into %s.%s: %w", n, s.db, table, err)
	}
	return nil
}

const eventCols = "id, type, time, time_ms, org_id, room_id, actor_id, actor_type, actor_handle, owner_id, subject_id, subject_type, subject_handle, execution_id, source, schema_version, data, ingested_at, kafka_partition, kafka_offset"

// insertEvents writes the audit trail, one INSERT per block of at most
// MaxPartitionsPerBlock days.
func (s *Store) insertEvents(ctx context.Context, rows []EventRow, at time.Time) error {
	return byDay(rows, func(r *EventRow) time.Time { return r.Time }, func(block []EventRow) error { return s.insertEventBlock(ctx, block, at) })
}

// insertEventBlock appends the rows column by column (sendColumns). A non-zero
// written is every row's ingested_at.
func (s *Store) insertEventBlock(ctx context.Context, rows []EventRow, written time.Time) error {
	n := len(rows)
	var (
		id, typ, org, room, actor, actorType, actorHandle, owner = strs(n), strs(n), strs(n), strs(n), strs(n), strs(n), strs(n), strs(n)
		subj, subjType, subjHandle, exec, source, data           = strs(n), strs(n), strs(n), strs(n), strs(n), strs(n)
		times, ingested                                          = make([]time.Time, n), make([]time.Time, n)
		millis, version                                          = make([]uint16, n), make([]uint16, n)
		partition                                                = make([]int32, n)
		offset                                                   = make([]int64, n)
	)
	for i := range rows {
		r := &rows[i]
		at := StoredActorType(r.ActorType)
		id[i], typ[i], times[i], millis[i], org[i], room[i] = r.ID, r.Type, r.Time, ms(r.Time), r.OrgID, r.RoomID
		actor[i], actorType[i], actorHandle[i], owner[i] = r.ActorID, at, r.ActorHandle, r.OwnerID
		subj[i], subjType[i], subjHandle[i], exec[i], source[i] = r.SubjectID, r.SubjectType, r.SubjectHandle, r.ExecutionID, r.Source
		version[i], data[i], ingested[i], partition[i], offset[i] = r.SchemaVersion, r.Data, r.IngestedAt, r.Partition, r.Offset
		if !written.IsZero() {
			ingested[i] = written
		}
	}
	return s.sendColumns(ctx, "events", eventCols, n, id, typ, times, millis, org, room, actor, actorType, actorHandle, owner,
		subj, subjType, subjHandle, exec, source, version, data, ingested, partition, offset)
}

// sendColumns inserts n rows given column by column (a slice per column of cols, in
// its order): one Append per column instead of a boxed value per cell, which halves
// the client's CPU per row on the tables that carry most of ingest's rows.
func (s *Store) sendColumns(ctx context.Context, table, cols string, n int, columns ...any) error {
	batch, err := s.conn.PrepareBatch(ctx, "INSERT INTO "+s.db+"."+table+" ("+cols+")")
	if err != nil {
		return fmt.Errorf("cannot prepare insert into %s.%s: %w", s.db, table, err)
	}
	defer batch.Abort()
	for i, col := range columns {
		if err := batch.Column(i).Append(col); err != nil {
			return fmt.Errorf("cannot append column %s of %s.%s: %w", strings.Split(cols, ", ")[i], s.db, table, &ValueError{Table: s.db + "." + table, Err: err})
		}
	}
	if err := batch.Send(); err != nil {
		return fmt.Errorf("cannot insert %d rows into %s.%s: %w", n, s.db, table, err)
	}
	return nil
}

func strs(n int) []string { return make([]string, n) }

const usageCols = "event_id, time, time_ms, org_id, owner_id, agent_id, room_id, execution_id, model, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, reasoning_tokens, cost, currency, priced, catalog_version, version, " +
	"initiator_id, initiator_type, initiator_org, initiator_owner, trigger_id, chain_depth, link"

// InsertUsage writes usage facts (ingest, and reprice with higher versions).
func (s *Store) InsertUsage(ctx context.Context, rows []UsageRow) error {
	return s.send(ctx, "usage", usageCols, len(rows), func(i int) uint32 { return DayPartition(rows[i].Time) }, func(b driver.Batch, i int) error {
		r := &rows[i]
		return b.Append(r.EventID, r.Time, ms(r.Time), r.OrgID, r.OwnerID, r.AgentID, r.RoomID, r.ExecutionID, r.Model,
			r.InputTokens, r.OutputTokens, r.CacheReadTokens, r.CacheWriteTokens, r.Reasoning,
			micros(r.CostMicros), r.Currency, b2u(r.Priced), r.CatalogVersion, r.Version,
			r.Chain.InitiatorID, r.Chain.InitiatorType, r.Chain.InitiatorOrg, r.Chain.InitiatorOwner, r.Chain.TriggerID, r.Chain.Depth, r.Chain.Link)
	})
}

func (s *Store) insertDeadLetters(ctx context.Context, rows []DeadLetter) error {
	return s.send(ctx, "dead_letters", "time, topic, partition, offset, key, raw, stage, reason, raw_bytes, raw_truncated, received_at", len(rows),
		func(i int) uint32 { return MonthPartition(rows[i].Time) }, func(b driver.Batch, i int) error {
			r := &rows[i]
			return b.Append(r.Time, r.Topic, r.Partition, r.Offset, r.Key, r.Raw, r.Stage, r.Reason, r.RawBytes, b2u(r.RawTruncated), r.ReceivedAt)
		})
}

func (s *Store) insertDirectory(ctx context.Context, rows []DirectoryRow) error {
	return s.send(ctx, "directory", "kind, id, org_id, handle, name, owner_id, model, description, personal_registry_access, shared_with_org, global, listed, suspended, event_id, updated_at, version", len(rows), nil, func(b driver.Batch, i int) error {
		r := &rows[i]
		return b.Append(r.Kind, r.ID, r.OrgID, r.Handle, r.Name, r.OwnerID, r.Model, r.Desc,
			b2u(r.PersonalRegistryAccess), b2u(r.SharedWithOrg), b2u(r.Global), b2u(r.Listed), b2u(r.Suspended),
			r.EventID, r.UpdatedAt, r.Version)
	})
}

// LoadDirectory reads the directory snapshot (latest row of each agent and person).
func (s *Store) LoadDirectory(ctx context.Context) ([]DirectoryRow, error) {
	rows, err := s.conn.Query(ctx, "SELECT toString(kind), id, org_id, handle, name, owner_id, model, description, personal_registry_access, shared_with_org, global, listed, suspended, event_id, updated_at, version FROM "+s.db+".directory FINAL")
	if err != nil {
		return nil, fmt.Errorf("cannot read %s.directory: %w", s.db, err)
	}
	defer rows.Close()
	var out []DirectoryRow
	for rows.Next() {
		var r DirectoryRow
		var pra, swo, glob, listed, susp uint8
		if err := rows.Scan(&r.Kind, &r.ID, &r.OrgID, &r.Handle, &r.Name, &r.OwnerID, &r.Model, &r.Desc, &pra, &swo, &glob, &listed, &susp, &r.EventID, &r.UpdatedAt, &r.Version); err != nil {
			return nil, fmt.Errorf("cannot read %s.directory: %w", s.db, err)
		}
		r.PersonalRegistryAccess, r.SharedWithOrg, r.Global, r.Listed, r.Suspended = pra == 1, swo == 1, glob == 1, listed == 1, susp == 1
		out = append(out, r)
	}
	return out, rows.Err()
}

// UnattributedParties returns the actors and subjects of events stored without an
// organization since the given time (ingested_at), each with the last time one was
// stored. The consumer reads it at start; org "" is a key prefix, so the scan is cheap.
func (s *Store) UnattributedParties(ctx context.Context, since time.Time) (map[string]time.Time, error) {
	return s.lastSeen(ctx, "SELECT if(actor_id != '', actor_id, subject_id) AS party, toUInt64(max(ingested_at)) * 1000000000 FROM "+s.db+
		".events WHERE org_id = '' AND ingested_at >= ? GROUP BY party", since.UTC())
}

// UnpricedAgents returns the agents with usage written without a price because no
// model was known, since the given time (a usage row's version is its write time),
// each with the last such write. It reads without FINAL: an agent whose usage was
// repriced since may be listed, which costs one reprice that changes nothing.
func (s *Store) UnpricedAgents(ctx context.Context, since time.Time) (map[string]time.Time, error) {
	return s.lastSeen(ctx, "SELECT agent_id, max(version) FROM "+s.db+
		".usage WHERE priced = 0 AND model = 'unknown' AND version >= ? GROUP BY agent_id", uint64(max(since.UnixNano(), 0)))
}

// lastSeen runs q, whose rows are (key, UInt64 nanoseconds since 1970).
func (s *Store) lastSeen(ctx context.Context, q string, args ...any) (map[string]time.Time, error) {
	rows, err := s.conn.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("cannot query %s: %w", s.db, err)
	}
	defer rows.Close()
	out := map[string]time.Time{}
	for rows.Next() {
		var k string
		var ns uint64
		if err := rows.Scan(&k, &ns); err != nil {
			return nil, fmt.Errorf("cannot read from %s: %w", s.db, err)
		}
		out[k] = time.Unix(0, int64(ns)).UTC()
	}
	return out, rows.Err()
}
