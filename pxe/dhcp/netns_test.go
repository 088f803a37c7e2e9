//go:build linux

package dhcp

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/gpurack/gpurack/internal/netnstest"
	"github.com/gpurack/gpurack/internal/testreq"
)

// startDHCP runs a Server on ports 67 and 4011 in a fresh
// namespace and returns the client namespace, its interface and the
// server's metrics.
func startDHCP(t *testing.T, cfg Config) (env *netnstest.Env, clientNS, clientIf string, m *Metrics) {
	t.Helper()
	env = netnstest.New(t)
	srvNS, cliNS := env.Namespace(), env.Namespace()
	s, c := env.Veth(srvNS, cliNS)
	env.AddAddr(s, "10.88.0.1/24")
	m = NewMetrics(nil)
	srv := &Server{Config: cfg, Metrics: m}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 2)
	t.Cleanup(func() {
		cancel()
		for range 2 {
			<-done
		}
	})
	for _, port := range []int{67, PXEPort} {
		var err error
		if e := netnstest.InNamespace(srvNS, func() error {
			conn, lerr := Listen(s.Name, port)
			if lerr != nil {
				return lerr
			}
			go func() { done <- srv.Serve(ctx, conn) }()
			return nil
		}); e != nil {
			err = e
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return env, cliNS, c.Name, m
}

// udhcpc runs busybox udhcpc once in ns and returns the environment its
// script saw for the lease (the "bound" event), as a map.
func udhcpc(t *testing.T, env *netnstest.Env, ns, iface string, args ...string) map[string]string {
	t.Helper()
	testreq.Tool(t, "udhcpc", "apt-get install udhcpc (hack/deps.sh lists it)")
	dir := t.TempDir()
	script := filepath.Join(dir, "script.sh")
	out := filepath.Join(dir, "bound.env")
	if err := os.WriteFile(script, fmt.Appendf(nil, "#!/bin/sh\n[ \"$1\" = bound ] && env > %s\nexit 0\n", out), 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cmdArgs := append([]string{"-i", iface, "-f", "-q", "-n", "-t", "4", "-T", "1", "-A", "1", "-s", script, "-O", "43", "-O", "60", "-O", "97"}, args...)
	cmd := env.Command(ns, "udhcpc", cmdArgs...)
	outb, err := exec.CommandContext(ctx, cmd.Path, cmd.Args[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("udhcpc %s: %v\n%s", strings.Join(args, " "), err, outb)
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatalf("udhcpc got no lease: %v\n%s", err, outb)
	}
	vars := map[string]string{}
	for line := range strings.SplitSeq(string(data), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			vars[k] = v
		}
	}
	return vars
}

// TestProxyWithUdhcpc: a real DHCP client (busybox udhcpc) in a namespace
// gets the right boot file from the proxy for option 93 values 0, 7, 9 and
// 16, and the script URL when its user class is iPXE.
func TestProxyWithUdhcpc(t *testing.T) {
	cfg := Config{
		ServerIP:    netip.MustParseAddr("10.88.0.1"),
		ScriptURL:   "http://10.88.0.1:8080/boot.ipxe",
		HTTPBootURL: "http://10.88.0.1:8080/ipxe/ipxe.efi",
	}
	env, ns, iface, m := startDHCP(t, cfg)
	const uuidHex = "00443322116655887799aabbccddeeff00"
	for _, tc := range []struct {
		name, vendor, arch, userClass string
		wantFile, wantVendor          string
	}{
		{"bios", "PXEClient:Arch:00000:UNDI:002001", "0000", "", "undionly.kpxe", "PXEClient"},
		{"efi-x64", "PXEClient:Arch:00007:UNDI:003000", "0007", "", "snponly.efi", "PXEClient"},
		{"efi-bc", "PXEClient:Arch:00009:UNDI:003000", "0009", "", "snponly.efi", "PXEClient"},
		{"httpboot", "HTTPClient:Arch:00016:UNDI:003000", "0010", "", "http://10.88.0.1:8080/ipxe/ipxe.efi", "HTTPClient"},
		{"ipxe", "PXEClient:Arch:00000:UNDI:002001", "0000", "69505845", "http://10.88.0.1:8080/boot.ipxe", "PXEClient"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := []string{"-V", tc.vendor, "-x", "0x5d:" + tc.arch, "-x", "0x61:" + uuidHex}
			if tc.userClass != "" {
				args = append(args, "-x", "0x4d:"+tc.userClass)
			}
			vars := udhcpc(t, env, ns, iface, args...)
			if vars["boot_file"] != tc.wantFile {
				t.Errorf("boot_file %q; want %q (env %v)", vars["boot_file"], tc.wantFile, vars)
			}
			if vars["ip"] != "0.0.0.0" {
				t.Errorf("proxy gave address %q", vars["ip"])
			}
			if vars["serverid"] != "10.88.0.1" || vars["siaddr"] != "10.88.0.1" || vars["sname"] != "10.88.0.1" {
				t.Errorf("serverid %q siaddr %q sname %q", vars["serverid"], vars["siaddr"], vars["sname"])
			}
			if got := vars["opt97"]; got != "" && got != uuidHex {
				t.Errorf("option 97 %q; want %q echoed", got, uuidHex)
			}
			// UEFI PXE offers leave 43 out (BINL, port 4011); udhcpc's
			// REQUEST then gets the ACK, which carries it.
			if tc.wantVendor == "PXEClient" && vars["opt43"] != "060108ff" {
				t.Errorf("option 43 %q; want 060108ff", vars["opt43"])
			}
			t.Logf("%s: boot_file=%s opt43=%s opt60=%s opt97=%s", tc.name, vars["boot_file"], vars["opt43"], vars["opt60"], vars["opt97"])
		})
	}
	// A plain client (no PXE vendor class) gets nothing, and that is counted.
	t.Run("not-pxe", func(t *testing.T) {
		before := counterValue(m.Ignores.WithLabelValues(string(ReasonNotPXE)))
		cmd := env.Command(ns, "udhcpc", "-i", iface, "-f", "-q", "-n", "-t", "2", "-T", "1", "-s", "/bin/true")
		if out, err := cmd.CombinedOutput(); err == nil {
			t.Fatalf("a non-PXE client got a lease from the proxy:\n%s", out)
		}
		if after := counterValue(m.Ignores.WithLabelValues(string(ReasonNotPXE))); after < before+1 {
			t.Errorf("not-pxe ignores %v → %v; want counted", before, after)
		}
	})
}

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return -1
	}
	return m.GetCounter().GetValue()
}

