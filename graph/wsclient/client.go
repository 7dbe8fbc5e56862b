// Package wsclient is a small graphql-transport-ws client on coder/websocket: what
// bandplane's own tests and `bandplane bench query` subscribe with.
//
// It may import ingest/, policy/, query/, schema/ and its own folder's packages, never
// deploy/ or cmd/ (deploy/layers).
package wsclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/coder/websocket"
	"github.com/coder/websocket/wsjson"
)

// Protocol is the WebSocket subprotocol spoken.
const Protocol = "graphql-transport-ws"

// Message is one "next" payload of a subscription, or its end: Err is set by an
// "error" message (the server's errors) or a broken connection, and the channel then
// closes.
type Message struct {
	Data   json.RawMessage
	Errors []GraphQLError
	Err    error
}

// GraphQLError is one error of a GraphQL answer.
type GraphQLError struct {
	Message    string         `json:"message"`
	Extensions map[string]any `json:"extensions"`
}

// Code is the error's extensions.code.
func (e GraphQLError) Code() string { s, _ := e.Extensions["code"].(string); return s }

type frame struct {
	ID      string          `json:"id,omitempty"`
	Type    string          `json:"type"`
	Payload json.RawMessage `json:"payload,omitempty"`
}

// Conn is one acknowledged connection.
type Conn struct {
	ws     *websocket.Conn
	mu     sync.Mutex
	subs   map[string]chan Message
	nextID int
	done   chan struct{}
	err    error

	closing   chan struct{} // closed by Close: the reader stops waiting on full channels
	closeOnce sync.Once
}

// Dial connects to url (ws:// or wss://), sends connection_init with the bearer token
// in the payload's Authorization and waits for connection_ack.
func Dial(ctx context.Context, url, token string) (*Conn, error) {
	ws, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{Subprotocols: []string{Protocol}})
	if err != nil {
		if resp != nil {
			return nil, fmt.Errorf("cannot open a WebSocket to %s: %w (HTTP %d)", url, err, resp.StatusCode)
		}
		return nil, fmt.Errorf("cannot open a WebSocket to %s: %w", url, err)
	}
	ws.SetReadLimit(4 << 20)
	payload, _ := json.Marshal(map[string]string{"Authorization": "Bearer " + token})
	if err := wsjson.Write(ctx, ws, frame{Type: "connection_init", Payload: payload}); err != nil {
		_ = ws.CloseNow()
		return nil, fmt.Errorf("cannot send connection_init: %w", err)
	}
	for {
		var f frame
		if err := wsjson.Read(ctx, ws, &f); err != nil {
			_ = ws.CloseNow()
			var ce websocket.CloseError
			if errors.As(err, &ce) {
				return nil, fmt.Errorf("connection refused at init: %d %s", ce.Code, ce.Reason)
			}
			return nil, fmt.Errorf("no connection_ack: %w", err)
		}
		switch f.Type {
		case "connection_ack":
			c := &Conn{ws: ws, subs: map[string]chan Message{}, done: make(chan struct{}), closing: make(chan struct{})}
			go c.read()
			return c, nil
		case "ping":
			_ = wsjson.Write(ctx, ws, frame{Type: "pong"})
		case "connection_error", "error":
			_ = ws.CloseNow()
			return nil, fmt.Errorf("connection refused at init: %s", f.Payload)
		}
	}
}

// Subscribe starts a subscription; its messages arrive on the returned channel,
// buffered by buffer, until it completes, fails or the connection closes. The reader
// blocks on a full channel: read it.
func (c *Conn) Subscribe(ctx context.Context, query string, vars map[string]any, buffer int) (string, <-chan Message, error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return "", nil, c.err
	}
	c.nextID++
	id := strconv.Itoa(c.nextID)
	ch := make(chan Message, buffer)
	c.subs[id] = ch
	c.mu.Unlock()
	payload, _ := json.Marshal(map[string]any{"query": query, "variables": vars})
	if err := wsjson.Write(ctx, c.ws, frame{ID: id, Type: "subscribe", Payload: payload}); err != nil {
		c.mu.Lock()
		delete(c.subs, id)
		c.mu.Unlock()
		return "", nil, fmt.Errorf("cannot subscribe: %w", err)
	}
	return id, ch, nil
}

