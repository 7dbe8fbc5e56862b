package dashboards

import (
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
)

// decisionsWhere selects the policy decisions (policy.decided; the agent decided about
// is the actor) of the selection in the range.
var decisionsWhere = `type = 'policy.decided'
	  AND ` + is("org_id", varOrg) + `
	  AND ` + is("actor_id", varAgent) + `
	  AND ` + is(decisionName, varDecision) + `
	  AND ` + timeFilter("time")

// eventMs orders two events of the same second (time has seconds, time_ms the rest).
const eventMs = "toUInt64(toUInt32(time)) * 1000 + time_ms"

// contactRequests is one row per contact request of the range, as its latest event left
// it. The platform sends contact.request_received and contact.request_updated on the
// recipient's channel (query/contacts.go): the actor is the recipient agent, owner_id its
// owner, org_id its organization; the requester is named by its handle only (a person,
// or owner/agent), matched to the directory without a leading @.
var contactRequests = `(
	  SELECT org_id, visitParamExtractString(data, 'request_id') AS request,
	    argMax(owner_id, ` + eventMs + `) AS recipient_owner,
	    argMax(visitParamExtractString(data, 'status'), ` + eventMs + `) AS status,
	    argMax(replaceRegexpOne(visitParamExtractString(data, 'from_handle'), '^@', ''), ` + eventMs + `) AS from_handle
	  FROM bandplane.events FINAL
	  WHERE type IN ('contact.request_received', 'contact.request_updated')
	    AND ` + is("org_id", varOrg) + ` AND ` + is("owner_id", varOwner) + ` AND ` + is("actor_id", varAgent) + `
	    AND ` + timeFilter("time") + `
	  GROUP BY org_id, request
	  HAVING request != ''
	) AS requests`

var (
	decisionsOverTimeSQL = sql(`
	SELECT ` + bucket("time") + ` AS bucket, if(` + decisionAllowed + ` = 1, 'allowed', 'denied') AS outcome, count() AS decisions
	FROM bandplane.events FINAL
	WHERE ` + decisionsWhere + `
	GROUP BY bucket, outcome
	ORDER BY bucket, outcome`)

	decisionsByReasonSQL = sql(`
	SELECT ` + decisionName + ` AS decision, if(` + decisionAllowed + ` = 1, 'allowed', 'denied') AS outcome,
	  ` + decisionCode + ` AS reason, count() AS decisions, uniqExact(actor_id) AS agents, max(time) AS last_decision
	FROM bandplane.events FINAL
	WHERE ` + decisionsWhere + `
	GROUP BY decision, outcome, reason
	ORDER BY decisions DESC, decision, outcome, reason`)

	denialsOverTimeSQL = sql(`
	SELECT ` + bucket("time") + ` AS bucket, ` + decisionCode + ` AS reason, count() AS denials
	FROM bandplane.events FINAL
	WHERE ` + decisionsWhere + ` AND ` + decisionAllowed + ` = 0
	GROUP BY bucket, reason
	ORDER BY bucket, reason`)

	contactFunnelSQL = sql(`
	SELECT count() AS requests, countIf(status = 'pending') AS pending, countIf(status = 'approved') AS approved,
	  countIf(status = 'rejected') AS rejected, countIf(status = 'cancelled') AS cancelled
	FROM ` + contactRequests)

	// By the recipient's owner and organization, with the requests that came from another
	// organization (the requester's handle is in the directory under another org).
	contactsByOwnerSQL = sql(`
	SELECT ` + nameOr("owner_name", "owner_id") + ` AS owner, organization, requests, pending, approved, rejected,
	  cancelled, from_other_orgs, org_id
	FROM (
	  SELECT owner_id, ` + nameOr("org_name", "org_id") + ` AS organization, requests, pending, approved, rejected,
	    cancelled, from_other_orgs, org_id
	  FROM (
	    SELECT org_id, recipient_owner AS owner_id, count() AS requests, countIf(status = 'pending') AS pending,
	      countIf(status = 'approved') AS approved, countIf(status = 'rejected') AS rejected,
	      countIf(status = 'cancelled') AS cancelled,
	      countIf(requester_org != '' AND requester_org != org_id) AS from_other_orgs
	    FROM (
	      SELECT org_id, recipient_owner, status, from_handle FROM ` + contactRequests + `
	    ) AS r
	    ANY LEFT JOIN (SELECT handle AS from_handle, any(org_id) AS requester_org
	      FROM bandplane.directory FINAL GROUP BY handle) AS requesters USING (from_handle)
	    GROUP BY org_id, owner_id
	  ) AS per_owner
	  ANY LEFT JOIN ` + orgLookup + ` USING (org_id)
	) AS named
	ANY LEFT JOIN ` + ownerLookup + ` USING (owner_id)
	ORDER BY requests DESC, owner`)

	// A cross-organization add: a participant.added whose participant (the subject) is
	// registered in another organization than the room's (rooms.org_id; the event's own
	// org_id is the participant's).
	crossOrgAdds = `(
	  SELECT at, room_org AS org_id, room_id, participant_id, participant_org, participant_name
	  FROM (
	    SELECT at, room_id, participant_id, participant_org, participant_name
	    FROM (
	      SELECT time AS at, room_id, subject_id AS participant_id
	      FROM bandplane.events FINAL
	      WHERE type = 'participant.added' AND ` + is("room_id", varRoom) + ` AND ` + is("subject_id", varAgent) + `
	        AND ` + timeFilter("time") + `
	    ) AS added
	    ANY LEFT JOIN (SELECT id AS participant_id, any(org_id) AS participant_org,
	        any(if(handle = '', '', concat('@', handle))) AS participant_name
	      FROM bandplane.directory FINAL GROUP BY id) AS parties USING (participant_id)
	  ) AS with_party
	  ANY LEFT JOIN (SELECT room_id, any(org_id) AS room_org FROM bandplane.rooms FINAL GROUP BY room_id) AS room_orgs
	    USING (room_id)
	  WHERE participant_org != '' AND room_org != '' AND participant_org != room_org
	    AND ` + isEither("room_org", "participant_org", varOrg) + `
	) AS cross_org`

	crossOrgSummarySQL = sql(`
	SELECT sum(adds) AS cross_org_adds, sum(refused) AS refused_without_contact
	FROM (
	  SELECT count() AS adds, toUInt64(0) AS refused FROM ` + crossOrgAdds + `
	  UNION ALL
	  SELECT toUInt64(0) AS adds, count() AS refused
	  FROM bandplane.events FINAL
	  WHERE ` + decisionsWhere + ` AND ` + decisionCode + ` = 'cross_org_requires_contact'
	) AS both_kinds`)

	crossOrgAddsSQL = sql(`
	SELECT at, ` + nameOr("room_name", "room_id") + ` AS room, ` + nameOr("participant_name", "participant_id") + ` AS participant,
	  from_org, into_org, room_id
	FROM (
	  SELECT at, org_id, room_id, participant_id, participant_name, from_org, ` + nameOr("org_name", "org_id") + ` AS into_org
	  FROM (
	    SELECT at, org_id, room_id, participant_id, participant_name, ` + nameOr("org_name", "participant_org") + ` AS from_org
	    FROM ` + crossOrgAdds + `
	    ANY LEFT JOIN (SELECT org_id AS participant_org, org_name FROM (` + orgNames + `) AS o) AS participant_orgs USING (participant_org)
	  ) AS with_from
	  ANY LEFT JOIN ` + orgLookup + ` USING (org_id)
	) AS with_into
	ANY LEFT JOIN ` + roomLookup + ` USING (room_id)
	ORDER BY at DESC, room, participant
	LIMIT 200`)

	revisionsOverTimeSQL = sql(`
	SELECT ` + bucket("time") + ` AS bucket, ` + decisionRevision + ` AS revision, count() AS decisions
	FROM bandplane.events FINAL
	WHERE ` + decisionsWhere + `
	GROUP BY bucket, revision
	ORDER BY bucket, revision`)

	revisionsSQL = sql(`
	SELECT ` + decisionRevision + ` AS revision, min(time) AS first_decision, max(time) AS last_decision,
	  count() AS decisions, countIf(` + decisionAllowed + ` = 0) AS denied
	FROM bandplane.events FINAL
	WHERE ` + decisionsWhere + `
	GROUP BY revision
	ORDER BY last_decision DESC, revision`)
)

