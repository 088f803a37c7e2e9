package profile

import (
	"errors"
	"fmt"
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/gpurack/gpurack/internal/checkid"
	"github.com/gpurack/gpurack/internal/disksel"
	"github.com/gpurack/gpurack/internal/nodecontract"
	"github.com/gpurack/gpurack/internal/strictyaml"
	"github.com/gpurack/gpurack/internal/xidclass"
)

// Load reads and validates the profile at path.
func Load(path string) (*Profile, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read profile: %w", err)
	}
	return Parse(path, data)
}

// Parse decodes and validates a profile. file names the source in errors. The error,
// if any, is of type Errors and lists every problem found, each with file, line and
// field.
func Parse(file string, data []byte) (*Profile, error) {
	var p Profile
	pos, err := strictyaml.Decode(file, data, &p)
	if err != nil {
		return nil, err
	}
	p.applyDefaults()
	v := validator{file: file, pos: pos}
	v.profile(&p)
	if len(v.errs) > 0 {
		return nil, v.errs.Sorted()
	}
	return &p, nil
}

type validator struct {
	file string
	pos  strictyaml.Positions
	errs Errors
}

func (v *validator) fail(field, format string, args ...any) {
	v.errs = append(v.errs, v.pos.At(v.file, field, fmt.Sprintf(format, args...)))
}

// required reports a missing value and returns false, or returns true.
func (v *validator) required(field, value, example string) bool {
	if strings.TrimSpace(value) == "" {
		v.fail(field, "is required (for example %s)", example)
		return false
	}
	return true
}

var (
	nameRE          = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
	debNameRE       = regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]+$`)
	kernelReleaseRE = regexp.MustCompile(`^[0-9]+\.[0-9]+(\.[0-9]+)?(\+deb[0-9]+)?(-[0-9]+)?-[a-z0-9]+$`)
	driverVersionRE = regexp.MustCompile(`^[0-9]{3}\.[0-9]{2,3}(\.[0-9]{2})?$`)
	k8sVersionRE    = regexp.MustCompile(`^v1\.[0-9]+\.[0-9]+$`)
	sha256RE        = regexp.MustCompile(`^[0-9a-f]{64}$`)
	labelNameRE     = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$`)
	dnsSubdomainRE  = regexp.MustCompile(`^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$`)
	labelValueRE    = regexp.MustCompile(`^([A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?)?$`)
	// imageRefRE is the shape of an image reference; gpuimage checks it in full
	// against the archive.
	imageRefRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:/@-]{0,254}$`)
)

// Suites are the Debian releases a profile may name.
var Suites = []string{"bookworm", "trixie", "forky"}

var areas = map[string]bool{"main": true, "contrib": true, "non-free": true, "non-free-firmware": true}

func (v *validator) profile(p *Profile) {
	if v.required("name", p.Name, "name: debian12-nvidia535") && !nameRE.MatchString(p.Name) {
		v.fail("name", "%q is not a valid name; use lowercase letters, digits and '-' (at most 63)", p.Name)
	}
	v.base(&p.Base)
	v.kernel(p)
	if p.GPU != nil {
		v.gpu(p.GPU)
	}
	v.kubernetes(&p.Kubernetes)
	v.packages(p.Packages)
	v.extraDebs(p.ExtraDebs)
	v.images(p.Images)
	v.checks(p.Checks)
	v.node(&p.Node)
	v.boot(&p.Boot)
	v.storage(p)
	v.computeLibrary(p)
}

// computeLibrary: the compute check dlopens libcuda.so.1, which an image with a driver
// ships only when packages list libcuda1 (the driver's apt preference pins its version).
// A simulated node runs no kernel and needs none.
func (v *validator) computeLibrary(p *Profile) {
	if p.HasDriver() && p.GPU.ComputeEnabled() && !slices.Contains(p.Packages, ComputeLibraryPackage) {
		v.fail("gpu.compute.enabled", "the compute check loads libcuda.so.1, which the image lacks; add %s to packages (the driver's apt preference pins it to the driver's version)", ComputeLibraryPackage)
	}
}

// storage checks the data-disk rules with the selector's own parser (internal/disksel),
// so the profile refuses exactly what the agent would.
func (v *validator) storage(p *Profile) {
	s := &p.Storage
	if len(s.DataDisks) > 0 && !slices.Contains(p.Packages, "xfsprogs") {
		v.fail("storage.dataDisks", "data disks are formatted with mkfs.xfs, which the image lacks; add xfsprogs to packages")
	}
	for i, spec := range s.DataDisks {
		if _, err := disksel.ParseRule(spec); err != nil {
			var fe *disksel.FieldError
			if errors.As(err, &fe) {
				v.fail(fmt.Sprintf("storage.dataDisks[%d].%s", i, fe.Field), "%s", fe.Msg)
			} else {
				v.fail(fmt.Sprintf("storage.dataDisks[%d]", i), "%v", err)
			}
		}
	}
}

func (v *validator) base(b *Base) {
	if v.required("base.distro", b.Distro, "distro: debian") && b.Distro != "debian" {
		v.fail("base.distro", "%q is not supported; only debian is", b.Distro)
	}
	if v.required("base.suite", b.Suite, "suite: bookworm") && !slices.Contains(Suites, b.Suite) {
		v.fail("base.suite", "unknown suite %q; use one of %s", b.Suite, strings.Join(Suites, ", "))
	}
	seen := map[string]bool{}
	for i, c := range b.Components {
		f := fmt.Sprintf("base.components[%d]", i)
		switch {
		case !areas[c]:
			v.fail(f, "unknown archive area %q; use main, contrib, non-free or non-free-firmware", c)
		case seen[c]:
			v.fail(f, "%q is listed twice", c)
		}
		seen[c] = true
	}
	if b.Mirror != "" {
		u, err := url.Parse(b.Mirror)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https" && u.Scheme != "file") || (u.Scheme != "file" && u.Host == "") {
			v.fail("base.mirror", "%q is not an http, https or file URL of a Debian archive; leave it out to use the host's configured source", b.Mirror)
		}
	}
}

// moduleNameRE is a kernel module's name.
var moduleNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,63}$`)

