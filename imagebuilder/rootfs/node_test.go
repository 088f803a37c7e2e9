package rootfs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpurack/gpurack/agent/nodeexporter"
)

func TestNodeWrite(t *testing.T) {
	src := t.TempDir()
	for _, f := range []string{"kubelet", "node_exporter", "pause.tar", "gpuagent", "gpuagent.service", "mods/kernel/fs/overlayfs/overlay.ko", "mods/modules.builtin", "nvidia.ko"} {
		os.MkdirAll(filepath.Dir(filepath.Join(src, f)), 0o755)
		os.WriteFile(filepath.Join(src, f), []byte(f), 0o644)
	}
	n := &Node{ImageID: "abc", ProfileJSON: []byte(`{"name":"tiny"}`), Kubelet: filepath.Join(src, "kubelet"), PauseImage: filepath.Join(src, "pause.tar"),
		NodeExporter: filepath.Join(src, "node_exporter"),
		PauseTag:     "registry.k8s.io/pause:3.10.1", Agent: filepath.Join(src, "gpuagent"), AgentUnit: filepath.Join(src, "gpuagent.service"),
		KernelVersion: "6.1.0-57-amd64", KernelModules: filepath.Join(src, "mods"), Modules: []string{"kernel/fs/overlayfs/overlay.ko"},
		InstalledList: "/tmp/x", ExtraModules: map[string]string{"updates/dkms/nvidia-current.ko": filepath.Join(src, "nvidia.ko")}}
	ov := t.TempDir()
	cmds, err := n.Write(ov)
	if err != nil {
		t.Fatal(err)
	}
	checks := map[string]string{
		"etc/containerd/config.toml":              "SystemdCgroup = true",
		"etc/gpurack/profile.json":                `{"name":"tiny"}`,
		"etc/systemd/system/kubelet.service":      "--bootstrap-kubeconfig=/var/lib/kubelet/bootstrap-kubeconfig --kubeconfig=/var/lib/kubelet/kubeconfig --config=/var/lib/kubelet/config.yaml",
		"etc/sysctl.d/90-gpurack-kubernetes.conf": "net.bridge.bridge-nf-call-iptables = 1",
		// The pod network's links match before 80-gpurack-dhcp.network's Type=ether.
		"etc/systemd/network/10-gpurack-pod-network.network": "Name=cni0 flannel.* veth*\n\n[Link]\nUnmanaged=yes",
		"etc/systemd/networkd.conf.d/gpurack.conf":           "ManageForeignRoutes=no",
		"etc/modules-load.d/gpurack-kubernetes.conf":         "br_netfilter",
		"usr/bin/kubelet":                                               "kubelet",
		"usr/bin/node_exporter":                                         "node_exporter",
		"etc/systemd/system/node-exporter.service":                      "ExecStart=/usr/bin/node_exporter --web.listen-address=${LISTEN} --web.config.file=%d/web.yml",
		"usr/bin/gpuagent":                                              "gpuagent",
		"etc/systemd/system/gpuagent.service":                           "gpuagent.service",
		"usr/lib/modules/6.1.0-57-amd64/kernel/fs/overlayfs/overlay.ko": "overlay.ko",
		"usr/lib/modules/6.1.0-57-amd64/modules.builtin":                "modules.builtin",
		"usr/lib/modules/6.1.0-57-amd64/updates/dkms/nvidia-current.ko": "nvidia.ko",
	}
	for f, want := range checks {
		data, err := os.ReadFile(filepath.Join(ov, f))
		if err != nil || !strings.Contains(string(data), want) {
			t.Errorf("%s: %v, lacks %q", f, err, want)
		}
	}
	if data, _ := os.ReadFile(filepath.Join(ov, "etc/containerd/config.toml")); !strings.Contains(string(data), `sandbox_image = "registry.k8s.io/pause:3.10.1"`) {
		t.Errorf("containerd config has no sandbox_image:\n%s", data)
	}
	all := strings.Join(cmds, "\n")
	for _, want := range []string{"depmod -b \"$1\" 6.1.0-57-amd64", "enable var-lib-containerd.mount systemd-networkd.service systemd-resolved.service gpurack-images.service gpurack-boot-report.service gpuagent.service", "dpkg-query"} {
		if !strings.Contains(all, want) {
			t.Errorf("customize commands lack %q:\n%s", want, all)
		}
	}
	if strings.Contains(all, "kubelet.service") {
		t.Error("kubelet.service must not be enabled: gpuagent starts it")
	}
	if strings.Contains(all, "node-exporter.service") {
		t.Error("node-exporter.service must not be enabled: gpuagent starts it with its credential")
	}
	if st, err := os.Stat(filepath.Join(ov, "usr/bin/node_exporter")); err != nil || st.Mode().Perm() != 0o755 {
		t.Errorf("usr/bin/node_exporter: %v, %v", st, err)
	}
	n.AgentUnit = ""
	if _, err := n.Write(t.TempDir()); err == nil || !strings.Contains(err.Error(), "no gpuagent unit given") {
		t.Errorf("Write without a gpuagent unit: err = %v", err)
	}
}

