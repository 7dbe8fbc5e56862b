package schema

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/maphash"
	"math"
	"math/bits"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// CheckJSON is the guard every line passes before any decoder sees it (Decode runs it;
// other decoders of client JSON should run it first too). It scans b once, left to
// right, with an explicit stack (no recursion, no allocation for ordinary lines), and
// returns nil when b is one well-formed JSON value that breaks none of these rules, or
// else a *FieldError for the first that it breaks:
//
//   - nesting deeper than MaxDepth (64) levels of objects and arrays, the top-level
//     value being level 1: the scan stops at the first container of level 65, so a line
//     nested millions of levels deep costs only the bytes up to there, and no decoder
//     (segmentio's recurses) ever sees more than MaxDepth levels;
//   - duplicate keys in any object at any level. Keys are compared after unescaping
//     ("a" and "\u0061" are the same key) and ignoring case the way encoding/json and
//     the fast decoder match keys to struct fields, Unicode folding included ("id",
//     "ID" and "Id" are the same key, as are "s" and "ſ"): either way the decoders would
//     keep only the last one, and another reader might keep the first;
//   - keys with a letter that is not ASCII but folds to an ASCII one (ſ, the Kelvin
//     sign), which encoding/json matches to a field and the fast decoder does not;
//   - invalid UTF-8 anywhere in a string, and escaped lone surrogates (\ud800 not
//     followed by a low surrogate, a low surrogate alone), which the decoders would
//     both turn into U+FFFD, so that distinct ids would collide.
//
// The error names, as a dotted path into b as sent, where it happened
// (`payload.metadata.mentions[0]`; the duplicated member itself for a duplicate key;
// the empty path for the top level). JSON that is not well-formed gets encoding/json's
// own error, `invalid JSON at offset N: …`, without the fast decoder ever seeing it.
func CheckJSON(b []byte) error {
	if fe := checkJSON(b, 0, ""); fe != nil {
		return fe
	}
	return nil
}

// checkJSON is CheckJSON for a value that sits `outer` levels deep in a line (data:
// 1) and whose path there is prefix ("data"); the depth limit counts those levels.
//
// It is one function with its stack in local arrays (helpers take and return slices)
// so that, for ordinary lines, nothing escapes to the heap; it jumps between its three
// states (a value, a key, after a value) with goto, which measured faster than a loop
// over a state variable.
func checkJSON(b []byte, outer int, prefix string) *FieldError {
	if len(b) > math.MaxInt32 {
		return &FieldError{Field: prefix, Reason: fmt.Sprintf("%d bytes of JSON is too large", len(b))}
	}
	var (
		levelBuf [8]level
		keyBuf   [32]span
		levels   = levelBuf[:0]
		keys     = keyBuf[:0]
		i        = skipSpace(b, 0)
		top      *level
		end, at  int
		prob     int
		flags    uint8
		ok       bool
	)

value:
	if i >= len(b) {
		return syntaxErr(b, prefix, i)
	}
	switch b[i] {
	case '"':
		if end, _, prob, at = scanString(b, i); prob != strOK {
			return stringErr(b, prefix, levels, false, prob, at)
		}
		i = end
	case '{':
		if outer+len(levels) >= MaxDepth {
			return depthErr(b, prefix, levels, i)
		}
		levels = append(levels, level{obj: true, first: int32(len(keys))})
		if i = skipSpace(b, i+1); i < len(b) && b[i] == '}' {
			levels = levels[:len(levels)-1]
			i++
			goto after
		}
		goto key
	case '[':
		if outer+len(levels) >= MaxDepth {
			return depthErr(b, prefix, levels, i)
		}
		levels = append(levels, level{})
		if i = skipSpace(b, i+1); i < len(b) && b[i] == ']' {
			levels = levels[:len(levels)-1]
			i++
			goto after
		}
		goto value
	case 't':
		if !hasLit(b, i, "true") {
			return syntaxErr(b, prefix, i)
		}
		i += 4
	case 'f':
		if !hasLit(b, i, "false") {
			return syntaxErr(b, prefix, i)
		}
		i += 5
	case 'n':
		if !hasLit(b, i, "null") {
			return syntaxErr(b, prefix, i)
		}
		i += 4
	default:
		if i, ok = scanNumber(b, i); !ok {
			return syntaxErr(b, prefix, i)
		}
	}

after:
	if i < len(b) && b[i] <= ' ' {
		i = skipSpace(b, i)
	}
	if len(levels) == 0 {
		if i != len(b) {
			return syntaxErr(b, prefix, i)
		}
		return nil
	}
	if i >= len(b) {
		return syntaxErr(b, prefix, i)
	}
	top = &levels[len(levels)-1]
	switch c := b[i]; {
	case c == ',':
		if i++; i < len(b) && b[i] <= ' ' {
			i = skipSpace(b, i)
		}
		if top.obj {
			goto key
		}
		top.index++
		goto value
	case c == '}' && top.obj:
		keys = keys[:top.first]
	case c == ']' && !top.obj:
	default:
		return syntaxErr(b, prefix, i)
	}
	levels = levels[:len(levels)-1]
	i++
	goto after

key:
	if i >= len(b) || b[i] != '"' {
		return syntaxErr(b, prefix, i)
	}
	if end, flags, prob, at = scanString(b, i); prob != strOK {
		return stringErr(b, prefix, levels, true, prob, at)
	}
	{
		k := span{start: int32(i + 1), end: int32(end - 1), flags: flags}
		if flags == 0 && k.end > k.start {
			k.sig = uint32(k.end-k.start)<<16 | uint32(b[k.start]|0x20)<<8 | uint32(b[k.end-1]|0x20)
		}
		top = &levels[len(levels)-1]
		top.key, top.hasKey = k, true
		if flags != 0 {
			if r := asciiLookalike(b, k); r != 0 {
				return failAt(b, prefix, levels, true, "key has %U, which encoding/json matches as the letter %q and the fast decoder does not", r, foldRune(r))
			}
		}
		// The common case inline: a plain key whose sig no earlier key of a small,
		// plain object has, so that there is nothing to compare.
		if bit := uint64(1) << (k.sig * 0x9E3779B1 >> 26); flags == 0 && !top.odd && top.mask&bit == 0 &&
			top.set == nil && len(keys)-int(top.first) < linearKeys {
			top.mask |= bit
			keys = append(keys, k)
		} else {
			var dup int
			var prev span
			if keys, prev, dup = addKey(b, top, keys, k); dup != notDup {
				return dupErr(b, prefix, levels, dup, prev)
			}
		}
	}
	if i = end; i < len(b) && b[i] <= ' ' {
		i = skipSpace(b, i)
	}
	if i >= len(b) || b[i] != ':' {
		return syntaxErr(b, prefix, i)
	}
	if i++; i < len(b) && b[i] <= ' ' {
		i = skipSpace(b, i)
	}
	goto value
}

