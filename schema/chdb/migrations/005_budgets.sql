-- Budgets (policy/README.md, "Budgets and reservations"), kept by ingest from the
-- budget.set and budget.deleted events bandplane's policy side writes: one row per
-- budget, the latest change winning under FINAL (version: the change's time in
-- milliseconds × 10^6 plus its Kafka offset modulo 10^6, as the work tables). data is
-- the event's data (the budget as JSON), which the policy replica reads back at start.
-- Not partitioned: retention never drops a budget in force, whatever its age.
CREATE TABLE IF NOT EXISTS {db}.budgets (
    org_id     String,
    budget_id  String,
    deleted    UInt8,
    data       String,
    updated_at DateTime('UTC'),
    event_id   String,
    version    UInt64
) ENGINE = ReplacingMergeTree(version)
ORDER BY (org_id, budget_id);
