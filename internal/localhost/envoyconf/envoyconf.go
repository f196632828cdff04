// Package envoyconf reads the wasm HTTP filter's plugin settings out of an
// Envoy bootstrap (envoy.yaml), so the local host and Envoy use one file.
package envoyconf

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"
)

// Type URLs the extraction recognises.
const (
	WasmFilterType  = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm"
	HCMType         = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
	StringValueType = "type.googleapis.com/google.protobuf.StringValue"
	BytesValueType  = "type.googleapis.com/google.protobuf.BytesValue"
)

// Plugin is one wasm HTTP filter's settings.
type Plugin struct {
	// Path is where the filter's typed_config sits in the document, e.g.
	// "static_resources.listeners[0]....http_filters[0].typed_config".
	Path string
	// Name, RootID and VMID are config.name, config.root_id and
	// config.vm_config.vm_id.
	Name, RootID, VMID string
	// Configuration is config.configuration unwrapped: the value of a
	// StringValue or the decoded bytes of a BytesValue; nil if absent.
	Configuration []byte
	// VMConfiguration is config.vm_config.configuration, unwrapped the same
	// way.
	VMConfiguration []byte
	// WasmFile is config.vm_config.code.local.filename, if set.
	WasmFile string
	// FailurePolicy is config.failure_policy, or "FAIL_OPEN" when only the
	// deprecated fail_open: true is set; empty if neither is.
	FailurePolicy string
	// Manager is the typed_config of the HTTP connection manager whose
	// http_filters hold this filter (nil if none encloses it), at
	// ManagerPath; see ConnectionManager.
	Manager     map[string]any
	ManagerPath string
}

