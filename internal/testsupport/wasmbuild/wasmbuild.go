// Package wasmbuild builds the tokengate module for tests and benchmarks,
// so that a stale build/tokengate.wasm can never pass them: every test
// binary that drives the module compiles it from the sources it was built
// with, once per process, into a directory of its own (packages are tested
// in parallel, and must not overwrite each other's module).
//
// $TOKENGATE_WASM, when set, names a module to use instead (to benchmark a
// different build).
package wasmbuild

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
)

var (
	once sync.Once
	dir  string
	path string
	wasm []byte
	err  error
)

// Path builds the module (once per process) and returns the path of the
// file, which lives until Cleanup.
func Path() (string, error) {
	once.Do(build)
	return path, err
}

// Module builds the module (once per process) and returns its bytes.
func Module() ([]byte, error) {
	once.Do(build)
	return wasm, err
}

// Cleanup removes what Path built; TestMain calls it after m.Run.
func Cleanup() {
	if dir != "" {
		_ = os.RemoveAll(dir)
	}
}

func build() {
	if p := os.Getenv("TOKENGATE_WASM"); p != "" {
		path = p
		wasm, err = os.ReadFile(p)
		return
	}
	root, e := Root()
	if e != nil {
		err = e
		return
	}
	if dir, err = os.MkdirTemp("", "tokengate-wasm"); err != nil {
		return
	}
	// Read every source the module is built from, in this process: go
	// test caches a package's result keyed on the files its test opened,
	// so a change to the module's sources re-runs the tests that drive it.
	if err = touchSources(root); err != nil {
		return
	}
	path = filepath.Join(dir, "tokengate.wasm")
	// The flags of `make build` (Makefile): -s -w drops the wasm name
	// section, which only names functions in a VM's trap trace; Go's own
	// tables, which its panics use, stay.
	cmd := exec.Command("go", "build", "-buildmode=c-shared", "-trimpath", "-ldflags=-s -w", "-o", path, "./cmd/tokengate")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
	if out, e := cmd.CombinedOutput(); e != nil {
		err = fmt.Errorf("building the module: %v\n%s", e, out)
		return
	}
	wasm, err = os.ReadFile(path)
}

// Root returns the repository root: the nearest directory above the
// working directory whose go.mod is the main module's (it has a
// cmd/tokengate directory).
func Root() (string, error) {
	d, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(d, "cmd", "tokengate", "main.go")); err == nil {
			return d, nil
		}
		parent := filepath.Dir(d)
		if parent == d {
			return "", errors.New("no repository root (cmd/tokengate) above the working directory")
		}
		d = parent
	}
}

// touchSources opens go.mod, go.sum and the Go files of every package of
// the repository that the module links.
func touchSources(root string) error {
	cmd := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.Dir}}{{end}}", "./cmd/tokengate")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("listing the module's packages: %w", err)
	}
	files := []string{filepath.Join(root, "go.mod"), filepath.Join(root, "go.sum")}
	for _, d := range strings.Fields(string(out)) {
		if !strings.HasPrefix(d, root) {
			continue // a dependency from the module cache: go.sum covers it
		}
		matches, _ := filepath.Glob(filepath.Join(d, "*.go"))
		files = append(files, matches...)
	}
	for _, f := range files {
		if _, err := os.ReadFile(f); err != nil {
			return err
		}
	}
	return nil
}