func depthErr(b []byte, prefix string, levels []level, at int) *FieldError {
	return failAt(b, prefix, levels, true, "nested deeper than %d levels (at offset %d)", MaxDepth, at)
}

// linearKeys is how many keys of one object are compared one by one (after the sig
// and the mask, which rule out most pairs); an object with more switches to a set.
// Almost every object of an event has fewer. Measured (BenchmarkCheckJSONKeys), the
// linear scan is the faster up to about 32 keys, and never allocates; past that, the
// set keeps the check linear. At worst (keys crafted to share their sig) each key is
// compared with 31 others: a constant factor, whatever the line.
const linearKeys = 32

const (
	keyEscaped  = 1 << iota // the raw key has a backslash
	keyNonASCII             // the raw key has a byte ≥ 0x80
)

// span is a key: the raw bytes between its quotes. sig, of a key without escapes or
// non-ASCII bytes, is its length and its first and last bytes, lower-cased: two such
// keys can only be the same when their sigs are.
type span struct {
	start, end int32
	sig        uint32
	flags      uint8
}

// level is one open object or array.
type level struct {
	key    span    // object: the current member's key (valid once hasKey)
	index  int32   // array: the current element
	first  int32   // object: keys[first:] are its keys while it has at most linearKeys
	obj    bool    // an object, not an array
	hasKey bool    // object: key is set
	odd    bool    // object: a key has escapes or non-ASCII bytes
	mask   uint64  // object: a bit for the sig of each plain key
	set    *keySet // object: its keys once it has more than linearKeys
}

