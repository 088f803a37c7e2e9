//go:build linux

package gpupods

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/gpurack/gpurack/agent/cdi"
	"github.com/gpurack/gpurack/agent/deviceplugin"
	"github.com/gpurack/gpurack/agent/gpu/sim"
	"github.com/gpurack/gpurack/agent/monitor"
	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster"
	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster/hostnode"
	"github.com/gpurack/gpurack/imagebuilder/build"
	"github.com/gpurack/gpurack/imagebuilder/rootfs"
	"github.com/gpurack/gpurack/internal/profile"
	"github.com/gpurack/gpurack/internal/testreq"
)

// gpuNodeOptions configure newGPUNode.
type gpuNodeOptions struct {
	name string
	// pods: build what pods need, the GPU container runtime and the probe image.
	pods bool
	// nativeCDI: containerd 1.7 with its own CDI, as trixie images run it (built from
	// the upstream source of the version the trixie profile locks); otherwise this
	// machine's containerd 1.6 with nvidia-container-runtime, as bookworm images.
	nativeCDI bool
	// statusEvery is kubelet's nodeStatusUpdateFrequency; empty: kubelet's default.
	statusEvery string
}

// gpuNode is a host node (real kubelet and containerd) with the agent's GPU side
// beside it: a simulated DGX H100, the agent's monitor over it, and the device plugin
// (startPlugin) writing the simulated CDI spec.
type gpuNode struct {
	hn  *hostnode.Node
	cs  kubernetes.Interface
	sim *sim.Sim
	mon *monitor.Monitor
	// startPlugin runs the device plugin as gpuagent does, each GPU advertised as
	// replicas devices; stop ends it.
	startPlugin func(replicas int) (plugin *deviceplugin.Plugin, stop func())
}

func newGPUNode(tb testing.TB, ctx context.Context, o gpuNodeOptions) *gpuNode {
	tb.Helper()
	hostnode.Require(tb)
	testreq.Tool(tb, "go", "install Go (the version go.mod names)")
	root, err := filepath.Abs("../..")
	if err != nil {
		tb.Fatal(err)
	}
	tmp, err := os.MkdirTemp("", "gpr-gpupods-") // short: the CDI and runtime paths stay readable
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(tmp) })
	cdiDir, devDir := filepath.Join(tmp, "cdi"), filepath.Join(tmp, "sim-dev")
	ho := hostnode.Options{Name: o.name}
	if o.statusEvery != "" {
		ho.KubeletConfig = "nodeStatusUpdateFrequency: " + o.statusEvery
	}
	if o.pods {
		probeTar := filepath.Join(tmp, "probe.tar")
		if out, err := exec.CommandContext(ctx, filepath.Join(root, "hack", "probe-image.sh"), probeTar).CombinedOutput(); err != nil {
			tb.Fatalf("hack/probe-image.sh: %v\n%s", err, out)
		}
		ho.Images = []string{probeTar}
	}
	switch {
	case o.pods && o.nativeCDI:
		bin := containerd17(tb, ctx, root)
		ho.Env = []string{"PATH=" + bin + string(os.PathListSeparator) + os.Getenv("PATH")}
		ho.CRIConfig = func(*hostnode.Node) string {
			return rootfs.ContainerdGPU{SpecDirs: []string{cdiDir}}.CRIConfig(rootfs.GPURuntimeNativeCDI)
		}
	case o.pods:
		// The GPU container runtime as gpuimage builds it for containerd 1.6 images,
		// with the images' config pointed at this node's CDI directory.
		runtime := filepath.Join(tmp, "nvidia-container-runtime")
		if err := build.GoBuild(ctx, root, "github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-container-runtime", runtime, true, "test"); err != nil {
			tb.Fatal(err)
		}
		runtimeConfig := filepath.Join(tmp, "nvidia-container-runtime.toml")
		if err := os.WriteFile(runtimeConfig, []byte(rootfs.NvidiaRuntimeConfigFor([]string{cdiDir})), 0o644); err != nil {
			tb.Fatal(err)
		}
		ho.CRIConfig = func(n *hostnode.Node) string {
			return rootfs.ContainerdGPU{RuntimeBinary: runtime, RuncRoot: n.RuncRoot()}.CRIConfig(rootfs.GPURuntimeNvidiaCDI)
		}
		ho.Env = []string{"NVIDIA_CTK_CONFIG_FILE_PATH=" + runtimeConfig}
	}
	c := testcluster.Shared(tb)
	g := &gpuNode{cs: c.Clientset(tb), hn: hostnode.Start(tb, c, ho)}

	p, err := profile.Load(filepath.Join(root, "profiles", "debian12-nvidia535.yaml"))
	if err != nil {
		tb.Fatal(err)
	}
	if g.sim, err = sim.New("dgxh100", sim.Options{DriverVersion: p.GPU.Driver.Version}); err != nil {
		tb.Fatal(err)
	}
	g.mon = monitor.New(monitor.Config{Backend: g.sim, Profile: p, Interval: 100 * time.Millisecond, ClearAfter: 2 * time.Second})
	go g.mon.Run(ctx)
	g.startPlugin = func(replicas int) (*deviceplugin.Plugin, func()) {
		pctx, cancel := context.WithCancel(ctx)
		plugin := deviceplugin.New(deviceplugin.Config{Monitor: g.mon, Dir: g.hn.DevicePluginDir(), Simulated: true, Replicas: replicas,
			Poll: 100 * time.Millisecond, Log: slog.New(slog.NewTextHandler(testLog{tb}, nil)),
			CDI: func(ctx context.Context, gpus []deviceplugin.GPU) error {
				_, err := cdi.WriteSimulated(ctx, cdi.SimOptions{Dir: cdiDir, DevDir: devDir, GPUs: deviceplugin.CDIGPUs(gpus)})
				return err
			}})
		done := make(chan struct{})
		go func() { plugin.Run(pctx); close(done) }()
		return plugin, func() { cancel(); <-done }
	}
	return g
}

