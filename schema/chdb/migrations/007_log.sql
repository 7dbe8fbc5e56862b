-- The audit trail's transparency log (ingest/seal and ingest/seal/tlog; README,
-- "Tamper-evident audit trail"): one append-only RFC 6962 Merkle tree per
-- organization, over a leaf per stored copy of an event row, with signed checkpoints.
-- Every row here is something an attacker with write access may edit: readers check
-- it against a checkpoint signed with the audit key before they rely on it.
--
-- seals and seal_entries (002) are no longer written or read: the log replaces the
-- chain of seals. A database sealed by an older bandplane keeps them.

-- The leaves by event key, in the events table's order (verify and exports join them
-- with the rows): idx is the leaf's index in its organization's log, digest the hex
-- SealDigest of the row's content, and the rest the bookkeeping the leaf commits to.
CREATE TABLE IF NOT EXISTS {db}.log_leaves (
    org_id          String,
    time            DateTime('UTC'),
    time_ms         UInt16,
    id              String,
    idx             UInt64,
    digest          String,
    ingested_at     DateTime('UTC'),
    kafka_partition Int32,
    kafka_offset    Int64
) ENGINE = ReplacingMergeTree()
ORDER BY (org_id, time, id, idx);

-- The leaves by index: each leaf's time (Unix milliseconds) and inner digest (hex),
-- from which its tree hash follows (tlog.LeafHash). A scan of an organization's index
-- recomputes its root and proves every leaf's time.
CREATE TABLE IF NOT EXISTS {db}.log_index (
    org_id  String,
    idx     UInt64,
    time_ms Int64,
    inner   String
) ENGINE = ReplacingMergeTree()
ORDER BY (org_id, idx);

-- The hashes (hex) of the perfect subtrees above the leaves (level >= 1), which
-- inclusion and consistency proofs are made of.
CREATE TABLE IF NOT EXISTS {db}.log_tree (
    org_id String,
    level  UInt8,
    idx    UInt64,
    hash   String
) ENGINE = ReplacingMergeTree()
ORDER BY (org_id, level, idx);

-- The signed checkpoint (C2SP tlog-checkpoint note) of every size an organization's
-- log reached. note is the whole signed note; the other columns repeat what it says
-- for queries and dashboards, and nothing trusts them. note is part of the key, so a
-- forged row stands beside the signed one instead of replacing it.
CREATE TABLE IF NOT EXISTS {db}.checkpoints (
    org_id    String,
    size      UInt64,
    root      String,
    signed_at DateTime('UTC'),
    key_id    String,
    note      String
) ENGINE = ReplacingMergeTree()
ORDER BY (org_id, size, note);

-- Audit key rotations: signed notes by the old and the new key (tlog.Rotation).
CREATE TABLE IF NOT EXISTS {db}.key_rotations (
    recorded_at DateTime('UTC'),
    note        String
) ENGINE = ReplacingMergeTree()
ORDER BY (note);
