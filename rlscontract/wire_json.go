package rlscontract

import (
	"errors"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/tokengate/tokengate/internal/guest/lite"
	"github.com/tokengate/tokengate/internal/guest/lite/ljson"
)

// The JSON form of the messages (settings.rls.protocol "json"): protobuf's
// JSON mapping (protojson), what envoyproxy/ratelimit's HTTP /json endpoint
// and tokengate-rls's read and write. Written and read by hand, as the
// binary form is, so that the guest links no encoding/json or protobuf
// runtime (the module must stay under 3 MiB).

// AppendRequestJSON appends a RateLimitRequest{domain, descriptors,
// hits_addend} in protobuf's JSON form: lowerCamelCase field names, a
// descriptor's hits_addend (a UInt64Value) as a decimal string, as
// protojson writes a 64-bit integer. Strings must be valid UTF-8 (proto3
// strings are); invalid bytes are written as U+FFFD.
func AppendRequestJSON(dst []byte, domain string, ds []Descriptor, hitsAddend uint32) []byte {
	dst = append(dst, `{"domain":`...)
	dst = appendJSONString(dst, domain)
	dst = append(dst, `,"descriptors":[`...)
	for i, d := range ds {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, `{"entries":[`...)
		for j, e := range d.Entries {
			if j > 0 {
				dst = append(dst, ',')
			}
			dst = append(dst, `{"key":`...)
			dst = appendJSONString(dst, e.Key)
			dst = append(dst, `,"value":`...)
			dst = appendJSONString(dst, e.Value)
			dst = append(dst, '}')
		}
		dst = append(dst, ']')
		if d.HitsAddend > 0 {
			dst = append(dst, `,"hitsAddend":"`...)
			dst = strconv.AppendUint(dst, d.HitsAddend, 10)
			dst = append(dst, '"')
		}
		dst = append(dst, '}')
	}
	dst = append(dst, ']')
	if hitsAddend > 0 {
		dst = append(dst, `,"hitsAddend":`...)
		dst = strconv.AppendUint(dst, uint64(hitsAddend), 10)
	}
	return append(dst, '}')
}

const hexDigits = "0123456789abcdef"

// appendJSONString appends s as a JSON string: quotes, backslashes and
// control characters escaped, invalid UTF-8 as U+FFFD.
func appendJSONString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				dst = append(dst, '\\', c)
			case c < 0x20:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&15])
			default:
				dst = append(dst, c)
			}
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			dst = append(dst, `\ufffd`...)
		} else {
			dst = append(dst, s[i:i+n]...)
		}
		i += n
	}
	return append(dst, '"')
}

var errJSON = errors.New("rlscontract: malformed JSON RateLimitResponse")

// ParseResponseJSON decodes a RateLimitResponse in protobuf's JSON form.
// It accepts what protojson accepts for the fields the filter uses: the
// lowerCamelCase or the proto field names, enums by name or number,
// durations as "1.5s", 32-bit integers as numbers or strings; unknown
// fields are skipped.
func ParseResponseJSON(b []byte) (Response, error) {
	var r Response
	if !ljson.Valid(b) {
		return r, errJSON
	}
	v := ljson.ParseBytes(b)
	if !v.IsObject() {
		return r, errJSON
	}
	var err error
	if r.OverallCode, err = jsonEnum(field(v, "overallCode", "overall_code"), codeNames); err != nil {
		return r, err
	}
	sts := field(v, "statuses", "statuses")
	if sts.Exists() && sts.Type != ljson.Null && !sts.IsArray() {
		return r, errJSON
	}
	for _, sv := range arrayOf(sts) {
		s, err := parseStatusJSON(sv)
		if err != nil {
			return r, err
		}
		r.Statuses = append(r.Statuses, s)
	}
	hs := field(v, "responseHeadersToAdd", "response_headers_to_add")
	if hs.Exists() && hs.Type != ljson.Null && !hs.IsArray() {
		return r, errJSON
	}
	for _, hv := range arrayOf(hs) {
		if !hv.IsObject() {
			return r, errJSON
		}
		k, v, raw := field(hv, "key", "key"), field(hv, "value", "value"), field(hv, "rawValue", "raw_value")
		if !isString(k) || !isString(v) || !isString(raw) {
			return r, errJSON
		}
		val := v.Str
		if raw.Str != "" {
			d, ok := decodeBase64(raw.Str)
			if !ok {
				return r, errJSON
			}
			if len(d) > 0 {
				val = string(d)
			}
		}
		r.Headers = append(r.Headers, [2]string{k.Str, val})
	}
	return r, nil
}

