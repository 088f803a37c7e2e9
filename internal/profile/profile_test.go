package profile

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestShippedProfilesAreValid(t *testing.T) {
	paths, err := filepath.Glob("../../profiles/*.yaml")
	if err != nil || len(paths) < 3 {
		t.Fatalf("want the three shipped profiles, found %v (%v)", paths, err)
	}
	for _, path := range paths {
		p, err := Load(path)
		if err != nil {
			t.Errorf("%s: %v", path, err)
			continue
		}
		if want := strings.TrimSuffix(filepath.Base(path), ".yaml"); p.Name != want {
			t.Errorf("%s: name %q, want the file name %q", path, p.Name, want)
		}
		if p.Name != "tiny" && !p.HasGPU() {
			t.Errorf("%s: an NVIDIA profile without a gpu section", path)
		}
	}
}

const tiny = `name: tiny
base:
  distro: debian
  suite: bookworm
kernel:
  package: linux-image-amd64
kubernetes:
  version: v1.34.2
`

const nvidia = `name: nv
base:
  distro: debian
  suite: bookworm
kernel:
  package: linux-image-6.1.0-50-amd64
  version: 6.1.0-50-amd64
gpu:
  vendor: nvidia
  driver:
    version: 535.261.03
    flavor: open
  expect:
    count: 8
    product: NVIDIA H100 80GB HBM3
    memoryMiB: 81559
    pcie: {gen: 5, width: 16}
    nvlinkLinks: 18
kubernetes:
  version: v1.34.2
`

// TestXIDWithdraw: gpu.xid.withdraw replaces the default classification, which
// applies when the setting (or the gpu section) is left out.
func TestXIDWithdraw(t *testing.T) {
	def, err := Parse("nv.yaml", []byte(nvidia))
	if err != nil {
		t.Fatal(err)
	}
	got := def.GPU.WithdrawXIDs()
	want := []uint32{48, 62, 64, 74, 79, 95, 119, 120, 140}
	if !slices.Equal(got, want) {
		t.Errorf("default withdraw XIDs %v, want the reset-gpu, reboot and fatal classes %v", got, want)
	}
	if got := (*GPU)(nil).WithdrawXIDs(); !slices.Equal(got, want) {
		t.Errorf("no gpu section: %v, want %v", got, want)
	}
	set, err := Parse("nv.yaml", []byte(strings.Replace(nvidia, "    nvlinkLinks: 18", "    nvlinkLinks: 18\n  xid:\n    withdraw: [79, 92]", 1)))
	if err != nil {
		t.Fatal(err)
	}
	if got := set.GPU.WithdrawXIDs(); !slices.Equal(got, []uint32{79, 92}) {
		t.Errorf("withdraw XIDs %v, want [79 92]", got)
	}
	// The setting survives the canonical form (profile.json on the node) and changes
	// the digest (the image id).
	again, err := Parse("nv.json", set.Canonical())
	if err != nil || !slices.Equal(again.GPU.WithdrawXIDs(), []uint32{79, 92}) {
		t.Fatalf("canonical form lost gpu.xid.withdraw: %v %v", err, again)
	}
	if set.Digest() == def.Digest() {
		t.Error("gpu.xid.withdraw did not change the digest")
	}
}

// TestTimeSlicing: gpu.sharing.timeSlicing.replicas is the devices per GPU, 1 when
// the setting (or the gpu section) is left out; it survives the canonical form and
// changes the digest, while a profile without it keeps the digest it had.
func TestTimeSlicing(t *testing.T) {
	def, err := Parse("nv.yaml", []byte(nvidia))
	if err != nil {
		t.Fatal(err)
	}
	if got := def.GPU.TimeSlicingReplicas(); got != 1 {
		t.Errorf("no sharing: %d replicas, want 1", got)
	}
	if got := (*GPU)(nil).TimeSlicingReplicas(); got != 1 {
		t.Errorf("no gpu section: %d replicas, want 1", got)
	}
	if strings.Contains(string(def.Canonical()), "sharing") {
		t.Errorf("canonical form of a profile without sharing names it: %s", def.Canonical())
	}
	set, err := Parse("nv.yaml", []byte(strings.Replace(nvidia, "    nvlinkLinks: 18", "    nvlinkLinks: 18\n  sharing:\n    timeSlicing:\n      replicas: 4", 1)))
	if err != nil {
		t.Fatal(err)
	}
	if got := set.GPU.TimeSlicingReplicas(); got != 4 {
		t.Errorf("%d replicas, want 4", got)
	}
	again, err := Parse("nv.json", set.Canonical())
	if err != nil || again.GPU.TimeSlicingReplicas() != 4 || again.Digest() != set.Digest() {
		t.Fatalf("canonical form lost gpu.sharing: %v %s", err, set.Canonical())
	}
	if set.Digest() == def.Digest() {
		t.Error("gpu.sharing did not change the digest")
	}
	for _, n := range []int{2, MaxTimeSlicingReplicas} {
		if _, err := Parse("nv.yaml", []byte(strings.Replace(nvidia, "    nvlinkLinks: 18", fmt.Sprintf("    nvlinkLinks: 18\n  sharing: {timeSlicing: {replicas: %d}}", n), 1))); err != nil {
			t.Errorf("replicas %d: %v", n, err)
		}
	}
}

