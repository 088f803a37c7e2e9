package runbooks

import (
	"crypto/rand"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gpurack/gpurack/internal/netnstest"
	"github.com/gpurack/gpurack/pxe/bmc/redfishtest"
)

// rack is a site's simulated servers in rack r1. Each is a real gpuagent process on
// the GPU simulator, as `make demo` runs them (it enrolls with gpuboot, joins the
// cluster by TLS bootstrap with its own Node and runs its commissioning checklist),
// on a loopback address of its own (127.0.0.SLOT: its API on :50051, /metrics on :9410,
// gossip on :7946), with a test BMC (pxe/bmc/redfishtest) in the world's network
// namespace whose power actions stop and start it: off kills the agent as a power cut
// does, on starts a new one with a new key (the servers are diskless), a cycle does
// both.
type rack struct {
	s        *site
	machines []*machine

	mu sync.Mutex
	// quarantineImage is an image on which the servers' checklist fails (an XID 79 on
	// GPU 3 from power-on): a bad image for a rollout's canary.
	quarantineImage string
}

// failOn makes the checklist of a server that boots image fail.
func (r *rack) failOn(image string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.quarantineImage = image
}

// fails reports whether a server that booted image fails its checklist.
func (r *rack) fails(image string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.quarantineImage != "" && image == r.quarantineImage
}

type machine struct {
	s           *site
	slot        int
	node        string // gpu-r1-SLOT
	serial, mac string
	addr, seed  string // its loopback address; the first machine's, which it gossips with first
	dir         string
	bmc         *redfishtest.Server

	mu      sync.Mutex
	on      bool
	agent   *exec.Cmd
	boots   int
	console string // the last boot script that did not boot, or the error
}

// newRack makes the machines of slots (not yet powered on), writes the rack's manifest
// /etc/gpuboot/rack-r1.csv with each BMC's address, and the BMC account
// /var/lib/gpuboot/bmc-credentials.yaml.
func (s *site) newRack(slots []int) *rack {
	r := &rack{s: s}
	manifest := "serial,mac,rack,slot,bmc\n"
	var ca []byte
	for _, slot := range slots {
		m := r.add("r1", slot, fmt.Sprintf("SN-R1-%02d", slot), fmt.Sprintf("02:00:00:00:01:%02x", slot))
		var l net.Listener
		if err := netnstest.InNamespace(s.w.ns, func() (err error) { l, err = net.Listen("tcp", "127.0.0.1:0"); return err }); err != nil {
			s.t.Fatal(err)
		}
		m.bmc = redfishtest.New(s.t, redfishtest.Config{Listener: l, PowerDelay: 200 * time.Millisecond, OnReset: m.reset})
		manifest += fmt.Sprintf("%s,%s,r1,%02d,%s\n", m.serial, m.mac, slot, m.bmc.URL)
		ca = append(ca, m.bmc.CAPEM()...)
	}
	s.writeFile("/etc/gpuboot/rack-r1.csv", manifest, 0o644)
	creds := "default:\n  username: admin\n  password: redfishtest\n  ca: |\n    " +
		strings.ReplaceAll(strings.TrimSpace(string(ca)), "\n", "\n    ") + "\n"
	s.writeFile("/var/lib/gpuboot/bmc-credentials.yaml", creds, 0o600)
	s.t.Cleanup(func() {
		for _, m := range r.machines {
			m.powerOff()
			if s.t.Failed() {
				s.t.Logf("%s: the end of its agent's log (boot %d):\n%s\nits console's last boot script that did not boot: %s", m.node, m.boots,
					tail(filepath.Join(m.dir, fmt.Sprintf("agent-boot%d.log", m.boots))), m.console)
			}
		}
	})
	return r
}

