package dashboards

import (
	"fmt"
	"time"

	"github.com/bandplane/bandplane/schema/work"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
)

// Task statuses by schema/work's rules: in progress is the only status that can be
// stuck, finished ones are final.
var (
	taskStatus     = work.StatusKeySQL
	inProgressList = work.SQLList(work.InProgressStatuses)
	finishedList   = work.SQLList(work.FinishedStatuses)
)

// stuckAfter is work.DefaultStuckAfter in seconds: a task in progress with no activity
// (its own update, or any event of its assignee in its room) for this long is stuck.
const stuckAfter = int(work.DefaultStuckAfter / time.Second)

// attentionWindow is work.AttentionWindow: an older unanswered request is not shown.
var attentionWindow = fmt.Sprintf("INTERVAL %d DAY", work.AttentionWindow/(24*time.Hour))

// tasksWhere selects the latest state of the tasks of the selection (tasks FINAL: the
// newest event of each task wins; deleted ones are left out).
var tasksWhere = `deleted = 0
	  AND ` + is("org_id", varOrg) + `
	  AND ` + is("room_id", varRoom) + `
	  AND ` + is("assignee_id", varAgent)

var (
	// Tasks touched in the range (updated_at), by the status they have now.
	tasksByStatusSQL = sql(`
	SELECT ` + taskStatus + ` AS task_status, count() AS tasks
	FROM bandplane.tasks FINAL
	WHERE ` + tasksWhere + ` AND ` + timeFilter("updated_at") + `
	GROUP BY task_status
	ORDER BY tasks DESC, task_status`)

	tasksByRoomSQL = sql(`
	SELECT ` + nameOr("room_name", "room_id") + ` AS room, open, in_progress, blocked, finished, other, total, room_id
	FROM (
	  SELECT org_id, room_id,
	    countIf(s = 'open') AS open,
	    countIf(s IN ` + inProgressList + `) AS in_progress,
	    countIf(s = 'blocked') AS blocked,
	    countIf(s IN ` + finishedList + `) AS finished,
	    countIf(s NOT IN ` + inProgressList + ` AND s NOT IN ` + finishedList + ` AND s NOT IN ('open', 'blocked')) AS other,
	    count() AS total
	  FROM (
	    SELECT org_id, room_id, ` + taskStatus + ` AS s
	    FROM bandplane.tasks FINAL
	    WHERE ` + tasksWhere + ` AND ` + timeFilter("updated_at") + `
	  ) AS t
	  GROUP BY org_id, room_id
	) AS per_room
	ANY LEFT JOIN ` + roomLookup + ` USING (room_id)
	ORDER BY total DESC, room`)

	// As of now, whatever the range: tasks in progress whose last activity (their own
	// update or the assignee's latest event in the room, room_activity kind 'event') is
	// older than the stuck time.
	stuckTasksSQL = sql(`
	SELECT title AS task, ` + nameOr("room_name", "room_id") + ` AS room, assignee, status, last_activity, idle,
	  task_id, room_id, agent_id
	FROM (
	  SELECT org_id, room_id, task_id, title, status, ` + nameOr("agent_name", "agent_id") + ` AS assignee, agent_id,
	    last_activity, idle
	  FROM (
	    SELECT org_id, room_id, task_id, title, status, assignee_id AS agent_id,
	      toDateTime(greatest(toUInt32(updated_at), toUInt32(act_time)), 'UTC') AS last_activity,
	      toInt64(now()) - toInt64(last_activity) AS idle
	    FROM (
	      SELECT org_id, room_id, task_id, title, status, assignee_id, updated_at
	      FROM bandplane.tasks FINAL
	      WHERE ` + tasksWhere + ` AND ` + taskStatus + ` IN ` + inProgressList + `
	    ) AS t
	    ANY LEFT JOIN (
	      SELECT org_id, room_id, actor_id AS assignee_id, time AS act_time
	      FROM bandplane.room_activity FINAL
	      WHERE kind = 'event' AND ` + is("org_id", varOrg) + `
	    ) AS a USING (org_id, room_id, assignee_id)
	    WHERE idle >= ` + itoa(stuckAfter) + `
	  ) AS stuck
	  ANY LEFT JOIN ` + agentLookup + ` USING (agent_id)
	) AS named
	ANY LEFT JOIN ` + roomLookup + ` USING (room_id)
	ORDER BY idle DESC, room, task
	LIMIT 200`)

	// Requests for a human's attention still open now (schema/work, Attention.Open):
	// open until the person it addresses (its first mention the directory knows as a
	// person; any person when none) posts a message in the room after it, or a task of the
	// room assigned to the agent that asked is updated after it (room_activity: a party's
	// latest message, and the latest task event of the room it was then assignee of).
	// Times are compared in milliseconds. people is a WITH inside the subquery (18.16
	// does not pass an outer WITH into subqueries); the three lookups are plain joins, not
	// lambdas over arrays: 18.16 prunes a subquery's column that only a lambda uses.
	openAttention = `(
	  SELECT org_id, room_id, event_id, asker_id, asker_handle, addressed_id, question, since
	  FROM (
	    SELECT org_id, room_id, event_id, asker_id, asker_handle, addressed_id, question, since, asked_ms, addressed_ms,
	      asker_task_ms
	    FROM (
	      SELECT org_id, room_id, event_id, asker_id, asker_handle, addressed_id, question, since, asked_ms, addressed_ms
	      FROM (
	        WITH (SELECT groupArray(id) FROM bandplane.directory FINAL WHERE kind = 'user' AND ` + is("org_id", varOrg) + `) AS people
	        SELECT org_id, room_id, event_id, asker_id, asker_handle, question, time AS since,
	          toUInt64(toUInt32(time)) * 1000 + time_ms AS asked_ms,
	          arrayFilter(m -> has(people, m), mentions)[1] AS addressed_id
	        FROM bandplane.attention FINAL
	        WHERE ` + is("org_id", varOrg) + ` AND ` + is("room_id", varRoom) + ` AND ` + is("asker_id", varAgent) + `
	          AND time >= now() - ` + attentionWindow + `
	      ) AS asks
	      ANY LEFT JOIN (
	        SELECT room_id, actor_id AS addressed_id, toUInt64(toUInt32(time)) * 1000 + time_ms AS addressed_ms
	        FROM bandplane.room_activity FINAL
	        WHERE kind = 'message' AND ` + is("org_id", varOrg) + `
	      ) AS replies USING (room_id, addressed_id)
	    ) AS with_reply
	    ANY LEFT JOIN (
	      SELECT room_id, actor_id AS asker_id, toUInt64(toUInt32(time)) * 1000 + time_ms AS asker_task_ms
	      FROM bandplane.room_activity FINAL
	      WHERE kind = 'task' AND ` + is("org_id", varOrg) + `
	    ) AS tasks_moved USING (room_id, asker_id)
	  ) AS with_task
	  ANY LEFT JOIN (
	    SELECT room_id, max(toUInt64(toUInt32(time)) * 1000 + time_ms) AS person_ms
	    FROM bandplane.room_activity FINAL
	    WHERE kind = 'message' AND actor_type = 'user' AND ` + is("org_id", varOrg) + `
	    GROUP BY room_id
	  ) AS people_replies USING (room_id)
	  WHERE if(addressed_id = '', person_ms, addressed_ms) <= asked_ms AND asker_task_ms <= asked_ms
	) AS open_asks`

	waitingSQL = sql(`
	SELECT ` + nameOr("room_name", "room_id") + ` AS room, asker, addressed_to, question, since, age, room_id, event_id
	FROM (
	  SELECT org_id, room_id, event_id, multiIf(agent_name != '', agent_name, asker_handle != '', concat('@', asker_handle), asker_id) AS asker,
	    addressed_to, question, since, age
	  FROM (
	    SELECT org_id, room_id, event_id, asker_id AS agent_id, asker_id, asker_handle,
	      if(actor_id = '', 'any person', ` + nameOr("actor_name", "actor_id") + `) AS addressed_to, question, since, age
	    FROM (
	      SELECT org_id, room_id, event_id, asker_id, asker_handle, addressed_id AS actor_id, question, since,
	        toInt64(now()) - toInt64(since) AS age
	      FROM ` + openAttention + `
	    ) AS o
	    ANY LEFT JOIN ` + actorLookup + ` USING (actor_id)
	  ) AS with_addressed
	  ANY LEFT JOIN ` + agentLookup + ` USING (agent_id)
	) AS with_asker
	ANY LEFT JOIN ` + roomLookup + ` USING (room_id)
	ORDER BY age DESC, room
	LIMIT 200`)

	waitingByRoomSQL = sql(`
	SELECT ` + nameOr("room_name", "room_id") + ` AS room, waiting, oldest_wait
	FROM (
	  SELECT org_id, room_id, count() AS waiting, max(toInt64(now()) - toInt64(since)) AS oldest_wait
	  FROM ` + openAttention + `
	  GROUP BY org_id, room_id
	) AS per_room
	ANY LEFT JOIN ` + roomLookup + ` USING (room_id)
	ORDER BY oldest_wait DESC, room
	LIMIT 30`)
)

