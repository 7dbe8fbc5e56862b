-- The audit trail: one row per event. ReplacingMergeTree collapses a replayed event
-- (same org, time and id) so FINAL / GROUP BY id reads count it once.
CREATE TABLE IF NOT EXISTS {db}.events (
    id              String,
    type            String,
    time            DateTime('UTC'),
    time_ms         UInt16,
    org_id          String,
    room_id         String,
    actor_id        String,
    actor_type      Enum8('agent' = 1, 'user' = 2, 'system' = 3),
    actor_handle    String,
    owner_id        String,
    subject_id      String,
    subject_type    String,
    subject_handle  String,
    execution_id    String,
    source          String,
    schema_version  UInt16,
    data            String,
    ingested_at     DateTime('UTC'),
    kafka_partition Int32,
    kafka_offset    Int64
) ENGINE = ReplacingMergeTree()
PARTITION BY toYYYYMMDD(time)
ORDER BY (org_id, time, id);

-- Usage and cost facts, one row per usage.reported event. version grows with every
-- (re)pricing, so a reprice replaces the row instead of adding to it.
CREATE TABLE IF NOT EXISTS {db}.usage (
    event_id           String,
    time               DateTime('UTC'),
    time_ms            UInt16,
    org_id             String,
    owner_id           String,
    agent_id           String,
    room_id            String,
    execution_id       String,
    model              String,
    input_tokens       UInt64,
    output_tokens      UInt64,
    cache_read_tokens  UInt64,
    cache_write_tokens UInt64,
    reasoning_tokens   UInt64,
    cost               Decimal(18, 6),
    currency           String,
    priced             UInt8,
    catalog_version    String,
    version            UInt64
) ENGINE = ReplacingMergeTree(version)
PARTITION BY toYYYYMMDD(time)
ORDER BY (org_id, time, event_id);

-- Hourly cost rollup, rebuilt from usage FINAL for every hour a batch touches; a
-- rebuild replaces the hour's rows (higher version), so it never adds twice.
CREATE TABLE IF NOT EXISTS {db}.usage_hourly (
    hour               DateTime('UTC'),
    org_id             String,
    owner_id           String,
    agent_id           String,
    room_id            String,
    model              String,
    events             UInt64,
    unpriced_events    UInt64,
    input_tokens       UInt64,
    output_tokens      UInt64,
    cache_read_tokens  UInt64,
    cache_write_tokens UInt64,
    reasoning_tokens   UInt64,
    cost               Decimal(18, 6),
    currency           String,
    version            UInt64
) ENGINE = ReplacingMergeTree(version)
PARTITION BY toYYYYMM(hour)
ORDER BY (org_id, hour, owner_id, agent_id, room_id, model);

-- Records that could not be decoded or validated, with the reason. Keyed by their
-- Kafka coordinates so a redelivered record is stored once.
CREATE TABLE IF NOT EXISTS {db}.dead_letters (
    time        DateTime('UTC'),
    topic       String,
    partition   Int32,
    offset      Int64,
    key         String,
    raw         String,
    stage       String,
    reason      String,
    received_at DateTime('UTC')
) ENGINE = ReplacingMergeTree()
PARTITION BY toYYYYMM(time)
ORDER BY (topic, partition, offset);

-- Directory snapshot (agents and people) from agent.registered / agent.updated /
-- user.registered. Keyed by (kind, id) rather than org first: an agent's latest
-- registration must replace the previous one even if it moved organization.
CREATE TABLE IF NOT EXISTS {db}.directory (
    kind                     Enum8('user' = 1, 'agent' = 2),
    id                       String,
    org_id                   String,
    handle                   String,
    name                     String,
    owner_id                 String,
    model                    String,
    description              String,
    personal_registry_access UInt8,
    shared_with_org          UInt8,
    global                   UInt8,
    listed                   UInt8,
    suspended                UInt8,
    event_id                 String,
    updated_at               DateTime('UTC'),
    version                  UInt64
) ENGINE = ReplacingMergeTree(version)
ORDER BY (kind, id);
