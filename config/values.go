package config

import (
	"math"
	"strconv"
	"strings"

	"github.com/tokengate/tokengate/internal/guest/lite"
	"github.com/tokengate/tokengate/internal/guest/lite/ljson"
)

// Names that differ only by '-' versus '_' are refused too: Prometheus
// replaces '-' with '_', so their metrics would collide.
func (p *parser) claim(path, name string) error {
	if prev, ok := p.names[name]; ok {
		return errAt(path, "duplicate rule name "+strconv.Quote(name)+" (first used at "+prev+")")
	}
	metric := lite.ReplaceByte(name, '-', '_')
	if prev, ok := p.metricNames[metric]; ok {
		return errAt(path, "rule name "+strconv.Quote(name)+" has the same metric name as "+
			strconv.Quote(prev.name)+" (at "+prev.path+"): Prometheus turns '-' into '_'")
	}
	p.names[name] = path
	p.metricNames[metric] = claimed{name: name, path: path}
	return nil
}

type claimed struct {
	_          incomparable
	name, path string
}

func requiredName(path string, v ljson.Result) (string, error) {
	if !v.Exists() {
		return "", errAt(path, "is required")
	}
	if v.Type != ljson.String {
		return "", errAt(path, "must be a string, got "+typeName(v))
	}
	if !validName(v.Str) {
		return "", errAt(path, "must be 1 to 64 characters from [A-Za-z0-9_-], got "+strconv.Quote(clip(v.Str)))
	}
	return v.Str, nil
}

// validName reports whether s is 1 to 64 characters from [A-Za-z0-9_-].
func validName(s string) bool {
	if len(s) == 0 || len(s) > maxNameLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z') {
			return false
		}
	}
	return true
}

// positive returns v as a finite number in (0, max].
func positive(path string, v ljson.Result, max float64) (float64, error) {
	if v.Type != ljson.Number {
		return 0, errAt(path, "must be a number, got "+typeName(v))
	}
	f, err := strconv.ParseFloat(v.Raw, 64)
	if err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
		return 0, errAt(path, "must be a finite number, got "+short(v.Raw))
	}
	if f <= 0 {
		return 0, errAt(path, "must be > 0, got "+num(f))
	}
	if f > max {
		return 0, errAt(path, "must be <= "+num(max)+", got "+num(f))
	}
	return f, nil
}

func integer(v ljson.Result) (int64, bool) {
	if v.Type != ljson.Number {
		return 0, false
	}
	n, err := strconv.ParseInt(v.Raw, 10, 64)
	return n, err == nil
}

// object refuses v unless it exists and is an object whose keys are all in
// allowed.
func object(path string, v ljson.Result, allowed ...string) error {
	if !v.Exists() {
		return errAt(path, "is required")
	}
	return fields(path, v, allowed...)
}

// fields refuses v unless it is an object whose keys are all in allowed.
// (One function for what every object's reader checks first: each copy
// of it inline costs the wasm module about a kilobyte.)
func fields(path string, v ljson.Result, allowed ...string) error {
	if !v.IsObject() {
		return errAt(path, "must be an object, got "+typeName(v))
	}
	return onlyFields(path, v, allowed...)
}

// choice returns the index in names of v, a string field at path; 0 when
// v does not exist. Any other value is refused with the list of names.
// (One function for every such field: a switch with its own message
// costs the wasm module hundreds of bytes.)
func choice(path string, v ljson.Result, names ...string) (int, error) {
	list := ""
	for i, n := range names {
		if !v.Exists() || v.Type == ljson.String && v.Str == n {
			return i * btoi(v.Exists()), nil
		}
		switch {
		case i == len(names)-1:
			list += " or "
		case i > 0:
			list += ", "
		}
		list += `"` + n + `"`
	}
	return 0, errAt(path, "must be "+list+", got "+short(v.Raw))
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// onlyFields rejects any key of obj not in allowed.
func onlyFields(path string, obj ljson.Result, allowed ...string) error {
	var err error
	seen := map[string]bool{}
	obj.ForEach(func(k, _ ljson.Result) bool {
		if seen[k.Str] {
			err = errAt(join(path, k.Str), "duplicate field")
			return false
		}
		seen[k.Str] = true
		for _, a := range allowed {
			if k.Str == a {
				return true
			}
		}
		err = errAt(join(path, k.Str), "unknown field (allowed: "+strings.Join(allowed, ", ")+")")
		return false
	})
	return err
}

func join(path, field string) string {
	if path == "" {
		return field
	}
	return path + "." + field
}

func typeName(v ljson.Result) string {
	switch {
	case !v.Exists():
		return "nothing"
	case v.IsArray():
		return "an array"
	case v.IsObject():
		return "an object"
	}
	switch v.Type {
	case ljson.String:
		return "a string"
	case ljson.Number:
		return "a number"
	case ljson.True, ljson.False:
		return "a boolean"
	case ljson.Null:
		return "null"
	}
	return "an unknown value"
}

func num(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

// clip shortens s for an error message.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// short is clip for raw JSON, without the whitespace between its tokens: a
// message is one line, whatever the layout of the file ("[\n 401\n]" is
// quoted as "[401]").
func short(raw string) string {
	var b []byte
	inString, escaped := false, false
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		switch {
		case inString:
			inString = escaped || c != '"'
			escaped = !escaped && c == '\\'
		case c == '"':
			inString = true
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			if b == nil {
				b = append(make([]byte, 0, len(raw)), raw[:i]...)
			}
			continue
		}
		if b != nil {
			b = append(b, c)
		}
	}
	if b != nil {
		raw = string(b)
	}
	return clip(raw)
}