// testLog writes the plugin's log lines to the test's log.
type testLog struct{ tb testing.TB }

func (w testLog) Write(b []byte) (int, error) {
	w.tb.Log(strings.TrimSuffix(string(b), "\n"))
	return len(b), nil
}

// containerd17Version is what containerd17's binaries say in their log.
func containerd17Version(tb testing.TB, root string) (version, locked string) {
	tb.Helper()
	lock, err := profile.LoadLock(filepath.Join(root, "profiles", "debian13-nvidia550.lock.json"))
	if err != nil {
		tb.Fatal(err)
	}
	lp := lock.Find("containerd")
	if lp == nil {
		tb.Fatal("the trixie lock has no containerd")
	}
	return "v" + strings.SplitN(lp.Version, "~", 2)[0], lp.Version
}

// containerd17 returns a directory holding containerd and containerd-shim-runc-v2 at
// the upstream version of the containerd that the trixie profile locks
// (profiles/debian13-nvidia550.lock.json: 1.7.24~ds1-… → v1.7.24), built from the Go
// module proxy once into the cache beside the pinned Kubernetes binaries. Debian 12
// has no containerd 1.7, and trixie's package links a newer glibc than Debian 12's.
func containerd17(tb testing.TB, ctx context.Context, root string) string {
	tb.Helper()
	version, locked := containerd17Version(tb, root)
	cache := os.Getenv("GPURACK_CACHE")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache", "gpurack")
	}
	bin := filepath.Join(cache, "containerd", version, "bin")
	if _, err := os.Stat(filepath.Join(bin, "containerd-shim-runc-v2")); err == nil {
		return bin
	}
	tb.Logf("building containerd %s (the trixie lock's %s) into %s", version, locked, bin)
	// Its go.mod has exclude directives, so `go install pkg@version` refuses it: the
	// module's source is fetched, copied out of the read-only module cache and built
	// as the main module (its vendor directory holds only modules.txt: -mod=mod).
	run := func(dir string, env []string, name string, arg ...string) string {
		cmd := exec.CommandContext(ctx, name, arg...)
		cmd.Dir, cmd.Env = dir, append(os.Environ(), env...)
		out, err := cmd.Output()
		if err != nil {
			var stderr []byte
			if ee, ok := err.(*exec.ExitError); ok {
				stderr = ee.Stderr
			}
			tb.Fatalf("build containerd %s: %s %v: %v\n%s", version, name, arg, err, stderr)
		}
		return string(out)
	}
	work := tb.TempDir()
	var mod struct{ Dir string }
	if err := json.Unmarshal([]byte(run(work, nil, "go", "mod", "download", "-json", "github.com/containerd/containerd@"+version)), &mod); err != nil || mod.Dir == "" {
		tb.Fatalf("go mod download containerd %s: %v", version, err)
	}
	src := filepath.Join(work, "src")
	run(work, nil, "cp", "-r", mod.Dir, src)
	run(work, nil, "chmod", "-R", "u+w", src)
	if err := os.MkdirAll(bin, 0o755); err != nil {
		tb.Fatal(err)
	}
	tmpBin := filepath.Join(work, "bin")
	run(src, []string{"CGO_ENABLED=0", "GOFLAGS=-mod=mod"}, "go", "build", "-trimpath", "-tags", "no_btrfs", "-o", tmpBin+"/",
		"-ldflags", "-X github.com/containerd/containerd/version.Version="+version,
		"./cmd/containerd", "./cmd/containerd-shim-runc-v2")
	for _, name := range []string{"containerd", "containerd-shim-runc-v2"} {
		if err := os.Rename(filepath.Join(tmpBin, name), filepath.Join(bin, name)); err != nil {
			run(work, nil, "cp", filepath.Join(tmpBin, name), filepath.Join(bin, name))
		}
	}
	return bin
}
