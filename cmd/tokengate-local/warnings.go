package main

import (
	"fmt"
	"io"

	"github.com/tokengate/tokengate/config"
)

// printWarnings prints, after a configuration the module accepted, what
// config.Warnings finds in it: ways around a limit that are legal but
// rarely meant. They do not make -check fail.
func printWarnings(stdout io.Writer, where string, pluginConfig []byte) {
	cfg, err := config.Parse(pluginConfig)
	if err != nil {
		return // the module accepted it; nothing more to say
	}
	for _, w := range config.Warnings(cfg) {
		fmt.Fprintf(stdout, "%s: warning: %s\n", where, w)
	}
}
