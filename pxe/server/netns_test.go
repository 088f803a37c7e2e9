package server_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpurack/gpurack/internal/netnstest"
	"github.com/gpurack/gpurack/internal/testreq"
	"github.com/gpurack/gpurack/pxe/tftp"
)

// TestServeInNamespace runs `gpuboot serve` with DHCP (proxy mode) and TFTP on a veth in
// a network namespace, as on a provisioning network, and reaches it from a second
// namespace with real clients: curl over TFTP and HTTP. It checks the wiring of serve,
// not the protocols (pxe/dhcp and pxe/tftp test those).
func TestServeInNamespace(t *testing.T) {
	netnstest.Require(t)
	testreq.File(t, filepath.Join(tftp.DefaultDir, "ipxe.efi"), "apt-get install ipxe (make deps installs it)")
	env, srvNS, cliNS, in := proxyInstanceInNamespaces(t)
	cmd := env.Command(srvNS, in.bin, "serve", "--config", in.cfg)
	var log strings.Builder
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, p := range []struct{ network, addr string }{
		{"tcp", "192.0.2.1:8443"}, {"tcp", "192.0.2.1:8080"}, {"udp", "0.0.0.0:67"}, {"udp", "0.0.0.0:4011"}, {"udp", "0.0.0.0:69"},
	} {
		if err := netnstest.WaitPortIn(ctx, srvNS, p.network, p.addr); err != nil {
			t.Fatalf("gpuboot serve not listening on %s %s: %v\n%s", p.network, p.addr, err, log.String())
		}
	}
	// TFTP from the other namespace.
	out := filepath.Join(t.TempDir(), "ipxe.efi")
	if o, err := env.Run(cliNS, "curl", "-sS", "--tftp-blksize", "1468", "-o", out, "tftp://192.0.2.1/ipxe.efi"); err != nil {
		t.Fatalf("curl tftp: %v\n%s\n%s", err, o, log.String())
	}
	want, _ := os.Stat(filepath.Join(tftp.DefaultDir, "ipxe.efi"))
	if got, err := os.Stat(out); err != nil || got.Size() != want.Size() {
		t.Fatalf("tftp fetched %v bytes, want %d", got, want.Size())
	}
	// /boot.ipxe from the other namespace records the machine as discovered.
	if o, err := env.Run(cliNS, "curl", "-sS", "http://192.0.2.1:8080/boot.ipxe?mac=52:54:00:dd:00:01&serial=NS-1"); err != nil {
		t.Fatalf("curl boot.ipxe: %v\n%s", err, o)
	}
	list, err := env.Run(srvNS, in.bin, "machines", "list", "--server", "192.0.2.1:8443", "--credentials", in.creds)
	if err != nil || !strings.Contains(list, "52:54:00:dd:00:01") || !strings.Contains(list, "discovered") {
		t.Fatalf("machines list in the server namespace: %v\n%s\n%s", err, list, log.String())
	}
}

// proxyInstanceInNamespaces is a gpuboot instance (newInstanceAt) in proxyDHCP mode
// on a veth between two new network namespaces: the server's (192.0.2.1, where
// the instance is to run) and a client's (192.0.2.2).
func proxyInstanceInNamespaces(t *testing.T) (env *netnstest.Env, srvNS, cliNS string, in *instance) {
	t.Helper()
	env = netnstest.New(t)
	srvNS, cliNS = env.Namespace(), env.Namespace()
	a, b := env.Veth(srvNS, cliNS)
	env.AddAddr(a, "192.0.2.1/24")
	env.AddAddr(b, "192.0.2.2/24")
	in = newInstanceAt(t, "192.0.2.1", "192.0.2.1:8080", "192.0.2.1:8443",
		"interfaces: [{name: "+a.Name+"}]\ndhcp: {mode: proxy}\ntftp: {dir: "+tftp.DefaultDir+"}\n")
	return env, srvNS, cliNS, in
}
