// Package dropin is the drop-in for envoyproxy/ratelimit
// (docs/dropin.md), as far as it differs from tokengate-rls: its
// environment (Settings, read by ParseSettings, which gives the service's
// lifecycle its daemon.Settings), and where it gets its rules, the
// runtime directory of YAML files (Runtime, read by the rlsyaml package)
// or an xDS server (XDS, with the rlsxds package), both sources of the
// lifecycle (daemon.Rules). Deciding envoyproxy/ratelimit's descriptors
// is internal/service/rls's (internal/service/rls/dropin.go, internal/service/rls/dropin_server.go).
package dropin

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"sort"

	"github.com/tokengate/tokengate/internal/service/daemon"
	"github.com/tokengate/tokengate/internal/service/dropin/rlsyaml"
	"github.com/tokengate/tokengate/internal/service/rls"
)

// LoadRuntime reads the runtime directory's YAML files into a
// configuration. A directory that does not exist holds no domains.
func LoadRuntime(dir string, ignoreDot bool, opt rls.DropinOptions) (*rls.Config, error) {
	return LoadRuntimeLimits(dir, ignoreDot, opt, rlsyaml.Limits{})
}

// LoadRuntimeLimits is LoadRuntime within lim (rlsyaml.LoadDirLimits).
func LoadRuntimeLimits(dir string, ignoreDot bool, opt rls.DropinOptions, lim rlsyaml.Limits) (*rls.Config, error) {
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return rls.NewDropinConfig(nil, opt)
	}
	domains, err := rlsyaml.LoadDirLimits(dir, ignoreDot, lim)
	if err != nil {
		return nil, err
	}
	return rls.NewDropinConfig(domains, opt)
}

// Runtime is the runtime directory as a source of rules. It is loaded
// again when it changes, as envoyproxy/ratelimit's runtime watch does,
// but only once the change is complete: every Poll takes a digest of the
// files' names and contents and the root's symlink target (a Kubernetes
// ConfigMap volume swaps a symlink), and a new digest is loaded when the
// next Poll sees it again. A file caught half-written (an editor or
// `cat > file` writing it in place) changes between two polls, so it is
// neither installed (a half file may parse, less the limits of its second
// half) nor logged as an error. A bad directory that stays is logged and
// the configuration in force kept.
type Runtime struct {
	// Root is RUNTIME_ROOT, Dir the directory of YAML files under it.
	Root, Dir string
	// IgnoreDot skips files whose name starts with a dot.
	IgnoreDot bool
	// Options are every domain's.
	Options rls.DropinOptions
	// Limits bound the directory's size and descriptors (fields <= 0:
	// rlsyaml's defaults).
	Limits rlsyaml.Limits
	// ServeBadAtStart, when the directory does not load at start, logs
	// the error and starts with no configuration (rls.Unloaded: every call
	// answered with an error) instead of failing the start.
	ServeBadAtStart bool
	// Log receives the reloads and their failures.
	Log *slog.Logger

	last [32]byte // the digest of the directory in force
	// seen is the digest of the last Poll, when it differed from last:
	// the next Poll loads it if it sees it again.
	seen [32]byte
}

var _ daemon.Rules = (*Runtime)(nil)

// First loads the directory.
func (r *Runtime) First() (*rls.Config, error) {
	c, err := r.loadBounded()
	if err != nil && r.ServeBadAtStart {
		r.Log.Error("no rate limit configuration loaded: every call is answered with an error until the directory loads", "error", err)
		return rls.Unloaded(), nil
	}
	return c, err
}

// Follow notes the directory's digest: Poll compares against it.
func (r *Runtime) Follow(context.Context, daemon.Apply) (bool, error) {
	r.last = runtimeDigest(r.Root, r.Dir)
	r.seen = r.last
	return true, nil
}

// Poll loads the directory again when its digest changed and the
// previous Poll saw the same new digest: the change is complete.
func (r *Runtime) Poll(apply daemon.Apply) {
	d := runtimeDigest(r.Root, r.Dir)
	if d == r.last {
		r.seen = d
		return
	}
	if d != r.seen {
		r.seen = d // changed since the last look: perhaps being written
		return
	}
	r.last = d
	r.load(apply)
}

// Reload loads the directory again, at once (SIGHUP: the operator says
// it is complete).
func (r *Runtime) Reload(_ string, apply daemon.Apply) {
	r.last = runtimeDigest(r.Root, r.Dir)
	r.seen = r.last
	r.load(apply)
}

// loadBounded loads the directory with the garbage collector at GOGC=100
// and gives the parse's garbage back to the system afterwards.
//
// Why: parsing leaves about 35 bytes of garbage per byte of YAML (the
// whole YAML tree) and the binary runs at GOGC=400, so with a
// configuration of 50 MB in force the next collection came only once the
// heap reached 250 MB: a reload of a file that had loaded in 75 MB peaked
// at 185 MB (issue 30: 370 MB, then 670 MB after one reload).
func (r *Runtime) loadBounded() (*rls.Config, error) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	defer debug.FreeOSMemory()
	return LoadRuntimeLimits(r.Dir, r.IgnoreDot, r.Options, r.Limits)
}

func (r *Runtime) load(apply daemon.Apply) {
	c, err := r.loadBounded()
	apply(c, err)
	domains := 0
	if err == nil {
		domains = len(c.Domains())
	}
	// The parse's garbage (the YAML tree, tens of times the files' size)
	// and the configuration just replaced are unreachable now: collect
	// them and give the memory back at once, so that a reload does not
	// hold two configurations and a tree until the next GC cycle, which
	// GOGC=400 puts far away (docs/dropin.md#limits).
	debug.FreeOSMemory()
	if err != nil {
		r.Log.Warn(fmt.Sprintf("configuration not reloaded, the one in force is kept: %v", err))
		return
	}
	r.Log.Warn(fmt.Sprintf("configuration reloaded: %d domains", domains))
}

// runtimeDigest is the digest of the directory: the root's symlink
// target, and each file's path, size, time and contents (so that an
// in-place write of the same size within one tick of the file system's
// clock is still a change).
func runtimeDigest(root, dir string) [32]byte {
	h := sha256.New()
	if t, err := os.Readlink(root); err == nil {
		fmt.Fprintf(h, "root->%s\n", t)
	}
	var paths []string
	_ = filepath.WalkDir(dir, func(path string, _ fs.DirEntry, err error) error {
		if err == nil {
			paths = append(paths, path)
		}
		return nil
	})
	sort.Strings(paths)
	for _, path := range paths {
		st, err := os.Stat(path)
		if err != nil {
			continue
		}
		fmt.Fprintf(h, "%q %d %d\n", path, st.Size(), st.ModTime().UnixNano())
		if !st.Mode().IsRegular() {
			continue
		}
		if f, err := os.Open(path); err == nil {
			_, _ = io.Copy(h, f)
			_ = f.Close()
		}
	}
	var sum [32]byte
	copy(sum[:], h.Sum(nil))
	return sum
}
