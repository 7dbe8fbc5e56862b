-- Work status (graph/README.md, "Work status"), kept by ingest from the events it
-- stores: each row is derived from one event alone, and version is the event's time in
-- milliseconds × 10^6 plus its Kafka offset modulo 10^6 (events of one room share a
-- partition, so the offset orders two events of the same millisecond), so the latest
-- event wins under FINAL whatever order the rows arrive in, and a replayed event
-- writes a row equal to the one it wrote before. tasks, room_activity and rooms are
-- not partitioned (a partition would keep a key's older row from collapsing with its
-- newer one); retention does not drop them.

-- The latest state of each task (task.created / task.updated / task.deleted carry the
-- task's whole state, as the platform's frames do).
CREATE TABLE IF NOT EXISTS {db}.tasks (
    org_id      String,
    task_id     String,
    room_id     String,
    title       String,
    status      String,
    assignee_id String,
    actor_id    String,
    created_at  DateTime('UTC'),
    updated_at  DateTime('UTC'),
    updated_ms  UInt16,
    deleted     UInt8,
    event_id    String,
    version     UInt64
) ENGINE = ReplacingMergeTree(version)
ORDER BY (org_id, task_id);

-- Who did what last in each room: kind 'event' is an actor's latest event of any type
-- in the room, kind 'message' its latest message.created (text cut to 200 characters),
-- kind 'task' the latest task event of the room whose assignee the actor was then (a
-- reassignment later does not move it: it closes that agent's requests for attention).
CREATE TABLE IF NOT EXISTS {db}.room_activity (
    org_id       String,
    room_id      String,
    actor_id     String,
    kind         Enum8('event' = 1, 'message' = 2, 'task' = 3),
    actor_type   Enum8('agent' = 1, 'user' = 2, 'system' = 3),
    actor_handle String,
    time         DateTime('UTC'),
    time_ms      UInt16,
    type         String,
    text         String,
    event_id     String,
    version      UInt64
) ENGINE = ReplacingMergeTree(version)
ORDER BY (org_id, room_id, actor_id, kind);

-- Requests for a human's attention (event.attention), one row each; mentions are the
-- ids the request @mentions. Whether one is still open is decided when it is read,
-- from room_activity and tasks (graph/README.md, "Work status").
CREATE TABLE IF NOT EXISTS {db}.attention (
    org_id       String,
    room_id      String,
    event_id     String,
    time         DateTime('UTC'),
    time_ms      UInt16,
    asker_id     String,
    asker_handle String,
    mentions     Array(String),
    question     String,
    version      UInt64
) ENGINE = ReplacingMergeTree(version)
PARTITION BY toYYYYMM(time)
ORDER BY (org_id, room_id, event_id);

-- Tool calls and their results, paired by the agent and tool_call_id (kind 'call' /
-- 'result': ids are the agent's own, two agents may both use call_0). A result without
-- a tool_call_id is keyed by its event id and pairs with nothing; a call without one is
-- not kept (it can never be paired).
CREATE TABLE IF NOT EXISTS {db}.tool_calls (
    org_id       String,
    agent_id     String,
    call_id      String,
    kind         Enum8('call' = 1, 'result' = 2),
    room_id      String,
    tool_name    String,
    time         DateTime('UTC'),
    time_ms      UInt16,
    is_error     UInt8,
    event_id     String,
    version      UInt64
) ENGINE = ReplacingMergeTree(version)
PARTITION BY toYYYYMM(time)
ORDER BY (org_id, agent_id, call_id, kind);

-- Room names and closures: kind 'title' from room.added (its title), kind 'deleted'
-- from room.deleted. A room is closed while its latest 'deleted' row is newer than its
-- latest 'title' row (room.removed takes one agent out, it does not close the room).
CREATE TABLE IF NOT EXISTS {db}.rooms (
    org_id   String,
    room_id  String,
    kind     Enum8('title' = 1, 'deleted' = 2),
    title    String,
    time     DateTime('UTC'),
    event_id String,
    version  UInt64
) ENGINE = ReplacingMergeTree(version)
ORDER BY (org_id, room_id, kind);

-- The rollup keeps the tokens of unpriced usage apart, so an answer can say which
-- tokens have no cost instead of counting them at 0. Hours rebuilt before this
-- migration read 0 here until they are rebuilt (bandplane reprice rebuilds them).
ALTER TABLE {db}.usage_hourly ADD COLUMN unpriced_input_tokens UInt64 DEFAULT 0;
ALTER TABLE {db}.usage_hourly ADD COLUMN unpriced_output_tokens UInt64 DEFAULT 0;
ALTER TABLE {db}.usage_hourly ADD COLUMN unpriced_cache_read_tokens UInt64 DEFAULT 0;
ALTER TABLE {db}.usage_hourly ADD COLUMN unpriced_cache_write_tokens UInt64 DEFAULT 0;
ALTER TABLE {db}.usage_hourly ADD COLUMN unpriced_reasoning_tokens UInt64 DEFAULT 0;
