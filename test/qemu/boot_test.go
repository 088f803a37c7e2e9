//go:build linux

package qemu

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/gpurack/gpurack/internal/netnstest"
	"github.com/gpurack/gpurack/internal/testreq"
	"github.com/gpurack/gpurack/pxe/dhcp"
	"github.com/gpurack/gpurack/pxe/httpboot"
	"github.com/gpurack/gpurack/pxe/httpboot/imagetest"
	"github.com/gpurack/gpurack/pxe/identity"
	"github.com/gpurack/gpurack/pxe/tftp"
)

const (
	serverIP  = "10.88.0.1"
	bootLimit = 300 * time.Second // QEMU's own timeout; boots take 10-20 s unloaded
	caPin     = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	ovmfCode  = "/usr/share/OVMF/OVMF_CODE_4M.fd"
	ovmfVars  = "/usr/share/OVMF/OVMF_VARS_4M.fd"
)

// requireTools skips, saying what to install, unless the tools are here.
func requireTools(t *testing.T, files ...string) {
	t.Helper()
	for _, bin := range []string{"qemu-system-x86_64", "dnsmasq", "timeout"} {
		testreq.Tool(t, bin, "hack/deps.sh installs qemu-system-x86, dnsmasq-base")
	}
	for _, f := range append(files, filepath.Join(tftp.DefaultDir, "snponly.efi")) {
		testreq.File(t, f, "hack/deps.sh installs ipxe, ipxe-qemu, ovmf")
	}
}

// kernelPath returns Debian's newest /boot/vmlinuz-*.
func kernelPath(t *testing.T) string {
	t.Helper()
	ks, _ := filepath.Glob("/boot/vmlinuz-*")
	if len(ks) == 0 {
		testreq.Missing(t, "no /boot/vmlinuz-*", "apt-get install linux-image-amd64 (hack/deps.sh lists it)")
	}
	sort.Strings(ks)
	return ks[len(ks)-1]
}

var (
	initrdOnce sync.Once
	initrdData []byte
	initrdErr  error
)

// buildInitrd compiles testdata/init statically and packs it as /init.
func buildInitrd(t *testing.T) []byte {
	t.Helper()
	initrdOnce.Do(func() {
		dir, err := os.MkdirTemp("", "gpurack-initrd-")
		if err != nil {
			initrdErr = err
			return
		}
		defer os.RemoveAll(dir)
		bin := filepath.Join(dir, "init")
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", bin, "./testdata/init")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
		if out, err := cmd.CombinedOutput(); err != nil {
			initrdErr = fmt.Errorf("build test init: %v\n%s", err, out)
			return
		}
		data, err := os.ReadFile(bin)
		if err != nil {
			initrdErr = err
			return
		}
		var buf bytes.Buffer
		initrdErr = writeCPIO(&buf, []cpioEntry{
			{Name: "dev", Mode: cpioDir | 0o755},
			{Name: "dev/console", Mode: cpioChar | 0o600, RMaj: 5, RMin: 1},
			{Name: "dev/port", Mode: cpioChar | 0o600, RMaj: 1, RMin: 4},
			{Name: "proc", Mode: cpioDir | 0o755},
			{Name: "init", Mode: cpioReg | 0o755, Data: data},
		})
		initrdData = buf.Bytes()
	})
	if initrdErr != nil {
		t.Fatal(initrdErr)
	}
	return initrdData
}

// recordingBooter boots every machine into one image and records the
// identities it was asked about.
type recordingBooter struct {
	image string
	mu    sync.Mutex
	seen  []identity.Identity
}

func (b *recordingBooter) BootTarget(_ context.Context, id identity.Identity, _ netip.Addr) (httpboot.Target, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.seen = append(b.seen, id)
	return httpboot.Target{Action: httpboot.Boot, ImageID: b.image}, nil
}

func (b *recordingBooter) identities() []identity.Identity {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]identity.Identity(nil), b.seen...)
}

// rig is one namespace with gpuboot's boot servers, a site DHCP server
// and a tap for QEMU.
type rig struct {
	env         *netnstest.Env
	ns          string
	tap         string
	booter      *recordingBooter
	dhcpMetrics *dhcp.Metrics
	tftpMetrics *tftp.Metrics
}

