package bench

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
)

// BenchmarkGuestPrimitives prices, in wazero, what a request through the
// module is made of: entering the guest (an empty export), a host call, a
// host call that calls back into the guest's malloc (every value a host
// returns), and inside the guest a Go call, a defer with recover, a small
// map lookup, a 48-byte allocation and formatting a 10-digit number. ns/op
// is per operation. The guest is bench/primitives, built here with the
// toolchain that builds the filter.
func BenchmarkGuestPrimitives(b *testing.B) {
	ctx := context.Background()
	out := filepath.Join(b.TempDir(), "primitives.wasm")
	build := exec.Command("go", "build", "-buildmode=c-shared", "-o", out, "./primitives")
	build.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
	if msg, err := build.CombinedOutput(); err != nil {
		b.Fatalf("building bench/primitives: %v\n%s", err, msg)
	}
	wasm, err := os.ReadFile(out)
	if err != nil {
		b.Fatal(err)
	}
	rt := wazero.NewRuntime(ctx)
	defer rt.Close(ctx)
	wasi_snapshot_preview1.MustInstantiate(ctx, rt)
	var malloc api.Function
	i32 := api.ValueTypeI32
	env := rt.NewHostModuleBuilder("env")
	env.NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(func(_ context.Context, _ api.Module, s []uint64) {
		s[0] += s[1]
	}), []api.ValueType{i32, i32}, []api.ValueType{i32}).Export("noop")
	env.NewFunctionBuilder().WithGoModuleFunction(api.GoModuleFunc(func(ctx context.Context, m api.Module, s []uint64) {
		res, err := malloc.Call(ctx, 16)
		if err != nil || !m.Memory().WriteUint32Le(uint32(s[0]), uint32(res[0])) {
			panic("callback: malloc failed")
		}
		s[0] = 0
	}), []api.ValueType{i32}, []api.ValueType{i32}).Export("callback")
	if _, err := env.Instantiate(ctx); err != nil {
		b.Fatal(err)
	}
	mod, err := rt.InstantiateWithConfig(ctx, wasm, wazero.NewModuleConfig().WithStartFunctions("_initialize"))
	if err != nil {
		b.Fatal(err)
	}
	malloc = mod.ExportedFunction("malloc")

	b.Run("enter-guest", func(b *testing.B) {
		f := mod.ExportedFunction("empty")
		for b.Loop() {
			if _, err := f.Call(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	// Each loop export repeats its operation n times per call, so the
	// cost of entering the guest is spread thin.
	const n = 1000
	for _, name := range []string{"host_call", "host_call_malloc", "go_call", "defer_recover", "map_lookup", "alloc48", "format10"} {
		f := mod.ExportedFunction(name)
		b.Run(name, func(b *testing.B) {
			calls := 0
			for b.Loop() {
				if _, err := f.Call(ctx, n); err != nil {
					b.Fatal(err)
				}
				calls++
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(calls*n), "ns/op")
		})
	}
}
