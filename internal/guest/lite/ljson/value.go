package ljson

import (
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// Type is the type of a JSON value, numbered as gjson numbers its types.
type Type int

// JSON value types. JSON is an object or an array.
const (
	Null Type = iota
	False
	Number
	String
	True
	JSON
)

// Result is one value of a document: its Type, its text (Raw) and, for a
// string, the unescaped string (Str); for a number, Num. The zero Result
// is a value that does not exist.
type Result struct {
	Type Type
	Raw  string
	Str  string
	Num  float64
}

// Parse reads the first value of json, which should be valid (see Valid):
// on invalid input the result is unspecified, but nothing panics.
func Parse(json string) Result {
	i := skipSpace(json, 0)
	r, _ := parseAt(json, i)
	return r
}

// ParseBytes is Parse of a byte slice; the Result's strings are copies.
func ParseBytes(json []byte) Result { return Parse(string(json)) }

// Exists reports whether the value exists (a JSON null exists).
func (r Result) Exists() bool { return r.Type != Null || len(r.Raw) != 0 }

// IsObject reports whether the value is an object.
func (r Result) IsObject() bool { return r.Type == JSON && len(r.Raw) > 0 && r.Raw[0] == '{' }

// IsArray reports whether the value is an array.
func (r Result) IsArray() bool { return r.Type == JSON && len(r.Raw) > 0 && r.Raw[0] == '[' }

// String returns the value as a string: a string's text, a number as
// written, "true", "false", an object or array as its JSON, "" for null.
func (r Result) String() string {
	switch r.Type {
	case False:
		return "false"
	case True:
		return "true"
	case Number:
		if r.Raw != "" {
			return r.Raw
		}
		return strconv.FormatFloat(r.Num, 'f', -1, 64)
	case String:
		return r.Str
	case JSON:
		return r.Raw
	}
	return ""
}

// Bool returns whether the value is true (a JSON true only).
func (r Result) Bool() bool { return r.Type == True }

// ForEach calls fn with each member of an object (the key as a String
// Result) or each element of an array (the key a Number: its index), in
// order, until fn returns false. For any other value it calls fn once
// with a zero key and the value itself.
func (r Result) ForEach(fn func(key, value Result) bool) {
	if !r.Exists() {
		return
	}
	if r.Type != JSON {
		fn(Result{}, r)
		return
	}
	s := r.Raw
	obj := s[0] == '{'
	i := skipSpace(s, 1)
	for n := 0; i < len(s) && s[i] != '}' && s[i] != ']'; n++ {
		var key Result
		if obj {
			var ok bool
			if key, i, ok = parseString(s, i); !ok {
				return
			}
			i = skipSpace(s, i)
			if i >= len(s) || s[i] != ':' {
				return
			}
			i = skipSpace(s, i+1)
		} else {
			key = Result{Type: Number, Raw: strconv.Itoa(n), Num: float64(n)}
		}
		v, end := parseAt(s, i)
		if end <= i {
			return
		}
		if !fn(key, v) {
			return
		}
		i = skipSpace(s, end)
		if i < len(s) && s[i] == ',' {
			i = skipSpace(s, i+1)
		}
	}
}

// Get returns the member called name of an object (the first one), or a
// Result that does not exist. Unlike gjson's Get it takes a member name,
// not a path.
func (r Result) Get(name string) Result {
	var out Result
	if !r.IsObject() {
		return out
	}
	r.ForEach(func(k, v Result) bool {
		if k.Str == name {
			out = v
			return false
		}
		return true
	})
	return out
}

// Array returns the elements of an array, the value itself for any other
// existing value, and nil for a value that does not exist.
func (r Result) Array() []Result {
	if !r.Exists() {
		return nil
	}
	if !r.IsArray() {
		return []Result{r}
	}
	var out []Result
	r.ForEach(func(_, v Result) bool {
		out = append(out, v)
		return true
	})
	return out
}

func skipSpace(s string, i int) int {
	for i < len(s) && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r') {
		i++
	}
	return i
}