func (v *validator) kernel(p *Profile) {
	k := &p.Kernel
	if !v.required("kernel.package", k.Package, "package: linux-image-amd64") {
		return
	}
	if !strings.HasPrefix(k.Package, "linux-image-") || !debNameRE.MatchString(k.Package) {
		v.fail("kernel.package", "%q is not a Debian kernel image package (linux-image-...)", k.Package)
		return
	}
	release := strings.TrimPrefix(k.Package, "linux-image-")
	meta := !kernelReleaseRE.MatchString(release) // linux-image-amd64, linux-image-cloud-amd64
	if k.Version != "" {
		if !kernelReleaseRE.MatchString(k.Version) {
			v.fail("kernel.version", "%q is not a kernel release like 6.1.0-50-amd64 (as uname -r prints it)", k.Version)
		} else if !meta && release != k.Version {
			v.fail("kernel.version", "%q does not match the package %s, which installs %s", k.Version, k.Package, release)
		}
	}
	for i, m := range k.Modules {
		if !moduleNameRE.MatchString(m) {
			v.fail(fmt.Sprintf("kernel.modules[%d]", i), "%q is not a kernel module name (as modprobe takes it: nfsd, xt_conntrack)", m)
		}
	}
	if p.HasDriver() {
		if meta {
			v.fail("kernel.package", "%s moves with every kernel update, which breaks prebuilt GPU modules; pin a versioned package such as linux-image-6.1.0-50-amd64", k.Package)
		} else if k.Version == "" {
			v.fail("kernel.version", "is required with a GPU driver, because modules are built and checked against it (for example version: %s)", release)
		}
	}
}

