// Package policy owns bandplane's governance decisions: the Rego bundle (rego/, Rego v1,
// embedded), the OPA engine that evaluates it, the directory replica the policies read,
// and the limiter and spend tracker that enforce send_message quotas.
//
// Decisions (data.bandplane.<name>.decision) and their inputs:
//
//	peer_visible    {agent, room?, candidate?}  with candidate: allow, is_contact, reason;
//	                                            without: peers (id, kind, handle, is_contact, reason)
//	add_participant {actor, room, participant}  allow, is_contact, reason; first failed check on deny
//	contact_request {from, handle}              allow, status, http_status, code, message, recipient, request_id
//	send_message    {agent, room, tokens?, cost_micros?, execution_id?, chain?}
//	                                            allow, owner, org, quota (or a loop deny); then Go
//	                                            enforces rates and budgets (the chain's initiator's
//	                                            too) and sets retry_after_ms
//
// Every Decision carries a decision id, allow, reasons (code and message) and the policy
// revision (sha256 of the bundle files). Deny by default: an evaluation error or an
// undefined result is a deny with reason eval_error or undefined. See README.md for the
// data layout, the directory file format and examples.
//
// It may import schema/ and its own folder's packages only; ingest/, policy/ and query/
// stand side by side and never import each other (deploy/layers).
package policy
