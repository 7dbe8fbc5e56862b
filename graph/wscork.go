package graph

import (
	"bufio"
	"errors"
	"net"
	"net/http"
	"sync"
)

// Coalesced WebSocket writes. coder/websocket flushes after every message, so each
// frame is a write(2) of its own; on loopback that syscall also runs the receiver's
// side of TCP, and with thousands of subscribers taking a stream of changes it is most
// of the server's CPU. A subscriber with several changes queued writes them as one
// batch instead: its connection is corked while the frames are written and the batch
// goes out in one write when it uncorks. Nothing waits for more to come: a subscriber
// that keeps up writes each change as it arrives, and batches grow only as far as the
// server falls behind.

// corkLimit bounds a corked batch in bytes: past it the batch so far is written.
const corkLimit = 64 << 10

// corkBuffers are the batches' buffers: only connections writing a batch hold one.
var corkBuffers = sync.Pool{New: func() any { b := make([]byte, 0, corkLimit); return &b }}

// corkConn is a hijacked connection whose writes can be held and sent together.
type corkConn struct {
	net.Conn
	mu  sync.Mutex
	buf *[]byte // the held bytes while corked (nil: writes go through)
}

func (c *corkConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.buf == nil {
		return c.Conn.Write(p)
	}
	if len(*c.buf)+len(p) > corkLimit {
		if err := c.flushLocked(); err != nil {
			return 0, err
		}
		if len(p) > corkLimit {
			return c.Conn.Write(p)
		}
	}
	*c.buf = append(*c.buf, p...)
	return len(p), nil
}

// cork holds the writes that follow until uncork.
func (c *corkConn) cork() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.buf == nil {
		c.buf = corkBuffers.Get().(*[]byte)
	}
}

// uncork writes what was held, in one write, and lets writes through again.
func (c *corkConn) uncork() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.buf == nil {
		return nil
	}
	err := c.flushLocked()
	corkBuffers.Put(c.buf)
	c.buf = nil
	return err
}

func (c *corkConn) flushLocked() error {
	b := *c.buf
	*c.buf = b[:0]
	if len(b) == 0 {
		return nil
	}
	_, err := c.Conn.Write(b)
	return err
}

// corkingWriter hands coder/websocket a corkConn when it hijacks the connection.
type corkingWriter struct {
	http.ResponseWriter
	conn *corkConn // set by Hijack
}

func (w *corkingWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	hj, ok := w.ResponseWriter.(http.Hijacker)
	if !ok {
		return nil, nil, errors.New("the connection cannot be hijacked")
	}
	conn, brw, err := hj.Hijack()
	if err != nil {
		return nil, nil, err
	}
	// net/http has sent the response's header by now; flushing is for a writer that
	// still holds bytes, which must go out before anything written through the cork.
	if err := brw.Flush(); err != nil {
		_ = conn.Close()
		return nil, nil, err
	}
	w.conn = &corkConn{Conn: conn}
	return w.conn, bufio.NewReadWriter(brw.Reader, bufio.NewWriterSize(w.conn, brw.Writer.Size())), nil
}
