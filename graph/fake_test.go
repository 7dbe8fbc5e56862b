package graph_test

import (
	"context"

	"github.com/bandplane/bandplane/query"
)

// The rest of graph.Querier: each validates like the real one and answers empty (or
// what the test set), so the API's error messages are the query package's.

func (f *fakeQuerier) UsageSeries(_ context.Context, q query.SeriesQuery) ([]query.Series, error) {
	if err := q.Validate(); err != nil {
		return nil, err
	}
	return []query.Series{}, f.err
}

func (f *fakeQuerier) Delegation(_ context.Context, q query.DelegationQuery) (query.Delegation, error) {
	if err := q.Validate(); err != nil {
		return query.Delegation{}, err
	}
	return query.Delegation{Hops: []query.Hop{}, Triggered: []query.Hop{}}, f.err
}

func (f *fakeQuerier) CrossOwnerSpend(_ context.Context, q query.CrossOwnerQuery) (query.CrossOwnerSpend, error) {
	if err := q.Validate(); err != nil {
		return query.CrossOwnerSpend{}, err
	}
	return query.CrossOwnerSpend{CausedByOthers: []query.CostRow{}, CausedForOthers: []query.CostRow{}}, f.err
}

func (f *fakeQuerier) ChattyAgents(_ context.Context, q query.ChattyQuery) ([]query.ChattyAgent, error) {
	return []query.ChattyAgent{}, f.err
}

func (f *fakeQuerier) RoomNames(_ context.Context, orgID string, ids []string) (map[string]string, error) {
	return map[string]string{}, nil
}

func (f *fakeQuerier) ContactRequests(_ context.Context, q query.ContactQuery) (query.ContactPage, error) {
	return query.ContactPage{Requests: []query.ContactRequest{}}, f.err
}

func (f *fakeQuerier) PolicyDecisions(_ context.Context, q query.DecisionQuery) (query.DecisionPage, error) {
	return query.DecisionPage{Decisions: []query.PolicyDecision{}}, f.err
}

func (f *fakeQuerier) WorkStatus(_ context.Context, q query.WorkQuery) (query.WorkStatus, error) {
	return query.WorkStatus{Rooms: []query.RoomWork{}}, f.err
}

func (f *fakeQuerier) Agents(_ context.Context, q query.AgentQuery) ([]query.Agent, error) {
	return []query.Agent{}, f.err
}

func (f *fakeQuerier) Rooms(_ context.Context, q query.RoomQuery) ([]query.Room, error) {
	return []query.Room{}, f.err
}
