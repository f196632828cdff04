package config

import (
	"errors"
	"strconv"
	"strings"

	"github.com/tokengate/tokengate/internal/guest/lite"
)

// DescriptorKind is what part of a request a descriptor reads.
type DescriptorKind uint8

// Descriptor kinds.
const (
	// DescIP is "ip:address": the client IP from the property
	// source.address, without port or IPv6 brackets, IPv4-mapped IPv6
	// addresses written as IPv4.
	DescIP DescriptorKind = iota
	// DescHeader is "header:<name>": a request header's value.
	DescHeader
	// DescQuery is "query:<name>": a query parameter, percent-decoded.
	DescQuery
	// DescJWT is "jwt:<claim>": a claim of the bearer JWT's payload. The
	// signature is not checked; that is Envoy's jwt_authn filter's job.
	DescJWT
	// DescPath is "path": the request path without the query string.
	DescPath
	// DescMethod is "method": the request method.
	DescMethod
	// DescHost is "host": the :authority (Host) header, lower-case, without
	// port or a trailing dot.
	DescHost
)

// Descriptor names one value of a request, such as "header:x-api-key".
type Descriptor struct {
	Kind DescriptorKind
	// Name is the header (lower-case), query parameter or claim name.
	Name string
}

// String returns the descriptor in configuration syntax.
func (d Descriptor) String() string {
	switch d.Kind {
	case DescIP:
		return "ip:address"
	case DescHeader:
		return "header:" + d.Name
	case DescQuery:
		return "query:" + d.Name
	case DescJWT:
		return "jwt:" + d.Name
	case DescPath:
		return "path"
	case DescMethod:
		return "method"
	default:
		return "host"
	}
}

// ParseDescriptor parses "ip:address", "header:<name>", "query:<name>",
// "jwt:<claim>", "path", "method" or "host". Names match [A-Za-z0-9_-]+.
func ParseDescriptor(s string) (Descriptor, error) {
	switch s {
	case "":
		return Descriptor{}, errEmptyDescriptor
	case "ip:address":
		return Descriptor{Kind: DescIP}, nil
	case "path":
		return Descriptor{Kind: DescPath}, nil
	case "method":
		return Descriptor{Kind: DescMethod}, nil
	case "host":
		return Descriptor{Kind: DescHost}, nil
	}
	kind, name, ok := strings.Cut(s, ":")
	bad := &ConfigError{Msg: "invalid descriptor " + strconv.Quote(clip(s)) +
		` (want ip:address, header:<name>, query:<name>, jwt:<claim>, path, method or host; names match [A-Za-z0-9_-]+)`}
	if !ok || !validName(name) {
		return Descriptor{}, bad
	}
	switch kind {
	case "header":
		return Descriptor{Kind: DescHeader, Name: lite.ToLowerASCII(name)}, nil
	case "query":
		return Descriptor{Kind: DescQuery, Name: name}, nil
	case "jwt":
		return Descriptor{Kind: DescJWT, Name: name}, nil
	}
	return Descriptor{}, bad
}

var errEmptyDescriptor = errors.New("descriptor is empty")
