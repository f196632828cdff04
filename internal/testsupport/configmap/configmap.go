// Package configmap lays out a directory as the kubelet mounts a
// Kubernetes ConfigMap volume, for the tests of the drop-in's runtime
// directory (its parser and the service started as ratelimit).
package configmap

import (
	"os"
	"path/filepath"
	"testing"
)

// Lay lays out files in dir as the kubelet mounts a ConfigMap: the files
// in ..<stamp>/, the symlink ..data to it, and each name a symlink to
// ..data/name. Called again with another stamp, it swaps ..data as the
// kubelet does on an update (a new symlink renamed over the old one) and
// removes the old directory.
func Lay(t testing.TB, dir, stamp string, files map[string]string) {
	t.Helper()
	ts := filepath.Join(dir, ".."+stamp)
	if err := os.MkdirAll(ts, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(ts, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	old, _ := os.Readlink(filepath.Join(dir, "..data"))
	if err := os.Symlink(".."+stamp, filepath.Join(dir, "..data_tmp")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	for name := range files {
		if _, err := os.Lstat(filepath.Join(dir, name)); err != nil {
			if err := os.Symlink(filepath.Join("..data", name), filepath.Join(dir, name)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if old != "" && old != ".."+stamp {
		if err := os.RemoveAll(filepath.Join(dir, old)); err != nil {
			t.Fatal(err)
		}
	}
}
