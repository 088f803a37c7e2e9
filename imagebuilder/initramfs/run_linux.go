package initramfs

import (
	"github.com/gpurack/gpurack/internal/manifest"

	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4/nclient4"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// ModuleList is the file in the initramfs that lists, one per line and in load order,
// the kernel modules gpurack-init loads (paths relative to /).
const ModuleList = "/etc/gpurack-init/modules"

// Failure is an error an operator can act on: what went wrong and what to do.
type Failure struct {
	What, Fix string
}

func (f *Failure) Error() string { return f.What + "; " + f.Fix }

func fail(fix, format string, args ...any) *Failure {
	return &Failure{What: fmt.Sprintf(format, args...), Fix: fix}
}

// Console writes gpurack-init's messages to the console.
type Console struct{ w io.Writer }

func (c *Console) Printf(format string, args ...any) {
	fmt.Fprintf(c.w, "gpurack-init: "+format+"\n", args...)
}

// Main is gpurack-init: it never returns.
func Main() {
	con := &Console{w: os.Stdout}
	if err := earlyMounts(); err != nil {
		con.Printf("FATAL: %v", err)
	}
	if f, err := os.OpenFile("/dev/console", os.O_WRONLY, 0); err == nil {
		con.w = f
	}
	raw, _ := os.ReadFile("/proc/cmdline")
	cfg, err := ParseCmdline(string(raw))
	if err == nil {
		err = run(con, cfg)
	}
	// run only returns on failure.
	var f *Failure
	if errors.As(err, &f) {
		con.Printf("FATAL: %s", f.What)
		con.Printf("what to do: %s", f.Fix)
	} else {
		con.Printf("FATAL: %v", err)
	}
	onFail := FailReboot
	if cfg != nil {
		onFail = cfg.OnFail
	}
	switch onFail {
	case FailPoweroff:
		con.Printf("powering off (gpurack.onfail=poweroff)")
		unix.Sync()
		unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	case FailHalt:
		con.Printf("halted (gpurack.onfail=halt); the message above says why")
	default:
		con.Printf("rebooting in 60 s to network-boot again (set gpurack.onfail=halt to stay here)")
		time.Sleep(60 * time.Second)
		unix.Sync()
		unix.Reboot(unix.LINUX_REBOOT_CMD_RESTART)
	}
	for {
		time.Sleep(time.Hour)
	}
}

func earlyMounts() error {
	for _, m := range []struct{ src, dst, fstype, data string }{
		{"devtmpfs", "/dev", "devtmpfs", "mode=0755"},
		{"proc", "/proc", "proc", ""},
		{"sysfs", "/sys", "sysfs", ""},
		{"tmpfs", "/run", "tmpfs", "mode=0755"},
	} {
		os.MkdirAll(m.dst, 0o755)
		if err := unix.Mount(m.src, m.dst, m.fstype, unix.MS_NOSUID, m.data); err != nil && !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("mount %s on %s: %v", m.fstype, m.dst, err)
		}
	}
	return nil
}

func run(con *Console, cfg *Config) error {
	loadModules(con)
	rootfs := PackedRootfs
	if cfg.RootfsURL != "" {
		if err := os.MkdirAll("/run/gpurack", 0o755); err != nil {
			return err
		}
		nic, err := bringUpNetwork(con, cfg.BootMAC)
		if err != nil {
			return err
		}
		rootfs = "/run/gpurack/rootfs.squashfs"
		if err := download(con, cfg, rootfs); err != nil {
			return err
		}
		releaseNetwork(con, nic)
	} else {
		if _, err := os.Stat(PackedRootfs); err != nil {
			return fail("boot through gpuboot's iPXE script, which appends gpurack.rootfs=, or pack rootfs.squashfs into the initramfs",
				"no rootfs: gpurack.rootfs= is not on the kernel command line and none is packed in the initramfs at %s", PackedRootfs)
		}
		con.Printf("using the rootfs packed in the initramfs")
		sum, err := fileSHA256(PackedRootfs)
		if err != nil {
			return err
		}
		if sum != cfg.RootfsSHA256 {
			return digestMismatch(cfg.RootfsSHA256, sum, PackedRootfs)
		}
	}
	con.Printf("rootfs sha256 %s verified", cfg.RootfsSHA256)
	if err := mountRoot(con, rootfs); err != nil {
		return err
	}
	return switchRoot(con, cfg.Init)
}

