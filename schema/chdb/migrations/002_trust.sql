-- API keys (README, "Keys and roles"). Only the SHA-256 of a token is stored; the
-- token itself is shown once, by `bandplane keys create`. A revocation writes the key
-- again with revoked_at set and a higher version. org_id '*' is a platform key.
CREATE TABLE IF NOT EXISTS {db}.api_keys (
    id           String,
    token_sha256 String,
    org_id       String,
    role         String,
    name         String,
    created_at   DateTime('UTC'),
    created_by   String,
    revoked_at   DateTime('UTC'),
    revoked_by   String,
    version      UInt64
) ENGINE = ReplacingMergeTree(version)
ORDER BY id;

-- Seals of the audit trail (README, "Tamper-evident audit trail"): one chain per
-- organization. A seal commits to its entries (seal_entries) by root, to the previous
-- seal of the organization by prev, and is signed with the audit key (Ed25519).
-- through is the ingest watermark: every event row ingested before it was sealed by
-- this seal or an earlier one. Two sealers may write seal n+1 from the same head (a
-- fork): hash is part of the key so both are kept, and verify accepts both (see
-- ingest/seal); an ALTER … UPDATE cannot change a key column.
CREATE TABLE IF NOT EXISTS {db}.seals (
    org_id     String,
    seq        UInt64,
    sealed_at  DateTime('UTC'),
    through    DateTime('UTC'),
    events     UInt64,
    first_time DateTime('UTC'),
    last_time  DateTime('UTC'),
    root       String,
    prev       String,
    hash       String,
    key_id     String,
    signature  String
) ENGINE = ReplacingMergeTree()
ORDER BY (org_id, seq, hash);

-- The events each seal covers (seal = the seal's hash), with the digest of each
-- event's content as sealed.
CREATE TABLE IF NOT EXISTS {db}.seal_entries (
    org_id  String,
    seq     UInt64,
    seal    String,
    time    DateTime('UTC'),
    time_ms UInt16,
    id      String,
    digest  String
) ENGINE = ReplacingMergeTree()
ORDER BY (org_id, seq, seal, id, time);

-- Partitions dropped by `bandplane retention`: every row a cut removed was older than
-- before. A cut is signed with the audit key (signature: hex Ed25519 over table_name,
-- before, at and partitions, see ingest/seal.CutContent; key_id names the key) when
-- retention was given it, and both are '' otherwise. Verify treats a sealed event as
-- expired, not missing, only under a cut that verifies with the audit key, recorded
-- after the event was sealed, and only when no row of the event's day is left.
CREATE TABLE IF NOT EXISTS {db}.retention_cuts (
    table_name String,
    before     DateTime('UTC'),
    at         DateTime('UTC'),
    partitions UInt64,
    key_id     String,
    signature  String
) ENGINE = MergeTree()
ORDER BY (table_name, at);

-- Rollup cost sums in Decimal(38,6): with the token and price caps no sum can overflow
-- (README, "Limits").
ALTER TABLE {db}.usage_hourly MODIFY COLUMN cost Decimal(38, 6);

-- A dead letter's raw record is stored truncated when it is larger than the
-- dead-letter limit; raw_bytes is its full size and raw_truncated says it was cut.
ALTER TABLE {db}.dead_letters ADD COLUMN raw_bytes UInt64 DEFAULT 0;
ALTER TABLE {db}.dead_letters ADD COLUMN raw_truncated UInt8 DEFAULT 0;