func TestNodeImageArchives(t *testing.T) {
	src := t.TempDir()
	for _, f := range []string{"kubelet", "pause.tar", "gpuagent", "gpuagent.service", "probe.tar"} {
		os.WriteFile(filepath.Join(src, f), []byte(f), 0o644)
	}
	n := &Node{ImageID: "abc", ProfileJSON: []byte(`{}`), Kubelet: filepath.Join(src, "kubelet"), PauseImage: filepath.Join(src, "pause.tar"),
		PauseTag: "registry.k8s.io/pause:3.10.1", Agent: filepath.Join(src, "gpuagent"), AgentUnit: filepath.Join(src, "gpuagent.service"),
		KernelVersion: "6.1.0-57-amd64", KernelModules: filepath.Join(src, "mods"), InstalledList: "/tmp/x",
		Images: []ImageArchive{{Src: filepath.Join(src, "probe.tar"), Dst: "/usr/share/gpurack/images/0123.tar", Names: []string{"gpurack.io/probe:v1"}}}}
	ov := t.TempDir()
	if _, err := n.Write(ov); err != nil {
		t.Fatal(err)
	}
	if data, err := os.ReadFile(filepath.Join(ov, "usr/share/gpurack/images/0123.tar")); err != nil || string(data) != "probe.tar" {
		t.Errorf("archive not shipped: %q %v", data, err)
	}
	unit, _ := os.ReadFile(filepath.Join(ov, "etc/systemd/system/gpurack-images.service"))
	pause := strings.Index(string(unit), "import --all-platforms /usr/share/gpurack/images/pause.tar\n")
	probe := strings.Index(string(unit), "ExecStart=/usr/bin/ctr --namespace k8s.io images import /usr/share/gpurack/images/0123.tar\n")
	if pause < 0 || probe < pause || !strings.Contains(string(unit), "Before=kubelet.service") || !strings.Contains(string(unit), "gpurack.io/probe:v1") {
		t.Errorf("gpurack-images.service does not import the archive after the pause image, before kubelet:\n%s", unit)
	}
	// Without archives the unit is what it always was: one import, of the pause image.
	n.Images = nil
	ov = t.TempDir()
	if _, err := n.Write(ov); err != nil {
		t.Fatal(err)
	}
	unit, _ = os.ReadFile(filepath.Join(ov, "etc/systemd/system/gpurack-images.service"))
	if strings.Count(string(unit), "ExecStart=") != 1 || !strings.HasSuffix(string(unit), "pause.tar\n\n[Install]\nWantedBy=multi-user.target\n") {
		t.Errorf("unit without archives:\n%s", unit)
	}
	for _, dst := range []string{"/etc/passwd", "/usr/share/gpurack/images/../../x.tar", "/usr/share/gpurack/images/pause.tar"} {
		n.Images = []ImageArchive{{Src: filepath.Join(src, "probe.tar"), Dst: dst}}
		if _, err := n.Write(t.TempDir()); err == nil {
			t.Errorf("archive destination %s accepted", dst)
		}
	}
}

// The unit loads, as credentials, the very files agent/nodeexporter writes, from the
// directory it writes them in, and runs sandboxed.
func TestNodeExporterUnitLoadsTheAgentsFiles(t *testing.T) {
	for _, f := range []string{nodeexporter.WebConfigFile, nodeexporter.CertFile, nodeexporter.KeyFile, nodeexporter.ClientCAFile} {
		want := "\nLoadCredential=" + f + ":" + nodeexporter.DefaultDir + "/" + f + "\n"
		if !strings.Contains(nodeExporterUnit, want) {
			t.Errorf("node-exporter.service lacks %q", strings.TrimSpace(want))
		}
	}
	for _, want := range []string{"\nEnvironmentFile=" + nodeexporter.DefaultDir + "/" + nodeexporter.EnvFile + "\n",
		"--web.config.file=%d/" + nodeexporter.WebConfigFile, "\nDynamicUser=yes\n", "\nProtectSystem=strict\n", "\nCapabilityBoundingSet=\n", "($$|/)"} {
		if !strings.Contains(nodeExporterUnit, want) {
			t.Errorf("node-exporter.service lacks %q", strings.TrimSpace(want))
		}
	}
	if nodeexporter.Unit != "node-exporter.service" {
		t.Errorf("the image ships node-exporter.service, the agent restarts %s", nodeexporter.Unit)
	}
}
