//go:build linux

package tftp

import (
	"bytes"
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/gpurack/gpurack/internal/netnstest"
	"github.com/gpurack/gpurack/internal/testreq"
)

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return -1
	}
	return m.GetCounter().GetValue()
}

// eventually polls read until it returns want or 5 s pass, and returns the
// last value read. Server-side counters trail the client's exit.
func eventually(read func() float64, want float64) float64 {
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := read()
		if got == want || time.Now().After(deadline) {
			return got
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// ipxeDir skips the test unless the Debian ipxe package is installed.
func ipxeDir(t *testing.T) string {
	t.Helper()
	testreq.File(t, filepath.Join(DefaultDir, "ipxe.efi"), "apt-get install ipxe (hack/deps.sh lists it)")
	return DefaultDir
}

func startServer(t *testing.T, cfg Config) (*netnstest.Env, string, *Metrics) {
	t.Helper()
	env := netnstest.New(t)
	srvNS, cliNS := env.Namespace(), env.Namespace()
	s, c := env.Veth(srvNS, cliNS)
	env.AddAddr(s, "10.89.0.1/24")
	env.AddAddr(c, "10.89.0.2/24")
	m := NewMetrics(nil)
	srv, err := New(cfg, m, nil)
	if err != nil {
		t.Fatal(err)
	}
	var conn *net.UDPConn
	if err := netnstest.InNamespace(srvNS, func() error {
		var err error
		conn, err = Listen("10.89.0.1:69")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	// Serve runs on a thread inside the namespace: pin/tftp opens each
	// transfer's socket from the serving goroutine.
	go func() {
		done <- netnstest.InNamespace(srvNS, func() error { return srv.Serve(ctx, conn) })
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return env, cliNS, m
}

// TestTFTPWithRealClients fetches ipxe.efi with curl negotiating blksize
// 1468 and tsize, and checks that tftp-hpa's "../" request is refused with
// a TFTP error.
func TestTFTPWithRealClients(t *testing.T) {
	dir := ipxeDir(t)
	for _, single := range []bool{false, true} {
		name := "per-transfer-port"
		if single {
			name = "single-port"
		}
		t.Run(name, func(t *testing.T) {
			env, ns, m := startServer(t, Config{Dir: dir, SinglePort: single})
			want, err := os.ReadFile(filepath.Join(dir, "ipxe.efi"))
			if err != nil {
				t.Fatal(err)
			}
			out := filepath.Join(t.TempDir(), "ipxe.efi")
			log, err := env.Run(ns, "curl", "-sS", "-v", "--max-time", "60", "--tftp-blksize", "1468", "-o", out, "tftp://10.89.0.1/ipxe.efi")
			if err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(out)
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("fetched %d bytes (err %v); want ipxe.efi's %d bytes\n%s", len(got), err, len(want), log)
			}
			wantBlk := "got option=(blksize) value=(1468)"
			if single {
				// pin/tftp's single-port path clamps to the MTU minus IPv6
				// overhead: 1452 on a 1500-byte link.
				wantBlk = "got option=(blksize) value=(1452)"
			}
			if !strings.Contains(log, wantBlk) {
				t.Errorf("want %q in curl's log:\n%s", wantBlk, log)
			}
			if !strings.Contains(log, "got option=(tsize) value=("+itoa(len(want))+")") {
				t.Errorf("tsize %d not acknowledged:\n%s", len(want), log)
			}
			// The client exits once it has sent its last ACK; the server
			// counts the bytes when it receives that ACK, a moment later.
			if got := eventually(func() float64 { return counterValue(m.Bytes) }, float64(len(want))); got != float64(len(want)) {
				t.Errorf("bytes counter %v; want %d", got, len(want))
			}
			if single {
				return
			}
			testreq.Tool(t, "tftp", "apt-get install tftp-hpa (hack/deps.sh lists it)")
			tmp := t.TempDir()
			cmd := env.Command(ns, "tftp", "-v", "-m", "octet", "10.89.0.1", "-c", "get", "../../etc/passwd", filepath.Join(tmp, "passwd"))
			outb, _ := cmd.CombinedOutput()
			if !strings.Contains(string(outb), "Error code") || !strings.Contains(string(outb), "access violation") {
				t.Errorf("tftp-hpa ../ request: want a TFTP error naming the access violation, got:\n%s", outb)
			}
			if fi, err := os.Stat(filepath.Join(tmp, "passwd")); err == nil && fi.Size() > 0 {
				t.Errorf("../../etc/passwd was served (%d bytes)", fi.Size())
			}
			if got := eventually(func() float64 { return counterValue(m.Transfers.WithLabelValues("refused")) }, 1); got != 1 {
				t.Errorf("refused counter %v; want 1", got)
			}
			t.Logf("tftp-hpa: %s", strings.TrimSpace(string(outb)))
		})
	}
}

func itoa(n int) string { return strconv.Itoa(n) }