// TestGPUSimulator: gpu.simulator makes a simulated GPU profile: GPUs (the runtime, the
// device plugin) but no driver, so no versioned kernel either; it survives the
// canonical form and changes the digest, and profiles without it keep theirs.
func TestGPUSimulator(t *testing.T) {
	src := strings.Replace(tiny, "kubernetes:", "gpu:\n  vendor: nvidia\n  simulator: dgxh100\n  expect:\n    count: 8\n    product: NVIDIA H100 80GB HBM3\n    memoryMiB: 81559\n    pcie: {gen: 5, width: 16}\nkubernetes:", 1)
	p, err := Parse("sim.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	if !p.HasGPU() || p.HasDriver() || !p.Simulated() {
		t.Errorf("HasGPU %v HasDriver %v Simulated %v, want true false true", p.HasGPU(), p.HasDriver(), p.Simulated())
	}
	again, err := Parse("sim.json", p.Canonical())
	if err != nil || !again.Simulated() || again.GPU.Simulator != "dgxh100" || again.Digest() != p.Digest() {
		t.Fatalf("canonical form lost gpu.simulator: %v %s", err, p.Canonical())
	}
	nv, err := Parse("nv.yaml", []byte(nvidia))
	if err != nil {
		t.Fatal(err)
	}
	if !nv.HasDriver() || nv.Simulated() || strings.Contains(string(nv.Canonical()), "simulator") {
		t.Errorf("a driver profile: HasDriver %v Simulated %v, canonical %s", nv.HasDriver(), nv.Simulated(), nv.Canonical())
	}
	plain, err := Parse("tiny.yaml", []byte(tiny))
	if err != nil {
		t.Fatal(err)
	}
	if plain.HasGPU() || plain.HasDriver() || plain.Simulated() {
		t.Error("a profile without a gpu section has GPUs")
	}
}

func TestDefaultsAndCanonicalForm(t *testing.T) {
	p, err := Parse("tiny.yaml", []byte(tiny))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(p.Base.Components, ",") != "main,contrib,non-free,non-free-firmware" {
		t.Errorf("default components = %v", p.Base.Components)
	}
	if p.Kubernetes.ContainerRuntime != "containerd" {
		t.Errorf("default runtime = %q", p.Kubernetes.ContainerRuntime)
	}
	// Comments and formatting do not change the digest; content does.
	reformatted := "# a comment\n" + strings.ReplaceAll(tiny, "suite: bookworm", "suite:   bookworm  # pinned")
	q, err := Parse("tiny.yaml", []byte(reformatted))
	if err != nil {
		t.Fatal(err)
	}
	if p.Digest() != q.Digest() {
		t.Error("a comment changed the profile digest")
	}
	r, _ := Parse("tiny.yaml", []byte(strings.ReplaceAll(tiny, "v1.34.2", "v1.34.3")))
	if r.Digest() == p.Digest() {
		t.Error("a different Kubernetes version gave the same digest")
	}
	if !strings.HasPrefix(p.Digest(), "sha256:") || len(p.Digest()) != 71 {
		t.Errorf("digest %q is not sha256:HEX", p.Digest())
	}
}

// errorCase edits a valid profile and expects an error naming field and line.
type errorCase struct {
	name      string
	base      string
	old, new  string
	wantField string
	wantLine  int
	wantText  string
}

