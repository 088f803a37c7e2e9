//go:build linux

package systemdhost

import (
	"bufio"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpurack/gpurack/internal/netnstest"
	"github.com/gpurack/gpurack/internal/testreq"
	"github.com/gpurack/gpurack/pxe/tftp"
	"github.com/gpurack/gpurack/test/rigimage"
)

// The boot network: the container (gpuboot's host) and a client, on a veth pair. The
// container's address is the one docs/pxe.md's install commands advertise.
const (
	gpubootAddr = "192.0.2.1"
	clientAddr  = "192.0.2.2"
	clientMAC   = "52:54:00:5d:00:01"
	gpubootUnit = "gpuboot.service"
	tftpFile    = "undionly.kpxe" // what gpuboot's TFTP serves the client (BIOS PXE's boot file)
)

// capNetBindService is CAP_NET_BIND_SERVICE (10) as /proc/PID/status shows a set of
// capabilities: the unit's only one.
const capNetBindService = "0000000000000400"

// TestGpubootService installs gpuboot.service as docs/pxe.md says, in the node image
// booted with systemd as PID 1, and checks what the unit promises: it runs as the
// user gpuboot with CAP_NET_BIND_SERVICE alone, no new privileges, a system call
// filter, a read-only system but for its state directory; it serves DHCP, TFTP, HTTP
// and its API; it logs to the journal; a killed gpuboot is restarted after RestartSec;
// a stop is clean and stays stopped; a state directory left to root is taken back at
// the next start.
func TestGpubootService(t *testing.T) {
	requireHost(t)
	// undionly.kpxe: a regular file (ipxe.efi is a link out of the directory, to
	// /boot, which the container does not have).
	testreq.File(t, filepath.Join(tftp.DefaultDir, tftpFile), "apt-get install ipxe (hack/deps.sh lists it); gpuboot serves it over TFTP")
	testreq.Tool(t, "udhcpc", "apt-get install udhcpc (hack/deps.sh lists it); it is the PXE client")
	bins := rigimage.BuildBinaries(t)
	image, pubKey := nodeImage(t, bins)
	root := repoRoot(t)

	env := netnstest.New(t)
	ns, cli := env.Namespace(), env.Namespace()
	nic, peer := env.Veth(ns, cli)
	env.AddAddr(nic, gpubootAddr+"/24")
	env.AddAddr(peer, clientAddr+"/24")

	// What the documented commands install, by the relative paths they name (the
	// repository's root, with the gpuboot binary built from it).
	src := stageTree(t, map[string]string{"gpuboot": bins.Gpuboot, "pxe/systemd": filepath.Join(root, "pxe", "systemd")})
	store := filepath.Dir(image)
	if err := os.Chmod(store, 0o755); err != nil { // gpuboot reads it as its own user
		t.Fatal(err)
	}
	c := bootContainer(t, bootSpec{
		rootfs: filepath.Join(image, "rootfs.squashfs"), dir: t.TempDir(), ns: ns,
		binds: [][2]string{
			{src, "/root/gpurack"},
			{store, "/var/lib/gpurack/images"},
			{pubKey, "/etc/gpurack/image-signing.pub"},
			{tftp.DefaultDir, tftp.DefaultDir},
		},
	})
	// The configuration the documented commands expect at /etc/gpuboot/gpuboot.yaml
	// (its "write /etc/gpuboot/gpuboot.yaml" step): docs/examples/gpuboot.yaml's paths,
	// this network's interface and the image in the store.
	c.writeFile("/etc/gpuboot/gpuboot.yaml", []byte(`stateDir: /var/lib/gpuboot
advertise: `+gpubootAddr+`
listen: {http: ":8080", tls: ":8443"}
interfaces: [{name: `+nic.Name+`}]
dhcp: {mode: proxy}
tftp: {dir: `+tftp.DefaultDir+`}
images: {store: /var/lib/gpurack/images, trustedKeys: [/etc/gpurack/image-signing.pub]}
racks: [{name: r1, defaultImage: `+filepath.Base(image)+`}]
admin: {tokensFile: /var/lib/gpuboot/operator-tokens}
logLevel: info
`), 0o644)
	block := docBlock(t, filepath.Join(root, "docs", "pxe.md"), "## Running gpuboot under systemd")
	out := c.run("bash", "-c", "set -euxo pipefail\ncd /root/gpurack\n"+block)
	t.Logf("docs/pxe.md's install commands, run in the container:\n%s", out)

	pid := checkGpubootSandbox(t, c)
	checkGpubootServes(t, c, env, cli, peer, image)
	checkGpubootJournal(t, c)
	checkGpubootRestart(t, c, pid)
	checkGpubootStop(t, c)
	checkStateTakeover(t, c)
}

