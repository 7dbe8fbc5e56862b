package graph

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/99designs/gqlgen/graphql"
	"github.com/99designs/gqlgen/graphql/errcode"
	"github.com/coder/websocket"
	"github.com/vektah/gqlparser/v2/gqlerror"

	"github.com/bandplane/bandplane/schema/keys"
	"github.com/bandplane/bandplane/schema/share"
)

// GraphQL over WebSocket: graphql-transport-ws, and graphql-ws (the older
// subscriptions-transport-ws protocol, also taken when a client names none), on
// coder/websocket. Queries and mutations sent over a connection run through gqlgen as
// over HTTP. A subscription to the live hub is delivered differently, because one
// change may go to thousands of subscribers:
//
//   - gqlgen renders a change once per render group: the subscriptions of one
//     selection set and variables, of one organization and role (renderGroup). Every
//     subscriber of the group is sent the same bytes.
//   - Each subscriber's frames are built in a buffer of its own, reused from change to
//     change, and written by its own goroutine, so one that reads slowly delays nobody
//     else. The hub's buffer of 256 changes (--graphql-subscriber-buffer) is its queue:
//     past it the subscription ends with SLOW_SUBSCRIBER; a write the peer does not
//     take within WebSocketWriteTimeout closes the connection.
//   - The subscriptions share WebSocketWritesPerSecond: each waits for its share
//     after a write, and the changes queued by then go out together (wscork.go).

// The subprotocols, in the order the server prefers them.
const (
	protoTransportWS = "graphql-transport-ws"
	protoGraphQLWS   = "graphql-ws"
)

// wsReadLimit bounds one message a client sends, in bytes.
const wsReadLimit = 1 << 20

// keepAliveEvery is how often graphql-ws connections get a "ka" message, which its
// clients expect.
const keepAliveEvery = 10 * time.Second

// Close codes: graphql-transport-ws's, and bandplane's own in the 4000s for refused
// connections (admitInit).
const (
	closeBadMessage   = 4400
	closeUnauthorized = 4401
	closeInitTimeout  = 4408
	closeDuplicateID  = 4409
	closeTooManyInits = 4429
)

// wsTransport is the gqlgen transport of WebSocket upgrades.
type wsTransport struct {
	auth    keys.Holder
	sockets *share.Pool // the authenticated connections' slots (admitInit)
	limits  Limits
	origins []string
	log     *slog.Logger
	groups  renderGroups
	hub     *Hub // counts the renders (nil: no live updates)
	// delivering counts the hub subscriptions being delivered, which share
	// limits.WebSocketWritesPerSecond.
	delivering atomic.Int64
}

// writeGap is the least time a subscription leaves between its writes: its share of
// limits.WebSocketWritesPerSecond.
func (t *wsTransport) writeGap() time.Duration {
	return time.Duration(t.delivering.Load()) * time.Second / time.Duration(t.limits.WebSocketWritesPerSecond)
}

var _ graphql.Transport = (*wsTransport)(nil)

func (t *wsTransport) Supports(r *http.Request) bool {
	upgrade, _ := upgradeTokens(r.Header)
	return upgrade
}

func (t *wsTransport) Do(w http.ResponseWriter, r *http.Request, exec graphql.GraphExecutor) {
	cw := &corkingWriter{ResponseWriter: w}
	ws, err := websocket.Accept(cw, r, &websocket.AcceptOptions{Subprotocols: []string{protoTransportWS, protoGraphQLWS},
		OriginPatterns: t.origins})
	if err != nil {
		return // Accept answered the request
	}
	ws.SetReadLimit(wsReadLimit)
	c := &wsConn{t: t, ws: ws, cork: cw.conn, exec: exec, legacy: !strings.EqualFold(ws.Subprotocol(), protoTransportWS), headers: r.Header,
		ops: map[string]*wsOp{}}
	c.serve(r.Context())
}

// frame is a message of either protocol.
type frame struct {
	ID      string          `json:"id,omitempty"`
	Type    string          `json:"type"`
	Payload json.RawMessage `json:"payload,omitempty"`
}

