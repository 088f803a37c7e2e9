// Package invbench measures gpuboot's enrollment on its two inventory stores side by
// side (issue 31): Register of new machines over real TLS gRPC on loopback, into a
// bbolt file or into Machine objects of a real apiserver. test/bench/inventory.sh runs
// it and writes docs/bench/inventory.md.
package invbench

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	machinev1 "github.com/gpurack/gpurack/api/machine/v1"
	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterconfig"
	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster"
	"github.com/gpurack/gpurack/internal/pki"
	"github.com/gpurack/gpurack/internal/testreq"
	"github.com/gpurack/gpurack/pxe/enroll"
	"github.com/gpurack/gpurack/pxe/inventory"
	"github.com/gpurack/gpurack/pxe/inventory/kubestore"
	"github.com/gpurack/gpurack/pxe/policy"
)

func TestMain(m *testing.M) { os.Exit(testcluster.Main(m)) }

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// serve runs an enrollment service on store over TLS on loopback and returns a client
// pinned to its CA.
func serve(t *testing.T, store inventory.Store) bootv1.EnrollmentServiceClient {
	t.Helper()
	ca, err := pki.NewCA(pki.CARequest{CommonName: "gpurack bench CA"})
	if err != nil {
		t.Fatal(err)
	}
	server, err := pki.IssueServer(ca, []string{"127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := enroll.New(context.Background(), enroll.Config{
		Store: store, Policy: policy.Policy{Mode: policy.Manual}, CA: ca, DefaultRack: "r1",
		Racks:      map[string]enroll.Rack{"r1": {Name: "r1", DefaultImage: "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", GossipKey: make([]byte, 32)}},
		CreateRate: 1e6, CreateBurst: 1e6, MaxUnapproved: 1 << 30,
	})
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{server.TLSCertificate(ca.Cert)}, MinVersion: tls.VersionTLS12})))
	bootv1.RegisterEnrollmentServiceServer(gs, svc)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(pki.ClientConfigPinned(ca.Pin()))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return bootv1.NewEnrollmentServiceClient(conn)
}

// register makes n first Registers of distinct machines (MACs under prefix) from
// workers goroutines and returns the wall time and each call's latency.
func register(t *testing.T, c bootv1.EnrollmentServiceClient, prefix byte, n, workers int) (time.Duration, []time.Duration) {
	t.Helper()
	var next atomic.Int64
	lat := make([]time.Duration, n)
	var wg sync.WaitGroup
	start := time.Now()
	for range workers {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				_, key, _ := ed25519.GenerateKey(rand.Reader)
				mac := fmt.Sprintf("52:55:%02x:%02x:%02x:%02x", prefix, byte(i>>16), byte(i>>8), byte(i))
				req := &bootv1.RegisterRequest{PublicKey: key.Public().(ed25519.PublicKey), Facts: &machinev1.MachineFacts{
					Identity: &machinev1.MachineIdentity{BootMac: mac, Serial: "SN-" + mac},
					Ips:      []string{"192.0.2.10"}, BootId: fmt.Sprintf("boot-%x", key[:4]),
					Gpus: []*machinev1.GPU{{Index: 0, ProductName: "NVIDIA H100 80GB HBM3"}},
				}}
				bootv1.SignRequest(key, bootv1.EnrollmentService_Register_FullMethodName, req, time.Now())
				t0 := time.Now()
				r, err := c.Register(context.Background(), req)
				lat[i] = time.Since(t0)
				if err != nil || r.Status != bootv1.RegisterStatus_REGISTER_STATUS_PENDING {
					t.Errorf("register %s: %v %v", mac, r.GetStatus(), err)
					return
				}
			}
		})
	}
	wg.Wait()
	return time.Since(start), lat
}

func pct(lat []time.Duration, p float64) float64 {
	s := slices.Clone(lat)
	slices.Sort(s)
	return float64(s[int(float64(len(s)-1)*p)].Microseconds()) / 1000
}

// TestInventoryRegister: INVENTORY_RUNS runs (default 3) of INVENTORY_MACHINES first
// Registers (default 300) from 16 clients, after 20 not timed, into each store,
// alternating which goes first. One line per run: "INVENTORY store=S run=R registers_per_s=… p50_ms=… p99_ms=…".
// It runs only with GPURACK_BENCH_INVENTORY=1 (test/bench/inventory.sh).
func TestInventoryRegister(t *testing.T) {
	testreq.OptIn(t, "GPURACK_BENCH_INVENTORY", "a benchmark of a few minutes against a real apiserver; make bench-inventory runs it")
	runs, n := envInt("INVENTORY_RUNS", 3), envInt("INVENTORY_MACHINES", 300)
	// etcd with fsync, as on a control-plane host (testcluster turns it off by default),
	// so that both stores commit to the disk.
	c := testcluster.NewWith(t, testcluster.Options{Configure: func(cfg *clusterconfig.Config) {
		delete(cfg.Etcd.ExtraArgs, "unsafe-no-fsync")
	}})
	cfg := testcluster.RESTConfigFrom(t, c.EnrollerKubeconfig)
	for r := range runs {
		order := []string{"bbolt", "cluster"}
		if r%2 == 1 {
			slices.Reverse(order)
		}
		for _, name := range order {
			var store inventory.Store
			if name == "bbolt" {
				b, err := inventory.OpenBolt(filepath.Join(t.TempDir(), "inventory.db"))
				if err != nil {
					t.Fatal(err)
				}
				defer b.Close()
				store = b
			} else {
				k, err := kubestore.New(cfg)
				if err != nil {
					t.Fatal(err)
				}
				store = k
			}
			client := serve(t, store)
			prefix := byte(r*2 + slices.Index(order, name))
			register(t, client, 0x80|prefix, 20, 4) // not timed: connections and caches warm
			wall, lat := register(t, client, prefix, n, 16)
			fmt.Printf("INVENTORY store=%s run=%d registers_per_s=%.1f p50_ms=%.2f p99_ms=%.2f\n",
				name, r+1, float64(n)/wall.Seconds(), pct(lat, 0.50), pct(lat, 0.99))
		}
	}
}