func (v *validator) gpu(g *GPU) {
	if v.required("gpu.vendor", g.Vendor, "vendor: nvidia") && g.Vendor != "nvidia" {
		v.fail("gpu.vendor", "%q is not supported; only nvidia is", g.Vendor)
	}
	switch {
	case g.Simulator != "":
		if !slices.Contains(SimulatorModels, g.Simulator) {
			v.fail("gpu.simulator", "unknown simulator model %q%s; use one of %s", g.Simulator, strictyaml.Suggest(g.Simulator, SimulatorModels), strings.Join(SimulatorModels, ", "))
		}
		if g.Driver != (Driver{}) {
			v.fail("gpu.driver", "a simulated GPU node ships no driver; leave gpu.driver out with gpu.simulator")
		}
	default:
		if v.required("gpu.driver.version", g.Driver.Version, "version: 535.261.03") && !driverVersionRE.MatchString(g.Driver.Version) {
			v.fail("gpu.driver.version", "%q is not an NVIDIA driver version like 535.261.03", g.Driver.Version)
		}
		if v.required("gpu.driver.flavor", g.Driver.Flavor, "flavor: open") && g.Driver.Flavor != "open" && g.Driver.Flavor != "proprietary" {
			v.fail("gpu.driver.flavor", "unknown flavor %q%s; use open or proprietary", g.Driver.Flavor, strictyaml.Suggest(g.Driver.Flavor, []string{"open", "proprietary"}))
		}
	}
	e := &g.Expect
	if e.Count < 1 || e.Count > 64 {
		v.fail("gpu.expect.count", "must be between 1 and 64 GPUs per node, got %d", e.Count)
	}
	v.required("gpu.expect.product", e.Product, `product: "NVIDIA H100 80GB HBM3"`)
	if e.MemoryMiB <= 0 {
		v.fail("gpu.expect.memoryMiB", "must be the framebuffer size per GPU in MiB, as nvidia-smi prints it (for example 81559)")
	}
	if g.XID != nil {
		v.xidPolicy(g.XID)
	}
	if g.Sharing != nil {
		v.sharing(g)
	}
	if g.Compute != nil {
		v.compute(g.Compute)
	}
	if e.PCIe.Gen < 1 || e.PCIe.Gen > 6 {
		v.fail("gpu.expect.pcie.gen", "must be a PCIe generation from 1 to 6, got %d", e.PCIe.Gen)
	}
	switch e.PCIe.Width {
	case 1, 2, 4, 8, 16, 32:
	default:
		v.fail("gpu.expect.pcie.width", "must be a PCIe link width of 1, 2, 4, 8, 16 or 32 lanes, got %d", e.PCIe.Width)
	}
	if e.NVLinkLinks < 0 || e.NVLinkLinks > 18 {
		v.fail("gpu.expect.nvlinkLinks", "must be from 0 to 18 links per GPU, got %d", e.NVLinkLinks)
	}
}

// xidPolicy checks gpu.xid: every withdraw code known to the classification table,
// none twice, and at least one (to withdraw no GPU on XIDs, disable gpu.xid.fatal in
// checks instead).
func (v *validator) xidPolicy(x *XIDPolicy) {
	if len(x.Withdraw) == 0 {
		v.fail("gpu.xid.withdraw", "lists no XID; list the XIDs that withdraw a GPU (for example [48, 79, 95]), or leave gpu.xid out for the default %v; to withdraw no GPU on any XID, disable gpu.xid.fatal under checks", xidclass.DefaultWithdraw())
		return
	}
	seen := map[uint32]bool{}
	for i, code := range x.Withdraw {
		f := fmt.Sprintf("gpu.xid.withdraw[%d]", i)
		switch {
		case !xidclass.Known(code):
			v.fail(f, "XID %d is not in gpurack's XID table; use one of %s (docs/agent.md lists what each means)", code, knownXIDs())
		case seen[code]:
			v.fail(f, "XID %d is listed twice", code)
		}
		seen[code] = true
	}
}

// sharing checks gpu.sharing: a way to share that is set, a replica count from 2 to
// MaxTimeSlicingReplicas, and GPUs to share.
func (v *validator) sharing(g *GPU) {
	if g.Expect.Count < 1 {
		v.fail("gpu.sharing", "shares GPUs, but the profile expects none; set gpu.expect (count, product, memoryMiB, pcie) for the node's GPUs, or remove gpu.sharing")
	}
	ts := g.Sharing.TimeSlicing
	if ts == nil {
		v.fail("gpu.sharing", "names no way to share GPUs; set timeSlicing: {replicas: N} (N from 2 to %d), or leave gpu.sharing out so that every container gets whole GPUs", MaxTimeSlicingReplicas)
		return
	}
	if ts.Replicas < 2 || ts.Replicas > MaxTimeSlicingReplicas {
		v.fail("gpu.sharing.timeSlicing.replicas", "must be from 2 to %d devices per GPU, got %d; for one device per GPU (no sharing) leave gpu.sharing out", MaxTimeSlicingReplicas, ts.Replicas)
	}
}