// wsConn is one connection.
type wsConn struct {
	t       *wsTransport
	ws      *websocket.Conn
	cork    *corkConn // ws's connection (wscork.go)
	exec    graphql.GraphExecutor
	legacy  bool // graphql-ws
	headers http.Header

	// wmu orders the connection's writes; writing is when the write in progress
	// started (Unix ns, 0: none), for the watchdog.
	wmu     sync.Mutex
	writing atomic.Int64
	closing atomic.Bool // a close handshake has started: the socket is its

	mu  sync.Mutex
	ops map[string]*wsOp // running operations by id
	wg  sync.WaitGroup
}

func (c *wsConn) serve(ctx context.Context) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	var release func() // the connection's slot, once its init is admitted
	defer func() {
		cancel()
		// Closed before waiting for the operations: one may be stuck writing to a peer
		// that reads nothing (a close handshake in progress closes it within 5 s).
		if !c.closing.Load() {
			_ = c.ws.CloseNow()
		}
		c.wg.Wait()
		close(done)
		if release != nil {
			release() // the slot is the connection's until its operations have ended
		}
	}()
	frames := make(chan frame)
	go c.read(done, frames)
	ctx, release = c.init(ctx, frames)
	if release == nil {
		return
	}
	go c.watch(ctx)
	for {
		f, ok := <-frames
		if !ok {
			return // the peer closed, or the connection failed
		}
		if !c.handle(ctx, f) {
			return
		}
	}
}

// read hands on the client's messages until the connection closes or done; a
// message that is not a JSON frame arrives as a frame without a type. Its reads take
// no context: a cancelled one would close the socket under a close handshake in
// progress, whose code the client must see.
func (c *wsConn) read(done <-chan struct{}, out chan<- frame) {
	defer close(out)
	for {
		typ, data, err := c.ws.Read(context.Background())
		if err != nil {
			return
		}
		var f frame
		if typ != websocket.MessageText || json.Unmarshal(data, &f) != nil {
			f = frame{}
		}
		select {
		case out <- f:
		case <-done:
			return
		}
	}
}

// init waits for connection_init (InitTimeout), authenticates its key and takes the
// connection's slot; it returns the connection's context (with the token) and what
// gives the slot back (nil: refused, the connection is closing). A ping before it is
// answered (graphql-transport-ws allows one at any time).
func (c *wsConn) init(ctx context.Context, frames <-chan frame) (context.Context, func()) {
	timer := time.NewTimer(c.t.limits.InitTimeout)
	defer timer.Stop()
	var f frame
	for {
		select {
		case m, ok := <-frames:
			if !ok {
				return nil, nil
			}
			f = m
		case <-timer.C:
			c.refuse(closeInitTimeout, "connection initialisation timeout")
			return nil, nil
		}
		if f.Type != "ping" || c.legacy {
			break
		}
		c.send(frame{Type: "pong"})
	}
	initArrived(ctx)
	switch {
	case f.Type == "subscribe" && !c.legacy:
		c.refuse(closeUnauthorized, "unauthorized: connection_init first")
		return nil, nil
	case f.Type != "connection_init":
		c.refuse(closeBadMessage, "the first message must be connection_init")
		return nil, nil
	}
	var payload map[string]any
	if len(f.Payload) > 0 && string(f.Payload) != "null" && json.Unmarshal(f.Payload, &payload) != nil {
		c.refuse(closeBadMessage, "the connection_init payload is not a JSON object")
		return nil, nil
	}
	auth, _ := payload["Authorization"].(string)
	if auth == "" {
		auth, _ = payload["authorization"].(string)
	}
	token, err := keys.ParseBearer(auth)
	if err != nil {
		c.refuse(closeUnauthorized, err.Error())
		return nil, nil
	}
	if token == "" {
		token = keys.TokenFrom(ctx) // the upgrade request's header
	}
	// A connection needs a key that exists; what it may read is decided per field.
	// graphql-transport-ws has no error message at init: the close frame says why (its
	// reason is at most 123 bytes).
	k, ok := c.t.auth.Lookup(ctx, token)
	if token == "" || !ok {
		c.refuse(closeUnauthorized, "unauthenticated: send a valid API key as the init payload's Authorization")
		return nil, nil
	}
	release, code, msg := admitInit(k, c.t.sockets, c.t.limits)
	if release == nil {
		c.refuse(code, msg)
		return nil, nil
	}
	// The acknowledgement carries no payload: echoing the init payload would send the
	// token back.
	c.send(frame{Type: "connection_ack"})
	if c.legacy {
		c.send(frame{Type: "ka"})
	}
	return keys.WithToken(ctx, token), release
}

