package rootfs

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	ctkconfig "github.com/NVIDIA/nvidia-container-toolkit/api/config/v1"
	"github.com/pelletier/go-toml"

	"github.com/gpurack/gpurack/agent/registryhosts"
	"github.com/gpurack/gpurack/internal/profile"
)

// lockedContainerd is the containerd version a shipped profile's lock pins.
func lockedContainerd(t *testing.T, name string) string {
	t.Helper()
	l, err := profile.LoadLock(filepath.Join("../../profiles", name+".lock.json"))
	if err != nil {
		t.Fatal(err)
	}
	p := l.Find("containerd")
	if p == nil {
		t.Fatalf("%s locks no containerd", name)
	}
	return p.Version
}

// The shipped profiles get the runtime their containerd needs: tiny none, bookworm's
// containerd 1.6 nvidia-container-runtime in CDI mode, trixie's 1.7 native CDI.
func TestGPURuntimeForShippedProfiles(t *testing.T) {
	for _, c := range []struct {
		profile string
		gpu     bool
		want    GPURuntime
	}{
		{"tiny", false, GPURuntimeNone},
		{"debian12-nvidia535", true, GPURuntimeNvidiaCDI},
		{"debian13-nvidia550", true, GPURuntimeNativeCDI},
	} {
		p, err := profile.Load(filepath.Join("../../profiles", c.profile+".yaml"))
		if err != nil {
			t.Fatal(err)
		}
		if (p.GPU != nil) != c.gpu {
			t.Fatalf("%s: GPU %v, want %v", c.profile, p.GPU != nil, c.gpu)
		}
		got, err := GPURuntimeFor(p.GPU != nil, lockedContainerd(t, c.profile))
		if err != nil || got != c.want {
			t.Errorf("%s: %v, %v; want %v", c.profile, got, err, c.want)
		}
	}
	for v, want := range map[string]GPURuntime{"1.6.20~ds1-1+deb12u3": GPURuntimeNvidiaCDI, "1.7.24~ds1-6+deb13u1": GPURuntimeNativeCDI,
		"2.1.4~ds1-1": GPURuntimeNativeCDI, "1:1.6.9-1": GPURuntimeNvidiaCDI, "1.10.0": GPURuntimeNativeCDI} {
		if got, err := GPURuntimeFor(true, v); err != nil || got != want {
			t.Errorf("containerd %s: %v, %v; want %v", v, got, err, want)
		}
	}
	for _, v := range []string{"", "1", "x.y", "1.x"} {
		if _, err := GPURuntimeFor(true, v); err == nil || !strings.Contains(err.Error(), "major.minor") {
			t.Errorf("containerd %q: %v", v, err)
		}
	}
}

// containerd's config parses as TOML and has exactly its case's GPU part: nothing for
// tiny, nvidia-container-runtime as the default runtime with the cdi.k8s.io/*
// annotations for containerd 1.6, enable_cdi with the spec directories for 1.7.
func TestContainerdConfigGPU(t *testing.T) {
	for _, g := range []GPURuntime{GPURuntimeNone, GPURuntimeNvidiaCDI, GPURuntimeNativeCDI} {
		t.Run(g.String(), func(t *testing.T) {
			text := containerdConfig("registry.k8s.io/pause:3.10.1", g)
			tree, err := toml.Load(text)
			if err != nil {
				t.Fatalf("containerd config is not TOML: %v\n%s", err, text)
			}
			get := func(key ...string) any {
				return tree.GetPath(append([]string{"plugins", "io.containerd.grpc.v1.cri"}, key...))
			}
			if get("sandbox_image") != "registry.k8s.io/pause:3.10.1" || get("containerd", "runtimes", "runc", "options", "SystemdCgroup") != true {
				t.Errorf("the CRI basics are gone:\n%s", text)
			}
			// Pulls read hosts.toml files from the folder gpuagent writes them to.
			if got := get("registry", "config_path"); got != registryhosts.DefaultDir || RegistryHostsDir != "/run/gpurack/containerd/certs.d" {
				t.Errorf("registry config_path %v, want %s (agent/registryhosts):\n%s", got, registryhosts.DefaultDir, text)
			}
			enable, dirs := get("enable_cdi"), get("cdi_spec_dirs")
			def, nv := get("containerd", "default_runtime_name"), get("containerd", "runtimes", "nvidia")
			switch g {
			case GPURuntimeNone:
				if enable != nil || dirs != nil || def != nil || nv != nil || strings.Contains(text, "nvidia") {
					t.Errorf("no-GPU config has GPU parts:\n%s", text)
				}
			case GPURuntimeNativeCDI:
				if enable != true || !slices.Contains(toStrings(dirs), "/var/run/cdi") || def != nil || nv != nil {
					t.Errorf("containerd 1.7 config: enable_cdi %v, cdi_spec_dirs %v, default runtime %v, nvidia runtime %v:\n%s", enable, dirs, def, nv, text)
				}
			case GPURuntimeNvidiaCDI:
				bin := get("containerd", "runtimes", "nvidia", "options", "BinaryName")
				ann := toStrings(get("containerd", "runtimes", "nvidia", "container_annotations"))
				typ := get("containerd", "runtimes", "nvidia", "runtime_type")
				cg := get("containerd", "runtimes", "nvidia", "options", "SystemdCgroup")
				if enable != nil || def != "nvidia" || bin != NvidiaRuntimePath || !slices.Equal(ann, []string{"cdi.k8s.io/*"}) || typ != "io.containerd.runc.v2" || cg != true {
					t.Errorf("containerd 1.6 config: enable_cdi %v, default %v, binary %v, annotations %v, type %v, SystemdCgroup %v:\n%s", enable, def, bin, ann, typ, cg, text)
				}
			}
		})
	}
}

