-- Who set each agent event going (schema/cause): one row per message, room event and
-- usage report of an agent or a person, with the trigger that started its execution,
-- the initiator at the root of the chain, its organization and accountable person, the
-- chain's depth, and how the link was made ('explicit', 'inferred', or 'pending' while
-- an explicit trigger has not arrived). A late trigger rewrites the rows it resolves
-- at a higher version. Messages keep the agents they mention and the platform's id, so
-- that ingest warms its tracker from the last hour's rows when it starts. Derived from
-- the sealed trail, never part of it: rebuilt by replaying the events.
CREATE TABLE IF NOT EXISTS {db}.causes (
    event_id         String,
    time             DateTime('UTC'),
    time_ms          UInt16,
    type             String,
    org_id           String,
    room_id          String,
    actor_id         String,
    actor_type       String,
    execution_id     String,
    message_id       String,
    mentions         Array(String),
    trigger_id       String,
    trigger_event_id String,
    initiator_id     String,
    initiator_type   String,
    initiator_org    String,
    initiator_owner  String,
    depth            UInt16,
    link             String,
    version          UInt64
) ENGINE = ReplacingMergeTree(version)
PARTITION BY toYYYYMMDD(time)
ORDER BY (org_id, time, event_id);

-- A usage fact carries its chain too, so that costs group by initiator from the
-- rollups, and a reprice keeps the chain as it rewrites the row.
ALTER TABLE {db}.usage ADD COLUMN initiator_id String DEFAULT '';
ALTER TABLE {db}.usage ADD COLUMN initiator_type String DEFAULT '';
ALTER TABLE {db}.usage ADD COLUMN initiator_org String DEFAULT '';
ALTER TABLE {db}.usage ADD COLUMN initiator_owner String DEFAULT '';
ALTER TABLE {db}.usage ADD COLUMN trigger_id String DEFAULT '';
ALTER TABLE {db}.usage ADD COLUMN chain_depth UInt16 DEFAULT 0;
ALTER TABLE {db}.usage ADD COLUMN link String DEFAULT '';
