package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/bandplane/bandplane/policy/api"
	"github.com/bandplane/bandplane/query"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/directory"
)

func init() {
	registerGroup("agents", "bind OpenTelemetry senders' identities to directory agents (bind, unbind, list)", agentsUsage,
		map[string]runFunc{"bind": agentsBind, "unbind": agentsUnbind, "list": agentsList})
}

const agentsUsage = `usage: bandplane agents <bind|unbind|list> [flags]

  bind --org ORG --agent AGENT_ID (--service NAME | --agent-key VALUE)
                                 attribute the spans of ORG's OpenTelemetry senders whose
                                 service.name is NAME (or whose gen_ai.agent.id is VALUE) to
                                 the agent, a registered agent of ORG; prints the change
  unbind --org ORG (--service NAME | --agent-key VALUE)
                                 remove that binding; prints the change
  list --org ORG [--table]       the bindings in force, from the trail in ClickHouse

A span counts for an agent only through a binding an operator made, never by a name
its sender chooses. Each change is an agent.bound or agent.unbound event on the events
topic: every serve's policy side applies it within a second, and it is in the audit
trail.
Run 'bandplane agents <command> -h' for its flags.
`

func agentFlagError(e *env, cmd, format string, args ...any) error {
	fmt.Fprintf(e.stderr, "bandplane agents %s: %s\n", cmd, fmt.Sprintf(format, args...))
	return exitError{code: 2}
}

// identityFlags name the sender's identity a binding is about: exactly one of them.
type identityFlags struct{ service, agentKey string }

func (f *identityFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.service, "service", "", "the senders' OpenTelemetry resource attribute service.name (or --agent-key)")
	fs.StringVar(&f.agentKey, "agent-key", "", "the senders' span attribute gen_ai.agent.id (or --service)")
}

// identity is the binding's kind and value, and the flag that gave it; problem says
// what is wrong with the flags otherwise.
func (f *identityFlags) identity() (kind, value, flagName, problem string) {
	switch {
	case f.service != "" && f.agentKey != "":
		return "", "", "", "--service and --agent-key: give one of them, not both"
	case f.service != "":
		return schema.BindingService, f.service, "--service", ""
	case f.agentKey != "":
		return schema.BindingAgent, f.agentKey, "--agent-key", ""
	}
	return "", "", "", "--service or --agent-key is required"
}

// bindingEvent is the agent.bound or agent.unbound event of a CLI change, recorded as
// the --by name (cliKey), like a budget's.
func bindingEvent(typ, org string, d schema.BindingData, by string, now time.Time) schema.Event {
	now = now.UTC().Truncate(time.Millisecond)
	data, _ := json.Marshal(d)
	ev := schema.Event{
		ID: bindingEventID(typ, org, d, now), Type: typ, Time: now, OrgID: org,
		Actor:  schema.Party{ID: cliKey(by).ID, Type: schema.ActorSystem},
		Source: api.SourcePolicy, SchemaVersion: schema.Version, Data: data,
	}
	if d.AgentID != "" {
		ev.Subject = &schema.Party{ID: d.AgentID, Type: schema.ActorAgent}
	}
	return ev
}

// bindingEventID is readable where it fits an id (binding-<org>-<kind>-<value>-<agent>-<unix ms>,
// unbinding-… for an unbinding), and a digest of the same parts where it does not. The
// agent is part of it: two binds of one identity in the same millisecond are two
// events, which every reader orders alike by id (directory.ApplyBinding).
func bindingEventID(typ, org string, d schema.BindingData, at time.Time) string {
	prefix := "binding"
	if typ == schema.TypeAgentUnbound {
		prefix = "unbinding"
	}
	ms := strconv.FormatInt(at.UnixMilli(), 10)
	id := prefix + "-" + org + "-" + d.Kind + "-" + d.Value + "-" + d.AgentID + "-" + ms
	if len(id) <= schema.MaxIDBytes {
		return id
	}
	sum := sha256.Sum256([]byte(org + "\x00" + d.Kind + "\x00" + d.Value + "\x00" + d.AgentID))
	return prefix + "-" + hex.EncodeToString(sum[:16]) + "-" + ms
}

// checkBindingFlags validates the event a change writes and reports what is wrong as
// the flag that gave it.
func checkBindingFlags(e *env, cmd string, ev *schema.Event, d schema.BindingData, valueFlag string) error {
	// The id is made of the other parts: checked with a plain one, a wrong part is
	// reported as its own flag rather than as the id.
	probe := *ev
	probe.ID = "binding"
	err := d.ValidateFor(ev.Type)
	if err == nil {
		err = probe.Validate()
	}
	if err == nil {
		err = ev.Validate()
	}
	if err == nil {
		return nil
	}
	var fe *schema.FieldError
	if errors.As(err, &fe) {
		switch fe.Field {
		case "org_id":
			return agentFlagError(e, cmd, "--org: %s", fe.Reason)
		case "data.value":
			return agentFlagError(e, cmd, "%s: %s", valueFlag, fe.Reason)
		case "data.agent_id", "subject.id":
			return agentFlagError(e, cmd, "--agent: %s", fe.Reason)
		}
	}
	return agentFlagError(e, cmd, "%v", err)
}