func TestProfileErrors(t *testing.T) {
	cases := []errorCase{
		{"unknown top-level key", tiny, "kubernetes:", "colour: blue\nkubernetes:", "colour", 7, `unknown field "colour"`},
		{"unknown nested key suggests", nvidia, "    flavor: open", "    flavour: open", "gpu.driver.flavour", 12, `did you mean "flavor"`},
		{"missing driver version", nvidia, "    version: 535.261.03\n", "", "gpu.driver.version", 10, "is required"},
		{"flavor typo", nvidia, "flavor: open", "flavor: opne", "gpu.driver.flavor", 12, `unknown flavor "opne"`},
		{"wrong type", nvidia, "count: 8", "count: eight", "gpu.expect.count", 14, "whole number"},
		{"list expected", tiny, "  suite: bookworm", "  suite: bookworm\n  components: main", "base.components", 5, "expected a list"},
		{"bad suite", tiny, "suite: bookworm", "suite: buster", "base.suite", 4, "unknown suite"},
		{"bad component", tiny, "  suite: bookworm", "  suite: bookworm\n  components: [main, nonfree]", "base.components[1]", 5, "unknown archive area"},
		{"meta kernel with GPU", nvidia, "package: linux-image-6.1.0-50-amd64", "package: linux-image-amd64", "kernel.package", 6, "pin a versioned package"},
		{"kernel mismatch", nvidia, "version: 6.1.0-50-amd64", "version: 6.1.0-57-amd64", "kernel.version", 7, "does not match"},
		{"bad kernel module", nvidia, "version: 6.1.0-50-amd64", "version: 6.1.0-50-amd64\n  modules: [nfsd, ../evil]", "kernel.modules[1]", 8, "not a kernel module name"},
		{"bad k8s version", tiny, "v1.34.2", "1.34", "kubernetes.version", 8, "not a Kubernetes release"},
		{"duplicate key", tiny, "name: tiny", "name: tiny\nname: other", "name", 2, "given twice"},
		{"bad check id", tiny, "kubernetes:", "checks:\n  gpu.tempreature:\n    warn: 3\nkubernetes:", "checks[gpu.tempreature]", 8, "unknown check id"},
		{"reserved label", tiny, "kubernetes:", "node:\n  labels:\n    nvidia.com/gpu.product: x\nkubernetes:", "node.labels[nvidia.com/gpu.product]", 9, "reserved"},
		{"bad taint effect", tiny, "kubernetes:", "node:\n  taints:\n    - key: a\n      effect: NoSchedul\nkubernetes:", "node.taints[0].effect", 10, "unknown effect"},
		{"reserved kernel arg", tiny, "kubernetes:", "boot:\n  kernelArgs: [gpurack.rootfs=x]\nkubernetes:", "boot.kernelArgs[0]", 8, "set by gpuimage"},
		{"versioned package", tiny, "kubernetes:", "packages: [curl=7.88]\nkubernetes:", "packages[0]", 7, "carries a version"},
		{"extra deb sha", tiny, "kubernetes:", "extraDebs:\n  - file: fm.deb\n    sha256: abc\nkubernetes:", "extraDebs[0].sha256", 9, "64 lowercase hex"},
		{"image without path", tiny, "kubernetes:", "images:\n  - name: gpurack.io/probe:v1\nkubernetes:", "images[0].path", 8, "is required"},
		{"image listed twice", tiny, "kubernetes:", "images:\n  - path: a.tar\n  - path: ./a.tar\nkubernetes:", "images[1].path", 9, "listed twice"},
		{"image bad name", tiny, "kubernetes:", "images:\n  - path: a.tar\n    name: 'a b'\nkubernetes:", "images[0].name", 9, "not an image reference"},
		{"alias", tiny, "name: tiny", "name: &n tiny\ndescription: *n", "description", 2, "aliases are not supported"},
		{"unknown withdraw XID", nvidia, "    nvlinkLinks: 18", "    nvlinkLinks: 18\n  xid:\n    withdraw: [48, 999]", "gpu.xid.withdraw[1]", 20, "XID 999 is not in gpurack's XID table"},
		{"withdraw XID twice", nvidia, "    nvlinkLinks: 18", "    nvlinkLinks: 18\n  xid:\n    withdraw:\n      - 79\n      - 79", "gpu.xid.withdraw[1]", 22, "listed twice"},
		{"empty withdraw list", nvidia, "    nvlinkLinks: 18", "    nvlinkLinks: 18\n  xid:\n    withdraw: []", "gpu.xid.withdraw", 20, "disable gpu.xid.fatal"},
		{"withdraw not a number", nvidia, "    nvlinkLinks: 18", "    nvlinkLinks: 18\n  xid:\n    withdraw: [xid79]", "gpu.xid.withdraw[0]", 20, "whole number"},
		{"pod network backend", tiny, "  version: v1.34.2", "  version: v1.34.2\n  podNetwork:\n    backend: udp", "kubernetes.podNetwork.backend", 10, "use vxlan or host-gw"},
		{"pod subnet", tiny, "  version: v1.34.2", "  version: v1.34.2\n  podNetwork:\n    podSubnet: 10.244.1.0/16", "kubernetes.podNetwork.podSubnet", 10, "networking.podSubnet"},
		{"one replica is no sharing", nvidia, "    nvlinkLinks: 18", "    nvlinkLinks: 18\n  sharing:\n    timeSlicing:\n      replicas: 1", "gpu.sharing.timeSlicing.replicas", 21, "must be from 2 to 64 devices per GPU, got 1"},
		{"too many replicas", nvidia, "    nvlinkLinks: 18", "    nvlinkLinks: 18\n  sharing:\n    timeSlicing:\n      replicas: 65", "gpu.sharing.timeSlicing.replicas", 21, "got 65"},
		{"replicas not whole", nvidia, "    nvlinkLinks: 18", "    nvlinkLinks: 18\n  sharing:\n    timeSlicing:\n      replicas: 2.5", "gpu.sharing.timeSlicing.replicas", 21, "whole number"},
		{"replicas left out", nvidia, "    nvlinkLinks: 18", "    nvlinkLinks: 18\n  sharing:\n    timeSlicing: {}", "gpu.sharing.timeSlicing.replicas", 20, "got 0"},
		{"sharing without a way", nvidia, "    nvlinkLinks: 18", "    nvlinkLinks: 18\n  sharing: {}", "gpu.sharing", 19, "set timeSlicing: {replicas: N}"},
		{"unknown sharing strategy", nvidia, "    nvlinkLinks: 18", "    nvlinkLinks: 18\n  sharing:\n    mps: {replicas: 2}", "gpu.sharing.mps", 20, `unknown field "mps"`},
		{"sharing without GPUs", tiny, "kubernetes:", "gpu:\n  sharing:\n    timeSlicing:\n      replicas: 4\nkubernetes:", "gpu.sharing", 8, "the profile expects none"},
		{"unknown simulator", tiny, "kubernetes:", "gpu:\n  vendor: nvidia\n  simulator: dgx-h100\n  expect: {count: 8, product: P, memoryMiB: 1, pcie: {gen: 5, width: 16}}\nkubernetes:", "gpu.simulator", 9, `unknown simulator model "dgx-h100"`},
		{"simulator with a driver", nvidia, "  vendor: nvidia", "  vendor: nvidia\n  simulator: dgxh100", "gpu.driver", 11, "ships no driver"},
		{"bad mirror", tiny, "  suite: bookworm", "  suite: bookworm\n  mirror: ftp:/x", "base.mirror", 5, "not an http"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			src := strings.Replace(c.base, c.old, c.new, 1)
			if src == c.base {
				t.Fatalf("test edit %q did not apply", c.old)
			}
			_, err := Parse("p.yaml", []byte(src))
			var es Errors
			if !errors.As(err, &es) {
				t.Fatalf("want Errors, got %v", err)
			}
			for _, e := range es {
				if e.Field == c.wantField && e.Line == c.wantLine && strings.Contains(e.Msg, c.wantText) {
					if !strings.HasPrefix(e.Error(), "p.yaml:") {
						t.Errorf("error %q does not start with the file name", e)
					}
					return
				}
			}
			t.Errorf("want an error at p.yaml:%d on %s containing %q; got:\n%v", c.wantLine, c.wantField, c.wantText, err)
		})
	}
}

