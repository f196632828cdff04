package daemon

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"

	"github.com/tokengate/tokengate/internal/service/rls"
)

// JSONFile is tokengate-rls's source of rules: the filter's JSON
// configuration in one file, loaded again on SIGHUP and, polled, when its
// bytes change.
type JSONFile struct {
	path string
	log  *slog.Logger
	data []byte      // the file's bytes in force
	stat os.FileInfo // at the last look
}

// NewJSONFile returns the source of the configuration file at path.
func NewJSONFile(path string, log *slog.Logger) *JSONFile {
	return &JSONFile{path: path, log: log}
}

// First reads and parses the file; an error names it.
func (f *JSONFile) First() (*rls.Config, error) {
	data, err := os.ReadFile(f.path)
	if err != nil {
		return nil, err
	}
	cfg, err := rls.ParseConfig(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", f.path, err)
	}
	f.data = data
	return cfg, nil
}

// Follow notes the file's state: Poll compares against it.
func (f *JSONFile) Follow(context.Context, Apply) (bool, error) {
	f.stat, _ = os.Stat(f.path)
	return true, nil
}

// Poll loads the file again when it changed since the last look and its
// bytes are not those in force.
func (f *JSONFile) Poll(apply Apply) {
	fi, _ := os.Stat(f.path)
	if !rls.FileChanged(fi, f.stat) {
		return
	}
	f.stat = fi
	if data, err := os.ReadFile(f.path); err != nil || !bytes.Equal(data, f.data) {
		f.load("file changed", apply)
	}
}

// Reload loads the file again.
func (f *JSONFile) Reload(why string, apply Apply) {
	f.stat, _ = os.Stat(f.path)
	f.load(why, apply)
}

// load reads, validates and applies the file; on error the configuration
// in force stays.
func (f *JSONFile) load(why string, apply Apply) {
	data, err := os.ReadFile(f.path)
	var cfg *rls.Config
	if err == nil {
		cfg, err = rls.ParseConfig(data)
	}
	apply(cfg, err)
	if err != nil {
		f.log.Error("configuration not reloaded: the previous one stays", "file", f.path, "trigger", why, "error", err)
		return
	}
	f.data = data
	f.log.Info("configuration reloaded", "file", f.path, "trigger", why, "rules", len(cfg.Rules()))
}