// add makes a server of rack rackName (r1, r2, …) at slot, not yet powered on and
// without a BMC; its node is gpu-RACK-SLOT, its address 127.0.RACKNUMBER.SLOT, and it
// gossips first with the rack's first server.
func (r *rack) add(rackName string, slot int, serial, mac string) *machine {
	n := strings.TrimPrefix(rackName, "r")
	m := &machine{s: r.s, slot: slot, node: fmt.Sprintf("gpu-%s-%02d", rackName, slot), serial: serial, mac: mac,
		addr: fmt.Sprintf("127.0.%s.%d", n, slot), seed: fmt.Sprintf("127.0.%s.%d", n, slot),
		dir: filepath.Join(r.s.root, "machines", fmt.Sprintf("%s-slot%02d", rackName, slot))}
	for _, o := range r.machines {
		if strings.HasPrefix(o.node, "gpu-"+rackName+"-") {
			m.seed = o.addr
			break
		}
	}
	m.writeFacts()
	r.machines = append(r.machines, m)
	return m
}

// writeFacts writes what the agent reads of the machine: its serial, UUID and boot MAC.
func (m *machine) writeFacts() {
	root := filepath.Join(m.dir, "root")
	for p, v := range map[string]string{
		"sys/class/dmi/id/product_serial": m.serial,
		"sys/class/dmi/id/product_uuid":   strings.ToUpper(m.uuid()),
		"proc/cmdline":                    "console=ttyS0 BOOTIF=01-" + strings.ReplaceAll(m.mac, ":", "-") + " quiet",
	} {
		os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755)
		if err := os.WriteFile(filepath.Join(root, p), []byte(v+"\n"), 0o644); err != nil {
			m.s.t.Fatal(err)
		}
	}
}

// reset is the BMC's power action.
func (m *machine) reset(kind string) {
	switch kind {
	case "ForceOff", "GracefulShutdown":
		m.powerOff()
	case "On", "ForceOn", "PushPowerButton":
		m.powerOn()
	case "PowerCycle", "ForceRestart", "GracefulRestart":
		m.powerOff()
		m.powerOn()
	}
}

// powerOn powers the machine on, unless it is: its firmware network-boots (boot) and
// its agent starts on the image it booted.
func (m *machine) powerOn() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.on {
		return
	}
	m.on = true
	m.boots++
	boot := m.boots
	go m.boot(boot)
}

// boot is boot number n, as the firmware and gpurack-init do it: ask gpuboot for the
// machine's /boot.ipxe (as iPXE does, with its MAC, UUID and serial), fetch the kernel,
// initrd and root filesystem it names (gpuboot serves only a verified image), and
// record the image in /etc/gpurack/image-id, which the agent reads; a hold script, or a
// file gpuboot refuses, is tried again after the script's wait (here 2 s), as long as
// the machine is on and this is still its boot. Then the agent starts, with a new key.
func (m *machine) boot(n int) {
	q := fmt.Sprintf("mac=%s&uuid=%s&serial=%s", m.mac, m.uuid(), m.serial)
	for {
		out, err := m.s.sh(`script=$(curl -sSf "http://`+gpubootName+`:8080/boot.ipxe?`+q+`") || exit 1
id=$(printf '%s\n' "$script" | sed -n 's,^kernel http://[^ ]*/images/\([0-9a-f]*\)/vmlinuz .*,\1,p')
[ -n "$id" ] || { printf '%s\n' "$script"; exit 1; }
for f in vmlinuz initrd.img rootfs.squashfs; do curl -sSf -o /dev/null "http://`+gpubootName+`:8080/images/$id/$f" || exit 1; done
mkdir -p `+filepath.Join(m.dir, "root", "etc", "gpurack")+` && echo "$id" >`+filepath.Join(m.dir, "root", "etc", "gpurack", "image-id"), time.Minute)
		m.mu.Lock()
		if !m.on || m.boots != n {
			m.mu.Unlock()
			return
		}
		if err == nil {
			m.startAgent(n)
			m.mu.Unlock()
			return
		}
		m.console = out
		m.mu.Unlock()
		time.Sleep(2 * time.Second)
	}
}

// uuid is the machine's SMBIOS UUID, as its facts give it.
func (m *machine) uuid() string { return fmt.Sprintf("4c4c4544-0000-1000-8000-%012x", m.slot) }

