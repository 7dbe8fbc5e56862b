package keys

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/bandplane/bandplane/schema"
)

// Source is the source of the key.created and key.revoked events.
const Source = schema.SourceBandplane + "-keys"

// Producer writes bandplane's own audit events (kafka.Producer implements it). Produce
// blocks until every in-sync replica has acknowledged all events, or returns an error.
type Producer interface {
	Produce(ctx context.Context, events []schema.Event) error
}

// EventData is the data of key.created and key.revoked. It never holds the token nor
// its digest.
type EventData struct {
	KeyID string `json:"key_id"`
	Org   string `json:"org"` // PlatformOrg for a platform key (whose event has no org_id)
	Role  Role   `json:"role"`
	Name  string `json:"name"`
}

// Store is the api_keys table (migration 002): one row per key and state, the newest
// version wins (ReplacingMergeTree(version)); reads use FINAL.
type Store struct {
	conn driver.Conn
	db   string
	p    Producer
}

func NewStore(conn driver.Conn, db string, p Producer) *Store {
	return &Store{conn: conn, db: db, p: p}
}

// record is a row of api_keys: the key and what only the store and the cache see.
type record struct {
	Key
	digest  string // hex SHA-256 of the token
	version uint64
}

const keyCols = "id, token_sha256, org_id, role, name, created_at, created_by, revoked_at, revoked_by, version"

// epoch is how a DateTime column stores "never" (its zero).
var epoch = time.Unix(0, 0).UTC()

// Create makes a key of org with role and returns it with its token, which exists
// nowhere else: only its SHA-256 is stored.
//
// Its key.created event is produced before the key is stored, so no usable key exists
// without its audit event: when the event cannot be written nothing is stored; when
// the row cannot be stored after the event was written, the trail tells of a key that
// never existed, which grants nothing (and if the insert did land despite the error,
// its event is already there).
func (s *Store) Create(ctx context.Context, org string, role Role, name, by string) (Key, string, error) {
	if err := errors.Join(ValidateOrg(org), validRole(role), validateName(name), validateBy(by)); err != nil {
		return Key{}, "", fmt.Errorf("cannot create key: %w", err)
	}
	token := newToken()
	now := time.Now().UTC().Truncate(time.Second) // DateTime holds seconds
	r := record{
		Key:     Key{ID: schema.NewID(), Org: org, Role: role, Name: name, CreatedAt: now, CreatedBy: by},
		digest:  digestHex(token),
		version: uint64(time.Now().UnixNano()),
	}
	if err := s.produce(ctx, event(schema.TypeKeyCreated, r.Key, now, by)); err != nil {
		return Key{}, "", fmt.Errorf("cannot create key: its key.created event could not be written, so no key was stored: %w", err)
	}
	if err := s.insert(ctx, r); err != nil {
		return Key{}, "", fmt.Errorf("cannot store key %s (its key.created event is written; the key does not exist, create another): %w", r.ID, err)
	}
	return r.Key, token, nil
}

func validRole(r Role) error {
	if r.Valid() {
		return nil
	}
	_, err := ParseRole(string(r))
	return err
}

// Revoke revokes key id, recording by as who did it, and returns the key as revoked.
// An unknown id is an error wrapping schema.ErrNotFound; a key already revoked is returned as
// it is, with no new event.
//
// The revocation is stored before its key.revoked event is produced: a revocation must
// take effect even when Kafka is down (an error then says the event is missing), and an
// event must never claim a revocation that ClickHouse refused.
func (s *Store) Revoke(ctx context.Context, id, by string) (Key, error) {
	if id == "" || len(id) > schema.MaxIDBytes {
		return Key{}, fmt.Errorf("cannot revoke key %q: %w (a key id is 1 to %d bytes)", id, schema.ErrNotFound, schema.MaxIDBytes)
	}
	if err := validateBy(by); err != nil {
		return Key{}, fmt.Errorf("cannot revoke key %s: %w", id, err)
	}
	recs, err := s.records(ctx, "WHERE id = ?", id)
	if err != nil {
		return Key{}, fmt.Errorf("cannot revoke key %s: %w", id, err)
	}
	if len(recs) == 0 {
		return Key{}, fmt.Errorf("cannot revoke key %q: %w", id, schema.ErrNotFound)
	}
	r := recs[0]
	if !r.Active() {
		return r.Key, nil
	}
	r.RevokedAt, r.RevokedBy = time.Now().UTC().Truncate(time.Second), by
	r.version = max(uint64(time.Now().UnixNano()), r.version+1)
	if err := s.insert(ctx, r); err != nil {
		return Key{}, fmt.Errorf("cannot revoke key %s (it is still active): %w", id, err)
	}
	if err := s.produce(ctx, event(schema.TypeKeyRevoked, r.Key, r.RevokedAt, by)); err != nil {
		return r.Key, fmt.Errorf("key %s is revoked, but its key.revoked event could not be written: %w", id, err)
	}
	return r.Key, nil
}