func TestSyntaxAndEmpty(t *testing.T) {
	for name, src := range map[string]string{
		"empty":  "",
		"syntax": "name: tiny\nbase: [unclosed\n",
		"scalar": "just text",
		"tabs":   "name: tiny\n\tbase: x\n",
	} {
		_, err := Parse("p.yaml", []byte(src))
		if err == nil || !strings.HasPrefix(err.Error(), "p.yaml:") {
			t.Errorf("%s: want a located error, got %v", name, err)
		}
	}
}

func TestLoadMissingFile(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "nope.yaml"))
	if err == nil || !strings.Contains(err.Error(), "nope.yaml") {
		t.Fatalf("want an error naming the file, got %v", err)
	}
}

func TestImagesField(t *testing.T) {
	src := strings.Replace(tiny, "kubernetes:", "images:\n  - path: images/probe.tar\n    name: gpurack.io/probe:v1\nkubernetes:", 1)
	p, err := Parse("profiles/p.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Images) != 1 || p.Images[0].Path != "images/probe.tar" || p.Images[0].Name != "gpurack.io/probe:v1" {
		t.Fatalf("images %+v", p.Images)
	}
	if !strings.Contains(string(p.Canonical()), `"images":[{"path":"images/probe.tar","name":"gpurack.io/probe:v1"}]`) {
		t.Errorf("canonical form lacks the images: %s", p.Canonical())
	}
	// A profile without images keeps its canonical form (and so its lock).
	plain, err := Parse("profiles/p.yaml", []byte(tiny))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(plain.Canonical()), "images") {
		t.Errorf("a profile without images mentions them: %s", plain.Canonical())
	}
	if got := ArchivePath("profiles/p.yaml", "images/probe.tar"); got != "profiles/images/probe.tar" {
		t.Errorf("ArchivePath relative = %s", got)
	}
	if got := ArchivePath("profiles/p.yaml", "/srv/a.tar"); got != "/srv/a.tar" {
		t.Errorf("ArchivePath absolute = %s", got)
	}
}