// handle acts on one message after the init; false ends the connection.
func (c *wsConn) handle(ctx context.Context, f frame) bool {
	switch {
	case f.Type == "connection_init":
		c.refuse(closeTooManyInits, "too many initialisation requests")
		return false
	case f.Type == "ping" && !c.legacy:
		c.send(frame{Type: "pong"})
	case f.Type == "pong" && !c.legacy:
	case f.Type == "subscribe" && !c.legacy, f.Type == "start" && c.legacy:
		return c.start(ctx, f)
	case f.Type == "complete" && !c.legacy, f.Type == "stop" && c.legacy:
		// The id is free at once: the client may reuse it in its next message, which
		// this loop reads only after this one.
		c.mu.Lock()
		if op := c.ops[f.ID]; op != nil {
			op.cancel()
			delete(c.ops, f.ID)
		}
		c.mu.Unlock()
	case f.Type == "connection_terminate" && c.legacy:
		c.close(int(websocket.StatusNormalClosure), "terminated")
		return false
	default:
		c.refuse(closeBadMessage, "invalid message")
		return false
	}
	return true
}

// start runs operation f.ID.
func (c *wsConn) start(ctx context.Context, f frame) bool {
	if f.ID == "" || len(f.ID) > 256 {
		c.refuse(closeBadMessage, "an operation needs an id of 1 to 256 bytes")
		return false
	}
	c.mu.Lock()
	_, dup := c.ops[f.ID]
	running := len(c.ops)
	c.mu.Unlock()
	if dup {
		c.refuse(closeDuplicateID, "subscriber for "+f.ID+" already exists")
		return false
	}
	if running >= c.t.limits.MaxOperationsPerWebSocket {
		c.sendErrors(f.ID, gqlerror.List{{Message: fmt.Sprintf("this connection runs %d operations, the most it may (--graphql-max-operations-per-websocket)", running),
			Extensions: map[string]any{"code": "TOO_MANY_REQUESTS"}}})
		return true
	}
	params := &graphql.RawParams{}
	if len(f.Payload) == 0 || json.Unmarshal(f.Payload, params) != nil {
		c.sendErrors(f.ID, gqlerror.List{{Message: "the operation's payload is not a JSON object with a query"}})
		return true
	}
	params.Headers = c.headers
	params.ReadTime = graphql.TraceTiming{Start: graphql.Now(), End: graphql.Now()}
	rc, errs := c.exec.CreateOperationContext(ctx, params)
	if errs != nil {
		resp := c.exec.DispatchError(graphql.WithOperationContext(ctx, rc), errs)
		if errcode.GetErrorKind(errs) == errcode.KindProtocol {
			c.sendErrors(f.ID, resp.Errors)
		} else {
			c.next(f.ID, resp)
			c.send(frame{ID: f.ID, Type: "complete"})
		}
		return true
	}
	octx, cancel := context.WithCancel(graphql.WithOperationContext(ctx, rc))
	op := &wsOp{cancel: cancel}
	c.mu.Lock()
	c.ops[f.ID] = op
	c.mu.Unlock()
	c.wg.Go(func() {
		defer cancel()
		c.run(octx, f.ID, op, rc)
	})
	return true
}

// wsOp is a running operation.
type wsOp struct{ cancel context.CancelFunc }