// parseAt reads the value starting at s[i] and returns it and the index
// after it; end == i when there is no value there.
func parseAt(s string, i int) (Result, int) {
	if i >= len(s) {
		return Result{}, i
	}
	switch c := s[i]; {
	case c == '{' || c == '[':
		end := skipContainer(s, i)
		if end <= i {
			return Result{}, i
		}
		return Result{Type: JSON, Raw: s[i:end]}, end
	case c == '"':
		r, end, ok := parseString(s, i)
		if !ok {
			return Result{}, i
		}
		return r, end
	case c == '-' || '0' <= c && c <= '9':
		end := i + 1
		for end < len(s) && (s[end] >= '0' && s[end] <= '9' || s[end] == '.' || s[end] == 'e' || s[end] == 'E' || s[end] == '+' || s[end] == '-') {
			end++
		}
		n, _ := strconv.ParseFloat(s[i:end], 64)
		return Result{Type: Number, Raw: s[i:end], Num: n}, end
	}
	for _, lit := range [...]struct {
		text string
		typ  Type
	}{{"true", True}, {"false", False}, {"null", Null}} {
		if len(s)-i >= len(lit.text) && s[i:i+len(lit.text)] == lit.text {
			return Result{Type: lit.typ, Raw: lit.text}, i + len(lit.text)
		}
	}
	return Result{}, i
}

// skipContainer returns the index after the object or array at s[i], or
// i if it does not close.
func skipContainer(s string, i int) int {
	depth := 0
	for j := i; j < len(s); j++ {
		switch s[j] {
		case '{', '[':
			depth++
		case '}', ']':
			depth--
			if depth == 0 {
				return j + 1
			}
		case '"':
			_, end, ok := scanString(s, j)
			if !ok {
				return i
			}
			j = end - 1
		}
	}
	return i
}

// scanString finds the end of the string at s[i] ('"') and whether it has
// escapes.
func scanString(s string, i int) (escaped bool, end int, ok bool) {
	for j := i + 1; j < len(s); j++ {
		switch s[j] {
		case '"':
			return escaped, j + 1, true
		case '\\':
			escaped = true
			j++
		}
	}
	return false, i, false
}

// parseString reads the string at s[i]: Raw with its quotes, Str
// unescaped as encoding/json does (a lone surrogate becomes U+FFFD).
func parseString(s string, i int) (Result, int, bool) {
	if i >= len(s) || s[i] != '"' {
		return Result{}, i, false
	}
	escaped, end, ok := scanString(s, i)
	if !ok {
		return Result{}, i, false
	}
	body := s[i+1 : end-1]
	if escaped {
		body = unescape(body)
	}
	return Result{Type: String, Raw: s[i:end], Str: body}, end, true
}

func unescape(s string) string {
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '\\' || i+1 >= len(s) {
			out = append(out, c)
			continue
		}
		i++
		switch s[i] {
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r, n := hex4(s[i+1:])
			if n == 0 {
				out = append(out, '\\', 'u')
				continue
			}
			i += 4
			if utf16.IsSurrogate(r) {
				if i+2 < len(s) && s[i+1] == '\\' && s[i+2] == 'u' {
					if r2, n2 := hex4(s[i+3:]); n2 != 0 {
						if dec := utf16.DecodeRune(r, r2); dec != utf8.RuneError {
							out = utf8.AppendRune(out, dec)
							i += 6
							continue
						}
					}
				}
				r = utf8.RuneError
			}
			out = utf8.AppendRune(out, r)
		default: // '"', '\\', '/'
			out = append(out, s[i])
		}
	}
	return string(out)
}

// hex4 reads four hex digits; n is 0 if they are not there.
func hex4(s string) (rune, int) {
	if len(s) < 4 {
		return 0, 0
	}
	var r rune
	for _, c := range []byte(s[:4]) {
		var d byte
		switch {
		case '0' <= c && c <= '9':
			d = c - '0'
		case 'a' <= c && c <= 'f':
			d = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			d = c - 'A' + 10
		default:
			return 0, 0
		}
		r = r<<4 | rune(d)
	}
	return r, 4
}