// compute checks gpu.compute: a ratio in (0, 1] and figures that are finite, not
// negative and below ComputeMaxFigure (NaN fails every comparison, so each test is
// written to reject it).
func (v *validator) compute(c *Compute) {
	if !(c.MinRatio >= 0 && c.MinRatio <= 1) {
		v.fail("gpu.compute.minRatio", "must be a share from 0 to 1 (for example 0.7: warn below 70%% of an expected figure), got %v", c.MinRatio)
	}
	for _, f := range []struct {
		name string
		v    float64
	}{
		{"tflopsFP32", c.Expect.TFLOPSFP32}, {"deviceGBps", c.Expect.DeviceGBps},
		{"h2dGBps", c.Expect.H2DGBps}, {"d2hGBps", c.Expect.D2HGBps},
	} {
		if !(f.v >= 0 && f.v <= ComputeMaxFigure) {
			v.fail("gpu.compute.expect."+f.name, "must be from 0 (not judged) to %d, got %v; give the figure a healthy GPU of this class reaches with gpurack's kernels (docs/compute-check.md)", ComputeMaxFigure, f.v)
		}
	}
}

func knownXIDs() string {
	var codes []string
	for _, c := range xidclass.Table() {
		codes = append(codes, fmt.Sprint(c.Code))
	}
	return strings.Join(codes, ", ")
}

func (v *validator) kubernetes(k *Kubernetes) {
	if v.required("kubernetes.version", k.Version, "version: v1.34.2") && !k8sVersionRE.MatchString(k.Version) {
		v.fail("kubernetes.version", "%q is not a Kubernetes release like v1.34.2", k.Version)
	}
	if k.ContainerRuntime != "containerd" {
		v.fail("kubernetes.containerRuntime", "%q is not supported; use containerd", k.ContainerRuntime)
	}
	if pn := k.PodNetwork; pn != nil {
		if !ValidPodNetworkBackend(pn.Backend) {
			v.fail("kubernetes.podNetwork.backend", "%q is not a pod network backend; use vxlan or host-gw", pn.Backend)
		}
		if pn.PodSubnet != "" && !ValidPodSubnet(pn.PodSubnet) {
			v.fail("kubernetes.podNetwork.podSubnet", "%q is not a network in CIDR form like 10.244.0.0/16 (the cluster's networking.podSubnet)", pn.PodSubnet)
		}
	}
}

func (v *validator) packages(pkgs []string) {
	seen := map[string]bool{}
	for i, p := range pkgs {
		f := fmt.Sprintf("packages[%d]", i)
		switch {
		case strings.Contains(p, "="):
			v.fail(f, "%q carries a version; list the name only, the lock file pins versions", p)
		case !debNameRE.MatchString(p):
			v.fail(f, "%q is not a Debian package name", p)
		case seen[p]:
			v.fail(f, "%q is listed twice", p)
		}
		seen[p] = true
	}
}

func (v *validator) extraDebs(debs []ExtraDeb) {
	for i, d := range debs {
		f := fmt.Sprintf("extraDebs[%d]", i)
		if v.required(f+".file", d.File, "file: debs/nvidia-fabricmanager-535_535.261.03-1_amd64.deb") && !strings.HasSuffix(d.File, ".deb") {
			v.fail(f+".file", "%q is not a .deb file", d.File)
		}
		if !sha256RE.MatchString(d.SHA256) {
			v.fail(f+".sha256", "must be the file's sha256 as 64 lowercase hex digits (sha256sum prints it)")
		}
	}
}

