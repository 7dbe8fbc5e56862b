-- The initiator rollup: usage summed by who set it going (schema/cause, as usage
-- carries it since 009): the initiator, its type and accountable person, and the
-- chain's depth, with the agents' owner and the model. costs and usageSeries read it
-- when they group or filter by those; crossOwnerSpend compares the owner with the
-- initiator's. It is built like the cost rollup (schema/README.md, "The cost
-- rollups"): initiator_hourly from usage FINAL, initiator_rollup its hours and the days
-- summed from them. It is apart from usage_rollup because a person's requests reach
-- many agents: grouped by agent and room as well, the days hold some ten times the
-- groups of the cost rollup, and every cost read would pay for them. Empty when
-- created, it is filled by ingest's catch-up at start (StaleHours lists every hour
-- while one rollup is empty); usage stored before 009 has no chain ('' and 0).
CREATE TABLE IF NOT EXISTS {db}.initiator_hourly (
    hour                        DateTime('UTC'),
    org_id                      String,
    owner_id                    String,
    model                       String,
    initiator_id                String,
    initiator_type              String,
    initiator_owner             String,
    chain_depth                 UInt16,
    events                      UInt64,
    unpriced_events             UInt64,
    input_tokens                UInt64,
    output_tokens               UInt64,
    cache_read_tokens           UInt64,
    cache_write_tokens          UInt64,
    reasoning_tokens            UInt64,
    unpriced_input_tokens       UInt64,
    unpriced_output_tokens      UInt64,
    unpriced_cache_read_tokens  UInt64,
    unpriced_cache_write_tokens UInt64,
    unpriced_reasoning_tokens   UInt64,
    cost                        Decimal(38, 6),
    currency                    String,
    version                     UInt64
) ENGINE = ReplacingMergeTree(version)
PARTITION BY toYYYYMM(hour)
ORDER BY (org_id, hour, owner_id, model, initiator_id, initiator_type, initiator_owner, chain_depth);

CREATE TABLE IF NOT EXISTS {db}.initiator_rollup (
    grain                       Enum8('hour' = 1, 'day' = 2),
    bucket                      DateTime('UTC'),
    org_id                      String,
    owner_id                    String,
    model                       String,
    initiator_id                String,
    initiator_type              String,
    initiator_owner             String,
    chain_depth                 UInt16,
    events                      UInt64,
    unpriced_events             UInt64,
    input_tokens                UInt64,
    output_tokens               UInt64,
    cache_read_tokens           UInt64,
    cache_write_tokens          UInt64,
    reasoning_tokens            UInt64,
    unpriced_input_tokens       UInt64,
    unpriced_output_tokens      UInt64,
    unpriced_cache_read_tokens  UInt64,
    unpriced_cache_write_tokens UInt64,
    unpriced_reasoning_tokens   UInt64,
    cost                        Decimal(38, 6),
    currency                    String,
    version                     UInt64
) ENGINE = ReplacingMergeTree(version)
PARTITION BY toYYYYMM(bucket)
ORDER BY (grain, org_id, bucket, owner_id, model, initiator_id, initiator_type, initiator_owner, chain_depth)
PRIMARY KEY (grain, org_id, bucket)
SETTINGS index_granularity = 1024;