// List returns every key, revoked ones included, newest first.
func (s *Store) List(ctx context.Context) ([]Key, error) {
	recs, err := s.load(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]Key, len(recs))
	for i := range recs {
		out[i] = recs[i].Key
	}
	return out, nil
}

// load reads every key with its digest (the Cache's source).
func (s *Store) load(ctx context.Context) ([]record, error) {
	return s.records(ctx, "")
}

func (s *Store) records(ctx context.Context, where string, args ...any) ([]record, error) {
	q := "SELECT " + keyCols + " FROM " + s.db + ".api_keys FINAL " + where + " ORDER BY created_at DESC, id DESC"
	rows, err := s.conn.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("cannot read %s.api_keys: %w", s.db, err)
	}
	defer rows.Close()
	var out []record
	for rows.Next() {
		var r record
		var role string
		if err := rows.Scan(&r.ID, &r.digest, &r.Org, &role, &r.Name, &r.CreatedAt, &r.CreatedBy, &r.RevokedAt, &r.RevokedBy, &r.version); err != nil {
			return nil, fmt.Errorf("cannot read %s.api_keys: %w", s.db, err)
		}
		r.Role = Role(role)
		r.CreatedAt = r.CreatedAt.UTC()
		if r.RevokedAt.Unix() <= 0 {
			r.RevokedAt = time.Time{}
		} else {
			r.RevokedAt = r.RevokedAt.UTC()
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("cannot read %s.api_keys: %w", s.db, err)
	}
	return out, nil
}

func (s *Store) insert(ctx context.Context, r record) error {
	batch, err := s.conn.PrepareBatch(ctx, "INSERT INTO "+s.db+".api_keys ("+keyCols+")")
	if err != nil {
		return fmt.Errorf("cannot prepare insert into %s.api_keys: %w", s.db, err)
	}
	defer batch.Abort()
	revoked := r.RevokedAt
	if revoked.IsZero() {
		revoked = epoch
	}
	if err := batch.Append(r.ID, r.digest, r.Org, string(r.Role), r.Name, r.CreatedAt, r.CreatedBy, revoked, r.RevokedBy, r.version); err != nil {
		return fmt.Errorf("cannot append key %s to %s.api_keys: %w", r.ID, s.db, err)
	}
	if err := batch.Send(); err != nil {
		return fmt.Errorf("cannot insert key %s into %s.api_keys: %w", r.ID, s.db, err)
	}
	return nil
}

func (s *Store) produce(ctx context.Context, ev schema.Event) error {
	if s.p == nil {
		return errors.New("the key store has no producer for its audit events")
	}
	if err := ev.Validate(); err != nil { // a bug, not an input error: inputs are checked before
		return fmt.Errorf("cannot build %s event of key %s: %w", ev.Type, ev.Subject.ID, err)
	}
	return s.p.Produce(ctx, []schema.Event{ev})
}

// event is the audit event of a key's creation or revocation by by at t.
func event(typ string, k Key, t time.Time, by string) schema.Event {
	data, _ := json.Marshal(EventData{KeyID: k.ID, Org: k.Org, Role: k.Role, Name: k.Name})
	org := k.Org
	if k.Platform() {
		org = ""
	}
	return schema.Event{
		ID: schema.NewID(), Type: typ, Time: t, OrgID: org,
		Actor:         schema.Party{ID: by, Type: schema.ActorSystem},
		Subject:       &schema.Party{ID: k.ID, Type: schema.ActorSystem},
		Source:        Source,
		SchemaVersion: schema.Version,
		Data:          data,
	}
}

// digestBytes decodes a stored digest; a malformed one (a row written by hand) is
// reported so that the cache skips it.
func digestBytes(h string) ([32]byte, bool) {
	var d [32]byte
	if len(h) != 64 {
		return d, false
	}
	if _, err := hex.Decode(d[:], []byte(h)); err != nil {
		return d, false
	}
	return d, true
}
