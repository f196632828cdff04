// Package pretty is tokengate's own small implementation of the part of
// github.com/tidwall/pretty's API that github.com/tidwall/gjson calls (for
// its @pretty and @ugly modifiers): Options, DefaultOptions, Pretty,
// PrettyOptions and Ugly.
//
// go.mod replaces github.com/tidwall/pretty with this module because the
// original links encoding/json, which adds about 1 MB to the wasm guest;
// tokengate never uses those modifiers, but gjson links them. It is written
// for tokengate, not copied: it formats valid JSON and passes anything else
// through as unchanged as it can.
package pretty

import "sort"

// Options control PrettyOptions.
type Options struct {
	// Width is the widest line on which an array of scalars is kept whole.
	Width int
	// Prefix starts every line.
	Prefix string
	// Indent is one level of indentation.
	Indent string
	// SortKeys sorts object members by key.
	SortKeys bool
}

// DefaultOptions are the options of Pretty.
var DefaultOptions = &Options{Width: 80, Prefix: "", Indent: "  ", SortKeys: false}

// Pretty formats json with DefaultOptions.
func Pretty(json []byte) []byte { return PrettyOptions(json, nil) }

// Ugly removes every space outside strings.
func Ugly(json []byte) []byte {
	out := make([]byte, 0, len(json))
	for i := 0; i < len(json); i++ {
		c := json[i]
		if c == '"' {
			end := stringEnd(json, i)
			out = append(out, json[i:end]...)
			i = end - 1
			continue
		}
		if c > ' ' {
			out = append(out, c)
		}
	}
	return out
}

// PrettyOptions formats json: one member or element per line, indented,
// with a space after each colon, arrays of scalars kept on one line when
// they fit in opts.Width, and a final newline. nil opts means
// DefaultOptions.
func PrettyOptions(json []byte, opts *Options) []byte {
	if opts == nil {
		opts = DefaultOptions
	}
	v, _ := parse(Ugly(json), 0)
	f := formatter{opts: opts}
	f.out = append(f.out, opts.Prefix...)
	f.value(v, 0)
	return append(f.out, '\n')
}

// node is a parsed JSON value: a scalar's raw text, or an array's or
// object's children (an object's keys are the raw, quoted strings).
type node struct {
	raw      []byte
	open     byte // '[' or '{', 0 for a scalar
	keys     [][]byte
	children []node
}

// parse reads one value of compact JSON at b[i:] and returns it and the
// index after it.
func parse(b []byte, i int) (node, int) {
	if i >= len(b) {
		return node{}, i
	}
	switch b[i] {
	case '[', '{':
		n := node{open: b[i]}
		closer := byte(']')
		if n.open == '{' {
			closer = '}'
		}
		i++
		for i < len(b) && b[i] != closer {
			if n.open == '{' {
				end := i + 1
				if b[i] == '"' {
					end = stringEnd(b, i)
				}
				n.keys = append(n.keys, b[i:end])
				i = end
				if i < len(b) && b[i] == ':' {
					i++
				}
			}
			var child node
			start := i
			child, i = parse(b, i)
			n.children = append(n.children, child)
			if i < len(b) && b[i] == ',' {
				i++
			}
			if i == start { // not JSON: stop rather than loop
				break
			}
		}
		return n, min(i+1, len(b))
	case '"':
		end := stringEnd(b, i)
		return node{raw: b[i:end]}, end
	}
	end := i
	for end < len(b) && b[end] != ',' && b[end] != ']' && b[end] != '}' && b[end] != ':' {
		end++
	}
	if end == i {
		end++
	}
	return node{raw: b[i:end]}, end
}

// stringEnd returns the index after the string that starts at b[i] == '"'.
func stringEnd(b []byte, i int) int {
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\\':
			j++
		case '"':
			return j + 1
		}
	}
	return len(b)
}

type formatter struct {
	opts *Options
	out  []byte
}

func (f *formatter) newline(depth int) {
	f.out = append(f.out, '\n')
	f.out = append(f.out, f.opts.Prefix...)
	for i := 0; i < depth; i++ {
		f.out = append(f.out, f.opts.Indent...)
	}
}

func (f *formatter) value(n node, depth int) {
	if n.open == 0 {
		f.out = append(f.out, n.raw...)
		return
	}
	closer := byte(']')
	if n.open == '{' {
		closer = '}'
	}
	if len(n.children) == 0 {
		f.out = append(f.out, n.open, closer)
		return
	}
	if n.open == '[' && f.fitsOnOneLine(n, depth) {
		f.out = append(f.out, '[')
		for i, c := range n.children {
			if i > 0 {
				f.out = append(f.out, ',')
			}
			f.out = append(f.out, c.raw...)
		}
		f.out = append(f.out, ']')
		return
	}
	order := make([]int, len(n.children))
	for i := range order {
		order[i] = i
	}
	if n.open == '{' && f.opts.SortKeys {
		sort.SliceStable(order, func(a, b int) bool { return string(n.keys[order[a]]) < string(n.keys[order[b]]) })
	}
	f.out = append(f.out, n.open)
	for k, i := range order {
		if k > 0 {
			f.out = append(f.out, ',')
		}
		f.newline(depth + 1)
		if n.open == '{' {
			f.out = append(f.out, n.keys[i]...)
			f.out = append(f.out, ':', ' ')
		}
		f.value(n.children[i], depth+1)
	}
	f.newline(depth)
	f.out = append(f.out, closer)
}

// fitsOnOneLine reports whether an array holds only scalars and fits in
// Width at this depth.
func (f *formatter) fitsOnOneLine(n node, depth int) bool {
	width := len(f.opts.Prefix) + depth*len(f.opts.Indent) + 2
	for _, c := range n.children {
		if c.open != 0 {
			return false
		}
		width += len(c.raw) + 1
	}
	return width <= f.opts.Width
}