// Governance is "bandplane — Governance": what the policies decided and why, how contact
// requests across owners and organizations end, which participants came from another
// organization, and which policy revision was deciding when.
func Governance() *dashboard.DashboardBuilder {
	g := &grid{}
	d := newDashboard("bandplane — Governance", GovernanceUID,
		"Policy decisions (policy.decided), contact requests, cross-organization adds and policy revisions, from the audit trail (bandplane.events).",
		[]string{"governance"}, "now-7d").
		WithVariable(orgVariable()).
		WithVariable(ownerVariable()).
		WithVariable(agentVariable(false)).
		WithVariable(roomVariable()).
		WithVariable(decisionVariable())

	d = d.WithPanel(timeSeriesPanel(g, 12, 8, "Decisions allowed and denied", "Policy decisions per interval and outcome.",
		decisionsOverTimeSQL, "short", "${__field.labels.outcome}", "1m", true))
	d = d.WithPanel(timeSeriesPanel(g, 12, 8, "Denials by reason", "Denied decisions per interval and first reason code.",
		denialsOverTimeSQL, "short", "${__field.labels.reason}", "1m", true))
	d = d.WithPanel(tablePanel(g, 24, 9, "Decisions by decision and reason",
		"Every decision and outcome with its first reason code (policy/README.md lists them), how often, for how many agents, and when last.",
		decisionsByReasonSQL))
	d = d.WithPanel(statPanel(g, 12, 5, "Contact-request funnel",
		"Contact requests of the range by their latest status: pending → approved, rejected or cancelled (the last three are final).",
		contactFunnelSQL, "short").
		ColorMode(common.BigValueColorModeValue))
	d = d.WithPanel(statPanel(g, 12, 5, "Cross-organization adds and refusals",
		"Participants added to a room of another organization than their own, and add_participant decisions refused for want of an approved contact (cross_org_requires_contact).",
		crossOrgSummarySQL, "short"))
	d = d.WithPanel(tablePanel(g, 12, 9, "Contact requests by owner",
		"Per recipient owner and organization: requests by latest status, and those from people or agents of another organization.",
		contactsByOwnerSQL).
		OverrideByName("organization", cellLink("Cost of ${__data.fields.organization}", orgLink("org_id"))).
		OverrideByName("org_id", hidden()))
	d = d.WithPanel(tablePanel(g, 12, 9, "Cross-organization adds",
		"Participants added from another organization, newest first.",
		crossOrgAddsSQL).
		OverrideByName("room", cellLink("Work in ${__data.fields.room}", roomLink("room_id"))).
		OverrideByName("room_id", hidden()))
	d = d.WithPanel(timeSeriesPanel(g, 16, 8, "Policy revisions in force", "Decisions per interval by the policy bundle revision (hash) that made them.",
		revisionsOverTimeSQL, "short", "${__field.labels.revision}", "1m", true))
	d = d.WithPanel(tablePanel(g, 8, 8, "Policy revisions", "Each revision's first and last decision in the range; the top one decides now.",
		revisionsSQL))
	return d
}
