-- The cost rollups group by who set the spend going too: the initiator (schema/cause,
-- as usage carries it since 009), its type and accountable person, and the chain's
-- depth, so that costs and series group and filter by them from the rollup. The new
-- columns end the sorting key (a rebuilt hour replaces each of its groups, the
-- initiator's included) but not the primary key, which reads narrow by. Rows written
-- before hold '' and 0: no chain was recorded for them. 18.16 adds a column to the
-- sorting key only in the ALTER that adds it, and only without a default expression.
ALTER TABLE {db}.usage_hourly ADD COLUMN initiator_id String, ADD COLUMN initiator_type String,
    ADD COLUMN initiator_owner String, ADD COLUMN chain_depth UInt16,
    MODIFY ORDER BY (org_id, hour, owner_id, agent_id, room_id, model, initiator_id, initiator_type, initiator_owner, chain_depth);
ALTER TABLE {db}.usage_rollup ADD COLUMN initiator_id String, ADD COLUMN initiator_type String,
    ADD COLUMN initiator_owner String, ADD COLUMN chain_depth UInt16,
    MODIFY ORDER BY (grain, org_id, bucket, owner_id, agent_id, room_id, model, initiator_id, initiator_type, initiator_owner, chain_depth);
