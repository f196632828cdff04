// Package rlsyaml reads envoyproxy/ratelimit's YAML configuration into
// tokengate-rls's (rls.Domain, then rls.NewDropinConfig): one domain per
// file, nested descriptors with key and value, and rate_limit's unit,
// requests_per_unit, unlimited, name and replaces, shadow_mode and
// detailed_metric on the descriptor. It is strict: an unknown field, a
// value of the wrong type, a bad unit or a duplicate descriptor is an
// error naming the file, the line and the path of the field.
// docs/dropin.md describes the format and what differs.
//
//	domain: edge
//	descriptors:
//	  - key: remote_address
//	    rate_limit: {unit: minute, requests_per_unit: 60}
package rlsyaml

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	yaml "go.yaml.in/yaml/v3"

	"github.com/tokengate/tokengate/internal/service/rls"
)

// Parse parses one file (named name in errors) of one domain.
func Parse(name string, data []byte) (*rls.Domain, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	p := parser{file: name}
	if len(doc.Content) == 0 {
		return nil, fmt.Errorf("%s: empty file: want a domain and its descriptors", name)
	}
	root := doc.Content[0]
	d := &rls.Domain{}
	err := p.fields(root, "", map[string]func(*yaml.Node, string) error{
		"domain": func(n *yaml.Node, path string) error { return p.str(n, path, &d.Name) },
		"descriptors": func(n *yaml.Node, path string) (err error) {
			d.Descriptors, err = p.descriptors(n, path)
			return err
		},
	})
	if err != nil {
		return nil, err
	}
	if d.Name == "" {
		return nil, p.errAt(root, "domain", "required, and not empty")
	}
	return d, nil
}

