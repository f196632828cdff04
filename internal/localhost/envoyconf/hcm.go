package envoyconf

import (
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Manager holds the settings of an HTTP connection manager that change
// what a filter sees, with Envoy's defaults.
type Manager struct {
	NormalizePath     bool   // normalize_path
	MergeSlashes      bool   // merge_slashes
	EscapedSlashes    string // path_with_escaped_slashes_action; "KEEP_UNCHANGED" by default
	UseRemoteAddress  bool   // use_remote_address
	XFFNumTrustedHops int    // xff_num_trusted_hops
	SkipXFFAppend     bool   // skip_xff_append
	MaxHeadersKB      int    // max_request_headers_kb; 60 by default
	MaxHeadersCount   int    // common_http_protocol_options.max_headers_count; 100 by default
	// StreamIdleTimeout is stream_idle_timeout: nil when the document
	// leaves it out (Envoy's default, 5 minutes), 0 to disable it.
	StreamIdleTimeout *time.Duration
	RequestTimeout    time.Duration // request_timeout; 0 (none) by default
}

// unhonoured are connection manager settings that change the request a
// filter sees and that the local host does not reproduce: a document
// that sets one is refused, naming it, rather than served differently
// from Envoy.
var unhonoured = []string{
	"strip_matching_host_port", "strip_any_host_port", "strip_trailing_host_dot",
	"path_normalization_options", "original_ip_detection_extensions", "early_header_mutation_extensions",
	"internal_address_config", "forward_client_cert_details", "set_current_client_cert_details",
	"via", "server_header_transformation", "scheme_header_transformation", "append_x_forwarded_port",
	"append_local_overload", "add_proxy_protocol_connection_state", "preserve_external_request_id",
	"always_set_request_id_in_response", "request_id_extension", "normalize_path_on_redirect",
	"common_http_protocol_options.headers_with_underscores_action", "http_protocol_options.allow_chunked_length",
	"uri_normalization_options",
}

// ConnectionManager reads an HttpConnectionManager typed_config. It fails
// naming any setting in unhonoured that the document sets to something
// other than its default, and any value it cannot read.
func ConnectionManager(path string, obj map[string]any) (Manager, error) {
	m := Manager{EscapedSlashes: "KEEP_UNCHANGED", MaxHeadersKB: 60, MaxHeadersCount: 100}
	var set []string
	for _, name := range unhonoured {
		if v, ok := lookup(obj, name); ok && !isDefault(v) {
			set = append(set, path+"."+name)
		}
	}
	if len(set) > 0 {
		sort.Strings(set)
		return m, fmt.Errorf("envoyconf: the local host does not reproduce %s; remove it or try the filter in Envoy", strings.Join(set, ", "))
	}
	var err error
	boolean := func(key string, dst *bool) {
		if v, ok := obj[key]; ok && err == nil {
			b, isBool := v.(bool)
			if !isBool {
				err = fmt.Errorf("envoyconf: %s.%s: want true or false, got %v", path, key, v)
			}
			*dst = b
		}
	}
	integer := func(key string, dst *int, lo, hi int) {
		if v, ok := obj[key]; ok && err == nil {
			n, isNum := v.(json.Number)
			i, perr := n.Int64()
			if !isNum || perr != nil || i < int64(lo) || i > int64(hi) {
				err = fmt.Errorf("envoyconf: %s.%s: want an integer from %d to %d, got %v", path, key, lo, hi, v)
			}
			*dst = int(i)
		}
	}
	boolean("normalize_path", &m.NormalizePath)
	boolean("merge_slashes", &m.MergeSlashes)
	boolean("use_remote_address", &m.UseRemoteAddress)
	boolean("skip_xff_append", &m.SkipXFFAppend)
	integer("xff_num_trusted_hops", &m.XFFNumTrustedHops, 0, 1<<30)
	integer("max_request_headers_kb", &m.MaxHeadersKB, 1, 8192)
	if v, ok := lookup(obj, "common_http_protocol_options.max_headers_count"); ok && err == nil {
		n, isNum := v.(json.Number)
		i, perr := n.Int64()
		if !isNum || perr != nil || i < 1 || i > 1<<20 {
			err = fmt.Errorf("envoyconf: %s.common_http_protocol_options.max_headers_count: want an integer from 1 to %d, got %v", path, 1<<20, v)
		}
		m.MaxHeadersCount = int(i)
	}
	duration := func(key string) (time.Duration, bool) {
		v, ok := obj[key]
		if !ok || err != nil {
			return 0, false
		}
		d, perr := protoDuration(v)
		if perr != nil {
			err = fmt.Errorf("envoyconf: %s.%s: %w", path, key, perr)
			return 0, false
		}
		return d, true
	}
	if d, ok := duration("stream_idle_timeout"); ok {
		m.StreamIdleTimeout = &d
	}
	if d, ok := duration("request_timeout"); ok {
		m.RequestTimeout = d
	}
	if v, ok := obj["path_with_escaped_slashes_action"]; ok && err == nil {
		s, _ := v.(string)
		switch s {
		case "IMPLEMENTATION_SPECIFIC_DEFAULT", "KEEP_UNCHANGED":
			m.EscapedSlashes = "KEEP_UNCHANGED"
		case "REJECT_REQUEST", "UNESCAPE_AND_REDIRECT", "UNESCAPE_AND_FORWARD":
			m.EscapedSlashes = s
		default:
			err = fmt.Errorf("envoyconf: %s.path_with_escaped_slashes_action: unknown action %v", path, v)
		}
	}
	return m, err
}

// protoDuration reads a google.protobuf.Duration in its JSON form, as
// Envoy's YAML writes one: decimal seconds with the suffix "s" ("300s",
// "0.25s"), not negative.
func protoDuration(v any) (time.Duration, error) {
	s, ok := v.(string)
	num, cut := strings.CutSuffix(s, "s")
	f, perr := strconv.ParseFloat(num, 64)
	if !ok || !cut || perr != nil || f < 0 || f > 315576000000 || strings.ContainsAny(num, "eE+-") {
		return 0, fmt.Errorf("want a duration such as \"300s\", got %v", v)
	}
	return time.Duration(f * float64(time.Second)), nil
}

// lookup follows a dotted name through nested objects.
func lookup(obj map[string]any, name string) (any, bool) {
	var v any = obj
	for _, part := range strings.Split(name, ".") {
		o, ok := v.(map[string]any)
		if !ok {
			return nil, false
		}
		if v, ok = o[part]; !ok {
			return nil, false
		}
	}
	return v, true
}

// isDefault reports whether a value is a proto3 default: false, 0, "",
// an empty list or object, or an enum's zero name.
func isDefault(v any) bool {
	switch v := v.(type) {
	case nil:
		return true
	case bool:
		return !v
	case json.Number:
		return v.String() == "0"
	case string:
		return v == "" || v == "OVERWRITE" || v == "ALLOW" || v == "SANITIZE" || v == "DEFAULT"
	case []any:
		return len(v) == 0
	case map[string]any:
		return len(v) == 0
	}
	return false
}
