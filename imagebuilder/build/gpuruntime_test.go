package build

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/gpurack/gpurack/imagebuilder/rootfs"
	"github.com/gpurack/gpurack/internal/profile"
)

// Each shipped profile bundles the GPU container runtime its containerd needs, and
// nothing of it without a GPU: the binaries join the bundled files the image id covers.
// A simulated GPU profile (tiny with gpu.simulator) bundles what its containerd needs
// as a driver profile does: its containers get the simulator's devices through CDI.
func TestGPURuntimeBinariesPerProfile(t *testing.T) {
	src := t.TempDir()
	hook, rt := filepath.Join(src, "nvidia-cdi-hook"), filepath.Join(src, "nvidia-container-runtime")
	for _, f := range []string{hook, rt} {
		if err := os.WriteFile(f, []byte(filepath.Base(f)), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for name, want := range map[string]struct {
		rt   rootfs.GPURuntime
		bins []string
	}{
		"tiny":               {rootfs.GPURuntimeNone, nil},
		"tiny+simulator":     {rootfs.GPURuntimeNvidiaCDI, []string{"nvidia-cdi-hook", "nvidia-container-runtime"}},
		"debian12-nvidia535": {rootfs.GPURuntimeNvidiaCDI, []string{"nvidia-cdi-hook", "nvidia-container-runtime"}},
		"debian13-nvidia550": {rootfs.GPURuntimeNativeCDI, []string{"nvidia-cdi-hook"}},
	} {
		file, simulated := strings.CutSuffix(name, "+simulator")
		p, err := profile.Load(filepath.Join("../../profiles", file+".yaml"))
		if err != nil {
			t.Fatal(err)
		}
		if simulated {
			p.GPU = &profile.GPU{Vendor: "nvidia", Simulator: "dgxh100"}
		}
		lock, err := profile.LoadLock(filepath.Join("../../profiles", file+".lock.json"))
		if err != nil {
			t.Fatal(err)
		}
		b := &imageBuild{o: Options{CDIHookBin: hook, NvidiaRuntimeBin: rt}, p: p, lock: lock, work: t.TempDir()}
		bundled := map[string]string{}
		if err := b.gpuRuntimeBinaries(context.Background(), bundled); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var got []string
		for n := range bundled {
			got = append(got, n)
		}
		sort.Strings(got)
		if b.gpuRT != want.rt || !slices.Equal(got, want.bins) {
			t.Errorf("%s: runtime %v bundles %v; want %v, %v", name, b.gpuRT, got, want.rt, want.bins)
		}
		if want.rt == rootfs.GPURuntimeNone && (b.cdiHook != "" || b.nvRuntime != "") {
			t.Errorf("%s: no-GPU image takes %q %q", name, b.cdiHook, b.nvRuntime)
		}
	}
}
