package policy_test

import (
	"context"
	"fmt"

	"github.com/bandplane/bandplane/policy"
)

// Architect Agent finds its sibling Reviewer Agent and adds it to the Webhook Retries
// room; the partner's Reviewer Agent needs an approved contact first.
func ExampleEngine_Decide() {
	ctx := context.Background()
	snap, err := policy.LoadDirectoryFile("testdata/directory.json")
	if err != nil {
		panic(err)
	}
	dir := policy.NewDirectory()
	if err := dir.Load(ctx, snap); err != nil {
		panic(err)
	}
	engine, err := policy.New(ctx, policy.Config{Directory: dir})
	if err != nil {
		panic(err)
	}

	peers, _ := engine.Decide(ctx, policy.PeerVisible, policy.PeerInput{Agent: "a-architect", Room: "room-webhook-retries"})
	for _, p := range peers.Peers {
		fmt.Println("peer", p.Handle, p.Reason, p.IsContact)
	}
	add, _ := engine.Decide(ctx, policy.AddParticipant, policy.AddInput{Actor: "a-architect", Room: "room-webhook-retries", Participant: "a-reviewer"})
	fmt.Println("add reviewer:", add.Allow, add.Via)
	add, _ = engine.Decide(ctx, policy.AddParticipant, policy.AddInput{Actor: "a-architect", Room: "room-webhook-retries", Participant: "a-partner-reviewer"})
	fmt.Println("add partner reviewer:", add.Allow, add.Reasons[0].Code)
	req, _ := engine.Decide(ctx, policy.ContactRequest, policy.ContactInput{From: "a-architect", Handle: "@partner/reviewer-agent"})
	fmt.Println("contact request:", req.HTTPStatus, req.Message)
	// Output:
	// peer alice/reviewer-agent sibling false
	// peer band/search-agent global false
	// peer bob/security-agent org_shared false
	// add reviewer: true sibling
	// add partner reviewer: false not_peer
	// contact request: 409 A pending request already exists for @partner/reviewer-agent
}