// run executes one operation and tells the client how it ended.
func (c *wsConn) run(ctx context.Context, id string, op *wsOp, rc *graphql.OperationContext) {
	slot := &liveSlot{}
	ctx = context.WithValue(ctx, liveKey{}, slot)
	var ended gqlerror.List
	defer func() {
		if r := recover(); r != nil {
			err := rc.Recover(ctx, r)
			var gerr *gqlerror.Error
			if !errors.As(err, &gerr) {
				gerr = &gqlerror.Error{Message: "internal error"}
			}
			ended = gqlerror.List{gerr}
		}
		// The id is free again before the client hears the operation ended: it may
		// reuse it at once (unless a completion freed it already, and a new operation
		// of the id runs).
		c.mu.Lock()
		if c.ops[id] == op {
			delete(c.ops, id)
		}
		c.mu.Unlock()
		switch {
		case ctx.Err() != nil && len(ended) == 0:
			// The client completed it, or the connection ended: nothing to tell.
		case len(ended) > 0:
			c.sendErrors(id, ended)
		default:
			c.send(frame{ID: id, Type: "complete"})
		}
	}()
	responses, rctx := c.exec.DispatchOperation(ctx, rc)
	if in := slot.in; in != nil {
		ended = c.deliver(rctx, id, rc, slot)
		return
	}
	for {
		resp := responses(rctx)
		if resp == nil {
			return
		}
		c.next(id, resp)
	}
}

// deliver sends a hub subscription's changes, rendered by its group, until it ends;
// it returns why the hub ended it (nil: the client or the connection did).
func (c *wsConn) deliver(ctx context.Context, id string, rc *graphql.OperationContext, slot *liveSlot) gqlerror.List {
	g, err := c.t.groups.join(ctx, c.exec, rc, slot.group, c.t.hub)
	if err != nil {
		return gqlerror.List{{Message: err.Error(), Extensions: map[string]any{"code": "UNAVAILABLE"}}}
	}
	defer c.t.groups.leave(g)
	c.t.delivering.Add(1)
	defer c.t.delivering.Add(-1)
	var wrote time.Time // when this subscription last wrote
	prefix := c.nextPrefix(id)
	buf := make([]byte, 0, 1024) // this subscriber's frames, reused
	var ends []int               // where each frame of a batch ends in buf
	for {
		select {
		case ch, ok := <-slot.in:
			if !ok {
				if r := slot.reason.Load(); r != nil {
					return gqlerror.List{r}
				}
				return nil
			}
			// The write waits for the subscription's share of the process's writes,
			// and the changes queued by then go out with this one (wscork.go). Only
			// this goroutine receives from slot.in, so the queued ones are there to
			// take, before a close.
			if wait := wrote.Add(c.t.writeGap()).Sub(c.t.limits.now()); wait > 0 {
				if c.t.limits.sleep(ctx, wait) != nil {
					return nil
				}
			}
			queued := min(len(slot.in), maxCoalesced-1)
			buf, ends = buf[:0], ends[:0]
			for i := 0; ; i++ {
				payload, err := g.render(ctx, ch)
				if err != nil {
					return gqlerror.List{{Message: err.Error(), Extensions: map[string]any{"code": "UNAVAILABLE"}}}
				}
				buf = append(append(append(buf, prefix...), payload...), '}')
				ends = append(ends, len(buf))
				if i == queued {
					break
				}
				ch = <-slot.in
			}
			if c.writeBatch(buf, ends) != nil {
				return nil
			}
			wrote = c.t.limits.now()
		case <-ctx.Done():
			return nil
		}
	}
}

// maxCoalesced bounds the changes one batch of a subscriber carries.
const maxCoalesced = 64

// nextPrefix is the start of a frame carrying a response of operation id, up to its
// payload: the payload (appendResponse) and a closing brace complete it. frame and
// encoding/json are not used for these, which would walk the response's bytes again.
func (c *wsConn) nextPrefix(id string) []byte {
	quoted, _ := json.Marshal(id)
	kind := "next"
	if c.legacy {
		kind = "data"
	}
	return append(append([]byte(`{"id":`), quoted...), `,"type":"`+kind+`","payload":`...)
}

// next sends one response of an operation gqlgen runs itself.
func (c *wsConn) next(id string, resp *graphql.Response) {
	b, err := appendResponse(c.nextPrefix(id), resp)
	if err != nil {
		b, _ = appendResponse(c.nextPrefix(id), &graphql.Response{Errors: gqlerror.List{{Message: "cannot encode the response: " + err.Error()}}})
	}
	_ = c.write(append(b, '}'))
}

func (c *wsConn) sendErrors(id string, errs gqlerror.List) {
	b, _ := json.Marshal(errs)
	c.send(frame{ID: id, Type: "error", Payload: b})
}

func (c *wsConn) send(f frame) {
	b, _ := json.Marshal(f)
	_ = c.write(b)
}