func (v *validator) images(ims []ImageArchive) {
	seen := map[string]bool{}
	for i, im := range ims {
		f := fmt.Sprintf("images[%d]", i)
		if v.required(f+".path", im.Path, "path: images/probe.tar") {
			switch {
			case strings.ContainsFunc(im.Path, func(r rune) bool { return r < 0x20 || r == 0x7f }):
				v.fail(f+".path", "%q contains a control character", im.Path)
			case seen[filepath.Clean(im.Path)]:
				v.fail(f+".path", "%q is listed twice", im.Path)
			}
			seen[filepath.Clean(im.Path)] = true
		}
		if im.Name != "" && !imageRefRE.MatchString(im.Name) {
			v.fail(f+".name", "%q is not an image reference like registry.example/team/image:tag", im.Name)
		}
	}
}

func (v *validator) checks(c map[string]CheckOverride) {
	for _, id := range slices.Sorted(maps.Keys(c)) {
		f := "checks[" + id + "]"
		if !checkid.Known(id) {
			v.fail(f, "unknown check id %q; the ids are listed in docs/checks.md", id)
			continue
		}
		o := c[id]
		if o.Warn != nil && *o.Warn < 0 {
			v.fail(f+".warn", "must not be negative")
		}
		if o.Fail != nil && *o.Fail < 0 {
			v.fail(f+".fail", "must not be negative")
		}
	}
}

func (v *validator) node(n *Node) {
	for _, k := range slices.Sorted(maps.Keys(n.Labels)) {
		f := "node.labels[" + k + "]"
		if msg := labelKeyProblem(k); msg != "" {
			v.fail(f, "%s", msg)
		} else if strings.HasPrefix(k, "nvidia.com/") || strings.HasPrefix(k, nodecontract.LabelPrefix) {
			v.fail(f, "%q is reserved: GPU feature discovery owns nvidia.com/ and the agent owns %s", k, nodecontract.LabelPrefix)
		}
		if !labelValueRE.MatchString(n.Labels[k]) {
			v.fail(f, "value %q is not a valid label value (at most 63 of [A-Za-z0-9._-], alphanumeric at both ends)", n.Labels[k])
		}
	}
	for i, t := range n.Taints {
		f := fmt.Sprintf("node.taints[%d]", i)
		if msg := labelKeyProblem(t.Key); msg != "" {
			v.fail(f+".key", "%s", msg)
		}
		if !labelValueRE.MatchString(t.Value) {
			v.fail(f+".value", "%q is not a valid taint value", t.Value)
		}
		switch t.Effect {
		case "NoSchedule", "PreferNoSchedule", "NoExecute":
		default:
			v.fail(f+".effect", "unknown effect %q; use NoSchedule, PreferNoSchedule or NoExecute", t.Effect)
		}
	}
}

// labelKeyProblem checks a Kubernetes label or taint key ([prefix/]name).
func labelKeyProblem(k string) string {
	if k == "" {
		return "a key is required"
	}
	prefix, name, hasPrefix := strings.Cut(k, "/")
	if !hasPrefix {
		name = prefix
	} else if !dnsSubdomainRE.MatchString(prefix) {
		return fmt.Sprintf("key %q has an invalid prefix; it must be a DNS subdomain such as example.com", k)
	}
	if !labelNameRE.MatchString(name) {
		return fmt.Sprintf("key %q is not valid: the name part is at most 63 of [A-Za-z0-9._-], alphanumeric at both ends", k)
	}
	return ""
}

// reservedArgs are set by gpuimage and gpuboot (CONTRACTS §3) and may not be overridden.
var reservedArgs = []string{"gpurack.", "initrd=", "BOOTIF=", "root="}

func (v *validator) boot(b *Boot) {
	for i, a := range b.KernelArgs {
		f := fmt.Sprintf("boot.kernelArgs[%d]", i)
		if a == "" || strings.ContainsAny(a, " \t\n\"'") {
			v.fail(f, "%q must be one kernel argument without spaces or quotes", a)
			continue
		}
		for _, r := range reservedArgs {
			if strings.HasPrefix(a, r) {
				v.fail(f, "%q is set by gpuimage and gpuboot (%s...); remove it", a, r)
			}
		}
	}
}
