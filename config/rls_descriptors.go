package config

import (
	"strconv"

	"github.com/tokengate/tokengate/internal/guest/lite/ljson"
)

// RLSDomain is one entry of the top-level "rls_descriptors" list: the
// token-bucket rules that the rate-limit service (cmd/tokengate-rls)
// applies to descriptors built by Envoy's own envoy.filters.http.ratelimit
// filter for one RateLimitRequest.domain. The filter only validates this
// section; its rules never apply to a request the filter sees.
//
// Example (a per-client-IP bucket, and one per client IP on POST):
//
//	"rls_descriptors": [{"domain": "edge", "descriptors": [
//	  {"key": "remote_address", "rule": {"name": "edge-ip",
//	    "algorithm_config": {"tokens_per_second": 10, "burst": 20}}},
//	  {"key": "header_match", "value": "post", "descriptors": [
//	    {"key": "remote_address", "rule": {"name": "edge-ip-post",
//	      "algorithm_config": {"tokens_per_second": 1, "burst": 5}}}]}
//	]}]
type RLSDomain struct {
	Domain      string
	Descriptors []*RLSDescriptor
}

// RLSDescriptor is one node of a domain's descriptor tree, in the manner of
// envoyproxy/ratelimit: the i-th entry of a descriptor is matched against
// the nodes at depth i, first a node with the entry's key and value, else
// one with its key and no value (any value). The rule of the node the last
// entry reaches applies; a descriptor that leaves the tree, or ends on a
// node without a rule, is not limited.
type RLSDescriptor struct {
	// Key is the descriptor entry's key ("remote_address", "generic_key",
	// "header_match", a request_headers descriptor_key, ...).
	Key string
	// Value, when not empty, is the entry value this node matches; empty
	// matches any value, and each value then has a bucket of its own.
	Value string
	// Rule is the token bucket of descriptors that end here; nil for an
	// inner node. Its bucket for a descriptor is identified by the values of
	// all the descriptor's entries.
	Rule *Rule
	// Descriptors are the nodes matched by the next entry.
	Descriptors []*RLSDescriptor
}

// maxRLSDepth bounds the depth of a descriptor tree (Envoy builds one
// descriptor entry per rate_limits action).
const maxRLSDepth = 8

func (p *parser) rlsDescriptors(cfg *Config, v ljson.Result) error {
	const path = "rls_descriptors"
	if !v.Exists() {
		return nil
	}
	if !v.IsArray() {
		return errAt(path, "must be an array of domains, got "+typeName(v))
	}
	for i, dv := range v.Array() {
		if err := p.rlsDomain(cfg, path+"["+strconv.Itoa(i)+"]", dv); err != nil {
			return err
		}
	}
	if len(cfg.RLSDescriptors) == 0 {
		return errAt(path, "must not be empty")
	}
	return nil
}

func (p *parser) rlsDomain(cfg *Config, dpath string, dv ljson.Result) error {
	if !dv.IsObject() {
		return errAt(dpath, "must be an object, got "+typeName(dv))
	}
	if err := onlyFields(dpath, dv, "domain", "descriptors"); err != nil {
		return err
	}
	name := dv.Get("domain")
	if !name.Exists() {
		return errAt(dpath+".domain", "is required")
	}
	if name.Type != ljson.String || name.Str == "" || len(name.Str) > 256 {
		return errAt(dpath+".domain", "must be a string of 1 to 256 bytes, got "+short(name.Raw))
	}
	for _, prev := range cfg.RLSDescriptors {
		if prev.Domain == name.Str {
			return errAt(dpath+".domain", "duplicate domain "+strconv.Quote(name.Str))
		}
	}
	nodes, err := p.rlsNodes(dpath+".descriptors", dv.Get("descriptors"), 1)
	if err != nil {
		return err
	}
	cfg.RLSDescriptors = append(cfg.RLSDescriptors, &RLSDomain{Domain: name.Str, Descriptors: nodes})
	return nil
}

