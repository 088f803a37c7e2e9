package server_test

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	machinev1 "github.com/gpurack/gpurack/api/machine/v1"
	"github.com/gpurack/gpurack/internal/testreq"
)

// procKiB reads a "Name:   N kB" line of /proc/PID/status.
func procKiB(t *testing.T, pid int, name string) int {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+":"); ok {
			n, _ := strconv.Atoi(strings.Fields(v)[0])
			return n
		}
	}
	t.Fatalf("no %s in /proc/%d/status", name, pid)
	return 0
}

// loadRSSBoundMiB is the bound the load test holds gpuboot's peak RSS to. Measured on
// 2 shared cores: 78 MiB peak with the kept counts; 164 MiB when every scrape decoded
// the inventory (and scrapes were 10 times fewer).
const loadRSSBoundMiB = 128

// TestLoadRandomRegistrations: 5000 Registers with random identities and the facts of
// an 8-GPU server, from 32 clients, while 8 clients scrape /metrics without pause.
// gpuboot's peak RSS stays under loadRSSBoundMiB, every registration is recorded, and
// a machine approved before the load keeps its state and key.
func TestLoadRandomRegistrations(t *testing.T) {
	testreq.OptIn(t, "GPURACK_LOAD", "5000 registrations, each with an fsync, take about two minutes on a shared disk")
	in := newInstance(t, "enrollment: {maxUnapproved: 100000, createRate: 100000, createBurst: 100000, sourceRate: 100000, sourceBurst: 100000}\n")
	in.start()
	c := in.enrollClient()

	approved := newTestAgent(0)
	if _, err := approved.register(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	in.cli("machines", "approve", approved.facts.Identity.BootMac, "--reason", "load test")
	rssStart := procKiB(t, in.cmd.Process.Pid, "VmRSS")

	const n, workers, scrapers = 5000, 32, 8
	var next, scrapes, failed atomic.Int64
	next.Store(1)
	done := make(chan struct{})
	var scrapeWG sync.WaitGroup
	for range scrapers {
		scrapeWG.Add(1)
		go func() {
			defer scrapeWG.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				resp, err := http.Get("http://" + in.httpAddr + "/metrics")
				if err != nil {
					failed.Add(1)
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				scrapes.Add(1)
			}
		}()
	}
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i > n {
					return
				}
				a := newTestAgent(i)
				a.facts.Identity.BootMac = fmt.Sprintf("52:54:01:%02x:%02x:%02x", i>>16&0xff, i>>8&0xff, i&0xff)
				for g := range 8 {
					a.facts.Gpus = append(a.facts.Gpus, &machinev1.GPU{Index: int32(g), ProductName: "NVIDIA H100 80GB HBM3",
						Uuid: fmt.Sprintf("GPU-%08x-0000-0000-0000-%012x", i, g), PciBusId: fmt.Sprintf("00000000:%02x:00.0", 0x18+g)})
				}
				if _, err := a.register(context.Background(), c); err != nil {
					failed.Add(1)
					t.Errorf("register %d: %v", i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(done)
	scrapeWG.Wait()
	pid := in.cmd.Process.Pid
	peak, rss := procKiB(t, pid, "VmHWM"), procKiB(t, pid, "VmRSS")
	t.Logf("%d registrations and %d /metrics scrapes: gpuboot RSS %d MiB at start, %d MiB at the end, peak %d MiB (bound %d MiB)",
		n, scrapes.Load(), rssStart/1024, rss/1024, peak/1024, loadRSSBoundMiB)
	if failed.Load() != 0 {
		t.Fatalf("%d calls failed", failed.Load())
	}
	if peak/1024 > loadRSSBoundMiB {
		t.Errorf("gpuboot's peak RSS %d MiB is above the bound of %d MiB", peak/1024, loadRSSBoundMiB)
	}
	ms := in.listMachines()
	if len(ms) != n+1 {
		t.Errorf("%d machines recorded, want %d", len(ms), n+1)
	}
	for _, m := range ms {
		if m.GetIdentity().GetBootMac() == approved.facts.Identity.BootMac {
			if m.State != bootv1.MachineState_MACHINE_STATE_APPROVED || m.KeyFingerprint != bootv1.KeyFingerprint(approved.key.Public().(ed25519.PublicKey)) {
				t.Errorf("the machine approved before the load is %s now, key %s", m.State, m.KeyFingerprint)
			}
		}
	}
}
