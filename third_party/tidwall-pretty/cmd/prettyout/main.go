// Command prettyout runs this replacement of tidwall/pretty on inputs read
// from stdin (a JSON array of base64 strings) and writes, for each, the
// base64 of Pretty, PrettyOptions (sorted keys, tab indent, width 8) and
// Ugly, one line each. The difftest module compares them with upstream.
package main

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"os"

	"github.com/tidwall/pretty"
)

func main() {
	var inputs []string
	if err := json.NewDecoder(os.Stdin).Decode(&inputs); err != nil {
		os.Exit(2)
	}
	w := bufio.NewWriter(os.Stdout)
	defer w.Flush()
	opts := &pretty.Options{Width: 8, Prefix: "", Indent: "\t", SortKeys: true}
	for _, in := range inputs {
		b, err := base64.StdEncoding.DecodeString(in)
		if err != nil {
			os.Exit(2)
		}
		for _, out := range [][]byte{pretty.Pretty(b), pretty.PrettyOptions(b, opts), pretty.Ugly(b)} {
			w.WriteString(base64.StdEncoding.EncodeToString(out) + "\n")
		}
	}
}