// startAgent starts boot n's gpuagent, with a new key and a new kernel boot id (m.mu
// held).
func (m *machine) startAgent(n int) {
	boot := filepath.Join(m.dir, fmt.Sprintf("boot%d", n))
	os.MkdirAll(boot, 0o700)
	bootID := filepath.Join(m.dir, "root", "proc", "sys", "kernel", "random", "boot_id")
	os.MkdirAll(filepath.Dir(bootID), 0o755)
	b := make([]byte, 16)
	rand.Read(b)
	if err := os.WriteFile(bootID, fmt.Appendf(nil, "%x-%x-%x-%x-%x\n", b[0:4], b[4:6], b[6:8], b[8:10], b[10:]), 0o644); err != nil {
		m.s.t.Errorf("%s: %v", m.node, err)
		return
	}
	log, err := os.Create(filepath.Join(m.dir, fmt.Sprintf("agent-boot%d.log", n)))
	if err != nil {
		m.s.t.Errorf("%s: %v", m.node, err)
		return
	}
	defer log.Close()
	cmd := m.s.command("gpuagent", "run", "--gpu-backend", "sim:dgxh100",
		"--profile", filepath.Join(m.s.w.root, "profiles", "debian12-nvidia535.yaml"), "--sim-seed", m.node,
		"--enroll", gpubootName+":8443", "--enroll-ca", m.s.values["PIN"], "--key-dir", filepath.Join(boot, "key"),
		"--facts-root", filepath.Join(m.dir, "root"), "--listen", m.addr+":50051", "--metrics-listen", m.addr+":9410",
		"--socket", filepath.Join(boot, "agent.sock"), "--kubelet-dir", filepath.Join(boot, "kubelet"),
		"--gossip-bind", m.addr+":7946", "--gossip-seed", m.seed+":7946", "--gossip-local", "--interval", "10s", "--clear-after", "10s")
	if image, _ := os.ReadFile(filepath.Join(m.dir, "root", "etc", "gpurack", "image-id")); m.s.rack.fails(strings.TrimSpace(string(image))) {
		cmd.Args = append(cmd.Args, "--fault", "xid:79@gpu3")
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		m.s.t.Errorf("%s: start gpuagent: %v", m.node, err)
		return
	}
	m.agent = cmd
}

// powerOff cuts the machine's power: its agent is killed, a boot under way ends.
func (m *machine) powerOff() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.on = false
	if m.agent == nil {
		return
	}
	syscall.Kill(-m.agent.Process.Pid, syscall.SIGKILL)
	m.agent.Wait()
	m.agent = nil
}

// powerOn powers every machine on and waits until gpuboot lists each ready.
func (r *rack) powerOn() {
	if len(r.machines) == 0 {
		return
	}
	start := time.Now()
	for _, m := range r.machines {
		m.powerOn()
	}
	for _, m := range r.machines {
		r.s.waitState(m.node, "ready", 3*time.Minute)
	}
	r.s.t.Logf("%d simulated machines ready in %.1f s", len(r.machines), time.Since(start).Seconds())
}

// waitState waits until `gpuboot machines list` shows node in state.
func (s *site) waitState(node, state string, d time.Duration) {
	s.t.Helper()
	deadline := time.Now().Add(d)
	var out string
	for time.Now().Before(deadline) {
		out, _ = s.sh("gpuboot machines list --server "+gpubootName+":8443 --credentials /var/lib/gpuboot/operators/admin", time.Minute)
		for line := range strings.SplitSeq(out, "\n") {
			// ID STATE RACK SLOT NODE …
			if f := strings.Fields(line); len(f) > 4 && f[1] == state && f[4] == node {
				return
			}
		}
		time.Sleep(time.Second)
	}
	s.t.Fatalf("%s is not %s after %s:\n%s\ngpuboot's log:\n%s", node, state, d, out, tail(filepath.Join(s.run, "gpuboot.log")))
}