var (
	codeNames = []string{"UNKNOWN", "OK", "OVER_LIMIT"}
	unitNames = []string{"UNKNOWN", "SECOND", "MINUTE", "HOUR", "DAY", "MONTH", "YEAR", "WEEK"}
)

func parseStatusJSON(v ljson.Result) (Status, error) {
	var s Status
	if !v.IsObject() {
		return s, errJSON
	}
	var err error
	if s.Code, err = jsonEnum(field(v, "code", "code"), codeNames); err != nil {
		return s, err
	}
	if cl := field(v, "currentLimit", "current_limit"); cl.IsObject() {
		if s.RequestsPerUnit, err = jsonUint32(field(cl, "requestsPerUnit", "requests_per_unit")); err != nil {
			return s, err
		}
		if s.Unit, err = jsonEnum(field(cl, "unit", "unit"), unitNames); err != nil {
			return s, err
		}
		n := field(cl, "name", "name")
		if !isString(n) {
			return s, errJSON
		}
		s.Name = n.Str
	} else if cl.Exists() && cl.Type != ljson.Null {
		return s, errJSON
	}
	if s.LimitRemaining, err = jsonUint32(field(v, "limitRemaining", "limit_remaining")); err != nil {
		return s, err
	}
	if s.UntilReset, err = jsonDuration(field(v, "durationUntilReset", "duration_until_reset")); err != nil {
		return s, err
	}
	if q := field(v, "quota", "quota"); q.IsObject() {
		s.HasQuota = true
		if s.Quota.Requests, err = jsonUint32(field(q, "requests", "requests")); err != nil {
			return s, err
		}
		id := field(q, "id", "id")
		if !isString(id) {
			return s, errJSON
		}
		s.Quota.ID = id.Str
		if vu := field(q, "validUntil", "valid_until"); vu.Exists() && vu.Type != ljson.Null {
			if vu.Type != ljson.String {
				return s, errJSON
			}
			if s.Quota.ValidUntil, err = parseTimestamp(vu.Str); err != nil {
				return s, err
			}
		}
	} else if q.Exists() && q.Type != ljson.Null {
		return s, errJSON
	}
	return s, nil
}

// arrayOf returns the elements of an array, nil for anything else.
func arrayOf(v ljson.Result) []ljson.Result {
	if !v.IsArray() {
		return nil
	}
	return v.Array()
}

// field returns member json (or, if absent, member proto) of object v.
func field(v ljson.Result, json, proto string) ljson.Result {
	if f := v.Get(json); f.Exists() || json == proto {
		return f
	}
	return v.Get(proto)
}

// isString reports whether v is a string, absent or null (the default "").
func isString(v ljson.Result) bool {
	return v.Type == ljson.String || v.Type == ljson.Null
}

// jsonEnum reads an enum: its name, its number, or absent/null (0).
func jsonEnum(v ljson.Result, names []string) (int, error) {
	switch v.Type {
	case ljson.Null:
		return 0, nil
	case ljson.String:
		for i, n := range names {
			if n == v.Str {
				return i, nil
			}
		}
		return 0, errors.New("rlscontract: unknown enum value " + strconv.Quote(v.Str))
	case ljson.Number:
		if v.Num >= 0 && v.Num <= math.MaxInt32 && v.Num == math.Trunc(v.Num) {
			return int(v.Num), nil
		}
	}
	return 0, errJSON
}