func TestPodNetworkSettings(t *testing.T) {
	p, err := Parse("p.yaml", []byte(tiny))
	if err != nil {
		t.Fatal(err)
	}
	if got := p.Kubernetes.PodNetworkSettings(); got.Backend != "vxlan" || got.PodSubnet != "10.244.0.0/16" {
		t.Errorf("defaults %+v", got)
	}
	if strings.Contains(string(p.Canonical()), "podNetwork") {
		t.Errorf("defaults leak into the canonical profile: %s", p.Canonical())
	}
	p, err = Parse("p.yaml", []byte(strings.Replace(tiny, "  version: v1.34.2", "  version: v1.34.2\n  podNetwork:\n    backend: host-gw\n    podSubnet: 10.42.0.0/16", 1)))
	if err != nil {
		t.Fatal(err)
	}
	if got := p.Kubernetes.PodNetworkSettings(); got.Backend != "host-gw" || got.PodSubnet != "10.42.0.0/16" {
		t.Errorf("settings %+v", got)
	}
}

func TestStorageDataDisks(t *testing.T) {
	withXFS := tiny + "packages: [xfsprogs]\n"
	src := withXFS + "storage:\n  dataDisks:\n    - transport: nvme\n      minSize: 1.92T\n    - path: /dev/vdb\n"
	p, err := Parse("profiles/p.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Storage.DataDisks) != 2 || p.Storage.DataDisks[0].Transport != "nvme" || p.Storage.DataDisks[1].Path != "/dev/vdb" {
		t.Fatalf("dataDisks %+v", p.Storage.DataDisks)
	}
	if !strings.Contains(string(p.Canonical()), `"storage":{"dataDisks":[{"minSize":"1.92T","transport":"nvme"},{"path":"/dev/vdb"}]}`) {
		t.Errorf("canonical form lacks the data disks: %s", p.Canonical())
	}
	// A profile without storage keeps its canonical form (and so its lock and image id).
	plain, err := Parse("profiles/p.yaml", []byte(tiny))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(plain.Canonical()), "storage") {
		t.Errorf("a profile without storage mentions it: %s", plain.Canonical())
	}
	// Bad rules are refused by the selector's own parser, at their line and field.
	bad := tiny + "storage:\n  dataDisks:\n    - transport: nvme\n    - {}\n    - minSize: lots\n      model: ok\n"
	_, err = Parse("profiles/p.yaml", []byte(bad))
	if err == nil {
		t.Fatal("bad data-disk rules accepted")
	}
	for _, want := range []string{"storage.dataDisks[1].path: the rule sets no field", `storage.dataDisks[2].minSize: "lots" is not a size`, "add xfsprogs to packages"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	if !strings.Contains(err.Error(), "p.yaml:") {
		t.Errorf("error %q names no line", err)
	}
}
