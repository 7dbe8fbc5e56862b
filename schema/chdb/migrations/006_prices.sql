-- Prices as data (README, "Prices and reprice jobs"). Each row is one model's prices
-- from its effective time on, as set by catalog version catalog_version: version 1 is
-- the seed (the built-in catalog.json or --catalog, one row per entry, written when
-- the table is empty), and every upsert adds version max + 1 with the one entry it
-- changed. Catalog version N is, for each (model, effective), the row of the highest
-- (catalog_version, set_at, set_id) at or below N (ingest/prices). Prices are in
-- currency units per million tokens with 9 decimals (pricing.MaxPricePerMillion caps
-- them at 10^6, inside Decimal(18, 9)). set_id tells apart two writers of one version;
-- an identical row written twice (a retried insert) collapses.
CREATE TABLE IF NOT EXISTS {db}.prices (
    catalog_version      UInt64,
    model                String,
    effective            DateTime('UTC'),
    provider             String,
    aliases              Array(String),
    currency             String,
    input_per_mtok       Decimal(18, 9),
    output_per_mtok      Decimal(18, 9),
    cache_read_per_mtok  Decimal(18, 9),
    cache_write_per_mtok Decimal(18, 9),
    reasoning_per_mtok   Decimal(18, 9),
    has_reasoning        UInt8,
    set_by               String,
    set_at               DateTime('UTC'),
    set_id               String,
    note                 String
) ENGINE = ReplacingMergeTree()
ORDER BY (catalog_version, model, effective, set_id);

-- Background jobs (kind 'reprice': recompute the usage costs of [range_from, range_to)
-- of org_id, '*' for every organization, with catalog version catalog_version, pinned
-- when the job first starts). One row per state change, the newest version wins
-- (FINAL). state: queued | running | done | failed | cancelled; a finished state is
-- written with version 2^63 + its time in ns, so no later write of a running process
-- can bring a finished job back. cursor: every day before it is repriced and its
-- rollup rebuilt (the checkpoint a resumed job starts from). heartbeat_at: a running
-- job whose heartbeat is older than the runners' stale limit is resumed by another.
-- Times that have not happened yet are 1970-01-01.
CREATE TABLE IF NOT EXISTS {db}.jobs (
    id              String,
    org_id          String,
    kind            String,
    agent_id        String,
    range_from      DateTime('UTC'),
    range_to        DateTime('UTC'),
    state           String,
    catalog_version UInt64,
    cursor          DateTime('UTC'),
    days_done       UInt32,
    days_total      UInt32,
    rows_scanned    UInt64,
    rows_changed    UInt64,
    still_unpriced  UInt64,
    cost_before     Decimal(38, 6),
    cost_after      Decimal(38, 6),
    requested_by    String,
    requested_at    DateTime('UTC'),
    started_at      DateTime('UTC'),
    finished_at     DateTime('UTC'),
    heartbeat_at    DateTime('UTC'),
    runner          String,
    error           String,
    version         UInt64
) ENGINE = ReplacingMergeTree(version)
ORDER BY (org_id, id);