// checkGpubootSandbox checks the running gpuboot's credentials and mounts against the
// unit, and returns its PID.
func checkGpubootSandbox(t *testing.T, c *nodeContainer) string {
	t.Helper()
	p := c.waitUnit(gpubootUnit, "active (running)", startLimit, func(p map[string]string) bool {
		return p["ActiveState"] == "active" && p["SubState"] == "running"
	}, "ActiveState", "SubState", "MainPID", "NRestarts", "User")
	pid := p["MainPID"]
	if p["User"] != "gpuboot" || p["NRestarts"] != "0" {
		t.Errorf("%s: User=%s NRestarts=%s, want gpuboot and 0", gpubootUnit, p["User"], p["NRestarts"])
	}
	uid, gid := strings.TrimSpace(c.run("id", "-u", "gpuboot")), strings.TrimSpace(c.run("id", "-g", "gpuboot"))
	status := procStatus(t, c, pid)
	for field, want := range map[string]string{
		// real, effective, saved and file-system IDs
		"Uid": strings.Repeat(uid+"\t", 3) + uid, "Gid": strings.Repeat(gid+"\t", 3) + gid,
		"CapEff": capNetBindService, "CapPrm": capNetBindService, "CapAmb": capNetBindService, "CapBnd": capNetBindService,
		"NoNewPrivs": "1", "Seccomp": "2",
	} {
		if status[field] != want {
			t.Errorf("gpuboot (pid %s) %s: %q, want %q (/proc/PID/status)", pid, field, status[field], want)
		}
	}
	// ProtectSystem=strict and StateDirectory=: the root is read-only in gpuboot's
	// mount namespace, its state directory writable; PrivateTmp gives it its own /tmp.
	mounts := mountOptions(t, c.run("cat", "/proc/"+pid+"/mountinfo"))
	for _, m := range []struct{ point, want string }{{"/", "ro"}, {"/usr", "ro"}, {"/etc", "ro"}, {"/var/lib/gpuboot", "rw"}, {"/tmp", "rw"}} {
		if got := mounts.optionAt(m.point); got != m.want {
			t.Errorf("gpuboot's mount namespace: %s is %q, want %q", m.point, got, m.want)
		}
	}
	// DHCP's port 67 (and TFTP's 69, the API's 8443) are gpuboot's own sockets.
	for _, s := range []struct{ proto, port string }{{"-u", "67"}, {"-u", "69"}, {"-t", "8443"}} {
		out := c.run("ss", "-Hlpn", s.proto, "sport = :"+s.port)
		if !strings.Contains(out, `"gpuboot",pid=`+pid+",") {
			t.Errorf("port %s is not gpuboot's (pid %s):\n%s", s.port, pid, out)
		}
	}
	owners := c.run("stat", "-c", "%U:%G %a", "/var/lib/gpuboot")
	foreign := c.run("find", "/var/lib/gpuboot", "(", "!", "-user", "gpuboot", "-o", "!", "-group", "gpuboot", ")")
	if strings.TrimSpace(owners) != "gpuboot:gpuboot 700" || strings.TrimSpace(foreign) != "" {
		t.Errorf("/var/lib/gpuboot is %s, want gpuboot:gpuboot 700; not gpuboot's: %q", owners, foreign)
	}
	return pid
}

// checkGpubootServes asks gpuboot for what a booting machine asks, from the client's
// namespace: a TFTP file, the image's kernel (its verified copy lands in the state
// directory), a proxyDHCP offer, a boot script; then its API, as the operator, lists
// the machine.
func checkGpubootServes(t *testing.T, c *nodeContainer, env *netnstest.Env, cli string, peer netnstest.Link, image string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startLimit)
	defer cancel()
	if err := netnstest.WaitPortIn(ctx, cli, "tcp", gpubootAddr+":8080"); err != nil {
		t.Fatalf("gpuboot's HTTP from the client: %v", err)
	}
	for _, f := range []struct{ url, want string }{
		{"tftp://" + gpubootAddr + "/" + tftpFile, filepath.Join(tftp.DefaultDir, tftpFile)},
		{"http://" + gpubootAddr + ":8080/images/" + filepath.Base(image) + "/vmlinuz", filepath.Join(image, "vmlinuz")},
	} {
		out, err := env.Run(cli, "curl", "-sS", "--max-time", "30", "-o", "/dev/null", "-w", "%{size_download}", f.url)
		want, serr := os.Stat(f.want)
		if err != nil || serr != nil || strings.TrimSpace(out) != strconv.FormatInt(want.Size(), 10) {
			t.Errorf("curl %s: %v %v: %s bytes, want %s's", f.url, err, serr, out, f.want)
		}
	}
	// A BIOS PXE client's DISCOVER (busybox udhcpc, vendor class PXEClient, option 93
	// = 0): the proxy's OFFER names the boot file and gpuboot as its server.
	lease := pxeDiscover(t, env, cli, peer)
	if lease["boot_file"] != tftpFile || lease["serverid"] != gpubootAddr {
		t.Errorf("proxyDHCP to a BIOS PXE client: boot_file %q from %q, want %s from %s (%v)", lease["boot_file"], lease["serverid"], tftpFile, gpubootAddr, lease)
	}
	script, err := env.Run(cli, "curl", "-sS", "--max-time", "30", "http://"+gpubootAddr+":8080/boot.ipxe?mac="+clientMAC+"&serial=SYSTEMD-1")
	if err != nil || !strings.Contains(script, "#!ipxe") || !strings.Contains(script, filepath.Base(image)) {
		t.Errorf("boot.ipxe: %v, want a script booting %s:\n%s", err, filepath.Base(image), script)
	}
	list := c.run("runuser", "-u", "gpuboot", "--", "gpuboot", "machines", "list",
		"--server", gpubootAddr+":8443", "--credentials", "/var/lib/gpuboot/operators/admin")
	if !strings.Contains(list, clientMAC) {
		t.Errorf("gpuboot machines list does not show %s:\n%s", clientMAC, list)
	}
}

