package policy

import (
	"errors"

	"github.com/open-policy-agent/opa/v1/ast"
)

// Facts are what the engine adds to the input of the two decisions that run on every
// add and every message, add_participant and send_message, as input.facts: the
// directory records of the ids the request names, their room membership and their
// contact, read from the Go model under one read lock (see policy/README.md).
//
// Why: OPA resolves each data.directory reference through its store, which costs
// about 5 µs per lookup on a 2-vCPU machine; the same values in the input cost a
// fraction of that (see policy/README.md for the figures). The policies stay the
// authority: they decide from the facts, and may still read data.directory for
// anything else. A caller cannot supply facts: an input that carries "facts" is
// refused.
//
// add_participant: input.facts = {
//	"actor":       record,
//	"participant": record,
//	"actor_in_room", "participant_in_room", "contact": booleans,
// }
// send_message: input.facts = {"agent": record (kind "unknown" unless an agent), "in_room": boolean,
//	"chain_valid"?: true}
//
// chain_valid is set when the engine built the input from a typed MessageInput whose
// Chain passed Chain.Validate (the HTTP API's rules, which the policy's own check of a
// chain agrees with: TestLoopGuardAgreesWithTheReference): the policy then skips its
// check of the chain, a dozen comparisons on every message.
//
// A record is data.directory.agents[id] or data.directory.people[id] with "kind":
// "agent" or "person" added, or {"kind": "unknown"} for an id the directory does not
// know (and for an id that is not a non-empty string).

var (
	factsKey              = ast.InternedTerm("facts")
	factActor             = ast.InternedTerm("actor")
	factParticipant       = ast.InternedTerm("participant")
	factActorInRoom       = ast.InternedTerm("actor_in_room")
	factParticipantInRoom = ast.InternedTerm("participant_in_room")
	factContact           = ast.InternedTerm("contact")
	factAgent             = ast.InternedTerm("agent")
	factInRoom            = ast.InternedTerm("in_room")
	factChainValid        = ast.InternedTerm("chain_valid")
	keyRoom               = ast.InternedTerm("room")
)

var errCallerFacts = errors.New("input.facts is reserved for the facts the engine adds from the directory; remove it from the input")

// withFacts returns the input of decision name with its facts added. Other decisions,
// and inputs that are not objects (the policy denies them as invalid), pass unchanged.
// An owned input (built for this decision) gets the facts inserted; any other is copied
// first, so a caller's value is never modified. chainValid says the input's chain was
// checked in Go.
func (d *Directory) withFacts(name string, v ast.Value, owned, chainValid bool) (ast.Value, error) {
	if name != AddParticipant && name != SendMessage {
		return v, nil
	}
	in, ok := v.(ast.Object)
	if !ok {
		return v, nil
	}
	if in.Get(factsKey) != nil {
		return nil, errCallerFacts
	}
	var facts *ast.Term
	if name == AddParticipant {
		facts = d.addFacts(stringAt(in, factActor), stringAt(in, keyRoom), stringAt(in, factParticipant))
	} else {
		facts = d.messageFacts(stringAt(in, factAgent), stringAt(in, keyRoom), chainValid)
	}
	if !owned {
		out := ast.NewObjectWithCapacity(in.Len() + 1)
		in.Foreach(func(k, v *ast.Term) { out.Insert(k, v) })
		in = out
	}
	in.Insert(factsKey, facts)
	return in, nil
}

func (d *Directory) addFacts(actor, room, participant string) *ast.Term {
	d.mu.RLock()
	defer d.mu.RUnlock()
	members := d.rooms[room]
	return ast.ObjectTerm(
		ast.Item(factActor, d.record(actor)),
		ast.Item(factParticipant, d.record(participant)),
		ast.Item(factActorInRoom, ast.InternedTerm(members[actor])),
		ast.Item(factParticipantInRoom, ast.InternedTerm(members[participant])),
		ast.Item(factContact, ast.InternedTerm(d.contacts[actor][participant])),
	)
}

func (d *Directory) messageFacts(agent, room string, chainValid bool) *ast.Term {
	d.mu.RLock()
	defer d.mu.RUnlock()
	rec := unknownRecord
	if _, ok := d.agents[agent]; ok {
		rec = d.records[agent]
	}
	o := ast.NewObject(
		ast.Item(factAgent, rec),
		ast.Item(factInRoom, ast.InternedTerm(d.rooms[room][agent])),
	)
	if chainValid {
		o.Insert(factChainValid, ast.InternedTerm(true))
	}
	return ast.NewTerm(o)
}

// chainChecked says whether input is a typed send_message input whose chain passes
// Chain.Validate.
func chainChecked(input any) bool {
	var c *Chain
	switch in := input.(type) {
	case MessageInput:
		c = in.Chain
	case *MessageInput:
		c = in.Chain
	}
	return c != nil && c.Validate() == nil
}

// unknownRecord is the record of an id the directory does not know: the policies test
// kind == "unknown" rather than negate a missing record, which costs OPA a sub-query.
var unknownRecord = ast.ObjectTerm(ast.Item(ast.InternedTerm("kind"), ast.InternedTerm("unknown")))

// record is the id's facts record; d.mu must be held.
func (d *Directory) record(id string) *ast.Term {
	if t := d.records[id]; t != nil {
		return t
	}
	return unknownRecord
}

// stringAt is in[key] when it is a string, else "" (no directory id is empty).
func stringAt(in ast.Object, key *ast.Term) string {
	if t := in.Get(key); t != nil {
		if s, ok := t.Value.(ast.String); ok {
			return string(s)
		}
	}
	return ""
}

// agentRecord and personRecord are the facts' records: the store documents with kind.
// They are built once per change and shared, read-only, by every decision.
func agentRecord(a Agent) *ast.Term {
	return ast.ObjectTerm(
		ast.Item(ast.InternedTerm("kind"), ast.InternedTerm("agent")),
		ast.Item(ast.InternedTerm("id"), ast.StringTerm(a.ID)),
		ast.Item(ast.InternedTerm("handle"), ast.StringTerm(a.Handle)),
		ast.Item(ast.InternedTerm("owner"), ast.StringTerm(a.Owner)),
		ast.Item(ast.InternedTerm("org"), ast.StringTerm(a.Org)),
		ast.Item(ast.InternedTerm("model"), ast.StringTerm(a.Model)),
		ast.Item(ast.InternedTerm("registry_access"), ast.InternedTerm(a.RegistryAccess)),
		ast.Item(ast.InternedTerm("shared_with_org"), ast.InternedTerm(a.SharedWithOrg)),
		ast.Item(ast.InternedTerm("global"), ast.InternedTerm(a.Global)),
		ast.Item(ast.InternedTerm("listed"), ast.InternedTerm(a.Listed)),
		ast.Item(ast.InternedTerm("suspended"), ast.InternedTerm(a.IsSuspended())),
	)
}

func personRecord(p Person) *ast.Term {
	return ast.ObjectTerm(
		ast.Item(ast.InternedTerm("kind"), ast.InternedTerm("person")),
		ast.Item(ast.InternedTerm("id"), ast.StringTerm(p.ID)),
		ast.Item(ast.InternedTerm("handle"), ast.StringTerm(p.Handle)),
		ast.Item(ast.InternedTerm("org"), ast.StringTerm(p.Org)),
	)
}
