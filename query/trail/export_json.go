package trail

import (
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"hash"
	"math/bits"
	"strconv"
	"unicode/utf8"
)

// The event line's JSON, written and read without reflection: an export is mostly
// event lines, and encoding/json's reflection was most of the cost of both writing
// and verifying one. appendEventJSON writes exactly what encoding/json (HTML escaping
// off) writes for an exportEvent, which a test checks on awkward and random values;
// parseEventJSON reads only that layout, byte for byte, so that what it reads is
// canonical without writing it again (anything else goes through encoding/json and is
// written again to be judged).

const hexDigits = "0123456789abcdef"

// Why a proof cannot be read.
var (
	errTooManyHashes = fmt.Errorf("the proof holds more than %d hashes", maxProofHashes)
	errProofEncoding = errors.New("the proof is not standard base64 of whole 32-byte hashes")
)

// jsonSafe are the ASCII bytes encoding/json writes as they are (HTML escaping off).
var jsonSafe = func() (s [utf8.RuneSelf]bool) {
	for b := 0x20; b < utf8.RuneSelf; b++ {
		s[b] = b != '"' && b != '\\'
	}
	return s
}()

// appendJSONString is encoding/json's string encoding with HTML escaping off.
func appendJSONString(dst []byte, src string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(src); {
		if b := src[i]; b < utf8.RuneSelf {
			if jsonSafe[b] {
				i++
				continue
			}
			dst = append(dst, src[start:i]...)
			switch b {
			case '\\', '"':
				dst = append(dst, '\\', b)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[b>>4], hexDigits[b&0xF])
			}
			i++
			start = i
			continue
		}
		c, size := utf8.DecodeRuneInString(src[i:])
		if c == utf8.RuneError && size == 1 {
			dst = append(dst, src[start:i]...)
			dst = append(dst, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if c == '\u2028' || c == '\u2029' {
			dst = append(dst, src[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[c&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, src[start:]...)
	return append(dst, '"')
}

// eventKeys are the event record's keys with what precedes each, in field order.
var eventKeys = [...]string{`{"kind":`, `,"id":`, `,"type":`, `,"time":`, `,"org_id":`, `,"room_id":`, `,"actor_id":`, `,"actor_type":`,
	`,"actor_handle":`, `,"owner_id":`, `,"subject_id":`, `,"subject_type":`, `,"subject_handle":`, `,"execution_id":`, `,"source":`,
	`,"schema_version":`, `,"data":`, `,"ingested_at":`, `,"kafka_partition":`, `,"kafka_offset":`, `,"leaf":`, `,"proof":`, `,"base64":`}

// strings are the event's string fields before schema_version, in field order.
func (e *exportEvent) strings() [15]*string {
	return [15]*string{&e.Kind, &e.ID, &e.Type, &e.Time, &e.OrgID, &e.RoomID, &e.ActorID, &e.ActorType, &e.ActorHandle, &e.OwnerID,
		&e.SubjectID, &e.SubjectType, &e.SubjectHandle, &e.ExecutionID, &e.Source}
}

// appendEventJSON appends the event's JSON object (no newline).
func appendEventJSON(dst []byte, e *exportEvent) []byte {
	for i, s := range e.strings() {
		dst = append(dst, eventKeys[i]...)
		dst = appendJSONString(dst, *s)
	}
	dst = append(dst, eventKeys[15]...)
	dst = strconv.AppendUint(dst, uint64(e.SchemaVersion), 10)
	dst = append(dst, eventKeys[16]...)
	dst = appendJSONString(dst, e.Data)
	dst = append(dst, eventKeys[17]...)
	dst = appendJSONString(dst, e.IngestedAt)
	dst = append(dst, eventKeys[18]...)
	dst = strconv.AppendInt(dst, int64(e.KafkaPartition), 10)
	dst = append(dst, eventKeys[19]...)
	dst = strconv.AppendInt(dst, e.KafkaOffset, 10)
	dst = append(dst, eventKeys[20]...)
	dst = strconv.AppendUint(dst, e.Leaf, 10)
	dst = append(dst, eventKeys[21]...)
	dst = appendJSONString(dst, e.Proof)
	if len(e.Base64) > 0 {
		dst = append(dst, eventKeys[22]...)
		for i, s := range e.Base64 {
			if i == 0 {
				dst = append(dst, '[')
			} else {
				dst = append(dst, ',')
			}
			dst = appendJSONString(dst, s)
		}
		dst = append(dst, ']')
	}
	return append(dst, '}')
}

// jsonReader reads the layout appendEventJSON writes; ok turns false at the first
// byte that is not it.
type jsonReader struct {
	b   []byte
	i   int
	ok  bool
	buf []byte
}

func (r *jsonReader) lit(s string) {
	if r.ok && len(r.b)-r.i >= len(s) && string(r.b[r.i:r.i+len(s)]) == s {
		r.i += len(s)
		return
	}
	r.ok = false
}

// str reads a JSON string as appendJSONString writes it, and nothing else: raw bytes
// are valid UTF-8 that it would not escape, escapes are the ones it writes. So a line
// parseEventJSON reads is byte for byte the one appendEventJSON writes of what it read.
func (r *jsonReader) str() string {
	if !r.ok || r.i >= len(r.b) || r.b[r.i] != '"' {
		r.ok = false
		return ""
	}
	r.i++
	start := r.i
	escaped := false
	for r.i < len(r.b) {
		c := r.b[r.i]
		switch {
		case c == '"':
			s := r.b[start:r.i]
			r.i++
			if !escaped {
				return string(s)
			}
			return r.unescape(s)
		case c == '\\':
			escaped = true
			if r.i+1 >= len(r.b) {
				r.ok = false
				return ""
			}
			r.i += 2 // the escaped byte is checked by unescape; a quote there is not the end
		case c < 0x20:
			r.ok = false
			return ""
		case c < utf8.RuneSelf:
			r.i++
		default:
			c, size := utf8.DecodeRune(r.b[r.i:])
			if c == utf8.RuneError && size == 1 || c == '\u2028' || c == '\u2029' {
				r.ok = false
				return ""
			}
			r.i += size
		}
	}
	r.ok = false
	return ""
}

// unescape decodes a string body holding the escapes appendJSONString writes.
func (r *jsonReader) unescape(s []byte) string {
	r.buf = r.buf[:0]
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' {
			r.buf = append(r.buf, s[i])
			continue
		}
		i++
		switch e := s[i]; e {
		case '"', '\\':
			r.buf = append(r.buf, e)
		case 'b':
			r.buf = append(r.buf, '\b')
		case 'f':
			r.buf = append(r.buf, '\f')
		case 'n':
			r.buf = append(r.buf, '\n')
		case 'r':
			r.buf = append(r.buf, '\r')
		case 't':
			r.buf = append(r.buf, '\t')
		case 'u':
			if i+5 > len(s) {
				r.ok = false
				return ""
			}
			switch u := string(s[i+1 : i+5]); {
			case u == "2028" || u == "2029":
				r.buf = utf8.AppendRune(r.buf, rune(0x2020+int(u[3]-'0')))
			case u[0] == '0' && u[1] == '0' && (u[2] == '0' || u[2] == '1') && isLowerHex(u[3]):
				b := (u[2]-'0')<<4 | unhex(u[3])
				if b == '\b' || b == '\f' || b == '\n' || b == '\r' || b == '\t' {
					r.ok = false // written as its short escape
					return ""
				}
				r.buf = append(r.buf, b)
			default:
				r.ok = false
				return ""
			}
			i += 4
		default:
			r.ok = false
			return ""
		}
	}
	return string(r.buf)
}

func isLowerHex(c byte) bool { return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' }

func unhex(c byte) byte {
	if c <= '9' {
		return c - '0'
	}
	return c - 'a' + 10
}

// digits reads a number as strconv writes it: an optional minus (when signed), then
// digits without a leading zero.
func (r *jsonReader) digits(signed bool) string {
	start := r.i
	if signed && r.i < len(r.b) && r.b[r.i] == '-' {
		r.i++
	}
	first := r.i
	for r.i < len(r.b) && r.b[r.i] >= '0' && r.b[r.i] <= '9' {
		r.i++
	}
	n := r.i - first
	if !r.ok || n == 0 || r.b[first] == '0' && (n > 1 || first > start) {
		r.ok = false
	}
	return string(r.b[start:r.i])
}

func (r *jsonReader) uint(bitSize int) uint64 {
	n, err := strconv.ParseUint(r.digits(false), 10, bitSize)
	if err != nil {
		r.ok = false
	}
	return n
}

func (r *jsonReader) int(bitSize int) int64 {
	n, err := strconv.ParseInt(r.digits(true), 10, bitSize)
	if err != nil {
		r.ok = false
	}
	return n
}

// parseEventJSON reads an event line in appendEventJSON's layout into e, and only
// that: true means appendEventJSON(e) gives b back. buf is scratch for escaped strings.
func parseEventJSON(b []byte, e *exportEvent, buf *[]byte) bool {
	r := jsonReader{b: b, ok: true, buf: *buf}
	defer func() { *buf = r.buf }()
	for i, s := range e.strings() {
		r.lit(eventKeys[i])
		*s = r.str()
	}
	r.lit(eventKeys[15])
	e.SchemaVersion = uint16(r.uint(16))
	r.lit(eventKeys[16])
	e.Data = r.str()
	r.lit(eventKeys[17])
	e.IngestedAt = r.str()
	r.lit(eventKeys[18])
	e.KafkaPartition = int32(r.int(32))
	r.lit(eventKeys[19])
	e.KafkaOffset = r.int(64)
	r.lit(eventKeys[20])
	e.Leaf = r.uint(64)
	r.lit(eventKeys[21])
	e.Proof = r.str()
	e.Base64 = nil
	if r.ok && r.i < len(r.b) && r.b[r.i] == ',' {
		r.lit(eventKeys[22] + "[")
		for r.ok {
			e.Base64 = append(e.Base64, r.str())
			if r.i < len(r.b) && r.b[r.i] == ',' {
				r.i++
				continue
			}
			r.lit("]")
			break
		}
	}
	r.lit("}")
	return r.ok && r.i == len(r.b) && e.Kind == KindEvent
}

// proofChecker checks inclusion proofs against one checkpoint. Lines come in time
// order, so neighbours share most of their proofs: once a proof has verified, the
// node at cacheLevel above its leaf and the rest of the proof from there are kept, and
// a later proof that computes the same node and carries the same rest is included
// without hashing that rest again (collision resistance makes the node genuine). A
// flipped byte anywhere still fails: below the node it changes the node, above it the
// rest differs from the verified one.
type proofChecker struct {
	size  uint64
	root  [sha256.Size]byte
	h     hash.Hash
	block [1 + 2*sha256.Size]byte
	proof []byte
	cache map[uint64]*verifiedNode
}

// cacheLevel is the level of the nodes kept: 2^cacheLevel neighbouring leaves share
// one.
const cacheLevel = 4

// maxCachedNodes bounds the nodes kept (about 600 bytes each); the cache starts over
// when full.
const maxCachedNodes = 4096

type verifiedNode struct {
	hash [sha256.Size]byte
	rest []byte
}

func newProofChecker(size uint64, root []byte) *proofChecker {
	c := &proofChecker{size: size, h: sha256.New(), cache: map[uint64]*verifiedNode{}}
	copy(c.root[:], root)
	c.block[0] = 1
	return c
}

// children sets out to the RFC 6962 hash of the interior node over l and r.
func (c *proofChecker) children(out *[sha256.Size]byte, l, r []byte) {
	copy(c.block[1:], l)
	copy(c.block[1+sha256.Size:], r)
	c.h.Reset()
	c.h.Write(c.block[:])
	c.h.Sum(out[:0])
}

// verify says whether leafHash is leaf's in the tree, by the base64 proof (an error
// says why it cannot be read).
func (c *proofChecker) verify(leaf uint64, leafHash []byte, proof64 string) (bool, error) {
	if len(proof64) > base64.StdEncoding.EncodedLen(maxProofHashes*sha256.Size) {
		return false, errTooManyHashes
	}
	n, err := base64.StdEncoding.Strict().Decode(c.proofBuf(base64.StdEncoding.DecodedLen(len(proof64))), []byte(proof64))
	if err != nil || n%sha256.Size != 0 {
		return false, errProofEncoding
	}
	pr := c.proof[:n]
	if leaf >= c.size || len(leafHash) != sha256.Size {
		return false, nil
	}
	inner := bits.Len64(leaf ^ (c.size - 1))
	if n/sha256.Size != inner+bits.OnesCount64(leaf>>uint(inner)) {
		return false, nil
	}
	var node, at [sha256.Size]byte
	copy(node[:], leafHash)
	keep := false
	for i := 0; i < inner; i++ {
		sib := pr[i*sha256.Size : (i+1)*sha256.Size]
		if (leaf>>uint(i))&1 == 0 {
			c.children(&node, node[:], sib)
		} else {
			c.children(&node, sib, node[:])
		}
		if inner > cacheLevel && i+1 == cacheLevel {
			if v, ok := c.cache[leaf>>cacheLevel]; ok {
				return v.hash == node && string(v.rest) == string(pr[cacheLevel*sha256.Size:]), nil
			}
			at, keep = node, true
		}
	}
	for i := inner; i < n/sha256.Size; i++ {
		c.children(&node, pr[i*sha256.Size:(i+1)*sha256.Size], node[:])
	}
	if node != c.root {
		return false, nil
	}
	if keep {
		if len(c.cache) >= maxCachedNodes {
			clear(c.cache)
		}
		c.cache[leaf>>cacheLevel] = &verifiedNode{hash: at, rest: append([]byte(nil), pr[cacheLevel*sha256.Size:]...)}
	}
	return true, nil
}

func (c *proofChecker) proofBuf(n int) []byte {
	if cap(c.proof) < n {
		c.proof = make([]byte, n)
	}
	c.proof = c.proof[:n]
	return c.proof
}
