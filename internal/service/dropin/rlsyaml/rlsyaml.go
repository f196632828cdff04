// Package rlsyaml reads envoyproxy/ratelimit's YAML configuration into
// tokengate-rls's (rls.Domain, then rls.NewDropinConfig): one domain per
// file, nested descriptors with key and value, and rate_limit's unit,
// requests_per_unit, unlimited, name and replaces, shadow_mode,
// detailed_metric and share_threshold on the descriptor. It is strict: an
// unknown field, a value of the wrong type, a bad unit or a duplicate
// descriptor is an error naming the file, the line and the path of the
// field ("file:line: path: message"), and every refusal
// rls.NewDropinConfig would make of a file is made here first, with its
// line.
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
	"unicode/utf8"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	yaml "go.yaml.in/yaml/v3"

	"github.com/tokengate/tokengate/internal/service/rls"
)

// Parse parses one file (named name in errors) of one domain.
func Parse(name string, data []byte) (*rls.Domain, error) {
	d, _, err := parse(name, data)
	return d, err
}

// parse is Parse, also returning the line of the domain's name.
func parse(name string, data []byte) (*rls.Domain, int, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, 0, yamlError(name, data, err)
	}
	p := parser{file: name}
	if len(doc.Content) == 0 {
		return nil, 0, fmt.Errorf("%s:1: empty file: want a domain and its descriptors", name)
	}
	root := doc.Content[0]
	d := &rls.Domain{}
	line := 0
	err := p.fields(root, "", map[string]func(*yaml.Node, string) error{
		"domain": func(n *yaml.Node, path string) error { line = n.Line; return p.str(n, path, &d.Name) },
		"descriptors": func(n *yaml.Node, path string) (err error) {
			d.Descriptors, err = p.descriptors(n, path)
			return err
		},
	})
	if err != nil {
		return nil, 0, err
	}
	if d.Name == "" {
		return nil, 0, p.errAt(root, "domain", "required, and not empty")
	}
	return d, line, nil
}

// yamlError is a YAML syntax error as "file:line: message". The YAML
// library names a line for most: its scanner's errors count lines from 1,
// its parser's (the messages of parserProblems) from 0, and either leaves
// out a line of 0; a line past the end is the last. For the others (a
// byte that is not UTF-8, a control character, an unknown anchor) the
// line is found here, else it is the first.
func yamlError(name string, data []byte, err error) error {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	parserError := false
	for _, p := range parserProblems {
		parserError = parserError || strings.Contains(msg, p)
	}
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		if n, after, ok := strings.Cut(rest, ": "); ok {
			if line, err := strconv.Atoi(n); err == nil {
				if parserError {
					line++
				}
				// At the end of the file: its last line.
				line = min(line, max(1, strings.Count(strings.TrimSuffix(string(data), "\n"), "\n")+1))
				return fmt.Errorf("%s:%d: %s", name, line, after)
			}
		}
	}
	if parserError {
		return fmt.Errorf("%s:1: %s", name, msg)
	}
	line := 1
	for i, r := range string(data) {
		if r == '\n' {
			line++
		}
		if r == utf8.RuneError && !strings.HasPrefix(string(data[i:]), "\uFFFD") || notYAML(r) {
			return fmt.Errorf("%s:%d: %s", name, line, msg)
		}
	}
	if a, ok := strings.CutPrefix(msg, "unknown anchor '"); ok {
		a, _, _ = strings.Cut(a, "'")
		if i := strings.Index(string(data), "*"+a); i >= 0 {
			return fmt.Errorf("%s:%d: %s", name, 1+strings.Count(string(data[:i]), "\n"), msg)
		}
	}
	return fmt.Errorf("%s:1: %s", name, msg)
}

// notYAML reports whether r is a character YAML does not allow in a
// stream (the C0 and C1 controls but tab, line feed, carriage return and
// next line, and DEL).
func notYAML(r rune) bool {
	return r < ' ' && r != '\n' && r != '\r' && r != '\t' || r == 0x7f || r >= 0x80 && r <= 0x9f && r != 0x85
}

// parserProblems are the messages of the YAML library's parser (as
// opposed to its scanner), whose lines it counts from 0.
var parserProblems = []string{"did not find expected ", "found duplicate %YAML directive",
	"found incompatible YAML document", "found undefined tag handle", "found duplicate %TAG directive"}

// LoadDir reads every file under dir (recursively, in name order; with
// ignoreDot, not the files and directories whose names start with '.'),
// each one domain, as envoyproxy/ratelimit reads its runtime directory
// RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config. A domain in two files is an
// error (that project's default, MERGE_DOMAIN_CONFIG=false).
//
// A directory that Kubernetes mounted from a ConfigMap (or a Secret, or a
// projected volume) holds each file twice: as name, a symlink to
// ..data/name, and under ..data, a symlink to the current
// ..<timestamp>/ directory. In a directory that has such a ..data
// symlink, the names starting with ".." are Kubernetes' own (a ConfigMap
// key cannot start with "..") and are skipped, ignoreDot or not, so that
// each file is read once, as the visible name.
func LoadDir(dir string, ignoreDot bool) ([]*rls.Domain, error) {
	return LoadDirLimits(dir, ignoreDot, Limits{})
}