// LoadDir reads every file under dir (recursively, in name order; with
// ignoreDot, not the files and directories whose names start with '.'),
// each one domain, as envoyproxy/ratelimit reads its runtime directory
// RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config. A domain in two files is an
// error (that project's default, MERGE_DOMAIN_CONFIG=false).
func LoadDir(dir string, ignoreDot bool) ([]*rls.Domain, error) {
	var files []string
	err := filepath.WalkDir(dir, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if ignoreDot && path != dir && strings.HasPrefix(e.Name(), ".") {
			if e.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if e.Type().IsRegular() || e.Type()&fs.ModeSymlink != 0 {
			if st, err := os.Stat(path); err == nil && st.Mode().IsRegular() {
				files = append(files, path)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	var out []*rls.Domain
	seen := map[string]string{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		d, err := Parse(f, data)
		if err != nil {
			return nil, err
		}
		if prev, ok := seen[d.Name]; ok {
			return nil, fmt.Errorf("%s: domain %q is also in %s", f, d.Name, prev)
		}
		seen[d.Name] = f
		out = append(out, d)
	}
	return out, nil
}

type parser struct{ file string }

func (p *parser) errAt(n *yaml.Node, path, msg string) error {
	if path == "" {
		path = "(top)"
	}
	return fmt.Errorf("%s:%d: %s: %s", p.file, n.Line, path, msg)
}

func kind(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		if n.Tag == "!!null" {
			return "null"
		}
		return strconv.Quote(n.Value)
	}
	return "an alias"
}

// fields walks mapping n: each key must be one of want (else an error
// naming the field), and want's function reads its value.
func (p *parser) fields(n *yaml.Node, path string, want map[string]func(*yaml.Node, string) error) error {
	if n.Kind != yaml.MappingNode {
		return p.errAt(n, path, "must be a mapping, got "+kind(n))
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		fp := k.Value
		if path != "" {
			fp = path + "." + k.Value
		}
		f, ok := want[k.Value]
		if !ok {
			names := make([]string, 0, len(want))
			for name := range want {
				names = append(names, name)
			}
			sort.Strings(names)
			return p.errAt(k, fp, "unknown field (want one of "+strings.Join(names, ", ")+")")
		}
		if seen[k.Value] {
			return p.errAt(k, fp, "given twice")
		}
		seen[k.Value] = true
		if err := f(v, fp); err != nil {
			return err
		}
	}
	return nil
}

func (p *parser) str(n *yaml.Node, path string, dst *string) error {
	if n.Kind != yaml.ScalarNode || n.Tag == "!!null" || n.Tag == "!!map" {
		return p.errAt(n, path, "must be a string, got "+kind(n))
	}
	*dst = n.Value
	return nil
}

func (p *parser) boolean(n *yaml.Node, path string, dst *bool) error {
	if n.Kind != yaml.ScalarNode || n.Tag != "!!bool" {
		return p.errAt(n, path, "must be true or false, got "+kind(n))
	}
	return n.Decode(dst)
}

func (p *parser) descriptors(n *yaml.Node, path string) ([]*rls.Descriptor, error) {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil, nil
	}
	if n.Kind != yaml.SequenceNode {
		return nil, p.errAt(n, path, "must be a list of descriptors, got "+kind(n))
	}
	var out []*rls.Descriptor
	for i, dn := range n.Content {
		dp := path + "[" + strconv.Itoa(i) + "]"
		d := &rls.Descriptor{}
		var shadow, detailed bool
		var rl *rls.RateLimit
		err := p.fields(dn, dp, map[string]func(*yaml.Node, string) error{
			"key":   func(v *yaml.Node, fp string) error { return p.str(v, fp, &d.Key) },
			"value": func(v *yaml.Node, fp string) error { return p.str(v, fp, &d.Value) },
			"rate_limit": func(v *yaml.Node, fp string) (err error) {
				rl, err = p.rateLimit(v, fp)
				return err
			},
			"descriptors": func(v *yaml.Node, fp string) (err error) {
				d.Descriptors, err = p.descriptors(v, fp)
				return err
			},
			"shadow_mode":     func(v *yaml.Node, fp string) error { return p.boolean(v, fp, &shadow) },
			"detailed_metric": func(v *yaml.Node, fp string) error { return p.boolean(v, fp, &detailed) },
			// Metrics and dynamic metadata only: read, checked, unused.
			"value_to_metric": func(v *yaml.Node, fp string) error { var b bool; return p.boolean(v, fp, &b) },
			"metadata": func(v *yaml.Node, fp string) error {
				if v.Kind != yaml.MappingNode {
					return p.errAt(v, fp, "must be a mapping, got "+kind(v))
				}
				return nil
			},
			// They change decisions, and tokengate-rls does not have them.
			"quota_mode":      p.unsupported,
			"share_threshold": p.unsupported,
		})
		if err != nil {
			return nil, err
		}
		if d.Key == "" {
			return nil, p.errAt(dn, dp+".key", "required, and not empty")
		}
		if rl != nil {
			rl.Shadow, rl.DetailedMetric = shadow, detailed
			d.RateLimit = rl
		}
		out = append(out, d)
	}
	return out, nil
}

func (p *parser) unsupported(v *yaml.Node, fp string) error {
	var b bool
	if err := p.boolean(v, fp, &b); err != nil || !b {
		return err
	}
	return p.errAt(v, fp, "not supported by tokengate-rls (docs/dropin.md#not-supported)")
}

func (p *parser) rateLimit(n *yaml.Node, path string) (*rls.RateLimit, error) {
	rl := &rls.RateLimit{}
	var unit string
	unitNode := n
	err := p.fields(n, path, map[string]func(*yaml.Node, string) error{
		"unit": func(v *yaml.Node, fp string) error { unitNode = v; return p.str(v, fp, &unit) },
		"requests_per_unit": func(v *yaml.Node, fp string) error {
			if v.Kind != yaml.ScalarNode || v.Tag != "!!int" {
				return p.errAt(v, fp, "must be a whole number, got "+kind(v))
			}
			u, err := strconv.ParseUint(v.Value, 0, 32)
			if err != nil {
				return p.errAt(v, fp, "must be a whole number from 0 to 4294967295, got "+v.Value)
			}
			rl.RequestsPerUnit = uint32(u)
			return nil
		},
		"unlimited": func(v *yaml.Node, fp string) error { return p.boolean(v, fp, &rl.Unlimited) },
		"name":      func(v *yaml.Node, fp string) error { return p.str(v, fp, &rl.Name) },
		"replaces": func(v *yaml.Node, fp string) error {
			if v.Kind != yaml.SequenceNode {
				return p.errAt(v, fp, "must be a list of {name: ...}, got "+kind(v))
			}
			for i, e := range v.Content {
				var name string
				ep := fp + "[" + strconv.Itoa(i) + "]"
				if err := p.fields(e, ep, map[string]func(*yaml.Node, string) error{
					"name": func(v *yaml.Node, fp string) error { return p.str(v, fp, &name) },
				}); err != nil {
					return err
				}
				if name == "" {
					return p.errAt(e, ep+".name", "required, and not empty")
				}
				if name == rl.Name && name != "" {
					return p.errAt(e, ep+".name", "a limit cannot replace itself")
				}
				rl.Replaces = append(rl.Replaces, name)
			}
			return nil
		},
	})
	if err != nil {
		return nil, err
	}
	if unit != "" {
		v, ok := rlsv3.RateLimitResponse_RateLimit_Unit_value[strings.ToUpper(unit)]
		if !ok || v == 0 {
			return nil, p.errAt(unitNode, path+".unit", "must be one of second, minute, hour, day, week, month, year; got "+strconv.Quote(unit))
		}
		rl.Unit = rls.Unit(v)
	}
	switch {
	case rl.Unlimited && unit != "":
		return nil, p.errAt(n, path, "unlimited must not have a unit")
	case !rl.Unlimited && unit == "":
		return nil, p.errAt(n, path+".unit", "required (second, minute, hour, day, week, month, year) unless unlimited")
	}
	for _, r := range rl.Replaces {
		if r == rl.Name {
			return nil, p.errAt(n, path+".replaces", "a limit cannot replace itself ("+strconv.Quote(r)+")")
		}
	}
	return rl, nil
}