// pxeDiscover runs busybox udhcpc once on link in ns as a BIOS PXE client and returns
// the environment its script saw for the offer it took ("bound"), as a map.
func pxeDiscover(t *testing.T, env *netnstest.Env, ns string, link netnstest.Link) map[string]string {
	t.Helper()
	dir := t.TempDir()
	script, got := filepath.Join(dir, "script.sh"), filepath.Join(dir, "bound.env")
	if err := os.WriteFile(script, []byte("#!/bin/sh\n[ \"$1\" = bound ] && env > "+got+"\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := env.Run(ns, "timeout", "30", "udhcpc", "-i", link.Name, "-f", "-q", "-n", "-t", "4", "-T", "1", "-A", "1", "-s", script,
		"-V", "PXEClient:Arch:00000:UNDI:002001", "-x", "0x5d:0000")
	if err != nil {
		t.Fatalf("udhcpc as a PXE client: %v", err)
	}
	data, err := os.ReadFile(got)
	if err != nil {
		t.Fatalf("udhcpc took no offer from gpuboot: %v\n%s", err, out)
	}
	vars := map[string]string{}
	for _, line := range strings.Split(string(data), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			vars[k] = v
		}
	}
	return vars
}

// checkGpubootJournal checks that gpuboot's log reached the journal, from the process
// running as gpuboot, and that the system call filter refused nothing it did.
func checkGpubootJournal(t *testing.T, c *nodeContainer) {
	t.Helper()
	uid := strings.TrimSpace(c.run("id", "-u", "gpuboot"))
	log := c.run("journalctl", "--no-pager", "-o", "cat", "_SYSTEMD_UNIT="+gpubootUnit, "_UID="+uid)
	for _, want := range []string{`msg="gpuboot serving"`, `msg="machine discovered"`, `msg="tftp: sent"`} {
		if !strings.Contains(log, want) {
			t.Errorf("journalctl -u gpuboot has no %s line from uid %s:\n%s", want, uid, log)
		}
	}
	if m := regexp.MustCompile(`(?i).*(operation not permitted|bad system call).*`).FindString(log); m != "" {
		t.Errorf("gpuboot hit the unit's sandbox: %s", m)
	}
}

// checkGpubootRestart kills gpuboot (SIGKILL, a crash) and waits for systemd to start
// it again after RestartSec, serving.
func checkGpubootRestart(t *testing.T, c *nodeContainer, pid string) {
	t.Helper()
	restartDelay, err := time.ParseDuration(c.unitProps(gpubootUnit, "RestartUSec")["RestartUSec"])
	if err != nil {
		t.Fatalf("%s RestartUSec: %v", gpubootUnit, err)
	}
	killed := time.Now()
	c.run("bash", "-c", "kill -KILL "+pid) // the image has no kill(1); bash's own
	p := c.waitUnit(gpubootUnit, "restarted", restartDelay+20*time.Second, func(p map[string]string) bool {
		return p["NRestarts"] == "1" && p["ActiveState"] == "active" && p["MainPID"] != pid && p["MainPID"] != "0"
	}, "NRestarts", "ActiveState", "MainPID")
	took := time.Since(killed)
	t.Logf("gpuboot killed (pid %s): restarted as pid %s after %s (RestartSec %s)", pid, p["MainPID"], took.Round(time.Millisecond), restartDelay)
	if took < restartDelay {
		t.Errorf("gpuboot restarted %s after the kill, before RestartSec %s", took, restartDelay)
	}
	ctx, cancel := context.WithTimeout(context.Background(), startLimit)
	defer cancel()
	if err := netnstest.WaitPortIn(ctx, c.spec.ns, "tcp", gpubootAddr+":8443"); err != nil {
		t.Errorf("the restarted gpuboot does not serve its API: %v", err)
	}
	if log := c.run("journalctl", "--no-pager", "-u", gpubootUnit); !strings.Contains(log, "status=9/KILL") {
		t.Errorf("journalctl -u gpuboot does not show the kill:\n%s", lastLines(log, 20))
	}
}

