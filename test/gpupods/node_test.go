//go:build linux

package gpupods

import (
	"context"
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
		probeTar := filepath.Join(tmp, "probe.tar")
		if out, err := exec.CommandContext(ctx, filepath.Join(root, "hack", "probe-image.sh"), probeTar).CombinedOutput(); err != nil {
			tb.Fatalf("hack/probe-image.sh: %v\n%s", err, out)
		}
		ho.Images = []string{probeTar}
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
