package ljson

import (
	"math"
	"strconv"
)

// Pointer is a JSON pointer (RFC 6901) split into its reference tokens,
// unescaped: "/usage/total_tokens" is ["usage", "total_tokens"].
type Pointer []string

// Bounds of a Pointer and of what PointerScanner keeps.
const (
	// MaxPointerTokens bounds the reference tokens of a Pointer.
	MaxPointerTokens = 8
	// MaxPointerToken bounds the bytes of one reference token.
	MaxPointerToken = 64
	// maxScanDepth bounds the nesting PointerScanner follows; a deeper
	// document stops the scan (nothing more is found).
	maxScanDepth = 512
	// maxNumber bounds the text of the number PointerScanner reads.
	maxNumber = 40
)

// ParsePointer parses a JSON pointer of 1 to MaxPointerTokens reference
// tokens of at most MaxPointerToken bytes: "/" then tokens separated by
// "/", with "~1" for '/' and "~0" for '~'. The whole document ("") is not
// a pointer here: the value sought is a number inside an object or array.
func ParsePointer(s string) (Pointer, bool) {
	if len(s) < 2 || s[0] != '/' {
		return nil, false
	}
	var p Pointer
	for _, raw := range splitSlash(s[1:]) {
		tok := make([]byte, 0, len(raw))
		for i := 0; i < len(raw); i++ {
			c := raw[i]
			if c == '~' {
				if i+1 == len(raw) || (raw[i+1] != '0' && raw[i+1] != '1') {
					return nil, false
				}
				c = '/'
				if raw[i+1] == '0' {
					c = '~'
				}
				i++
			}
			tok = append(tok, c)
		}
		if len(tok) > MaxPointerToken {
			return nil, false
		}
		p = append(p, string(tok))
	}
	if len(p) > MaxPointerTokens {
		return nil, false
	}
	return p, true
}