// checkGpubootStop stops gpuboot: SIGTERM, which it answers by exiting 0, so the unit
// is inactive with result success, and is not restarted.
func checkGpubootStop(t *testing.T, c *nodeContainer) {
	t.Helper()
	c.run("systemctl", "stop", gpubootUnit)
	names := []string{"ActiveState", "Result", "ExecMainCode", "ExecMainStatus", "NRestarts", "RestartUSec"}
	p := c.unitProps(gpubootUnit, names...)
	// ExecMainCode 1 is CLD_EXITED: gpuboot exited rather than being killed.
	if p["ActiveState"] != "inactive" || p["Result"] != "success" || p["ExecMainCode"] != "1" || p["ExecMainStatus"] != "0" {
		t.Errorf("after systemctl stop: %v, want inactive, success, exited with 0", p)
	}
	restartDelay, _ := time.ParseDuration(p["RestartUSec"])
	time.Sleep(restartDelay + 2*time.Second)
	if q := c.unitProps(gpubootUnit, names...); q["ActiveState"] != "inactive" || q["NRestarts"] != p["NRestarts"] {
		t.Errorf("gpuboot came back after a clean stop: %v", q)
	}
}

// checkStateTakeover gives the stopped gpuboot's state directory to root, as a
// `gpuboot init` run as root would leave it, and starts the unit: systemd chowns the
// directory and everything in it back to gpuboot (StateDirectory=, whose owner
// differs), and gpuboot starts on it.
func checkStateTakeover(t *testing.T, c *nodeContainer) {
	t.Helper()
	c.run("chown", "-R", "root:root", "/var/lib/gpuboot")
	c.run("systemctl", "start", gpubootUnit)
	c.waitUnit(gpubootUnit, "active (running)", startLimit, func(p map[string]string) bool {
		return p["ActiveState"] == "active" && p["SubState"] == "running"
	}, "ActiveState", "SubState")
	foreign := c.run("find", "/var/lib/gpuboot", "(", "!", "-user", "gpuboot", "-o", "!", "-group", "gpuboot", ")")
	if strings.TrimSpace(foreign) != "" {
		t.Errorf("a state directory owned by root: systemd left these to root at the start:\n%s", foreign)
	}
	ctx, cancel := context.WithTimeout(context.Background(), startLimit)
	defer cancel()
	if err := netnstest.WaitPortIn(ctx, c.spec.ns, "tcp", gpubootAddr+":8443"); err != nil {
		t.Errorf("gpuboot on the state directory systemd took over does not serve its API: %v", err)
	}
}

// procStatus reads /proc/PID/status in the container into its fields.
func procStatus(t *testing.T, c *nodeContainer, pid string) map[string]string {
	t.Helper()
	fields := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(c.run("cat", "/proc/"+pid+"/status")))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok {
			fields[k] = strings.TrimSpace(v)
		}
	}
	return fields
}

// mountTable is a process's mounts (/proc/PID/mountinfo): mount point → whether the
// last mount there is "ro" or "rw".
type mountTable map[string]string

func mountOptions(t *testing.T, mountinfo string) mountTable {
	t.Helper()
	m := mountTable{}
	for _, line := range strings.Split(mountinfo, "\n") {
		// ID parent major:minor root mountpoint options …
		f := strings.Fields(line)
		if len(f) < 6 {
			continue
		}
		m[f[4]] = strings.Split(f[5], ",")[0]
	}
	return m
}

// optionAt is "ro" or "rw" for the mount that holds point.
func (m mountTable) optionAt(point string) string {
	for p := point; ; p = filepath.Dir(p) {
		if o, ok := m[p]; ok {
			return o
		}
		if p == "/" {
			return ""
		}
	}
}

// docBlock returns the first ```sh block after heading in the markdown file doc: the
// commands a procedure gives, run by a test as written.
func docBlock(t *testing.T, doc, heading string) string {
	t.Helper()
	data, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(data), "\n"+heading+"\n")
	if !ok {
		t.Fatalf("%s has no heading %q", doc, heading)
	}
	_, block, ok := strings.Cut(after, "\n```sh\n")
	if !ok {
		t.Fatalf("%s: no ```sh block after %q", doc, heading)
	}
	block, _, ok = strings.Cut(block, "\n```")
	if !ok {
		t.Fatalf("%s: the ```sh block after %q does not end", doc, heading)
	}
	return block + "\n"
}