// bindingChange is what bind and unbind print: the event written and its binding.
type bindingChange struct {
	EventID string `json:"event_id"`
	Type    string `json:"type"`
	Org     string `json:"org"`
	schema.BindingData
	Handle string    `json:"handle,omitempty"`
	Time   time.Time `json:"time"`
}

func agentsBind(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "agents bind", "--org ORG --agent AGENT_ID (--service NAME | --agent-key VALUE) [flags]")
	var kf keysFlags
	kf.register(fs)
	var idf identityFlags
	idf.register(fs)
	org := fs.String("org", "", "organization of the binding and of its agent; required")
	agent := fs.String("agent", "", "id of the directory agent the senders' spans count for (a registered agent of --org); required")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return agentFlagError(e, "bind", "unexpected argument %q", pos[0])
	}
	if *org == "" {
		return agentFlagError(e, "bind", "--org is required")
	}
	if *agent == "" {
		return agentFlagError(e, "bind", "--agent is required")
	}
	kind, value, valueFlag, problem := idf.identity()
	if problem != "" {
		return agentFlagError(e, "bind", "%s", problem)
	}
	d := schema.BindingData{Kind: kind, Value: value, AgentID: *agent}
	ev := bindingEvent(schema.TypeAgentBound, *org, d, kf.by, time.Now())
	if err := checkBindingFlags(e, "bind", &ev, d, valueFlag); err != nil {
		return err
	}
	conn, err := kf.stack.openDB(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	names, err := query.New(conn, kf.stack.ch.Database).Names(ctx, *org, []string{*agent})
	if err != nil {
		return err
	}
	p, ok := names[*agent]
	if !ok || p.Kind != directory.KindAgent {
		return fmt.Errorf("cannot bind: agent %q is not registered in organization %s", *agent, *org)
	}
	if err := produceOwn(ctx, &kf.stack, kf.partitions, ev); err != nil {
		return fmt.Errorf("cannot record the binding on %s (it is not made): %w", kf.stack.topic, err)
	}
	return printJSON(e.stdout, bindingChange{EventID: ev.ID, Type: ev.Type, Org: ev.OrgID, BindingData: d, Handle: p.Handle, Time: ev.Time})
}

func agentsUnbind(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "agents unbind", "--org ORG (--service NAME | --agent-key VALUE) [flags]")
	var kf keysFlags
	kf.register(fs)
	var idf identityFlags
	idf.register(fs)
	org := fs.String("org", "", "organization of the binding; required")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return agentFlagError(e, "unbind", "unexpected argument %q", pos[0])
	}
	if *org == "" {
		return agentFlagError(e, "unbind", "--org is required")
	}
	kind, value, valueFlag, problem := idf.identity()
	if problem != "" {
		return agentFlagError(e, "unbind", "%s", problem)
	}
	d := schema.BindingData{Kind: kind, Value: value}
	probe := bindingEvent(schema.TypeAgentUnbound, *org, d, kf.by, time.Now())
	if err := checkBindingFlags(e, "unbind", &probe, d, valueFlag); err != nil {
		return err
	}
	conn, err := kf.stack.openDB(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	// The trail names the agent the unbinding ends, for the audit record. A binding it
	// does not show (not stored yet, or never made) is unbound all the same: the
	// tombstone outranks every older bind, wherever a reader meets it.
	inForce, _, err := trailBindings(ctx, conn, kf.stack.ch.Database, *org)
	if err != nil {
		return err
	}
	for _, b := range inForce {
		if b.Kind == kind && b.Value == value {
			d.AgentID = b.AgentID
		}
	}
	if d.AgentID == "" {
		fmt.Fprintf(e.stderr, "bandplane agents unbind: the trail shows no binding of %s %q in organization %s; recording the unbinding anyway\n", kind, value, *org)
	}
	ev := bindingEvent(schema.TypeAgentUnbound, *org, d, kf.by, time.Now())
	if err := produceOwn(ctx, &kf.stack, kf.partitions, ev); err != nil {
		return fmt.Errorf("cannot record the unbinding on %s (the binding stays): %w", kf.stack.topic, err)
	}
	return printJSON(e.stdout, bindingChange{EventID: ev.ID, Type: ev.Type, Org: ev.OrgID, BindingData: d, Time: ev.Time})
}