// Limits bound what LoadDirLimits loads (docs/dropin.md#limits); a field
// <= 0 takes its default.
//
// Why: parsing keeps the whole YAML tree (go.yaml.in/yaml's Node, with
// lines for the error messages) until the file is built: about 35 bytes
// of heap per byte of YAML, so a 7.3 MB file of 60,000 descriptors took
// 370 MB, and a reload more, with the configuration in force still held
// (issue 30). The directory's size is checked before any file is read.
type Limits struct {
	// Bytes is the most bytes the directory's files may hold together
	// (TOKENGATE_RUNTIME_MAX_BYTES).
	Bytes int64
	// Descriptors is the most descriptors, at every depth, of all the
	// domains together (TOKENGATE_RUNTIME_MAX_DESCRIPTORS).
	Descriptors int
}

// Default limits of LoadDirLimits.
const (
	DefaultMaxBytes       = 2 << 20
	DefaultMaxDescriptors = 10000
)

// WithDefaults returns l with every field <= 0 set to its default.
func (l Limits) WithDefaults() Limits {
	if l.Bytes <= 0 {
		l.Bytes = DefaultMaxBytes
	}
	if l.Descriptors <= 0 {
		l.Descriptors = DefaultMaxDescriptors
	}
	return l
}

// countDescriptors is the number of descriptors of ds at every depth.
func countDescriptors(ds []*rls.Descriptor) int {
	n := len(ds)
	for _, d := range ds {
		n += countDescriptors(d.Descriptors)
	}
	return n
}

// LoadDirLimits is LoadDir within lim: a directory whose files hold more
// than lim.Bytes, or whose domains more than lim.Descriptors descriptors,
// is refused with an error naming the limit.
func LoadDirLimits(dir string, ignoreDot bool, lim Limits) ([]*rls.Domain, error) {
	lim = lim.WithDefaults()
	var files []string
	var size int64
	err := filepath.WalkDir(dir, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		skip := ignoreDot && path != dir && strings.HasPrefix(e.Name(), ".")
		if !skip && path != dir && strings.HasPrefix(e.Name(), "..") {
			st, err := os.Lstat(filepath.Join(filepath.Dir(path), "..data"))
			skip = err == nil && st.Mode()&fs.ModeSymlink != 0
		}
		if skip {
			if e.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if e.Type().IsRegular() || e.Type()&fs.ModeSymlink != 0 {
			if st, err := os.Stat(path); err == nil && st.Mode().IsRegular() {
				files = append(files, path)
				size += st.Size()
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if size > lim.Bytes {
		return nil, fmt.Errorf("%s: %d bytes of files: over the limit of %d bytes (TOKENGATE_RUNTIME_MAX_BYTES)", dir, size, lim.Bytes)
	}
	sort.Strings(files)
	var out []*rls.Domain
	seen := map[string]string{}
	descriptors := 0
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		d, line, err := parse(f, data)
		if err != nil {
			return nil, err
		}
		if prev, ok := seen[d.Name]; ok {
			return nil, fmt.Errorf("%s:%d: domain: %q is also in %s", f, line, d.Name, prev)
		}
		seen[d.Name] = f + ":" + strconv.Itoa(line)
		if descriptors += countDescriptors(d.Descriptors); descriptors > lim.Descriptors {
			return nil, fmt.Errorf("%s: %d descriptors so far: over the limit of %d descriptors (TOKENGATE_RUNTIME_MAX_DESCRIPTORS)", f, descriptors, lim.Descriptors)
		}
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
	// ids are the composite keys of this level ("key_value", or "key"),
	// as envoyproxy/ratelimit files its nodes: two alike are a duplicate.
	ids := map[string]string{}
	for i, dn := range n.Content {
		dp := path + "[" + strconv.Itoa(i) + "]"
		d := &rls.Descriptor{}
		var shadow, detailed bool
		var rl *rls.RateLimit
		var share *yaml.Node
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
			"share_threshold": func(v *yaml.Node, fp string) error { share = v; return p.boolean(v, fp, &d.ShareThreshold) },
			// It changes decisions, and tokengate-rls does not have it.
			"quota_mode": p.unsupported,
		})
		if err != nil {
			return nil, err
		}
		if d.Key == "" {
			return nil, p.errAt(dn, dp+".key", "required, and not empty")
		}
		id := d.Key
		if d.Value != "" {
			id += "_" + d.Value
		}
		if prev, ok := ids[id]; ok {
			return nil, p.errAt(dn, dp, "duplicate descriptor: composite key "+strconv.Quote(id)+" (key_value) is also that of "+prev)
		}
		ids[id] = dp + " at line " + strconv.Itoa(dn.Line)
		if d.ShareThreshold && !strings.Contains(id, "*") {
			return nil, p.errAt(share, dp+".share_threshold", "needs a pattern: a '*' in the key or the value, got composite key "+strconv.Quote(id))
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