// Plugins returns every wasm HTTP filter in an Envoy YAML (or JSON)
// document, in document order: every object whose "@type" is
// WasmFilterType, wherever it is nested.
func Plugins(doc []byte) ([]Plugin, error) {
	j, err := yaml.YAMLToJSON(doc)
	if err != nil {
		return nil, fmt.Errorf("envoyconf: parsing YAML: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(j))
	dec.UseNumber()
	var root any
	if err := dec.Decode(&root); err != nil {
		return nil, fmt.Errorf("envoyconf: %w", err)
	}
	var out []Plugin
	var errs []error
	type hcm struct {
		path string
		obj  map[string]any
	}
	var managers []hcm // depth first: an enclosing manager comes before its filters
	walk(root, "", func(path string, obj map[string]any) {
		if obj["@type"] == HCMType {
			managers = append(managers, hcm{path, obj})
		}
		if obj["@type"] != WasmFilterType {
			return
		}
		p, err := plugin(path, obj)
		if err != nil {
			errs = append(errs, err)
			return
		}
		for i := len(managers) - 1; i >= 0; i-- {
			if m := managers[i]; strings.HasPrefix(path, m.path+".") {
				p.ManagerPath, p.Manager = m.path, m.obj
				break
			}
		}
		out = append(out, p)
	})
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return out, nil
}

// Find returns the wasm HTTP filter called name (config.name), or the only
// one when name is empty.
func Find(doc []byte, name string) (Plugin, error) {
	ps, err := Plugins(doc)
	if err != nil {
		return Plugin{}, err
	}
	if len(ps) == 0 {
		return Plugin{}, fmt.Errorf("envoyconf: no HTTP filter with typed_config @type %s", WasmFilterType)
	}
	names := make([]string, len(ps))
	for i, p := range ps {
		names[i] = strconv.Quote(p.Name)
		if name != "" && p.Name == name {
			return p, nil
		}
	}
	if name == "" && len(ps) == 1 {
		return ps[0], nil
	}
	if name == "" {
		return Plugin{}, fmt.Errorf("envoyconf: %d wasm filters (%s); choose one by name", len(ps), strings.Join(names, ", "))
	}
	return Plugin{}, fmt.Errorf("envoyconf: no wasm filter named %q (have %s)", name, strings.Join(names, ", "))
}

// walk calls fn for every object in v, depth first, map keys in sorted
// order.
func walk(v any, path string, fn func(path string, obj map[string]any)) {
	switch v := v.(type) {
	case map[string]any:
		fn(path, v)
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			p := k
			if path != "" {
				p = path + "." + k
			}
			walk(v[k], p, fn)
		}
	case []any:
		for i, e := range v {
			walk(e, path+"["+strconv.Itoa(i)+"]", fn)
		}
	}
}

func plugin(path string, typed map[string]any) (Plugin, error) {
	p := Plugin{Path: path}
	cfg, err := object(typed, "config", path)
	if err != nil || cfg == nil {
		if err == nil {
			err = fmt.Errorf("envoyconf: %s.config: missing", path)
		}
		return p, err
	}
	path += ".config"
	if p.Name, err = str(cfg, "name", path); err != nil {
		return p, err
	}
	if p.RootID, err = str(cfg, "root_id", path); err != nil {
		return p, err
	}
	if p.Configuration, err = anyValue(cfg, "configuration", path); err != nil {
		return p, err
	}
	if p.FailurePolicy, err = str(cfg, "failure_policy", path); err != nil {
		return p, err
	}
	if p.FailurePolicy == "" && cfg["fail_open"] == true {
		p.FailurePolicy = "FAIL_OPEN"
	}
	vm, err := object(cfg, "vm_config", path)
	if err != nil || vm == nil {
		return p, err
	}
	path += ".vm_config"
	if p.VMID, err = str(vm, "vm_id", path); err != nil {
		return p, err
	}
	if p.VMConfiguration, err = anyValue(vm, "configuration", path); err != nil {
		return p, err
	}
	if code, err := object(vm, "code", path); err != nil {
		return p, err
	} else if code != nil {
		if local, err := object(code, "local", path+".code"); err != nil {
			return p, err
		} else if local != nil {
			if p.WasmFile, err = str(local, "filename", path+".code.local"); err != nil {
				return p, err
			}
		}
	}
	return p, nil
}

func object(m map[string]any, key, path string) (map[string]any, error) {
	v, ok := m[key]
	if !ok || v == nil {
		return nil, nil
	}
	o, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("envoyconf: %s.%s: want an object, got %s", path, key, typeName(v))
	}
	return o, nil
}

func str(m map[string]any, key, path string) (string, error) {
	v, ok := m[key]
	if !ok || v == nil {
		return "", nil
	}
	s, ok := v.(string)
	if !ok {
		return "", fmt.Errorf("envoyconf: %s.%s: want a string, got %s", path, key, typeName(v))
	}
	return s, nil
}

// anyValue unwraps a google.protobuf.Any holding a StringValue or a
// BytesValue, as Envoy hands it to the filter.
func anyValue(m map[string]any, key, path string) ([]byte, error) {
	a, err := object(m, key, path)
	if err != nil || a == nil {
		return nil, err
	}
	path += "." + key
	t, err := str(a, "@type", path)
	if err != nil {
		return nil, err
	}
	v, err := str(a, "value", path)
	if err != nil {
		return nil, err
	}
	switch t {
	case StringValueType:
		return []byte(v), nil
	case BytesValueType:
		b, err := base64.StdEncoding.DecodeString(v)
		if err != nil {
			return nil, fmt.Errorf("envoyconf: %s.value: invalid base64: %w", path, err)
		}
		return b, nil
	}
	return nil, fmt.Errorf("envoyconf: %s.@type: %q is not supported (want %s or %s)", path, t, StringValueType, BytesValueType)
}

func typeName(v any) string {
	switch v.(type) {
	case map[string]any:
		return "an object"
	case []any:
		return "a list"
	case string:
		return "a string"
	case bool:
		return "a bool"
	case json.Number:
		return "a number"
	}
	return fmt.Sprintf("%T", v)
}