// write writes one message. It takes no context: coder/websocket watches one with a
// timer per write, and the watchdog bounds writes instead (WebSocketWriteTimeout).
func (c *wsConn) write(b []byte) error {
	return c.writeBatch(b, []int{len(b)})
}

// writeBatch writes the messages of b that end at ends, in one write(2) when there is
// more than one.
func (c *wsConn) writeBatch(b []byte, ends []int) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.writing.Store(time.Now().UnixNano())
	defer c.writing.Store(0)
	corked := len(ends) > 1 && c.cork != nil
	if corked {
		c.cork.cork()
	}
	var err error
	start := 0
	for _, end := range ends {
		if err = c.ws.Write(context.Background(), websocket.MessageText, b[start:end]); err != nil {
			break
		}
		start = end
	}
	if corked {
		err = errors.Join(err, c.cork.uncork())
	}
	return err
}

// watch closes the connection when a write waits longer than WebSocketWriteTimeout
// (the peer stopped reading), and keeps graphql-ws connections alive.
func (c *wsConn) watch(ctx context.Context) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	lastKA := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			if at := c.writing.Load(); at != 0 && now.Sub(time.Unix(0, at)) > c.t.limits.WebSocketWriteTimeout {
				c.t.log.Warn("closing a WebSocket whose peer takes no writes", "timeout", c.t.limits.WebSocketWriteTimeout)
				_ = c.ws.CloseNow()
				return
			}
			if c.legacy && now.Sub(lastKA) >= keepAliveEvery {
				lastKA = now
				go c.send(frame{Type: "ka"}) // a write of its own: the check above must go on
			}
		}
	}
}

// refuse ends the connection with code and reason; graphql-ws clients read a
// connection_error message first.
func (c *wsConn) refuse(code int, reason string) {
	if c.legacy {
		b, _ := json.Marshal(map[string]string{"message": reason})
		c.send(frame{Type: "connection_error", Payload: b})
	}
	c.close(code, reason)
}

// close starts the close handshake in the background: coder/websocket waits up to 5 s
// for the peer's answer, which a hostile peer never sends.
func (c *wsConn) close(code int, reason string) {
	if c.closing.Swap(true) {
		return
	}
	go func() { _ = c.ws.Close(websocket.StatusCode(code), clipReason(reason)) }()
}

// clipReason fits a close reason into the 123 bytes a close frame holds.
func clipReason(s string) string {
	if len(s) <= 123 {
		return s
	}
	s = s[:120]
	for !utf8.ValidString(s) { // not in the middle of a character
		s = s[:len(s)-1]
	}
	return s + "..."
}

type liveKey struct{}

// liveSlot is where a subscription field resolved over WebSocket hands its hub
// subscription to the transport (Resolver.subscribe).
type liveSlot struct {
	in     <-chan *change
	group  groupKey
	reason atomic.Pointer[gqlerror.Error] // why the hub ended it, set before in closes
}

// groupKey is what makes subscriptions render alike: the organization and the key's
// role (fields may answer by role) beside the operation.
type groupKey struct {
	org  string
	role keys.Role
}

// renderKey holds a render group's feed (*renderFeed) in the context of the group's
// own execution of the operation.
type renderKey struct{}

// renderFeed is what a render group feeds its execution; taken says the subscription
// field took it (an execution refused before its field ran never reads it).
type renderFeed struct {
	ch    chan *change
	taken atomic.Bool
}

// endSubscription records why the hub ended a subscription, for its transport to
// tell the client.
func endSubscription(ctx context.Context, err *gqlerror.Error) {
	if s, ok := ctx.Value(liveKey{}).(*liveSlot); ok {
		s.reason.Store(err)
	}
}

// renderGroup renders the changes of its subscriptions with one execution of their
// operation, fed by the group.
type renderGroup struct {
	gs      *renderGroups
	name    string
	members int           // under renderGroups.mu
	ready   chan struct{} // closed once the execution is started (or failed: dead)
	hub     *Hub

	mu        sync.Mutex
	feed      *renderFeed
	responses graphql.ResponseHandler
	ctx       context.Context
	cancel    context.CancelFunc
	dead      error // the group's execution ended: every render fails with it
}

type renderGroups struct {
	mu     sync.Mutex
	groups map[string]*renderGroup
}