func (p *parser) rlsNodes(path string, v ljson.Result, depth int) ([]*RLSDescriptor, error) {
	if !v.IsArray() {
		return nil, errAt(path, "must be an array of descriptors, got "+typeName(v))
	}
	if depth > maxRLSDepth {
		return nil, errAt(path, "descriptors nest at most "+strconv.Itoa(maxRLSDepth)+" deep")
	}
	var out []*RLSDescriptor
	for k, nv := range v.Array() {
		npath := path + "[" + strconv.Itoa(k) + "]"
		n, err := p.rlsNode(npath, nv, depth)
		if err != nil {
			return nil, err
		}
		for i, prev := range out {
			if prev.Key == n.Key && prev.Value == n.Value {
				return nil, errAt(npath, "repeats the key and value of "+path+"["+strconv.Itoa(i)+"]")
			}
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, errAt(path, "must not be empty")
	}
	return out, nil
}

func (p *parser) rlsNode(path string, v ljson.Result, depth int) (*RLSDescriptor, error) {
	if err := fields(path, v, "key", "value", "rule", "shadow", "descriptors"); err != nil {
		return nil, err
	}
	n := &RLSDescriptor{}
	key := v.Get("key")
	if !key.Exists() {
		return nil, errAt(join(path, "key"), "is required")
	}
	if key.Type != ljson.String || key.Str == "" || len(key.Str) > 256 {
		return nil, errAt(join(path, "key"), "must be a string of 1 to 256 bytes, got "+short(key.Raw))
	}
	n.Key = key.Str
	if val := v.Get("value"); val.Exists() {
		if val.Type != ljson.String || val.Str == "" || len(val.Str) > 1024 {
			return nil, errAt(join(path, "value"), "must be a string of 1 to 1024 bytes (omit it to match any value), got "+short(val.Raw))
		}
		n.Value = val.Str
	}
	if rv := v.Get("rule"); rv.Exists() {
		rpath := join(path, "rule")
		if !rv.IsObject() {
			return nil, errAt(rpath, "must be an object, got "+typeName(rv))
		}
		// The descriptor is the bucket's identity: no limit keys, match or
		// scope, and the service decides token buckets only.
		if err := onlyFields(rpath, rv, "name", "algorithm", "algorithm_config"); err != nil {
			return nil, err
		}
		if a := rv.Get("algorithm"); a.Exists() && !(a.Type == ljson.String && a.Str == "token_bucket") {
			return nil, errAt(join(rpath, "algorithm"), `must be "token_bucket" (the service decides token buckets only), got `+short(a.Raw))
		}
		r, err := p.rule(rpath, rv, false)
		if err != nil {
			return nil, err
		}
		if r.Delay.MaxReserved > 0 {
			return nil, errAt(join(rpath, "algorithm_config.max_reserved"), "the service answers at once: delayed admission is the filter's alone")
		}
		if r.Cost.Kind != CostFixed || r.Cost.Fixed != 1 {
			return nil, errAt(join(rpath, "algorithm_config"), "cost comes from the descriptor's hits_addend: no cost_source or fixed_cost")
		}
		if r.Settle != nil {
			return nil, errAt(join(rpath, "algorithm_config"), "the service takes hits at admission only: no count_statuses or reset_on_statuses")
		}
		r.Cluster = true
		n.Rule = r
	}
	switch sh := v.Get("shadow"); {
	case !sh.Exists():
	case sh.Type != ljson.True && sh.Type != ljson.False:
		return nil, errAt(join(path, "shadow"), "must be a boolean, got "+typeName(sh))
	case n.Rule == nil:
		return nil, errAt(join(path, "shadow"), "applies to a rule; this descriptor has none")
	default:
		n.Rule.Shadow = sh.Type == ljson.True
	}
	if ds := v.Get("descriptors"); ds.Exists() {
		var err error
		if n.Descriptors, err = p.rlsNodes(join(path, "descriptors"), ds, depth+1); err != nil {
			return nil, err
		}
	}
	if n.Rule == nil && n.Descriptors == nil {
		return nil, errAt(path, "needs a rule or descriptors")
	}
	return n, nil
}