// strPlain marks the bytes a string can hold as they are: not '"', '\\', a control
// character or a byte of a multi-byte UTF-8 sequence.
var strPlain = func() (t [256]bool) {
	for c := 0x20; c < 0x80; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// What scanString found wrong.
const (
	strOK = iota
	strSyntax
	strLoneSurrogate
	strBadUTF8
)

// For scanning 8 bytes of a string at once.
const (
	ones  = 0x0101010101010101
	highs = 0x8080808080808080
)

// scanString scans the string that starts at b[i] (a '"') and returns the index after
// it and what it holds (keyEscaped, keyNonASCII), or the problem and where it is.
func scanString(b []byte, i int) (end int, flags uint8, prob int, at int) {
	i++
	for {
		// Eight bytes at a time: m flags the bytes below 0x20, '"', '\\' and ≥ 0x80.
		// The lowest flag is exact (a borrow only runs upwards, past a flagged byte).
		for i+8 <= len(b) {
			x := binary.LittleEndian.Uint64(b[i:])
			q, s := x^(ones*'"'), x^(ones*'\\')
			if m := (x | (x-ones*0x20)&^x | (q-ones)&^q | (s-ones)&^s) & highs; m != 0 {
				i += bits.TrailingZeros64(m) >> 3
				goto special
			}
			i += 8
		}
		for i < len(b) && strPlain[b[i]] {
			i++
		}
	special:
		if i >= len(b) {
			return 0, 0, strSyntax, i
		}
		switch c := b[i]; {
		case c == '"':
			return i + 1, flags, strOK, 0
		case c == '\\':
			flags |= keyEscaped
			if i+1 >= len(b) {
				return 0, 0, strSyntax, i + 1
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
				continue
			case 'u':
			default:
				return 0, 0, strSyntax, i + 1
			}
			r, ok := hex4(b, i+2)
			if !ok {
				return 0, 0, strSyntax, i + 2
			}
			switch {
			case r >= 0xDC00 && r <= 0xDFFF:
				return 0, 0, strLoneSurrogate, i
			case r >= 0xD800 && r <= 0xDBFF:
				lo, ok := rune(0), false
				if i+7 < len(b) && b[i+6] == '\\' && b[i+7] == 'u' {
					lo, ok = hex4(b, i+8)
				}
				if !ok || lo < 0xDC00 || lo > 0xDFFF {
					return 0, 0, strLoneSurrogate, i
				}
				i += 12
			default:
				i += 6
			}
		case c < 0x20:
			return 0, 0, strSyntax, i
		default: // c >= 0x80
			flags |= keyNonASCII
			r, n := utf8.DecodeRune(b[i:])
			if r == utf8.RuneError && n == 1 {
				return 0, 0, strBadUTF8, i
			}
			i += n
		}
	}
}

// stringErr is a problem inside a string: a key's is its object's, a value's its own.
func stringErr(b []byte, prefix string, levels []level, isKey bool, prob, at int) *FieldError {
	what := "in a string"
	if isKey {
		what = "in a key"
	}
	switch prob {
	case strLoneSurrogate:
		return failAt(b, prefix, levels, !isKey, "%s: lone surrogate %s at offset %d", what, b[at:at+6], at)
	case strBadUTF8:
		return failAt(b, prefix, levels, !isKey, "%s: invalid UTF-8 at offset %d", what, at)
	}
	return syntaxErr(b, prefix, at)
}

// Kinds of duplicate key.
const (
	notDup  = iota
	dupSame // written the same
	dupFold // the same unescaped and folded
)

// addKey records the key k of the object top, whose keys so far are keys[top.first:]
// (or top.set), unless the object already has it; then it says how, and which.
func addKey(b []byte, top *level, keys []span, k span) ([]span, span, int) {
	if top.set != nil {
		if prev, dup := top.set.add(b, k); dup {
			return keys, prev, dupKind(b, prev, k)
		}
		return keys, span{}, notDup
	}
	// A plain key (no escapes, ASCII) can only equal an earlier plain key with its sig,
	// whose bit in the object's mask would then be set.
	bit := uint64(1) << (k.sig * 0x9E3779B1 >> 26)
	scan := k.flags != 0 || top.odd || top.mask&bit != 0
	if k.flags != 0 {
		top.odd = true
	}
	top.mask |= bit
	for _, prev := range keys[top.first:] {
		if !scan {
			break
		}
		if prev.flags|k.flags == 0 && prev.sig != k.sig {
			continue
		}
		if sameKey(b, prev, k) {
			return keys, prev, dupKind(b, prev, k)
		}
	}
	keys = append(keys, k)
	if n := len(keys) - int(top.first); n > linearKeys {
		top.set = &keySet{byHash: make(map[uint64]span, 2*n)}
		for _, prev := range keys[top.first:] {
			top.set.add(b, prev)
		}
		keys = keys[:top.first]
	}
	return keys, span{}, notDup
}

func dupKind(b []byte, prev, k span) int {
	if string(b[prev.start:prev.end]) == string(b[k.start:k.end]) {
		return dupSame
	}
	return dupFold
}

// keySet is the keys of a large object, by a hash of their folded form (seeded at
// random, so that nobody can choose keys that collide), with the few keys whose hash
// an earlier, different key had beside.
type keySet struct {
	byHash   map[uint64]span
	collided []span
}

// keySeed seeds keyHash; it is set once, at start, and never changes.
var keySeed = maphash.MakeSeed()

// add records k, unless the set has it: then it returns the earlier key.
func (s *keySet) add(b []byte, k span) (span, bool) {
	h := keyHash(b, k)
	prev, hit := s.byHash[h]
	if !hit {
		s.byHash[h] = k
		return span{}, false
	}
	if sameKey(b, prev, k) {
		return prev, true
	}
	for _, c := range s.collided {
		if sameKey(b, c, k) {
			return c, true
		}
	}
	s.collided = append(s.collided, k)
	return span{}, false
}

// keyHash hashes a key unescaped and folded (foldRune), so that keys sameKey calls
// the same hash the same.
func keyHash(b []byte, k span) uint64 {
	var buf [64]byte
	f := buf[:0]
	if k.flags == 0 {
		for _, c := range b[k.start:k.end] {
			if 'a' <= c && c <= 'z' {
				c -= 'a' - 'A'
			}
			f = append(f, c)
		}
	} else {
		for i := int(k.start); i < int(k.end); {
			var r rune
			r, i = keyRune(b, i)
			f = utf8.AppendRune(f, foldRune(r))
		}
	}
	return maphash.Bytes(keySeed, f)
}

func dupErr(b []byte, prefix string, levels []level, dup int, prev span) *FieldError {
	if dup == dupSame {
		return failAt(b, prefix, levels, true, "duplicate key")
	}
	return failAt(b, prefix, levels, true, "duplicate key: the same as %s once unescaped and compared ignoring case", pathKey(unescapeKey(b, prev)))
}

// sameKey says whether two keys are the same once unescaped and folded.
func sameKey(b []byte, x, y span) bool {
	if x.flags|y.flags == 0 {
		if x.end-x.start != y.end-y.start {
			return false
		}
		for i, j := x.start, y.start; i < x.end; i, j = i+1, j+1 {
			c, d := b[i], b[j]
			if c != d && (c|0x20 != d|0x20 || c|0x20 < 'a' || c|0x20 > 'z') {
				return false
			}
		}
		return true
	}
	i, j, xe, ye := int(x.start), int(y.start), int(x.end), int(y.end)
	for i < xe && j < ye {
		var r, s rune
		r, i = keyRune(b, i)
		s, j = keyRune(b, j)
		if r != s && foldRune(r) != foldRune(s) {
			return false
		}
	}
	return i == xe && j == ye
}

// foldRune is the fold encoding/json matches names with (its foldName): two names
// are the same field when their folded runes are.
func foldRune(r rune) rune {
	if r < utf8.RuneSelf {
		if 'a' <= r && r <= 'z' {
			r -= 'a' - 'A'
		}
		return r
	}
	return unicode.ToUpper(unicode.ToLower(r))
}

// asciiLookalike returns the first rune of key k that is not ASCII but folds to an
// ASCII letter (U+017F ſ folds to s, U+212A Kelvin sign to k), or 0. encoding/json
// matches such a key to a struct field ("input_tokenſ" is input_tokens) and
// segmentio's decoder does not, so the two decoders, the policy replica and ingest
// would read different values from one line.
func asciiLookalike(b []byte, k span) rune {
	for i := int(k.start); i < int(k.end); {
		var r rune
		r, i = keyRune(b, i)
		if r >= utf8.RuneSelf && foldRune(r) < utf8.RuneSelf {
			return r
		}
	}
	return 0
}

// unescapeKey is a key's text.
func unescapeKey(b []byte, k span) string {
	if k.flags&keyEscaped == 0 {
		return string(b[k.start:k.end])
	}
	var sb strings.Builder
	for i := int(k.start); i < int(k.end); {
		var r rune
		r, i = keyRune(b, i)
		sb.WriteRune(r)
	}
	return sb.String()
}

// keyRune decodes the rune at b[i] of a string the guard has checked, escapes
// included, and returns the index after it.
func keyRune(b []byte, i int) (rune, int) {
	c := b[i]
	if c < utf8.RuneSelf {
		if c != '\\' {
			return rune(c), i + 1
		}
		switch b[i+1] {
		case 'b':
			return '\b', i + 2
		case 'f':
			return '\f', i + 2
		case 'n':
			return '\n', i + 2
		case 'r':
			return '\r', i + 2
		case 't':
			return '\t', i + 2
		case 'u':
			r, _ := hex4(b, i+2)
			if r >= 0xD800 && r <= 0xDBFF {
				lo, _ := hex4(b, i+8)
				return (r-0xD800)<<10 | (lo - 0xDC00) + 0x10000, i + 12
			}
			return r, i + 6
		}
		return rune(b[i+1]), i + 2 // '"', '\\', '/'
	}
	r, n := utf8.DecodeRune(b[i:])
	return r, i + n
}

func hex4(b []byte, i int) (rune, bool) {
	if i+4 > len(b) {
		return 0, false
	}
	var r rune
	for _, c := range b[i : i+4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

func hasLit(b []byte, i int, lit string) bool {
	return len(b)-i >= len(lit) && string(b[i:i+len(lit)]) == lit
}

// scanNumber returns the end of the JSON number at b[i]: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
func scanNumber(b []byte, i int) (int, bool) {
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i >= len(b):
		return i, false
	case b[i] == '0':
		i++
	case '1' <= b[i] && b[i] <= '9':
		i = digits(b, i+1)
	default:
		return i, false
	}
	if i < len(b) && b[i] == '.' {
		j := digits(b, i+1)
		if j == i+1 {
			return j, false
		}
		i = j
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := digits(b, i)
		if j == i {
			return j, false
		}
		i = j
	}
	return i, true
}

func digits(b []byte, i int) int {
	for i < len(b) && '0' <= b[i] && b[i] <= '9' {
		i++
	}
	return i
}

// syntaxErr is a malformed line: encoding/json says what is wrong (it scans without
// recursing, and stops at its first error, which is the guard's too).
func syntaxErr(b []byte, prefix string, at int) *FieldError {
	var raw json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		fe := jsonErr(err, "")
		if fe.Field == "" {
			fe.Field = prefix
		}
		return fe
	}
	// Not reached: FuzzCheckJSON checks that the guard refuses only what encoding/json
	// refuses. Should they ever disagree, the line is still refused.
	return &FieldError{Field: prefix, Reason: fmt.Sprintf("invalid JSON at offset %d", at)}
}

// failAt is a FieldError at the current position: inside the innermost container's
// current member or element when member is set, else at that container.
func failAt(b []byte, prefix string, levels []level, member bool, format string, args ...any) *FieldError {
	return &FieldError{Field: pathAt(b, prefix, levels, member), Reason: fmt.Sprintf(format, args...)}
}

// Bounds on a path in an error, which a client can make as long as its line.
const (
	maxPathKey = 64  // bytes of one key
	maxPath    = 256 // bytes of the whole path; the middle is elided beyond
)

// pathAt is the path of the current position (see failAt), bounded in length.
func pathAt(b []byte, prefix string, levels []level, member bool) string {
	var sb strings.Builder
	sb.WriteString(prefix)
	for i, lv := range levels {
		if i == len(levels)-1 && !member {
			break // the innermost container itself
		}
		if !lv.obj {
			sb.WriteByte('[')
			sb.WriteString(strconv.Itoa(int(lv.index)))
			sb.WriteByte(']')
			continue
		}
		if !lv.hasKey {
			break
		}
		k := pathKey(unescapeKey(b, lv.key))
		if k[0] != '[' && sb.Len() > 0 {
			sb.WriteByte('.')
		}
		sb.WriteString(k)
	}
	p := sb.String()
	if len(p) > maxPath {
		head, tail := cutRunes(p, maxPath/2), p[len(p)-maxPath/2+8:]
		for len(tail) > 0 && !utf8.RuneStart(tail[0]) {
			tail = tail[1:]
		}
		p = head + "…" + tail
	}
	return p
}

// pathKey is a key as written in a path: as it is when it is a plain name, else
// quoted in brackets (`["a.b"]`); at most maxPathKey bytes of it.
func pathKey(k string) string {
	plain := k != ""
	for _, r := range k {
		if r == '.' || r == '[' || r == ']' || r == '"' || r == '\\' || r == ' ' || !unicode.IsPrint(r) {
			plain = false
			break
		}
	}
	cut := cutRunes(k, maxPathKey)
	if cut != k {
		cut += "…"
	}
	if plain {
		return cut
	}
	return "[" + strconv.Quote(cut) + "]"
}

// cutRunes is s cut to at most n bytes, on a rune boundary.
func cutRunes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// quoteShort quotes a value for an error message, at most 64 bytes of it: a client can
// send values as long as its line, and errors are echoed and logged.
func quoteShort(s string) string {
	if len(s) <= 64 {
		return strconv.Quote(s)
	}
	return strconv.Quote(cutRunes(s, 64)) + fmt.Sprintf("… (%d bytes)", len(s))
}