// join adds a subscriber to the group of its operation and key, starting the group's
// own execution of the operation when it is the first. The execution starts outside
// the groups' lock: joiners of other groups never wait for it.
func (gs *renderGroups) join(ctx context.Context, exec graphql.GraphExecutor, rc *graphql.OperationContext, k groupKey, hub *Hub) (*renderGroup, error) {
	vars, err := json.Marshal(rc.Variables) // map keys sorted: one text per value
	if err != nil {
		return nil, fmt.Errorf("cannot render this subscription: %w", err)
	}
	sum := sha256.New()
	for _, part := range []string{k.org, string(k.role), rc.OperationName, rc.RawQuery, string(vars)} {
		fmt.Fprintf(sum, "%d:%s", len(part), part)
	}
	name := hex.EncodeToString(sum.Sum(nil))
	gs.mu.Lock()
	g := gs.groups[name]
	if g != nil {
		g.members++
		gs.mu.Unlock()
		select {
		case <-g.ready:
		case <-ctx.Done():
			gs.leave(g)
			return nil, ctx.Err()
		}
		g.mu.Lock()
		dead := g.dead
		g.mu.Unlock()
		if dead != nil {
			gs.leave(g)
			return nil, dead
		}
		return g, nil
	}
	g = &renderGroup{gs: gs, name: name, members: 1, ready: make(chan struct{}), hub: hub, feed: &renderFeed{ch: make(chan *change, 1)}}
	if gs.groups == nil {
		gs.groups = map[string]*renderGroup{}
	}
	gs.groups[name] = g
	gs.mu.Unlock()

	// The group outlives the subscriber that started it: its context keeps the
	// subscriber's values (the operation, the key) but not its end.
	gctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	responses, rctx := exec.DispatchOperation(context.WithValue(gctx, renderKey{}, g.feed), rc)
	if rctx == nil { // an operation middleware answered without running it
		rctx = gctx
	}
	g.mu.Lock()
	g.responses, g.ctx, g.cancel = responses, rctx, cancel
	if !g.feed.taken.Load() {
		g.dead = errors.New("the subscription cannot be rendered; subscribe again")
	}
	dead := g.dead
	g.mu.Unlock()
	close(g.ready)
	if dead != nil {
		gs.leave(g)
		return nil, dead
	}
	return g, nil
}

func (gs *renderGroups) leave(g *renderGroup) {
	gs.mu.Lock()
	defer gs.mu.Unlock()
	if g.members--; g.members == 0 {
		if gs.groups[g.name] == g {
			delete(gs.groups, g.name)
		}
		if g.cancel != nil {
			g.cancel()
		}
	}
}

// retire takes a dead group out of the groups, so that new subscribers start another.
func (gs *renderGroups) retire(g *renderGroup) {
	gs.mu.Lock()
	defer gs.mu.Unlock()
	if gs.groups[g.name] == g {
		delete(gs.groups, g.name)
	}
}

// render returns the payload of change c for the group's subscribers, rendering it
// the first time one asks (ctx is the asking subscriber's). The bytes are kept on the
// change: they live as long as a subscriber's queue holds it, however far behind the
// others that one is.
func (g *renderGroup) render(ctx context.Context, c *change) ([]byte, error) {
	if b, ok := c.renders.Load(g); ok {
		return b.([]byte), nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if b, ok := c.renders.Load(g); ok {
		return b.([]byte), nil
	}
	if g.dead != nil {
		return nil, g.dead
	}
	select {
	case g.feed.ch <- c:
	case <-g.ctx.Done():
		return nil, g.die(errors.New("the subscription's renderer has stopped; subscribe again"))
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	resp := g.responses(g.ctx)
	if resp == nil {
		return nil, g.die(errors.New("the subscription's renderer has stopped; subscribe again"))
	}
	b, err := appendResponse(nil, resp)
	if err != nil {
		return nil, fmt.Errorf("cannot encode a change: %w", err)
	}
	g.hub.rendered.Add(1)
	c.renders.Store(g, b)
	return b, nil
}

// die marks the group dead (under g.mu): its members end, new subscribers start anew.
func (g *renderGroup) die(err error) error {
	g.dead = err
	g.cancel()
	g.gs.retire(g)
	return err
}
