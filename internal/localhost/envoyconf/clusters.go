package envoyconf

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"strconv"

	"sigs.k8s.io/yaml"
)

// Cluster is a static cluster the local host can call: its first
// endpoint's socket address and whether it speaks HTTP/2.
type Cluster struct {
	Name    string
	Address string // "host:port"
	HTTP2   bool
}

// Clusters returns the clusters of static_resources.clusters whose first
// endpoint is a socket_address (STATIC or STRICT_DNS with one endpoint),
// by name. HTTP/2 is either typed_extension_protocol_options'
// envoy.extensions.upstreams.http.v3.HttpProtocolOptions with
// explicit_http_config.http2_protocol_options, or the deprecated
// http2_protocol_options on the cluster.
func Clusters(doc []byte) (map[string]Cluster, error) {
	j, err := yaml.YAMLToJSON(doc)
	if err != nil {
		return nil, fmt.Errorf("envoyconf: parsing YAML: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(j))
	dec.UseNumber()
	var root map[string]any
	if err := dec.Decode(&root); err != nil {
		return nil, fmt.Errorf("envoyconf: %w", err)
	}
	out := map[string]Cluster{}
	sr, _ := root["static_resources"].(map[string]any)
	list, _ := sr["clusters"].([]any)
	for _, c := range list {
		co, _ := c.(map[string]any)
		name, _ := co["name"].(string)
		addr, ok := firstSocketAddress(co)
		if name == "" || !ok {
			continue
		}
		cl := Cluster{Name: name, Address: addr}
		if _, ok := co["http2_protocol_options"]; ok {
			cl.HTTP2 = true
		}
		if tepo, ok := co["typed_extension_protocol_options"].(map[string]any); ok {
			if hpo, ok := tepo["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"].(map[string]any); ok {
				if _, ok := lookup(hpo, "explicit_http_config.http2_protocol_options"); ok {
					cl.HTTP2 = true
				}
			}
		}
		out[name] = cl
	}
	return out, nil
}

func firstSocketAddress(c map[string]any) (string, bool) {
	eps, _ := lookup(c, "load_assignment.endpoints")
	el, _ := eps.([]any)
	for _, e := range el {
		eo, _ := e.(map[string]any)
		lbs, _ := eo["lb_endpoints"].([]any)
		for _, lb := range lbs {
			lo, _ := lb.(map[string]any)
			sa, ok := lookup(lo, "endpoint.address.socket_address")
			if !ok {
				continue
			}
			so, _ := sa.(map[string]any)
			host, _ := so["address"].(string)
			port, _ := so["port_value"].(json.Number)
			if host == "" || port == "" {
				continue
			}
			if _, err := strconv.Atoi(port.String()); err != nil {
				continue
			}
			return net.JoinHostPort(host, port.String()), true
		}
	}
	return "", false
}

// RouteCluster returns the cluster of the first route in the route_config
// of the plugin's connection manager, if it names one.
func RouteCluster(p Plugin) (string, bool) {
	vhs, _ := lookup(p.Manager, "route_config.virtual_hosts")
	list, _ := vhs.([]any)
	for _, vh := range list {
		vo, _ := vh.(map[string]any)
		routes, _ := vo["routes"].([]any)
		for _, r := range routes {
			ro, _ := r.(map[string]any)
			if c, ok := lookup(ro, "route.cluster"); ok {
				s, ok := c.(string)
				return s, ok && s != ""
			}
		}
	}
	return "", false
}