func splitSlash(s string) []string {
	var out []string
	start := 0
	for i := 0; i < len(s); i++ {
		if s[i] == '/' {
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return append(out, s[start:])
}

// String returns the pointer in its RFC 6901 form.
func (p Pointer) String() string {
	var b []byte
	for _, t := range p {
		b = append(b, '/')
		for i := 0; i < len(t); i++ {
			switch t[i] {
			case '~':
				b = append(b, "~0"...)
			case '/':
				b = append(b, "~1"...)
			default:
				b = append(b, t[i])
			}
		}
	}
	return string(b)
}

// Scanner states.
const (
	psValue      = iota // a value is expected
	psAfterValue        // ',' or a closing bracket is expected
	psKeyOrEnd          // after '{': a key or '}'
	psKey               // after ',' in an object: a key
	psColon             // after a key: ':'
	psString            // inside a string
	psNumber            // inside a number
	psLiteral           // inside true, false or null
	psDone              // the document has ended
	psFailed            // not JSON, or nested too deep: nothing more is found
)

// bom is the UTF-8 byte order mark.
const bom = "\xef\xbb\xbf"

// PointerScanner finds the number at a JSON pointer in a document that
// arrives in pieces of any size, with memory bounded whatever the
// document: it never keeps the document, only a bit per nesting level (up
// to 512 levels), the key being compared, and the number being read. A
// value at the pointer that is not a number (or a negative or infinite
// one) is not found; if the pointer appears several times (repeated keys),
// the last number wins (with Fold: the largest). Keys are compared after unescaping; a key escaped
// as a UTF-16 surrogate pair never matches.
//
// It reads what lax readers such as Python's json read: a leading UTF-8
// byte order mark is skipped, NaN, Infinity and -Infinity are values, and
// a string at the pointer holding a number ("500") is reported by Quoted.
// What they may read and it cannot is reported by Unreadable.
//
// The zero value is not usable: call Reset with a pointer first.
type PointerScanner struct {
	ptr   Pointer
	state uint8
	// For psString: whether the string is a key compared with the
	// pointer (cmp), and the escape being read.
	isKey, cmp bool
	esc        uint8 // 0 none, 1 after '\', 2..5 hex digits of \u
	uval       rune
	keyPos     int // bytes of the token matched so far; -1: no match
	// depth is the nesting depth (0 outside the root container); arrays
	// has a bit per level, set for an array. on is the deepest level whose
	// containers all lie on the pointer's path.
	depth, on int
	arrays    [maxScanDepth / 64]uint64
	// idx is the index of the current element of each array on the path.
	idx [MaxPointerTokens + 1]int
	// match reports whether the member being read at depth on is the
	// pointer's token for that level.
	match bool
	// capture reports whether the number being read is the target.
	capture bool
	// peekEmptyArray: the '[' just read may be closed at once.
	peekEmptyArray bool
	num            [maxNumber]byte
	numLen         int
	// lead counts the first bytes read (up to 3), bom those of them that
	// were a UTF-8 byte order mark.
	lead, bom uint8

	found, quoted, unreadable bool
	value, str                float64

	// Fold makes keys compare as Go's encoding/json compares them, and
	// repeated pointers keep their largest number; set it after Reset.
	// Keys then match the pointer's tokens as Go's encoding/json matches a
	// struct's fields, without regard to the case of ASCII letters (and
	// with the Kelvin sign U+212A for k and the long s U+017F for s, as
	// Unicode folds them), so {"MAX_TOKENS":5} is at /max_tokens; and when
	// the pointer is met several times (repeated keys, or spellings of one
	// key), Found and Quoted report the largest number, since a reader may
	// keep the first or the last. A token with other non-ASCII letters
	// compares exactly.
	Fold bool
	// pend is the next byte expected of a Kelvin sign or long s being
	// matched (0: none).
	pend byte
}

// Reset starts a new document, looking for p.
func (s *PointerScanner) Reset(p Pointer) {
	*s = PointerScanner{ptr: p}
}

// Found returns the number found at the pointer so far, if any.
func (s *PointerScanner) Found() (float64, bool) { return s.value, s.found }

// Quoted returns the number held by the last string found at the pointer
// so far ("500", "5e2"; nothing else in the string), if any: Found
// ignores it, lax readers (pydantic, for one) read it as a number.
func (s *PointerScanner) Quoted() (float64, bool) { return s.str, s.quoted }

// Unreadable reports whether the document holds what a lax reader may
// read and this scanner cannot: a document in UTF-16 or UTF-32 (a NUL or a
// UTF-16 byte order mark among its first bytes, as RFC 8259 section 8.1
// and Python's json.detect_encoding tell them), nesting deeper than 512
// levels, or at the pointer a number longer than 40 bytes or a string
// that holds no non-negative finite number of at most 40 bytes.
func (s *PointerScanner) Unreadable() bool { return s.unreadable }

// Failed reports whether the scan stopped because the input is not JSON or
// nests deeper than the scanner follows.
func (s *PointerScanner) Failed() bool { return s.state == psFailed }

// Done reports whether the document has ended (the root container closed)
// or the scan stopped: more input cannot change the result.
func (s *PointerScanner) Done() bool { return s.state == psDone || s.state == psFailed }

// End tells the scanner the document ends here: a number being read at the
// very end is complete.
func (s *PointerScanner) End() {
	if s.state == psNumber {
		s.endNumber()
	}
}

func (s *PointerScanner) isArray(d int) bool { return s.arrays[(d-1)/64]&(1<<((d-1)%64)) != 0 }

func (s *PointerScanner) fail() { s.state = psFailed }

// unread stops the scan: the document cannot be read (Unreadable).
func (s *PointerScanner) unread() { s.unreadable, s.state = true, psFailed }

// Write feeds the next piece of the document. It never fails: input that
// is not JSON stops the scan (see Failed).
func (s *PointerScanner) Write(b []byte) {
	for i := 0; i < len(b) && s.state < psDone; i++ {
		if s.state == psString && s.esc == 0 && !s.cmp && !s.capture {
			// Most of a large document is string contents that are not
			// compared: skip them in a tight loop.
			for i < len(b) && b[i] != '"' && b[i] != '\\' && b[i] >= 0x20 {
				i++
			}
			if i == len(b) {
				return
			}
		}
		s.step(b[i])
	}
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func (s *PointerScanner) step(c byte) {
	if s.lead < 3 {
		s.lead++
		switch {
		case c == 0 || s.lead == 1 && c >= 0xFE:
			s.unread() // UTF-16 or UTF-32
			return
		case s.bom+1 == s.lead && c == bom[s.bom]:
			s.bom++
			return
		}
	}
	switch s.state {
	case psString:
		s.stringByte(c)
		return
	case psNumber:
		if '0' <= c && c <= '9' || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-' {
			s.keep(c)
			return
		}
		if 'a' <= c|0x20 && c|0x20 <= 'z' {
			s.state, s.capture = psLiteral, false // -Infinity
			return
		}
		s.endNumber()
		s.step(c) // the delimiter
		return
	case psLiteral:
		if 'a' <= c|0x20 && c|0x20 <= 'z' {
			return
		}
		s.endValue()
		s.step(c)
		return
	}
	if isSpace(c) {
		return
	}
	switch s.state {
	case psValue:
		s.startValue(c)
	case psAfterValue:
		switch {
		case c == ',' && s.depth > 0:
			if s.isArray(s.depth) {
				if s.depth == s.on && s.depth <= len(s.ptr) {
					s.idx[s.depth]++
					s.match = s.indexMatches()
				}
				s.state = psValue
			} else {
				s.state = psKey
			}
		case (c == '}' || c == ']') && s.depth > 0 && (c == ']') == s.isArray(s.depth):
			s.close()
		default:
			s.fail()
		}
	case psKeyOrEnd, psKey:
		switch {
		case c == '"':
			s.state, s.isKey, s.esc = psString, true, 0
			s.cmp = s.depth == s.on && s.depth <= len(s.ptr)
			s.keyPos, s.pend = 0, 0
		case c == '}' && s.state == psKeyOrEnd:
			s.close()
		default:
			s.fail()
		}
	case psColon:
		if c != ':' {
			s.fail()
			return
		}
		s.state = psValue
	}
}

// startValue begins the value whose first byte is c.
func (s *PointerScanner) startValue(c byte) {
	target := s.depth > 0 && s.depth == s.on && s.match && s.depth == len(s.ptr)
	switch {
	case c == '{' || c == '[':
		if s.depth == maxScanDepth {
			s.unread()
			return
		}
		deeper := s.depth == 0 || (s.depth == s.on && s.match && s.depth < len(s.ptr))
		s.depth++
		bit := uint64(1) << ((s.depth - 1) % 64)
		if c == '[' {
			s.arrays[(s.depth-1)/64] |= bit
		} else {
			s.arrays[(s.depth-1)/64] &^= bit
		}
		if deeper {
			s.on = s.depth
		}
		s.match = false
		if c == '{' {
			s.state, s.peekEmptyArray = psKeyOrEnd, false
			return
		}
		if s.depth == s.on && s.depth <= len(s.ptr) {
			s.idx[s.depth] = 0
			s.match = s.indexMatches()
		}
		s.state = psValue
		s.peekEmptyArray = true
	case c == ']' && s.peekEmptyArray && s.depth > 0 && s.isArray(s.depth):
		s.close()
	case c == '"':
		s.state, s.isKey, s.cmp, s.esc = psString, false, false, 0
		s.capture, s.numLen = target, 0
	case c == '-' || '0' <= c && c <= '9':
		s.state, s.capture, s.numLen = psNumber, target, 0
		s.keep(c)
	case c == 't' || c == 'f' || c == 'n' || c == 'N' || c == 'I':
		s.state = psLiteral
	default:
		s.fail()
		return
	}
	if s.state != psValue {
		s.peekEmptyArray = false
	}
}

// indexMatches reports whether the current element of the array at depth
// s.depth is the pointer's token for that level.
func (s *PointerScanner) indexMatches() bool {
	tok := s.ptr[s.depth-1]
	if tok == "" || len(tok) > 1 && tok[0] == '0' || len(tok) > 9 {
		return false
	}
	n := 0
	for i := 0; i < len(tok); i++ {
		if tok[i] < '0' || tok[i] > '9' {
			return false
		}
		n = n*10 + int(tok[i]-'0')
	}
	return n == s.idx[s.depth]
}

// close ends the container at s.depth.
func (s *PointerScanner) close() {
	s.depth--
	if s.on > s.depth {
		s.on = s.depth
	}
	s.match = false
	if s.depth == 0 {
		s.state = psDone
		return
	}
	s.endValueInContainer()
}

// endValue ends a scalar value.
func (s *PointerScanner) endValue() {
	if s.depth == 0 {
		s.state = psDone
		return
	}
	s.endValueInContainer()
}

func (s *PointerScanner) endValueInContainer() {
	s.state = psAfterValue
	// An array member keeps its match until the ',' moves the index on.
	if !s.isArray(s.depth) {
		s.match = false
	}
}

// keep adds c to the number (or string) being captured; one longer than
// maxNumber cannot be read.
func (s *PointerScanner) keep(c byte) {
	switch {
	case !s.capture:
	case s.numLen == maxNumber:
		s.unreadable, s.capture = true, false
	default:
		s.num[s.numLen] = c
		s.numLen++
	}
}

// take ends the value captured at the pointer, if any: a non-negative
// finite number is found; a string is quoted if it holds one, and
// unreadable if not.
func (s *PointerScanner) take(quoted bool) {
	if !s.capture {
		return
	}
	s.capture = false
	v, err := strconv.ParseFloat(string(s.num[:s.numLen]), 64)
	ok := err == nil && v >= 0 && !math.IsInf(v, 0)
	switch {
	case quoted:
		s.unreadable = s.unreadable || !ok
		if !s.Fold || !s.quoted || ok && v > s.str {
			s.quoted, s.str = ok, v
		}
	case ok && (!s.Fold || !s.found || v > s.value):
		s.found, s.value = true, v
	}
}

func (s *PointerScanner) endNumber() {
	s.take(false)
	s.endValue()
}

// stringByte reads one byte of a string.
func (s *PointerScanner) stringByte(c byte) {
	switch s.esc {
	case 0:
		switch {
		case c == '\\':
			s.esc = 1
		case c == '"':
			s.endString()
		case c < 0x20:
			s.fail()
		default:
			s.strByte(c)
		}
	case 1:
		s.esc = 0
		switch c {
		case '"', '\\', '/':
			s.strByte(c)
		case 'b':
			s.strByte('\b')
		case 'f':
			s.strByte('\f')
		case 'n':
			s.strByte('\n')
		case 'r':
			s.strByte('\r')
		case 't':
			s.strByte('\t')
		case 'u':
			s.esc, s.uval = 2, 0
		default:
			s.fail()
		}
	default:
		var d rune
		switch {
		case '0' <= c && c <= '9':
			d = rune(c - '0')
		case 'a' <= c && c <= 'f':
			d = rune(c-'a') + 10
		case 'A' <= c && c <= 'F':
			d = rune(c-'A') + 10
		default:
			s.fail()
			return
		}
		s.uval = s.uval<<4 | d
		if s.esc++; s.esc < 6 {
			return
		}
		s.esc = 0
		if !s.cmp && !s.capture {
			return
		}
		if s.uval >= 0xD800 && s.uval < 0xE000 {
			s.keyPos = -1 // surrogates never match
			s.strByte(0)  // nor make a number
			return
		}
		var buf [4]byte
		n := encodeRune(buf[:], s.uval)
		for _, b := range buf[:n] {
			s.strByte(b)
		}
	}
}

// strByte takes one decoded byte of a string: a key's is compared with
// the pointer's token, a value's at the pointer captured.
func (s *PointerScanner) strByte(c byte) {
	if s.capture {
		s.keep(c)
		return
	}
	s.keyByte(c)
}

// keyByte compares one decoded byte of a key with the pointer's token.
func (s *PointerScanner) keyByte(c byte) {
	if !s.cmp || s.keyPos < 0 {
		return
	}
	tok := s.ptr[s.depth-1]
	if s.pend != 0 { // inside a Kelvin sign (E2 84 AA) or long s (C5 BF)
		switch {
		case c != s.pend:
			s.keyPos = -1
		case c == 0x84:
			s.pend = 0xAA
		default:
			s.pend = 0
			s.keyPos++
		}
		return
	}
	if s.keyPos < len(tok) {
		t := tok[s.keyPos]
		switch {
		case t == c:
		case !s.Fold:
			s.keyPos = -1
			return
		case t|0x20 == 'k' && c == 0xE2:
			s.pend = 0x84
			return
		case t|0x20 == 's' && c == 0xC5:
			s.pend = 0xBF
			return
		case t|0x20 != c|0x20 || t|0x20 < 'a' || t|0x20 > 'z':
			s.keyPos = -1
			return
		}
		s.keyPos++
		return
	}
	s.keyPos = -1
}

func (s *PointerScanner) endString() {
	if s.isKey {
		s.match = s.cmp && s.keyPos == len(s.ptr[s.depth-1])
		s.state = psColon
		return
	}
	s.take(true)
	s.endValue()
}

// encodeRune is utf8.EncodeRune for the BMP without surrogates.
func encodeRune(b []byte, r rune) int {
	switch {
	case r < 0x80:
		b[0] = byte(r)
		return 1
	case r < 0x800:
		b[0], b[1] = 0xC0|byte(r>>6), 0x80|byte(r)&0x3F
		return 2
	}
	b[0], b[1], b[2] = 0xE0|byte(r>>12), 0x80|byte(r>>6)&0x3F, 0x80|byte(r)&0x3F
	return 3
}
