-- The cost rollup read by costs, series, unpriced models and the policy replica
-- (schema/README.md, "The cost rollups"): the hours of usage_hourly and the days summed
-- from them, side by side, so that a range's whole days and its edge hours are one scan
-- of one table. grain says which a row is: 'hour' rows are copies of usage_hourly's,
-- with their versions; a 'day' row is a group's day (UTC, bucket its start) rebuilt
-- from the day's hours after they are, in the same insert as the hours it copies
-- (schema/store/rollup.go, refreshDays). A version grows with every rebuild, so a
-- group's row of the highest version is its current one; a group that left a bucket is
-- overwritten with zeros. Reads of one organization take that row per group without
-- FINAL (ORDER BY version DESC LIMIT 1 BY the key): exact whatever merges have done,
-- and the parts read in parallel instead of merged in one stream. Granules of 1024 rows
-- keep what a read selects close to what it needs (the edge hours of a month are a few
-- thousand rows). The grain leads the key, so that a read of the days of every
-- organization (the policy replica's, StaleDays) skips the hours; the primary key stops
-- at the bucket, which is all reads narrow by, so the index stays small.
--
-- usage_daily (004) is no longer written or read: usage_rollup replaces it. A database
-- that ran an earlier bandplane keeps it until retention drops its months.
CREATE TABLE IF NOT EXISTS {db}.usage_rollup (
    grain                       Enum8('hour' = 1, 'day' = 2),
    bucket                      DateTime('UTC'),
    org_id                      String,
    owner_id                    String,
    agent_id                    String,
    room_id                     String,
    model                       String,
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
ORDER BY (grain, org_id, bucket, owner_id, agent_id, room_id, model)
PRIMARY KEY (grain, org_id, bucket)
SETTINGS index_granularity = 1024;

-- What the rollups hold already, every row with its version (no FINAL: the reads pick
-- each group's newest row, and a FINAL over every month at once holds buffers per part
-- of all of them). Run again, it writes the same rows with the same versions, which
-- change nothing. The days are usage_daily's as they are: a day older than its hours
-- there is older than them here too, and StaleDays finds it.
INSERT INTO {db}.usage_rollup (grain, bucket, org_id, owner_id, agent_id, room_id, model, events, unpriced_events,
    input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, reasoning_tokens, unpriced_input_tokens,
    unpriced_output_tokens, unpriced_cache_read_tokens, unpriced_cache_write_tokens, unpriced_reasoning_tokens, cost,
    currency, version)
SELECT 'hour', hour, org_id, owner_id, agent_id, room_id, model, events, unpriced_events, input_tokens, output_tokens,
    cache_read_tokens, cache_write_tokens, reasoning_tokens, unpriced_input_tokens, unpriced_output_tokens,
    unpriced_cache_read_tokens, unpriced_cache_write_tokens, unpriced_reasoning_tokens, cost, currency, version
FROM {db}.usage_hourly;

INSERT INTO {db}.usage_rollup (grain, bucket, org_id, owner_id, agent_id, room_id, model, events, unpriced_events,
    input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, reasoning_tokens, unpriced_input_tokens,
    unpriced_output_tokens, unpriced_cache_read_tokens, unpriced_cache_write_tokens, unpriced_reasoning_tokens, cost,
    currency, version)
SELECT 'day', day, org_id, owner_id, agent_id, room_id, model, events, unpriced_events, input_tokens, output_tokens,
    cache_read_tokens, cache_write_tokens, reasoning_tokens, unpriced_input_tokens, unpriced_output_tokens,
    unpriced_cache_read_tokens, unpriced_cache_write_tokens, unpriced_reasoning_tokens, cost, currency, version
FROM {db}.usage_daily;