// TestProxyThroughRelay: a PXE client on another subnet reaches the proxy
// through a real DHCP relay (dnsmasq --dhcp-relay); the proxy unicasts its
// replies to the relay's giaddr on port 67 (RFC 2131 §4.1) and the client
// gets its boot file.
func TestProxyThroughRelay(t *testing.T) {
	testreq.Tool(t, "dnsmasq", "apt-get install dnsmasq-base (hack/deps.sh lists it); it is the DHCP relay here")
	env := netnstest.New(t)
	srvNS, relayNS, cliNS := env.Namespace(), env.Namespace(), env.Namespace()
	s, rs := env.Veth(srvNS, relayNS)
	rc, c := env.Veth(relayNS, cliNS)
	env.AddAddr(s, "10.88.0.1/24")
	env.AddAddr(rs, "10.88.0.2/24")
	env.AddAddr(rc, "10.77.0.1/24")
	if out, err := env.Run(srvNS, "ip", "route", "add", "10.77.0.0/24", "via", "10.88.0.2"); err != nil {
		t.Fatalf("route: %v %s", err, out)
	}
	relay := env.Command(relayNS, "dnsmasq", "--no-daemon", "--conf-file=/dev/null", "--user=root", "--port=0",
		"--pid-file=", "--log-facility=-", "--log-dhcp", "--dhcp-relay=10.77.0.1,10.88.0.1")
	var relayLog strings.Builder
	relay.Stdout, relay.Stderr = &relayLog, &relayLog
	if err := relay.Start(); err != nil {
		t.Fatal(err)
	}
	go relay.Wait()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("relay log:\n%s", relayLog.String())
		}
	})
	if err := netnstest.WaitPortIn(t.Context(), relayNS, "udp", ":67"); err != nil {
		t.Fatal(err)
	}
	m := NewMetrics(nil)
	srv := &Server{Config: Config{ServerIP: netip.MustParseAddr("10.88.0.1"), ScriptURL: "http://10.88.0.1:8080/boot.ipxe"}, Metrics: m}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	if err := netnstest.InNamespace(srvNS, func() error {
		conn, err := Listen(s.Name, 67)
		if err != nil {
			return err
		}
		go func() { done <- srv.Serve(ctx, conn) }()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); <-done })
	// -B: PXE firmware sets the broadcast flag; a relay cannot unicast
	// a proxy reply to a client that has no address (yiaddr 0).
	vars := udhcpc(t, env, cliNS, c.Name, "-B", "-V", "PXEClient:Arch:00000:UNDI:002001", "-x", "0x5d:0000")
	if vars["boot_file"] != "undionly.kpxe" || vars["siaddr"] != "10.88.0.1" {
		t.Errorf("through the relay: boot_file %q siaddr %q", vars["boot_file"], vars["siaddr"])
	}
	if n := counterValue(m.Replies.WithLabelValues("offer", "bios", "67")); n < 1 {
		t.Errorf("no offer counted")
	}
}

