// Package ljson reads JSON for the filter: a validator that says where a
// document stops being JSON, and a Result that walks a valid document
// without building it, in the shape of the subset of tidwall/gjson the
// filter used (Parse, Get of a member, ForEach, Array, the Type, Raw and
// Str fields). It replaces gjson in the wasm guest: gjson's init keeps its
// path modifiers alive, and through them tidwall/pretty, tidwall/match and
// the time package with its GODEBUG machinery, about 340 KB of the module
// for features the filter never uses. ljson_test.go checks it against
// gjson and encoding/json.
package ljson

import "strconv"

// Valid reports whether data is one JSON value (RFC 8259), surrounded by
// nothing but whitespace, nested at most maxDepth deep.
func Valid(data []byte) bool {
	s := scanner{b: data}
	s.space()
	if !s.value(0) {
		return false
	}
	s.space()
	return s.i == len(s.b)
}

// SyntaxError says where data, which Valid refused, stops being JSON:
// "line L, column C: <what>". Columns count bytes from 1.
func SyntaxError(data []byte) string {
	s := scanner{b: data}
	s.space()
	if s.value(0) {
		s.space()
		if s.i < len(s.b) {
			s.fail("unexpected data after the top-level value")
		}
	}
	if s.msg == "" {
		s.fail("invalid JSON")
	}
	line, col := 1, 1
	for _, c := range data[:min(s.i, len(data))] {
		if c == '\n' {
			line, col = line+1, 1
		} else {
			col++
		}
	}
	return "line " + strconv.Itoa(line) + ", column " + strconv.Itoa(col) + ": " + s.msg
}

// maxDepth bounds the nesting the scanner follows, as encoding/json does.
const maxDepth = 10000

type scanner struct {
	b   []byte
	i   int
	msg string
}

func (s *scanner) fail(msg string) bool {
	if s.msg == "" {
		s.msg = msg
	}
	return false
}

func (s *scanner) space() {
	for s.i < len(s.b) && (s.b[s.i] == ' ' || s.b[s.i] == '\t' || s.b[s.i] == '\n' || s.b[s.i] == '\r') {
		s.i++
	}
}

func (s *scanner) value(depth int) bool {
	if depth > maxDepth {
		return s.fail("nested too deeply")
	}
	if s.i >= len(s.b) {
		return s.fail("unexpected end of input")
	}
	switch c := s.b[s.i]; {
	case (c == '{' || c == '[') && depth >= maxDepth:
		return s.fail("nested too deeply")
	case c == '{':
		return s.container(depth, '}', true)
	case c == '[':
		return s.container(depth, ']', false)
	case c == '"':
		return s.str()
	case c == '-' || '0' <= c && c <= '9':
		return s.number()
	}
	for _, lit := range []string{"true", "false", "null"} {
		if len(s.b)-s.i >= len(lit) && string(s.b[s.i:s.i+len(lit)]) == lit {
			s.i += len(lit)
			return true
		}
	}
	return s.fail("unexpected character " + strconv.QuoteRune(rune(s.b[s.i])))
}

// container scans an object (members with keys) or an array up to close.
func (s *scanner) container(depth int, close byte, members bool) bool {
	s.i++
	s.space()
	if s.i < len(s.b) && s.b[s.i] == close {
		s.i++
		return true
	}
	for {
		if members {
			if s.i >= len(s.b) || s.b[s.i] != '"' {
				return s.fail("expected a string key")
			}
			if !s.str() {
				return false
			}
			s.space()
			if s.i >= len(s.b) || s.b[s.i] != ':' {
				return s.fail("expected ':' after an object key")
			}
			s.i++
			s.space()
		}
		if !s.value(depth + 1) {
			return false
		}
		s.space()
		switch {
		case s.i >= len(s.b):
			return s.fail("unexpected end of input")
		case s.b[s.i] == ',':
			s.i++
			s.space()
			if s.i < len(s.b) && s.b[s.i] == close {
				return s.fail("trailing comma")
			}
		case s.b[s.i] == close:
			s.i++
			return true
		default:
			return s.fail("expected ',' or '" + string(close) + "'")
		}
	}
}

func (s *scanner) str() bool {
	s.i++ // the opening quote
	for s.i < len(s.b) {
		switch c := s.b[s.i]; {
		case c == '"':
			s.i++
			return true
		case c == '\\':
			s.i++
			if s.i >= len(s.b) {
				return s.fail("unexpected end of input in a string")
			}
			switch s.b[s.i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				s.i++
			case 'u':
				for k := 1; k <= 4; k++ {
					if s.i+k >= len(s.b) || !isHex(s.b[s.i+k]) {
						return s.fail(`bad \u escape in a string`)
					}
				}
				s.i += 5
			default:
				return s.fail("bad escape in a string")
			}
		case c < 0x20:
			return s.fail("control character in a string")
		default:
			s.i++
		}
	}
	return s.fail("unterminated string")
}

func isHex(c byte) bool { return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F' }

func (s *scanner) number() bool {
	digits := func() int {
		n := 0
		for s.i < len(s.b) && '0' <= s.b[s.i] && s.b[s.i] <= '9' {
			s.i++
			n++
		}
		return n
	}
	if s.b[s.i] == '-' {
		s.i++
	}
	start := s.i
	if n := digits(); n == 0 {
		return s.fail("expected a digit")
	} else if n > 1 && s.b[start] == '0' {
		s.i = start
		return s.fail("number with a leading zero")
	}
	if s.i < len(s.b) && s.b[s.i] == '.' {
		s.i++
		if digits() == 0 {
			return s.fail("expected a digit after '.'")
		}
	}
	if s.i < len(s.b) && (s.b[s.i] == 'e' || s.b[s.i] == 'E') {
		s.i++
		if s.i < len(s.b) && (s.b[s.i] == '+' || s.b[s.i] == '-') {
			s.i++
		}
		if digits() == 0 {
			return s.fail("expected a digit in the exponent")
		}
	}
	return true
}
