package runbooks

import (
	"cmp"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/gpurack/gpurack/internal/manifest"
	"github.com/gpurack/gpurack/pxe/httpboot/imagetest"
)

// gpubootSite is what a site's gpuboot starts with, as the document's examples have it
// (docs/examples/gpuboot.yaml's paths): its state in /var/lib/gpuboot from `gpuboot
// init`, the image store /var/lib/gpurack/images trusting
// /etc/gpurack/image-signing.pub, whose private key the build host keeps in
// /etc/gpurack/keys/signing.pem, rack r1 from /etc/gpuboot/rack-r1.csv (approval
// allowlist, reenroll manual), the BMC accounts, and with a control plane the enroller
// kubeconfig. gpuboot serves on :8080 and :8443, advertised as 192.0.2.1 and
// gpuboot.example.
type gpubootSite struct {
	// cluster: gpuboot gets cluster.kubeconfig (the world's control plane).
	cluster bool
	// machines: the rack's simulated servers (slots), each with a test BMC; they are
	// powered on and ready before the runbook starts.
	machines []int
	// reenroll is enrollment.reenroll (default manual).
	reenroll string
}

// setUpGpuboot makes the site's gpuboot as g says, starts it with the systemctl
// stand-in, issues the metrics server's metrics-reader credential into
// /etc/gpurack/prometheus/gpuboot (docs/monitoring.md, "Scrape credentials"), and sets the placeholders IMAGE-ID (the rack's image) and OLD-ID (an image
// in the store that nothing uses).
func (s *site) setUpGpuboot(g gpubootSite) *rack {
	// docs/pxe.md, "Running gpuboot under systemd": the user, the directories, init as
	// gpuboot.
	out := s.must(`systemd-sysusers ` + filepath.Join(s.w.root, "pxe", "systemd", "sysusers.d", "gpuboot.conf") + `
install -d -o gpuboot -g gpuboot -m 0700 /var/lib/gpuboot
install -d -o root -g gpuboot -m 0750 /etc/gpuboot
runuser -u gpuboot -- gpuboot init --state-dir /var/lib/gpuboot --advertise ` + gpubootAddr + `,` + gpubootName + ` --rack r1
install -d -m 0700 /etc/gpurack/keys
gpuimage keygen /etc/gpurack/keys/signing.pem /etc/gpurack/keys/signing.pub.pem
install -m 0644 /etc/gpurack/keys/signing.pub.pem /etc/gpurack/image-signing.pub
runuser -u gpuboot -- gpuboot certs operator prometheus --state-dir /var/lib/gpuboot --level metrics-reader
install -d -m 0700 /etc/gpurack/prometheus/gpuboot
install -m 0600 /var/lib/gpuboot/operators/prometheus/ca.crt /var/lib/gpuboot/operators/prometheus/operator.crt /var/lib/gpuboot/operators/prometheus/operator.key /etc/gpurack/prometheus/gpuboot/
rm /var/lib/gpuboot/operators/prometheus/operator.key`)
	for line := range strings.SplitSeq(out, "\n") {
		if p, ok := strings.CutPrefix(line, "CA pin (gpurack.enroll.ca): "); ok {
			s.values["PIN"] = p
		}
	}
	if s.values["PIN"] == "" {
		s.t.Fatalf("gpuboot init printed no CA pin:\n%s", out)
	}
	s.values["IMAGE-ID"] = s.standInImage("/var/lib/gpurack/images", "/etc/gpurack/keys/signing.pem", "in-use")
	s.values["OLD-ID"] = s.standInImage("/var/lib/gpurack/images", "/etc/gpurack/keys/signing.pem", "old")
	r := s.newRack(g.machines)
	s.rack = r
	cluster := ""
	if g.cluster {
		s.must(`controlplane-bootstrap join-config --dir /var/lib/gpurack/cluster --out /etc/gpuboot
chgrp gpuboot /etc/gpuboot/enroller.kubeconfig && chmod 0640 /etc/gpuboot/enroller.kubeconfig`)
		cluster = "cluster: {kubeconfig: /etc/gpuboot/enroller.kubeconfig}\n"
	}
	s.writeFile("/etc/gpuboot/gpuboot.yaml", fmt.Sprintf(`stateDir: /var/lib/gpuboot
advertise: %[1]s
listen: {http: ":8080", tls: ":8443"}
dhcp: {enabled: false}
tftp: {enabled: false}
images:
  store: /var/lib/gpurack/images
  trustedKeys: [/etc/gpurack/image-signing.pub]
enrollment:
  reenroll: %[4]s
  # The rack's machines are gpuagent's GPU simulator (test/runbooks/rack_test.go).
  allowSimulated: true
policy: {approval: allowlist, allowlist: [rack-r1.csv]}
racks:
  - name: r1
    defaultImage: %[2]s
%[3]slogLevel: info
`, gpubootAddr, s.values["IMAGE-ID"], cluster, cmp.Or(g.reenroll, "manual")), 0o640)
	s.must(`chgrp gpuboot /etc/gpuboot/gpuboot.yaml /etc/gpuboot/rack-r1.csv
chown gpuboot:gpuboot /var/lib/gpuboot/bmc-credentials.yaml
runuser -u gpuboot -- gpuboot config check --config /etc/gpuboot/gpuboot.yaml
systemctl start gpuboot`)
	s.t.Cleanup(s.stopGpuboot)
	r.powerOn()
	return r
}