// jsonUint32 reads a uint32: a number or a decimal string, absent/null 0.
func jsonUint32(v ljson.Result) (uint32, error) {
	switch v.Type {
	case ljson.Null:
		return 0, nil
	case ljson.Number:
		if v.Num >= 0 && v.Num <= math.MaxUint32 && v.Num == math.Trunc(v.Num) {
			return uint32(v.Num), nil
		}
	case ljson.String:
		if n, err := strconv.ParseUint(v.Str, 10, 32); err == nil {
			return uint32(n), nil
		}
	}
	return 0, errJSON
}

// jsonDuration reads a google.protobuf.Duration, "<seconds>[.<frac>]s", in
// seconds; absent/null is 0.
func jsonDuration(v ljson.Result) (float64, error) {
	if v.Type == ljson.Null {
		return 0, nil
	}
	num, ok := strings.CutSuffix(v.Str, "s")
	if v.Type != ljson.String || !ok || num == "" || num[0] == '+' {
		return 0, errJSON
	}
	d, err := strconv.ParseFloat(num, 64)
	if err != nil || math.IsInf(d, 0) || math.IsNaN(d) {
		return 0, errJSON
	}
	return d, nil
}

// parseTimestamp reads a google.protobuf.Timestamp in RFC 3339 form
// ("2006-01-02T15:04:05[.frac](Z|±hh:mm)"), in seconds since the epoch.
func parseTimestamp(s string) (float64, error) {
	num := func(from, to int) (int, bool) {
		if to > len(s) {
			return 0, false
		}
		n := 0
		for _, c := range []byte(s[from:to]) {
			if c < '0' || c > '9' {
				return 0, false
			}
			n = n*10 + int(c-'0')
		}
		return n, true
	}
	year, ok1 := num(0, 4)
	month, ok2 := num(5, 7)
	day, ok3 := num(8, 10)
	hour, ok4 := num(11, 13)
	minute, ok5 := num(14, 16)
	sec, ok6 := num(17, 19)
	if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 || !ok6 || s[4] != '-' || s[7] != '-' || s[10] != 'T' && s[10] != 't' ||
		s[13] != ':' || s[16] != ':' || month < 1 || month > 12 || day < 1 || day > 31 || hour > 23 || minute > 59 || sec > 60 {
		return 0, errJSON
	}
	rest := s[19:]
	frac := 0.0
	if len(rest) > 0 && rest[0] == '.' {
		i := 1
		for i < len(rest) && rest[i] >= '0' && rest[i] <= '9' {
			i++
		}
		f, err := strconv.ParseFloat("0"+rest[:i], 64)
		if i == 1 || err != nil {
			return 0, errJSON
		}
		frac, rest = f, rest[i:]
	}
	offset := 0
	switch {
	case rest == "Z" || rest == "z":
	case len(rest) == 6 && (rest[0] == '+' || rest[0] == '-') && rest[3] == ':':
		h, ok1 := strconv.Atoi(rest[1:3])
		m, ok2 := strconv.Atoi(rest[4:6])
		if ok1 != nil || ok2 != nil || h > 23 || m > 59 {
			return 0, errJSON
		}
		offset = (h*60 + m) * 60
		if rest[0] == '-' {
			offset = -offset
		}
	default:
		return 0, errJSON
	}
	// Days from the civil date (Howard Hinnant's algorithm).
	y := year
	if month <= 2 {
		y--
	}
	era := y / 400
	yoe := y - era*400
	mp := (month + 9) % 12
	doy := (153*mp+2)/5 + day - 1
	doe := yoe*365 + yoe/4 - yoe/100 + doy
	days := era*146097 + doe - 719468
	return float64(days*86400+hour*3600+minute*60+sec-offset) + frac, nil
}

// decodeBase64 decodes a bytes field: protojson writes standard base64
// with padding and accepts URL-safe or unpadded forms too.
// ok reports whether it is valid.
func decodeBase64(s string) (b []byte, ok bool) {
	url := strings.ContainsAny(s, "-_") // base64.URLEncoding, else StdEncoding
	padded := len(s)%4 == 0             // else WithPadding(base64.NoPadding)
	return lite.DecodeBase64(s, url, padded)
}