func newRig(t *testing.T) *rig {
	t.Helper()
	kernel, err := os.ReadFile(kernelPath(t))
	if err != nil {
		testreq.Missing(t, fmt.Sprintf("cannot read the kernel (%v)", err), "run the tests as root (Debian's kernels are readable by root only)")
	}
	initrd := buildInitrd(t)
	env := netnstest.New(t)
	r := &rig{env: env, ns: env.Namespace(), dhcpMetrics: dhcp.NewMetrics(nil), tftpMetrics: tftp.NewMetrics(nil)}
	br := env.Bridge(r.ns)
	tap := env.Tap(r.ns)
	env.Attach(br, tap)
	r.tap = tap.Name
	env.AddAddr(br, serverIP+"/24")
	env.AddAddr(br, "fd88::1/64") // for the router advertisement

	// The image: Debian's kernel and the test initrd, signed.
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	store := t.TempDir()
	image, err := imagetest.Write(store, priv, map[string][]byte{
		"vmlinuz":    kernel,
		"initrd.img": initrd,
		"cmdline":    []byte("console=ttyS0,115200 panic=-1 loglevel=4 gpurack.rootfs.sha256=" + strings.Repeat("0", 64) + "\n"),
	})
	if err != nil {
		t.Fatal(err)
	}
	r.booter = &recordingBooter{image: image}

	// The site's DHCP server: addresses and an IPv6 RA (without one, iPXE
	// spends ~16 s on IPv6 autoconfiguration), no boot options.
	dns := env.Command(r.ns, "dnsmasq", "--no-daemon", "--conf-file=/dev/null", "--user=root", "--port=0",
		"--bind-interfaces", "--interface="+br.Name, "--log-facility=-", "--no-resolv", "--no-hosts",
		"--dhcp-leasefile="+filepath.Join(t.TempDir(), "leases"), "--pid-file=",
		"--dhcp-range=10.88.0.50,10.88.0.99,1h", "--no-ping", "--enable-ra", "--dhcp-range=fd88::,ra-only")
	dnsLog := &syncBuffer{}
	dns.Stdout, dns.Stderr = dnsLog, dnsLog
	if err := dns.Start(); err != nil {
		t.Fatalf("start dnsmasq: %v", err)
	}
	go dns.Wait()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("dnsmasq log:\n%s", dnsLog.String())
		}
	})

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	run := func(f func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(); err != nil && ctx.Err() == nil {
				t.Errorf("server: %v", err)
			}
		}()
	}

	// gpuboot: proxyDHCP on 67 and 4011, TFTP, HTTP.
	baseURL := "http://" + serverIP + ":8080"
	handler, err := httpboot.NewHandler(httpboot.Config{
		ImageStore: store, TrustedKeys: []ed25519.PublicKey{pub}, BaseURL: baseURL,
		EnrollAddr: serverIP + ":8443", EnrollCAPin: caPin, IPXEDir: tftp.DefaultDir,
	}, r.booter)
	if err != nil {
		t.Fatal(err)
	}
	dsrv := &dhcp.Server{Config: dhcp.Config{
		ServerIP: netip.MustParseAddr(serverIP), ScriptURL: handler.ScriptURL(),
		HTTPBootURL: baseURL + "/ipxe/ipxe.efi", EFIBootFile: "snponly.efi",
	}, Metrics: r.dhcpMetrics}
	tsrv, err := tftp.New(tftp.Config{}, r.tftpMetrics, nil)
	if err != nil {
		t.Fatal(err)
	}
	var conns []*net.UDPConn
	var ln net.Listener
	if err := netnstest.InNamespace(r.ns, func() error {
		for _, port := range []int{67, dhcp.PXEPort} {
			c, err := dhcp.Listen(br.Name, port)
			if err != nil {
				return err
			}
			conns = append(conns, c)
		}
		var err error
		ln, err = net.Listen("tcp4", serverIP+":8080")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	for _, c := range conns {
		run(func() error { return dsrv.Serve(ctx, c) })
	}
	run(func() error {
		return netnstest.InNamespace(r.ns, func() error {
			c, err := tftp.Listen(serverIP + ":69")
			if err != nil {
				return err
			}
			return tsrv.Serve(ctx, c)
		})
	})
	hs := &http.Server{Handler: handler}
	run(func() error {
		if err := hs.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	context.AfterFunc(ctx, func() { hs.Close() })
	return r
}

// boot runs QEMU with the given firmware arguments on the rig's tap and
// returns its exit code and the console output, ANSI sequences stripped.
func (r *rig) boot(t *testing.T, mac string, firmware ...string) (int, string) {
	t.Helper()
	args := []string{"-s", "KILL", fmt.Sprint(int(bootLimit.Seconds())),
		"qemu-system-x86_64", "-accel", "tcg", "-m", "768", "-nographic", "-no-reboot", "-boot", "n",
		"-smbios", "type=1,serial=GPR-QEMU-0001,uuid=11223344-5566-7788-99aa-bbccddeeff00",
		"-netdev", "tap,id=n0,ifname=" + r.tap + ",script=no,downscript=no",
		"-device", "isa-debug-exit,iobase=0xf4,iosize=0x04"}
	args = append(args, firmware...)
	cmd := r.env.Command(r.ns, "timeout", args...)
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.Stdin = nil
	start := time.Now()
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("run QEMU: %v", err)
	}
	console := stripANSI(out.String())
	t.Logf("QEMU exited with %d after %.1f s", code, time.Since(start).Seconds())
	return code, console
}

var ansiRE = regexp.MustCompile(`\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Za-z0-9]|[\x08\r]`)

func stripANSI(s string) string { return ansiRE.ReplaceAllString(s, "") }

// checkBooted asserts the guest's verdict and dumps the console otherwise.
func checkBooted(t *testing.T, code int, console string) {
	t.Helper()
	if code != 3 || !strings.Contains(console, "GPURACK-BOOT-OK") {
		tail := console
		if len(tail) > 6000 {
			tail = tail[len(tail)-6000:]
		}
		t.Fatalf("guest did not boot: QEMU exit %d (3 = the test init's OK; 124/137 = timeout)\nconsole tail:\n%s", code, tail)
	}
	for line := range strings.SplitSeq(console, "\n") {
		if strings.Contains(line, "GPURACK-TEST-INIT cmdline:") {
			t.Log(strings.TrimSpace(line))
		}
	}
}

func (r *rig) checkIdentity(t *testing.T, mac string) {
	t.Helper()
	want := mac + "|11223344-5566-7788-99aa-bbccddeeff00|GPR-QEMU-0001"
	for _, id := range r.booter.identities() {
		if id.Key() == want {
			return
		}
	}
	t.Errorf("/boot.ipxe never carried identity %q (QEMU -smbios type=1); saw %v", want, r.booter.identities())
}

// TestBIOSiPXEProxyBoot: SeaBIOS runs the iPXE option ROM, which
// identifies itself as iPXE, takes gpuboot's proxy offer (the script URL),
// fetches /boot.ipxe with its identity, and boots the image.
func TestBIOSiPXEProxyBoot(t *testing.T) {
	requireTools(t)
	r := newRig(t)
	const mac = "52:54:00:12:34:56"
	code, console := r.boot(t, mac, "-device", "virtio-net-pci,netdev=n0,mac="+mac+",bootindex=1")
	checkBooted(t, code, console)
	r.checkIdentity(t, mac)
	if n := counter(r.dhcpMetrics.Replies.WithLabelValues("offer", "ipxe", "67")); n < 1 {
		t.Errorf("no proxy offers to iPXE counted (%v)", n)
	}
}

// TestOVMFNativePXEBoot: OVMF's own UEFI PXE stack (romfile= drops the
// iPXE ROM) takes the proxy offer, asks the proxy on port 4011, fetches
// snponly.efi over TFTP, which then behaves as iPXE and boots the image.
// On EFI the kernel finds the initrd only because the script passes
// initrd=initrd.img.
func TestOVMFNativePXEBoot(t *testing.T) {
	requireTools(t, ovmfCode, ovmfVars)
	r := newRig(t)
	vars := filepath.Join(t.TempDir(), "OVMF_VARS.fd")
	data, err := os.ReadFile(ovmfVars)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(vars, data, 0o644); err != nil { // fresh per run: OVMF writes Boot#### entries
		t.Fatal(err)
	}
	const mac = "52:54:00:12:34:57"
	code, console := r.boot(t, mac,
		"-drive", "if=pflash,format=raw,readonly=on,file="+ovmfCode,
		"-drive", "if=pflash,format=raw,file="+vars,
		"-device", "virtio-net-pci,romfile=,netdev=n0,mac="+mac+",bootindex=1")
	checkBooted(t, code, console)
	r.checkIdentity(t, mac)
	if n := counter(r.dhcpMetrics.Replies.WithLabelValues("ack", "efi", "4011")); n < 1 {
		t.Errorf("no proxyDHCP ACK on port 4011 to the UEFI PXE client")
	}
	if n := counter(r.tftpMetrics.Transfers.WithLabelValues("ok")); n < 1 {
		t.Errorf("no TFTP transfer (snponly.efi) completed")
	}
	if !strings.Contains(console, "EFI stub: Loaded initrd from command line option") && !strings.Contains(console, "GPURACK-TEST-INIT") {
		t.Errorf("the kernel did not load the initrd named by initrd=")
	}
}

func counter(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return -1
	}
	return m.GetCounter().GetValue()
}

// syncBuffer is a bytes.Buffer safe for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