// Complete ends subscription id.
func (c *Conn) Complete(ctx context.Context, id string) error {
	return wsjson.Write(ctx, c.ws, frame{ID: id, Type: "complete"})
}

// Close closes the connection normally. Messages nobody read are dropped.
func (c *Conn) Close() error {
	c.closeOnce.Do(func() { close(c.closing) })
	err := c.ws.Close(websocket.StatusNormalClosure, "")
	<-c.done
	return err
}

// deliver hands m to ch unless the connection is being closed.
func (c *Conn) deliver(ch chan Message, m Message) {
	select {
	case ch <- m:
	case <-c.closing:
	}
}

// Done is closed when the connection has ended.
func (c *Conn) Done() <-chan struct{} { return c.done }

func (c *Conn) read() {
	defer close(c.done)
	ctx := context.Background()
	for {
		typ, b, err := c.ws.Read(ctx)
		if err == nil && typ != websocket.MessageText {
			err = fmt.Errorf("a %v message, not text", typ)
		}
		var f frame
		if err == nil {
			if id, data, ok := plainNext(b); ok {
				c.mu.Lock()
				ch := c.subs[id]
				c.mu.Unlock()
				if ch != nil {
					c.deliver(ch, Message{Data: data})
				}
				continue
			}
			if err = json.Unmarshal(b, &f); err != nil {
				err = fmt.Errorf("a message that is not a JSON frame: %w", err)
			}
		}
		if err != nil {
			c.mu.Lock()
			c.err = fmt.Errorf("connection closed: %w", err)
			for id, ch := range c.subs {
				c.deliver(ch, Message{Err: c.err})
				close(ch)
				delete(c.subs, id)
			}
			c.mu.Unlock()
			return
		}
		switch f.Type {
		case "ping":
			wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_ = wsjson.Write(wctx, c.ws, frame{Type: "pong"})
			cancel()
		case "next":
			var p struct {
				Data   json.RawMessage `json:"data"`
				Errors []GraphQLError  `json:"errors"`
			}
			_ = json.Unmarshal(f.Payload, &p)
			c.mu.Lock()
			ch := c.subs[f.ID]
			c.mu.Unlock()
			if ch != nil {
				c.deliver(ch, Message{Data: p.Data, Errors: p.Errors})
			}
		case "error", "complete":
			c.mu.Lock()
			ch := c.subs[f.ID]
			delete(c.subs, f.ID)
			c.mu.Unlock()
			if ch == nil {
				continue
			}
			if f.Type == "error" {
				var errs []GraphQLError
				_ = json.Unmarshal(f.Payload, &errs)
				c.deliver(ch, Message{Errors: errs, Err: fmt.Errorf("subscription failed: %s", f.Payload)})
			}
			close(ch)
		}
	}
}

// Frames of a response without errors, as bandplane's server writes them.
const (
	plainNextHead = `{"id":"`
	plainNextMid  = `","type":"next","payload":{"data":`
	plainNextTail = `}}`
)

// plainNext reads a "next" frame of a response without errors in the layout
// bandplane's server writes, without decoding the frame twice: the subscribers of
// `bench query` read as many messages as the server writes, on the same cores. Any
// other frame is not ok and is decoded in full. The data is checked to be one JSON
// value, so the frame is exactly what the layout says.
func plainNext(b []byte) (id string, data json.RawMessage, ok bool) {
	rest, ok := bytes.CutPrefix(b, []byte(plainNextHead))
	if !ok {
		return "", nil, false
	}
	end := bytes.IndexByte(rest, '"')
	if end < 0 || bytes.IndexByte(rest[:end], '\\') >= 0 {
		return "", nil, false
	}
	id, rest = string(rest[:end]), rest[end:]
	if rest, ok = bytes.CutPrefix(rest, []byte(plainNextMid)); !ok {
		return "", nil, false
	}
	if data, ok = bytes.CutSuffix(rest, []byte(plainNextTail)); !ok || !json.Valid(data) {
		return "", nil, false
	}
	return id, data, true
}
