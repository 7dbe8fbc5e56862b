-- Daily cost rollup: usage_hourly summed per day (UTC), rebuilt from it after every
-- refresh of the day's hours (ingest/store/rollup.go, RefreshDays). Cost reads take the whole
-- days of a range from it and only the edges from usage_hourly: over a month that is
-- about 14 times fewer rows to merge (FINAL) than hourly.
CREATE TABLE IF NOT EXISTS {db}.usage_daily (
    day                         DateTime('UTC'),
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
PARTITION BY toYYYYMM(day)
ORDER BY (org_id, day, owner_id, agent_id, room_id, model);

-- The days the hourly rollup holds already (a database that ran an earlier version);
-- groups a rebuild zeroed are left out (their rows carry no currency).
INSERT INTO {db}.usage_daily (day, org_id, owner_id, agent_id, room_id, model, events, unpriced_events, input_tokens,
    output_tokens, cache_read_tokens, cache_write_tokens, reasoning_tokens, unpriced_input_tokens, unpriced_output_tokens,
    unpriced_cache_read_tokens, unpriced_cache_write_tokens, unpriced_reasoning_tokens, cost, currency, version)
SELECT toStartOfDay(hour) AS d, org_id, owner_id, agent_id, room_id, model, sum(events), sum(unpriced_events),
    sum(input_tokens), sum(output_tokens), sum(cache_read_tokens), sum(cache_write_tokens), sum(reasoning_tokens),
    sum(unpriced_input_tokens), sum(unpriced_output_tokens), sum(unpriced_cache_read_tokens),
    sum(unpriced_cache_write_tokens), sum(unpriced_reasoning_tokens), sum(cost), any(currency), max(version)
FROM (SELECT * FROM {db}.usage_hourly FINAL) AS h
WHERE events > 0
GROUP BY d, org_id, owner_id, agent_id, room_id, model;