// TestFullModeWithUdhcpc: in full mode a real client gets an address from
// the pool, the network options and, being iPXE, the script URL and
// no-pxedhcp.
func TestFullModeWithUdhcpc(t *testing.T) {
	pool, err := NewPool(netip.MustParseAddr("10.88.0.100"), netip.MustParseAddr("10.88.0.110"), nil, time.Hour, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{
		Mode: ModeFull, ServerIP: netip.MustParseAddr("10.88.0.1"), ScriptURL: "http://10.88.0.1:8080/boot.ipxe",
		Leases: pool, SubnetMask: net.CIDRMask(24, 32), Routers: []netip.Addr{netip.MustParseAddr("10.88.0.1")},
	}
	env, ns, iface, _ := startDHCP(t, cfg)
	vars := udhcpc(t, env, ns, iface, "-V", "PXEClient:Arch:00000:UNDI:002001", "-x", "0x5d:0000", "-x", "0x4d:69505845", "-O", "175")
	if vars["ip"] != "10.88.0.100" || vars["subnet"] != "255.255.255.0" || vars["router"] != "10.88.0.1" {
		t.Errorf("lease: ip %q subnet %q router %q", vars["ip"], vars["subnet"], vars["router"])
	}
	if vars["boot_file"] != cfg.ScriptURL {
		t.Errorf("boot_file %q", vars["boot_file"])
	}
	if vars["opt175"] != "b00101" {
		t.Errorf("option 175 %q; want b00101 (no-pxedhcp)", vars["opt175"])
	}
}

// TestListenReceiveBuffer: Listen's socket gets the large receive buffer
// (the kernel reports twice what was set, for its bookkeeping), not the
// default of about 200 KiB, which overflows in a boot storm.
func TestListenReceiveBuffer(t *testing.T) {
	env := netnstest.New(t)
	ns := env.Namespace()
	s, _ := env.Veth(ns, env.Namespace())
	var got int
	if err := netnstest.InNamespace(ns, func() error {
		conn, err := Listen(s.Name, 67)
		if err != nil {
			return err
		}
		defer conn.Close()
		rc, err := conn.SyscallConn()
		if err != nil {
			return err
		}
		var serr error
		if err := rc.Control(func(fd uintptr) {
			got, serr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF)
		}); err != nil {
			return err
		}
		return serr
	}); err != nil {
		t.Fatal(err)
	}
	if got < ReceiveBuffer {
		t.Errorf("SO_RCVBUF = %d; want at least %d (needs CAP_NET_ADMIN for SO_RCVBUFFORCE)", got, ReceiveBuffer)
	}
}