// WorkStatus is "bandplane — Work status": tasks by status and room, the tasks that
// are stuck, and the requests waiting for a human, with their age.
func WorkStatus() *dashboard.DashboardBuilder {
	g := &grid{}
	d := newDashboard("bandplane — Work status", WorkUID,
		"Tasks (bandplane.tasks), requests for a human's attention (bandplane.attention) and room activity (bandplane.room_activity), as graph/README.md's work status reads them.",
		[]string{"work"}, "now-7d").
		Refresh("1m").
		WithVariable(orgVariable()).
		WithVariable(roomVariable()).
		WithVariable(agentVariable(false))

	d = d.WithPanel(barPanel(g, 8, 8, "Tasks by status", "Tasks updated in the range, by the status they have now.",
		tasksByStatusSQL, "task_status", "short"))
	d = d.WithPanel(tablePanel(g, 16, 8, "Tasks by room", "Tasks updated in the range per room and current status.",
		tasksByRoomSQL).
		OverrideByName("room", cellLink("Work in ${__data.fields.room}", roomLink("room_id"))).
		OverrideByName("room_id", hidden()))
	d = d.WithPanel(tablePanel(g, 24, 8, "Stuck tasks",
		"As of now, whatever the range: tasks in progress without activity (their update, or an event of the assignee in the room) for 15 minutes or more; idle in seconds.",
		stuckTasksSQL).
		OverrideByName("idle", unitOf("s")).
		OverrideByName("assignee", cellLink("Activity of ${__data.fields.assignee}", agentLink("agent_id"))).
		OverrideByName("task_id", hidden()).
		OverrideByName("room_id", hidden()).
		OverrideByName("agent_id", hidden()))
	d = d.WithPanel(tablePanel(g, 16, 9, "Waiting for a human",
		"As of now: requests for attention (last 30 days) that the person they address has not answered in the room, and no task of the asking agent moved since; age in seconds.",
		waitingSQL).
		OverrideByName("age", unitOf("s")).
		OverrideByName("room", cellLink("Work in ${__data.fields.room}", roomLink("room_id"))).
		OverrideByName("room_id", hidden()).
		OverrideByName("event_id", hidden()))
	d = d.WithPanel(barPanel(g, 8, 9, "Oldest wait per room", "Per room, the open requests for attention and the age of the oldest (seconds).",
		waitingByRoomSQL, "room", "s"))
	return d
}