func toStrings(v any) []string {
	var out []string
	if l, ok := v.([]any); ok {
		for _, e := range l {
			if s, ok := e.(string); ok {
				out = append(out, s)
			}
		}
	}
	return out
}

// nvidia-container-runtime's own config loader reads the shipped config as CDI mode,
// devices from cdi.k8s.io/ annotations only, and the spec directories agent/cdi writes.
func TestNvidiaRuntimeConfigLoadsInCDIMode(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.toml")
	if err := os.WriteFile(path, []byte(NvidiaRuntimeConfigFor(CDISpecDirs)), 0o644); err != nil {
		t.Fatal(err)
	}
	tc, err := ctkconfig.New(ctkconfig.WithConfigFile(path), ctkconfig.WithRequired(true))
	if err != nil {
		t.Fatal(err)
	}
	c, err := tc.Config()
	if err != nil {
		t.Fatal(err)
	}
	r := c.NVIDIAContainerRuntimeConfig
	if r.Mode != "cdi" || r.Modes.CDI.DefaultKind != "nvidia.com/gpu" || !slices.Equal(r.Modes.CDI.AnnotationPrefixes, []string{"cdi.k8s.io/"}) ||
		!slices.Contains(r.Modes.CDI.SpecDirs, "/var/run/cdi") || !slices.Equal(r.Runtimes, []string{"runc"}) {
		t.Errorf("runtime config %+v", r)
	}
	if c.AcceptEnvvarUnprivileged || c.AcceptDeviceListAsVolumeMounts {
		t.Errorf("an unprivileged container's NVIDIA_VISIBLE_DEVICES or mounts would select GPUs: %+v", c)
	}
}

// Write ships the GPU container runtime's files for its case only.
func TestNodeWriteGPURuntime(t *testing.T) {
	src := t.TempDir()
	for _, f := range []string{"kubelet", "pause.tar", "gpuagent", "gpuagent.service", "mods/modules.builtin", "nvidia-cdi-hook", "nvidia-container-runtime"} {
		os.MkdirAll(filepath.Dir(filepath.Join(src, f)), 0o755)
		os.WriteFile(filepath.Join(src, f), []byte(f), 0o644)
	}
	shipped := []string{"usr/bin/nvidia-cdi-hook", "usr/bin/nvidia-container-runtime", "etc/nvidia-container-runtime/config.toml"}
	for g, want := range map[GPURuntime][]string{GPURuntimeNone: nil, GPURuntimeNvidiaCDI: shipped, GPURuntimeNativeCDI: shipped[:1]} {
		n := &Node{ImageID: "abc", ProfileJSON: []byte(`{}`), Kubelet: filepath.Join(src, "kubelet"), PauseImage: filepath.Join(src, "pause.tar"),
			PauseTag: "registry.k8s.io/pause:3.10.1", Agent: filepath.Join(src, "gpuagent"), AgentUnit: filepath.Join(src, "gpuagent.service"),
			KernelVersion: "6.1.0-57-amd64", KernelModules: filepath.Join(src, "mods"), InstalledList: filepath.Join(src, "installed.txt"),
			GPURuntime: g, CDIHook: filepath.Join(src, "nvidia-cdi-hook"), NvidiaRuntime: filepath.Join(src, "nvidia-container-runtime")}
		ov := t.TempDir()
		if _, err := n.Write(ov); err != nil {
			t.Fatal(err)
		}
		for _, f := range shipped {
			st, err := os.Stat(filepath.Join(ov, f))
			switch {
			case slices.Contains(want, f) && err != nil:
				t.Errorf("%v: %s missing: %v", g, f, err)
			case slices.Contains(want, f) && strings.HasPrefix(f, "usr/bin/") && st.Mode().Perm() != 0o755:
				t.Errorf("%v: %s mode %v", g, f, st.Mode())
			case !slices.Contains(want, f) && err == nil:
				t.Errorf("%v: %s shipped", g, f)
			}
		}
		if g != GPURuntimeNone {
			n.CDIHook = ""
			if _, err := n.Write(t.TempDir()); err == nil || !strings.Contains(err.Error(), "nvidia-cdi-hook") {
				t.Errorf("%v without nvidia-cdi-hook: %v", g, err)
			}
		}
	}
}