func digestMismatch(want, got, from string) error {
	return fail("the image store holds a corrupted or tampered rootfs.squashfs, or the command line names another image: run `gpuimage verify` on the image directory and rebuild or re-copy the image",
		"rootfs digest mismatch: refusing to boot: gpurack.rootfs.sha256=%s but %s has sha256 %s", want, from, got)
}

// loadModules loads the listed modules in order. A module that fails to load is
// reported and skipped: NIC drivers for absent hardware are harmless, and a missing
// filesystem module shows up, with its name, when the mount fails.
func loadModules(con *Console) {
	f, err := os.Open(ModuleList)
	if err != nil {
		con.Printf("no module list %s (%v); relying on built-in drivers", ModuleList, err)
		return
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		path := strings.TrimSpace(sc.Text())
		if path == "" {
			continue
		}
		m, err := os.Open(path)
		if err != nil {
			con.Printf("module %s: %v", path, err)
			continue
		}
		err = unix.FinitModule(int(m.Fd()), "", 0)
		m.Close()
		if err != nil && !errors.Is(err, unix.EEXIST) {
			con.Printf("module %s: %v (skipped)", filepath.Base(path), err)
			continue
		}
		n++
	}
	con.Printf("loaded %d kernel modules", n)
}

// bringUpNetwork finds the boot NIC (by BOOTIF's MAC, or else the first Ethernet
// interface that gets a lease), configures it from DHCP and returns it. Candidates
// that get no lease are set down again.
func bringUpNetwork(con *Console, mac net.HardwareAddr) (netlink.Link, error) {
	lo, err := netlink.LinkByName("lo")
	if err == nil {
		netlink.LinkSetUp(lo)
	}
	var candidates []netlink.Link
	deadline := time.Now().Add(20 * time.Second)
	for {
		candidates = candidates[:0]
		links, _ := netlink.LinkList()
		for _, l := range links {
			a := l.Attrs()
			if a.Name == "lo" || len(a.HardwareAddr) != 6 || l.Type() != "device" {
				continue
			}
			if mac == nil || a.HardwareAddr.String() == mac.String() {
				candidates = append(candidates, l)
			}
		}
		if len(candidates) > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	if len(candidates) == 0 {
		if mac != nil {
			return nil, fail("check that the NIC's driver is in the initramfs (gpuimage adds common server NICs; see imagebuilder docs) and that BOOTIF names this machine's boot NIC",
				"no network interface has BOOTIF's MAC %s", mac)
		}
		return nil, fail("check that the NIC's driver is in the initramfs (gpuimage adds virtio and common server NICs)", "no Ethernet interface appeared within 20 s")
	}
	var errs []string
	for _, l := range candidates {
		name := l.Attrs().Name
		if err := netlink.LinkSetUp(l); err != nil {
			errs = append(errs, fmt.Sprintf("%s: link up: %v", name, err))
			continue
		}
		con.Printf("DHCP on %s (%s)", name, l.Attrs().HardwareAddr)
		if err := dhcp(con, l); err != nil {
			errs = append(errs, fmt.Sprintf("%s: %v", name, err))
			netlink.LinkSetDown(l)
			continue
		}
		return l, nil
	}
	return nil, fail("check the cable or switch port and that a DHCP server (site DHCP, or gpuboot in full mode) answers on the provisioning network",
		"no DHCP lease: %s", strings.Join(errs, "; "))
}

// releaseNetwork hands the boot NIC back once the rootfs is downloaded (the root is
// in memory): its addresses are removed and it is set down, so that udev in the rootfs
// can give it its predictable name (a rename fails on an interface that is up, and
// systemd-networkd then never manages it: no DHCP renewals, and network-online.target
// waits out systemd-networkd-wait-online's 2-minute timeout, delaying gpuagent) and
// systemd-networkd configures it from DHCP.
func releaseNetwork(con *Console, l netlink.Link) {
	addrs, _ := netlink.AddrList(l, netlink.FAMILY_V4)
	for _, a := range addrs {
		netlink.AddrDel(l, &a)
	}
	if err := netlink.LinkSetDown(l); err != nil {
		con.Printf("%s: link down: %v (systemd-networkd may not manage it)", l.Attrs().Name, err)
	}
}

func dhcp(con *Console, l netlink.Link) error {
	var lastErr error
	for attempt := 1; attempt <= 5; attempt++ {
		c, err := nclient4.New(l.Attrs().Name, nclient4.WithTimeout(4*time.Second), nclient4.WithRetry(2))
		if err != nil {
			lastErr = err
			time.Sleep(time.Second)
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		lease, err := c.Request(ctx)
		cancel()
		c.Close()
		if err != nil {
			lastErr = err
			con.Printf("DHCP attempt %d on %s: %v", attempt, l.Attrs().Name, err)
			continue
		}
		ack := lease.ACK
		mask := ack.SubnetMask()
		if mask == nil {
			mask = ack.YourIPAddr.DefaultMask()
		}
		addr := &netlink.Addr{IPNet: &net.IPNet{IP: ack.YourIPAddr, Mask: mask}}
		if err := netlink.AddrReplace(l, addr); err != nil {
			return fmt.Errorf("set address %s: %v", addr, err)
		}
		if gws := ack.Router(); len(gws) > 0 {
			if err := netlink.RouteReplace(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: gws[0]}); err != nil {
				return fmt.Errorf("default route via %s: %v", gws[0], err)
			}
		}
		var rc strings.Builder
		for _, d := range ack.DNS() {
			fmt.Fprintf(&rc, "nameserver %s\n", d)
		}
		os.MkdirAll("/etc", 0o755)
		os.WriteFile("/etc/resolv.conf", []byte(rc.String()), 0o644)
		con.Printf("DHCP lease %s from %s", addr.IPNet, ack.ServerIdentifier())
		return nil
	}
	return lastErr
}

// download fetches the rootfs with retries, hashing as it goes.
func download(con *Console, cfg *Config, dst string) error {
	client := &http.Client{Timeout: 30 * time.Minute}
	var lastErr error
	backoff := 2 * time.Second
	for attempt := 1; attempt <= cfg.Retries; attempt++ {
		sum, n, err := downloadOnce(con, client, cfg.RootfsURL, dst)
		switch {
		case err != nil:
			lastErr = err
		case sum != cfg.RootfsSHA256:
			lastErr = digestMismatch(cfg.RootfsSHA256, sum, fmt.Sprintf("%s (%d bytes)", cfg.RootfsURL, n))
		default:
			return nil
		}
		con.Printf("download attempt %d of %d: %v", attempt, cfg.Retries, lastErr)
		if attempt < cfg.Retries {
			time.Sleep(backoff)
			backoff = min(backoff*2, 30*time.Second)
		}
	}
	var f *Failure
	if errors.As(lastErr, &f) {
		return lastErr
	}
	return fail("check that gpuboot (or the HTTP server in gpurack.rootfs=) is up and reachable from the provisioning network, and that the image exists in its store",
		"could not download the rootfs after %d attempts: %v", cfg.Retries, lastErr)
}

func downloadOnce(con *Console, client *http.Client, url, dst string) (string, int64, error) {
	resp, err := client.Get(url)
	if err != nil {
		return "", 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", 0, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	f, err := os.Create(dst)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	total := resp.ContentLength
	con.Printf("downloading %s (%d MiB)", url, total>>20)
	var done int64
	nextPct := int64(10)
	buf := make([]byte, 1<<20)
	for {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			h.Write(buf[:n])
			if _, err := f.Write(buf[:n]); err != nil {
				return "", done, fmt.Errorf("write %s: %v (is the machine's memory large enough for the rootfs?)", dst, err)
			}
			done += int64(n)
			if total > 0 && done*100/total >= nextPct {
				con.Printf("downloaded %d%% (%d of %d MiB)", done*100/total, done>>20, total>>20)
				nextPct = done*100/total/10*10 + 10
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return "", done, fmt.Errorf("GET %s: after %d bytes: %v", url, done, rerr)
		}
	}
	return hex.EncodeToString(h.Sum(nil)), done, nil
}

// fileSHA256 is the lowercase hex sha256 of the file at path.
func fileSHA256(path string) (string, error) {
	d, err := manifest.DigestFile(path)
	return d.SHA256, err
}

const (
	roDir    = "/run/gpurack/ro"
	rwDir    = "/run/gpurack/rw"
	newRoot  = "/newroot"
	loopCtrl = "/dev/loop-control"
)

func mountRoot(con *Console, image string) error {
	for _, d := range []string{roDir, rwDir, newRoot} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	dev, err := attachLoop(image)
	if err != nil {
		return fail("the initramfs needs the loop module; rebuild the image with gpuimage", "attach %s to a loop device: %v", image, err)
	}
	if err := unix.Mount(dev, roDir, "squashfs", unix.MS_RDONLY, ""); err != nil {
		return fail("the initramfs needs the squashfs module, and the rootfs must be a squashfs image made by gpuimage",
			"mount the rootfs (%s on %s) as squashfs: %v", dev, roDir, err)
	}
	if err := unix.Mount("tmpfs", rwDir, "tmpfs", 0, "mode=0755"); err != nil {
		return fail("report this as a bug", "mount the tmpfs for the overlay: %v", err)
	}
	os.MkdirAll(rwDir+"/upper", 0o755)
	os.MkdirAll(rwDir+"/work", 0o755)
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s/upper,workdir=%s/work", roDir, rwDir, rwDir)
	if err := unix.Mount("overlay", newRoot, "overlay", 0, opts); err != nil {
		return fail("the initramfs needs the overlay module; rebuild the image with gpuimage", "mount the overlay on %s: %v", newRoot, err)
	}
	con.Printf("root is squashfs (%s) under a tmpfs overlay", dev)
	return nil
}

func attachLoop(image string) (string, error) {
	ctl, err := os.OpenFile(loopCtrl, os.O_RDWR, 0)
	if err != nil {
		return "", err
	}
	defer ctl.Close()
	n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
	if err != nil {
		return "", fmt.Errorf("LOOP_CTL_GET_FREE: %v", err)
	}
	dev := fmt.Sprintf("/dev/loop%d", n)
	var lf *os.File
	for i := 0; i < 50; i++ {
		if lf, err = os.OpenFile(dev, os.O_RDWR, 0); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		return "", err
	}
	defer lf.Close()
	img, err := os.Open(image)
	if err != nil {
		return "", err
	}
	defer img.Close()
	if err := unix.IoctlSetInt(int(lf.Fd()), unix.LOOP_SET_FD, int(img.Fd())); err != nil {
		return "", fmt.Errorf("LOOP_SET_FD: %v", err)
	}
	info := &unix.LoopInfo64{Flags: unix.LO_FLAGS_READ_ONLY}
	copy(info.File_name[:], image)
	if err := unix.IoctlLoopSetStatus64(int(lf.Fd()), info); err != nil {
		return "", fmt.Errorf("LOOP_SET_STATUS64: %v", err)
	}
	return dev, nil
}

// switchRoot moves the early mounts into the new root, makes it / and execs init
// there (what util-linux switch_root does, minus deleting the initramfs).
func switchRoot(con *Console, init string) error {
	if _, err := os.Stat(filepath.Join(newRoot, init)); err != nil {
		if _, lerr := os.Lstat(filepath.Join(newRoot, init)); lerr != nil {
			return fail("the rootfs must contain systemd (systemd-sysv); rebuild it with gpuimage, or set gpurack.init=",
				"%s is not in the new root: %v", init, err)
		}
	}
	for _, m := range []string{"/dev", "/proc", "/sys", "/run"} {
		dst := newRoot + m
		os.MkdirAll(dst, 0o755)
		if err := unix.Mount(m, dst, "", unix.MS_MOVE, ""); err != nil {
			return fail("report this as a bug", "move %s into the new root: %v", m, err)
		}
	}
	if err := unix.Chdir(newRoot); err != nil {
		return err
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fail("report this as a bug", "move the new root to /: %v", err)
	}
	if err := unix.Chroot("."); err != nil {
		return err
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	con.Printf("switch_root: exec %s", init)
	err := syscall.Exec(init, []string{init}, os.Environ())
	return fail("the rootfs's init must be executable", "exec %s: %v", init, err)
}
