package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/tokengate/tokengate/internal/localhost/envoyconf"
	"github.com/tokengate/tokengate/internal/localhost/wasmhost"
)

// checkTarget is one plugin configuration found in a file given to -check.
type checkTarget struct {
	where string // "envoy.yaml (static_resources...)", for messages
	opts  wasmhost.Options
}

// check validates a file without serving: a plugin configuration (JSON),
// an Envoy bootstrap (every wasm filter in it) or Istio WasmPlugin
// resources (every pluginConfig). Each configuration is given to the real
// module's proxy_on_configure, so the messages are the filter's own. It
// prints one line per configuration, then one per warning (printWarnings),
// and returns an error if any is refused.
func check(ctx context.Context, file string, wasm []byte, kong bool, stdout io.Writer) error {
	doc, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	targets, err := checkTargets(file, doc)
	if err != nil {
		return err
	}
	failed := 0
	for _, tg := range targets {
		var errs []string
		tg.opts.Wasm, tg.opts.Workers, tg.opts.Kong = wasm, 1, kong
		tg.opts.MinLogLevel = wasmhost.LogError
		tg.opts.LogSink = func(_ wasmhost.LogLevel, msg string) {
			if !strings.HasPrefix(msg, "host: ") {
				errs = append(errs, msg)
			}
		}
		h, err := wasmhost.New(ctx, tg.opts)
		if err == nil {
			_ = h.Close(ctx)
			fmt.Fprintf(stdout, "%s: ok\n", tg.where)
			printWarnings(stdout, tg.where, tg.opts.PluginConfig)
			continue
		}
		failed++
		if len(errs) == 0 {
			errs = []string{err.Error()}
		}
		for _, e := range errs {
			fmt.Fprintf(stdout, "%s: %s\n", tg.where, e)
		}
	}
	if failed > 0 {
		return fmt.Errorf("%s: %d of %d configurations refused", file, failed, len(targets))
	}
	return nil
}

// checkTargets tells the kind of document apart: JSON whose top level is
// a plugin configuration; YAML (or JSON) with "kind: WasmPlugin"
// documents; otherwise an Envoy bootstrap.
func checkTargets(file string, doc []byte) ([]checkTarget, error) {
	if pluginConfigFile(file, doc) {
		// The module judges it, byte for byte as Envoy would pass it: an
		// empty file, a top-level array, a byte order mark or broken JSON
		// get the filter's own message.
		return []checkTarget{{where: file, opts: wasmhost.Options{PluginConfig: doc}}}, nil
	}
	if plugins, ok, err := wasmPlugins(file, doc); ok || err != nil {
		return plugins, err
	}
	ps, err := envoyconf.Plugins(doc)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	if len(ps) == 0 {
		return nil, fmt.Errorf("%s: no plugin configuration (JSON), Istio WasmPlugin or Envoy wasm filter (%s) found", file, envoyconf.WasmFilterType)
	}
	out := make([]checkTarget, 0, len(ps))
	for _, p := range ps {
		out = append(out, checkTarget{where: file + " (" + p.Path + ")", opts: wasmhost.Options{
			PluginConfig: p.Configuration, VMConfig: p.VMConfiguration, PluginName: p.Name, RootID: p.RootID, VMID: p.VMID,
		}})
	}
	return out, nil
}

// pluginConfigFile reports whether doc is meant as a plugin configuration
// (JSON) rather than an Envoy bootstrap or Istio resources: it is empty; or
// it starts, after a UTF-8 byte order mark and white space, with '[' or
// with '{' and names neither static_resources nor WasmPlugin; or it is
// called *.json and is not such a JSON bootstrap.
func pluginConfigFile(file string, doc []byte) bool {
	trimmed := bytes.TrimSpace(bytes.TrimPrefix(doc, []byte("\xef\xbb\xbf")))
	envoyOrIstio := bytes.Contains(trimmed, []byte(`"static_resources"`)) || bytes.Contains(trimmed, []byte(`"WasmPlugin"`))
	switch {
	case len(trimmed) == 0, trimmed[0] == '[':
		return true
	case trimmed[0] == '{':
		return !envoyOrIstio
	}
	return strings.HasSuffix(strings.ToLower(file), ".json")
}

// wasmPlugins returns the pluginConfig of every "kind: WasmPlugin" document
// in a (multi-document) YAML file; ok is false when there is none.
func wasmPlugins(file string, doc []byte) ([]checkTarget, bool, error) {
	var out []checkTarget
	for i, part := range splitYAML(doc) {
		var obj struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
			Spec struct {
				PluginName   string          `json:"pluginName"`
				PluginConfig json.RawMessage `json:"pluginConfig"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal(part, &obj); err != nil || obj.Kind != "WasmPlugin" {
			continue
		}
		where := fmt.Sprintf("%s (document %d, WasmPlugin %s)", file, i+1, obj.Metadata.Name)
		if len(obj.Spec.PluginConfig) == 0 || string(obj.Spec.PluginConfig) == "null" {
			return nil, true, errors.New(where + ": spec.pluginConfig is missing")
		}
		out = append(out, checkTarget{where: where, opts: wasmhost.Options{PluginConfig: obj.Spec.PluginConfig, PluginName: obj.Spec.PluginName}})
	}
	return out, len(out) > 0, nil
}

// splitYAML splits a multi-document YAML stream at "---" lines.
func splitYAML(doc []byte) [][]byte {
	var parts [][]byte
	var cur []byte
	for _, line := range bytes.SplitAfter(doc, []byte("\n")) {
		if t := bytes.TrimRight(line, " \t\r\n"); bytes.Equal(t, []byte("---")) || bytes.HasPrefix(t, []byte("--- ")) {
			parts = append(parts, cur)
			cur = nil
			continue
		}
		cur = append(cur, line...)
	}
	return append(parts, cur)
}