// trailBindings reads org's binding events from the audit trail in ClickHouse and
// folds them as the policy replica does (directory.ApplyBinding, bandplane's sources
// only); skipped counts the events it refused.
func trailBindings(ctx context.Context, conn driver.Conn, db, org string) (inForce []directory.Binding, skipped int, err error) {
	q := query.New(conn, db)
	var events []query.Event
	aq := query.AuditQuery{OrgID: org, Types: []string{schema.TypeAgentBound, schema.TypeAgentUnbound}, Limit: query.MaxAuditLimit}
	for {
		page, err := q.AuditEvents(ctx, aq)
		if err != nil {
			return nil, 0, fmt.Errorf("cannot read the bindings of organization %s: %w", org, err)
		}
		events = append(events, page.Events...)
		if page.NextCursor == "" {
			break
		}
		aq.Before = page.NextCursor
	}
	inForce, skipped = foldBindings(org, events)
	return inForce, skipped, nil
}

// foldBindings applies stored binding events of org to a directory of their own and
// returns the bindings in force, whether or not their agent is registered.
func foldBindings(org string, events []query.Event) (inForce []directory.Binding, skipped int) {
	d := directory.New()
	for i := range events {
		ev := eventOfStored(&events[i])
		if ev.OrgID != org || !schema.OwnSource(ev.Source) || d.ApplyBinding(&ev) != nil {
			skipped++
		}
	}
	return d.Bindings(org), skipped
}

func eventOfStored(r *query.Event) schema.Event {
	ev := schema.Event{ID: r.ID, Type: r.Type, Time: r.Time, OrgID: r.OrgID, RoomID: r.RoomID,
		Actor:  schema.Party{ID: r.ActorID, Type: schema.ActorType(r.ActorType), Handle: r.ActorHandle},
		Source: r.Source, SchemaVersion: int(r.SchemaVersion), Data: json.RawMessage(r.Data)}
	if r.SubjectID != "" {
		ev.Subject = &schema.Party{ID: r.SubjectID, Type: schema.ActorType(r.SubjectType), Handle: r.SubjectHandle}
	}
	return ev
}

// listedBinding is one line of agents list: the binding, and its agent's handle and
// name where the organization's directory has them (none: the agent is not registered
// there, and the binding attributes nothing).
type listedBinding struct {
	directory.Binding
	Handle string `json:"handle,omitempty"`
	Name   string `json:"name,omitempty"`
}

func agentsList(ctx context.Context, e *env, args []string) error {
	fs := newFlagSet(e, "agents list", "--org ORG [--table] [flags]")
	var st stackFlags
	st.register(fs)
	org := fs.String("org", "", "organization whose bindings to list; required")
	table := fs.Bool("table", false, "print a table instead of one JSON line per binding")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return agentFlagError(e, "list", "unexpected argument %q", pos[0])
	}
	if *org == "" {
		return agentFlagError(e, "list", "--org is required")
	}
	conn, err := st.openDB(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	inForce, skipped, err := trailBindings(ctx, conn, st.ch.Database, *org)
	if err != nil {
		return err
	}
	if skipped > 0 {
		fmt.Fprintf(e.stderr, "bandplane agents list: ignored %d binding events that are not bandplane's or cannot be applied\n", skipped)
	}
	list, err := nameBindings(ctx, query.New(conn, st.ch.Database), *org, inForce)
	if err != nil {
		return err
	}
	return printBindings(e, list, *table)
}

// nameBindings adds the agents' handles and names from org's directory.
func nameBindings(ctx context.Context, q *query.Querier, org string, inForce []directory.Binding) ([]listedBinding, error) {
	out := make([]listedBinding, len(inForce))
	for start := 0; start < len(inForce); start += query.MaxNames {
		part := inForce[start:min(start+query.MaxNames, len(inForce))]
		ids := make([]string, len(part))
		for i, b := range part {
			ids[i] = b.AgentID
		}
		names, err := q.Names(ctx, org, ids)
		if err != nil {
			return nil, err
		}
		for i, b := range part {
			out[start+i] = listedBinding{Binding: b}
			if p, ok := names[b.AgentID]; ok && p.Kind == directory.KindAgent {
				out[start+i].Handle, out[start+i].Name = p.Handle, p.Name
			}
		}
	}
	return out, nil
}

func printBindings(e *env, list []listedBinding, table bool) error {
	if !table {
		for _, b := range list {
			if err := printJSON(e.stdout, b); err != nil {
				return err
			}
		}
		return nil
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KIND\tVALUE\tAGENT\tHANDLE\tNAME\tBOUND")
	for _, b := range list {
		handle, name := "-", "-"
		if b.Handle != "" {
			handle = "@" + b.Handle
		}
		if b.Name != "" {
			name = b.Name
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", b.Kind, b.Value, b.AgentID, handle, name, b.Time.Format(time.RFC3339))
	}
	return tw.Flush()
}