// standInImage writes a signed image into the site's store dir, signed with the site's
// private key file key, and returns its id. It stands in for `gpuimage build` (minutes,
// root and a Debian mirror): manifest.json, manifest.sig and the artifacts laid out as a
// build lays them out (pxe/httpboot/imagetest), its root filesystem a real squashfs
// with a dpkg database, so gpuimage verify and inspect read it as they read a built
// image. variant makes a different image.
func (s *site) standInImage(store, key, variant string) string {
	s.t.Helper()
	priv, err := manifest.LoadPrivateKey(s.hostPath(key))
	if err != nil {
		s.t.Fatal(err)
	}
	id, err := imagetest.Write(s.hostPath(store), priv, map[string][]byte{
		manifest.ArtifactRootfs:  s.w.rootfs(s.t),
		manifest.ArtifactCmdline: fmt.Appendf(nil, "console=ttyS0,115200 gpurack.test-variant=%s\n", variant),
	})
	if err != nil {
		s.t.Fatal(err)
	}
	return id
}

var rootfsOnce struct {
	sync.Once
	data []byte
	err  error
}

// rootfs is a small squashfs with a dpkg database of two packages, made once.
func (w *world) rootfs(t testing.TB) []byte {
	rootfsOnce.Do(func() {
		dir, err := os.MkdirTemp("", "runbooks-rootfs-")
		if err != nil {
			rootfsOnce.err = err
			return
		}
		defer os.RemoveAll(dir)
		status := "Package: base-files\nStatus: install ok installed\nVersion: 13.8\nInstalled-Size: 340\n\n" +
			"Package: gpurack-agent\nStatus: install ok installed\nVersion: 0.0.0\nInstalled-Size: 30000\n\n"
		os.MkdirAll(filepath.Join(dir, "tree", "var", "lib", "dpkg"), 0o755)
		os.WriteFile(filepath.Join(dir, "tree", "var", "lib", "dpkg", "status"), []byte(status), 0o644)
		sq := filepath.Join(dir, "rootfs.squashfs")
		if out, err := exec.Command("mksquashfs", filepath.Join(dir, "tree"), sq, "-noappend", "-quiet", "-all-root", "-mkfs-time", "0").CombinedOutput(); err != nil {
			rootfsOnce.err = fmt.Errorf("mksquashfs: %v\n%s", err, out)
			return
		}
		rootfsOnce.data, rootfsOnce.err = os.ReadFile(sq)
	})
	if rootfsOnce.err != nil {
		t.Fatal(rootfsOnce.err)
	}
	return rootfsOnce.data
}

// mergeYAML merges fragment into the site's YAML file p, as an operator's editor would:
// each top-level key of fragment replaces the file's. The file keeps its mode and owner.
func (s *site) mergeYAML(p, fragment string) {
	s.t.Helper()
	hp := s.hostPath(p)
	data, err := os.ReadFile(hp)
	if err != nil {
		s.t.Fatal(err)
	}
	var doc, frag map[string]any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		s.t.Fatalf("%s: %v", p, err)
	}
	if err := yaml.Unmarshal([]byte(fragment), &frag); err != nil {
		s.t.Fatalf("the document's fragment for %s does not parse: %v\n%s", p, err, fragment)
	}
	maps.Copy(doc, frag)
	out, err := yaml.Marshal(doc)
	if err != nil {
		s.t.Fatal(err)
	}
	if err := os.WriteFile(hp, out, 0); err != nil {
		s.t.Fatal(err)
	}
	s.t.Logf("%s after the merge:\n%s", p, out)
}

// stopGpuboot stops the site's gpuboot with the systemctl stand-in and, should that
// fail, kills the process its pid file names, so that no gpuboot outlives its test.
func (s *site) stopGpuboot() {
	if out, err := s.sh("systemctl stop gpuboot", time.Minute); err != nil {
		s.t.Errorf("systemctl stop gpuboot: %v\n%s", err, out)
	}
	if b, err := os.ReadFile(filepath.Join(s.run, "gpuboot.pid")); err == nil {
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && syscall.Kill(pid, 0) == nil {
			s.t.Errorf("gpuboot (pid %d) still runs after systemctl stop; killing it", pid)
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	if s.t.Failed() {
		s.t.Logf("the end of gpuboot's log:\n%s", tail(filepath.Join(s.run, "gpuboot.log")))
	}
}
