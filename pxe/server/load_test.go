package server_test

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	machinev1 "github.com/gpurack/gpurack/api/machine/v1"
	"github.com/gpurack/gpurack/internal/pki"
	"github.com/gpurack/gpurack/internal/testreq"
	"github.com/gpurack/gpurack/pxe/enroll"
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

// TestLoadRandomRegistrations: 1000 Registers (5000 with GPURACK_LOAD=1, about two
// minutes on a shared disk, each with an fsync) with random identities and the facts of
// an 8-GPU server, from 32 clients, while 8 clients scrape /metrics without pause.
// gpuboot's peak RSS stays under loadRSSBoundMiB, every registration is recorded, and
// a machine approved before the load keeps its state and key. make test (CI) runs the
// 1000.
func TestLoadRandomRegistrations(t *testing.T) {
	n := 1000
	if os.Getenv("GPURACK_LOAD") != "" {
		n = 5000
	}
	in := newInstance(t, "enrollment: {maxUnapproved: 100000, createRate: 100000, createBurst: 100000, sourceRate: 100000, sourceBurst: 100000}\n")
	in.start()
	c := in.enrollClient()

	approved := newTestAgent(0)
	if _, err := approved.register(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	in.cli("machines", "approve", approved.facts.Identity.BootMac, "--reason", "load test")
	rssStart := procKiB(t, in.cmd.Process.Pid, "VmRSS")

	const workers, scrapers = 32, 8
	var next, scrapes, failed atomic.Int64
	next.Store(1)
	done := make(chan struct{})
	metricsClient := in.metricsClient()
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
				resp, err := metricsClient.Get("https://" + in.tlsAddr + "/metrics")
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

// floodLine is what TestFloodLatency prints per phase, for test/bench/enrollflood.sh.
const floodLine = "FLOOD run=%d phase=%s seconds=%.1f flood_per_s=%.0f register_p50_ms=%.2f register_p99_ms=%.2f heartbeat_p50_ms=%.2f heartbeat_p99_ms=%.2f samples=%d\n"

// TestFloodLatency measures (it asserts nothing on time): the p50 and p99 of a bound
// machine's Register and Heartbeat with no flood and under a flood of unauthenticated
// Registers (random identities, each call a fresh key) from FLOOD_SOURCES loopback
// addresses (127.0.N.M) at FLOOD_RATE calls per second in all, alternating quiet and
// flood phases of FLOOD_SECONDS, FLOOD_RUNS times each, against one real gpuboot with
// enrollment.sourceRate 50/s per address (the flood's per-address rate at 100
// addresses). Then gpuboot's RSS at the byte cap on unapproved records: strangers
// register the largest facts and checklist until refused. Run by
// test/bench/enrollflood.sh.
func TestFloodLatency(t *testing.T) {
	testreq.OptIn(t, "GPURACK_BENCH_FLOOD", "a benchmark of several minutes that loads every core")
	env := func(name string, def int) int {
		if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
			return v
		}
		return def
	}
	rateTotal, sources, seconds, runs := env("FLOOD_RATE", 5000), env("FLOOD_SOURCES", 100), env("FLOOD_SECONDS", 8), env("FLOOD_RUNS", 3)
	in := newInstance(t, "enrollment: {sourceRate: 50, sourceBurst: 100}\n")
	in.start()
	ctx := context.Background()

	// The bound machine: approved, bundle fetched, mTLS heartbeats.
	c := in.enrollClientFrom("127.0.0.1")
	m := newTestAgent(1)
	if _, err := m.register(ctx, c); err != nil {
		t.Fatal(err)
	}
	in.cli("machines", "approve", m.facts.Identity.BootMac, "--reason", "flood bench")
	r, err := m.register(ctx, c)
	if err != nil || r.Status != bootv1.RegisterStatus_REGISTER_STATUS_APPROVED {
		t.Fatalf("register after approval: %v %v", r, err)
	}
	req := &bootv1.GetJoinBundleRequest{Token: r.Token, Signature: bootv1.SignJoinBundle(m.key, r.Challenge, r.Token)}
	bootv1.SignRequest(m.key, bootv1.EnrollmentService_GetJoinBundle_FullMethodName, req, time.Now())
	b, err := c.GetJoinBundle(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := pki.DecodeCertPEM([]byte(b.Bundle.AgentCertificatePem))
	if err != nil {
		t.Fatal(err)
	}
	tcfg := pki.ClientConfigPinned(in.pin)
	tcfg.Certificates = []tls.Certificate{{Certificate: [][]byte{cert.Raw}, PrivateKey: m.key, Leaf: cert}}
	conn, err := grpc.NewClient(in.tlsAddr, grpc.WithTransportCredentials(credentials.NewTLS(tcfg)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	mtls := bootv1.NewEnrollmentServiceClient(conn)

	floodClients := make([]bootv1.EnrollmentServiceClient, sources)
	for i := range floodClients {
		n := 256 + i
		floodClients[i] = in.enrollClientFrom(fmt.Sprintf("127.0.%d.%d", n>>8, n&255))
	}
	// measure runs the bound machine's calls (20 Registers and 20 Heartbeats a second)
	// for d and returns their latencies in ms.
	measure := func(d time.Duration) (reg, hb []float64) {
		tick := time.NewTicker(25 * time.Millisecond)
		defer tick.Stop()
		end := time.Now().Add(d)
		for i := 0; time.Now().Before(end); i++ {
			<-tick.C
			start := time.Now()
			if i%2 == 0 {
				if _, err := m.register(ctx, c); err != nil {
					t.Errorf("bound machine's register: %v", err)
				}
				reg = append(reg, float64(time.Since(start).Microseconds())/1000)
			} else {
				if _, err := mtls.Heartbeat(ctx, &bootv1.HeartbeatRequest{Identity: m.facts.Identity}); err != nil {
					t.Errorf("bound machine's heartbeat: %v", err)
				}
				hb = append(hb, float64(time.Since(start).Microseconds())/1000)
			}
		}
		return reg, hb
	}
	// flood sends rateTotal Registers a second, spread over the sources, until stop
	// is closed, and counts the calls answered.
	flood := func(stop <-chan struct{}, sent *atomic.Int64) *sync.WaitGroup {
		var wg sync.WaitGroup
		per := time.Duration(float64(time.Second) * float64(sources) / float64(rateTotal))
		for s, fc := range floodClients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				tick := time.NewTicker(per)
				defer tick.Stop()
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					case <-tick.C:
					}
					a := newTestAgent(i)
					a.facts.Identity.BootMac = fmt.Sprintf("52:54:02:%02x:%02x:%02x", s&0xff, i>>8&0xff, i&0xff)
					a.register(ctx, fc)
					sent.Add(1)
				}
			}()
		}
		return &wg
	}
	pct := func(v []float64, p float64) float64 {
		if len(v) == 0 {
			return 0
		}
		s := append([]float64(nil), v...)
		sort.Float64s(s)
		return s[min(len(s)-1, int(p*float64(len(s))))]
	}
	measure(2 * time.Second) // warm
	for run := 1; run <= runs; run++ {
		phases := []string{"quiet", "flood"}
		if run%2 == 0 {
			phases = []string{"flood", "quiet"}
		}
		for _, phase := range phases {
			var sent atomic.Int64
			stop := make(chan struct{})
			var wg *sync.WaitGroup
			if phase == "flood" {
				wg = flood(stop, &sent)
				time.Sleep(time.Second)
				sent.Store(0)
			}
			start := time.Now()
			reg, hb := measure(time.Duration(seconds) * time.Second)
			took := time.Since(start).Seconds()
			n := sent.Load()
			close(stop)
			if wg != nil {
				wg.Wait()
			}
			fmt.Printf(floodLine, run, phase, took, float64(n)/took, pct(reg, .5), pct(reg, .99), pct(hb, .5), pct(hb, .99), len(reg)+len(hb))
		}
	}

	// RSS at the byte cap (enrollment.maxUnapprovedBytes, default 64 MiB).
	capped := newInstance(t, "enrollment: {createRate: 100000, createBurst: 100000, sourceRate: 100000, sourceBurst: 100000}\n")
	capped.start()
	cc := capped.enrollClient()
	rssStart := procKiB(t, capped.cmd.Process.Pid, "VmRSS")
	stored := 0
	for i := 0; ; i++ {
		a := newTestAgent(i)
		a.facts.Identity.BootMac = fmt.Sprintf("52:54:03:00:%02x:%02x", i>>8&0xff, i&0xff)
		a.facts.Gpus = nil
		for g := range enroll.MaxFactsGPUs {
			a.facts.Gpus = append(a.facts.Gpus, &machinev1.GPU{Index: int32(g), ProductName: strings.Repeat("x", enroll.MaxFactsBytes/enroll.MaxFactsGPUs-64)})
		}
		cl := &machinev1.Checklist{Identity: a.facts.Identity}
		for k := range enroll.MaxChecklistResults {
			cl.Results = append(cl.Results, &machinev1.CheckResult{Id: fmt.Sprint("check.", k), Message: strings.Repeat("y", enroll.MaxChecklistBytes/enroll.MaxChecklistResults-48)})
		}
		rq := &bootv1.RegisterRequest{Facts: a.facts, Checklist: cl, PublicKey: a.key.Public().(ed25519.PublicKey)}
		bootv1.SignRequest(a.key, bootv1.EnrollmentService_Register_FullMethodName, rq, time.Now())
		if _, err := cc.Register(ctx, rq); err != nil {
			if !strings.Contains(err.Error(), "maxUnapprovedBytes") {
				t.Fatalf("register %d: %v, want the byte cap", i, err)
			}
			break
		}
		stored++
	}
	pid := capped.cmd.Process.Pid
	fmt.Printf("RSSCAP records=%d rss_start_mib=%d rss_mib=%d peak_mib=%d\n", stored, rssStart/1024, procKiB(t, pid, "VmRSS")/1024, procKiB(t, pid, "VmHWM")/1024)
}
