package enroll

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/proto"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	machinev1 "github.com/gpurack/gpurack/api/machine/v1"
	"github.com/gpurack/gpurack/internal/pki"
	"github.com/gpurack/gpurack/pxe/inventory"
	"github.com/gpurack/gpurack/pxe/policy"
)

// clock is a settable test clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// env is a Service behind a real TLS gRPC listener on loopback, with the real
// gpurack CA and a bbolt inventory.
type env struct {
	t     testing.TB
	svc   *Service
	store *inventory.BoltStore
	ca    *pki.CA
	clk   *clock
	addr  string
}

func newEnv(t testing.TB, mutate func(*Config)) *env {
	t.Helper()
	ca, err := pki.NewCA(pki.CARequest{CommonName: "gpurack test CA"})
	if err != nil {
		t.Fatal(err)
	}
	server, err := pki.IssueServer(ca, []string{"127.0.0.1", "localhost"})
	if err != nil {
		t.Fatal(err)
	}
	store, err := inventory.OpenBolt(filepath.Join(t.TempDir(), "inventory.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	clk := &clock{t: time.Now()}
	cfg := Config{
		Store:       store,
		Policy:      policy.Policy{Mode: policy.Manual},
		Racks:       map[string]Rack{"r1": {Name: "r1", DefaultImage: "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", GossipKey: make([]byte, 32)}},
		DefaultRack: "r1",
		CA:          ca,
		Now:         clk.Now,
		CreateRate:  1e6,
		CreateBurst: 1e6,
	}
	if mutate != nil {
		mutate(&cfg)
	}
	svc, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	tlsCfg := &tls.Config{
		Certificates: []tls.Certificate{server.TLSCertificate(ca.Cert)},
		ClientAuth:   tls.VerifyClientCertIfGiven,
		ClientCAs:    ca.CertPool(),
		MinVersion:   tls.VersionTLS12,
	}
	gs := grpc.NewServer(grpc.Creds(credentials.NewTLS(tlsCfg)))
	bootv1.RegisterEnrollmentServiceServer(gs, svc)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)
	return &env{t: t, svc: svc, store: store, ca: ca, clk: clk, addr: lis.Addr().String()}
}

// client dials the service the way an agent does: TLS pinned to the CA, optionally
// with a client certificate.
func (e *env) client(certs ...tls.Certificate) bootv1.EnrollmentServiceClient {
	e.t.Helper()
	cfg := pki.ClientConfigPinned(e.ca.Pin())
	cfg.Certificates = certs
	conn, err := grpc.NewClient(e.addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { conn.Close() })
	return bootv1.NewEnrollmentServiceClient(conn)
}

// agent is a test agent: a key and the facts it claims.
type agent struct {
	e     *env
	key   ed25519.PrivateKey
	facts *machinev1.MachineFacts
	c     bootv1.EnrollmentServiceClient
	// simulated marks the agent's reports simulated (simulator GPU backend).
	simulated bool
}

func (e *env) agent(mac, serial string) *agent {
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	return &agent{e: e, key: key, c: e.client(), facts: &machinev1.MachineFacts{
		Identity: &machinev1.MachineIdentity{BootMac: mac, Serial: serial, SmbiosUuid: "4c4c4544-0042-3510-8052-b4c04f4e5931"},
		Ips:      []string{"192.0.2.10"},
		BootId:   fmt.Sprintf("boot-%x", key[:4]),
		Gpus:     []*machinev1.GPU{{Index: 0, ProductName: "NVIDIA H100 80GB HBM3"}},
	}}
}

// rebooted returns the same machine with a fresh key, as after a reboot.
func (a *agent) rebooted() *agent {
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	facts := proto.CloneOf(a.facts)
	facts.BootId = fmt.Sprintf("boot-%x", key[:4]) // a new boot has a new boot id
	return &agent{e: a.e, key: key, c: a.e.client(), facts: facts}
}

func (a *agent) fp() string { return bootv1.KeyFingerprint(a.key.Public().(ed25519.PublicKey)) }

func (a *agent) register() (*bootv1.RegisterResponse, error) {
	req := &bootv1.RegisterRequest{Facts: a.facts, PublicKey: a.key.Public().(ed25519.PublicKey)}
	if err := bootv1.SignRequest(a.key, bootv1.EnrollmentService_Register_FullMethodName, req, a.e.clk.Now()); err != nil {
		a.e.t.Fatal(err)
	}
	return a.c.Register(context.Background(), req)
}

func (a *agent) mustRegister(want bootv1.RegisterStatus) *bootv1.RegisterResponse {
	a.e.t.Helper()
	r, err := a.register()
	if err != nil {
		a.e.t.Fatalf("register %s: %v", a.facts.Identity.BootMac, err)
	}
	if r.Status != want {
		a.e.t.Fatalf("register %s: %s (%s), want %s", a.facts.Identity.BootMac, r.Status, r.Message, want)
	}
	return r
}

// bundle redeems token with the challenge, signing with a's key.
func (a *agent) bundle(token string, challenge []byte) (*bootv1.JoinBundle, error) {
	req := &bootv1.GetJoinBundleRequest{Token: token, Signature: bootv1.SignJoinBundle(a.key, challenge, token)}
	if err := bootv1.SignRequest(a.key, bootv1.EnrollmentService_GetJoinBundle_FullMethodName, req, a.e.clk.Now()); err != nil {
		a.e.t.Fatal(err)
	}
	r, err := a.c.GetJoinBundle(context.Background(), req)
	return r.GetBundle(), err
}

func (a *agent) heartbeat(c bootv1.EnrollmentServiceClient, signed bool) (*bootv1.HeartbeatResponse, error) {
	req := &bootv1.HeartbeatRequest{Identity: a.facts.Identity, Health: &machinev1.HealthSummary{State: machinev1.HealthState_HEALTH_STATE_HEALTHY, GpuHealthy: true}}
	if signed {
		if err := bootv1.SignRequest(a.key, bootv1.EnrollmentService_Heartbeat_FullMethodName, req, a.e.clk.Now()); err != nil {
			a.e.t.Fatal(err)
		}
	}
	return c.Heartbeat(context.Background(), req)
}

func (a *agent) report(c bootv1.EnrollmentServiceClient, signed bool, phase machinev1.CheckPhase, status machinev1.CheckStatus) (*bootv1.ReportCommissioningResponse, error) {
	idx := int32(3)
	req := &bootv1.ReportCommissioningRequest{Report: &machinev1.Checklist{
		Identity: a.facts.Identity, Phase: phase, Overall: status, Simulated: a.simulated,
		Results: []*machinev1.CheckResult{{Id: "gpu.pcie.link-width", Status: status, GpuIndex: &idx}},
	}}
	if signed {
		if err := bootv1.SignRequest(a.key, bootv1.EnrollmentService_ReportCommissioning_FullMethodName, req, a.e.clk.Now()); err != nil {
			a.e.t.Fatal(err)
		}
	}
	return c.ReportCommissioning(context.Background(), req)
}

func (e *env) approve(mac string) *inventory.Machine {
	e.t.Helper()
	m, err := e.svc.Approve(context.Background(), mac, ApproveOptions{Actor: "operator:test", Reason: "test approval"})
	if err != nil {
		e.t.Fatalf("approve %s: %v", mac, err)
	}
	return m
}

func (e *env) machine(mac string) *inventory.Machine {
	e.t.Helper()
	m, err := e.svc.Resolve(context.Background(), mac)
	if err != nil {
		e.t.Fatal(err)
	}
	return m
}

func (e *env) checkHistory(mac string) {
	e.t.Helper()
	m := e.machine(mac)
	h, err := e.store.History(context.Background(), m.ID)
	if err != nil {
		e.t.Fatal(err)
	}
	if err := inventory.CheckHistory(h, m.State); err != nil {
		e.t.Fatalf("history of %s: %v", mac, err)
	}
}

// nodeBootID is the boot id the kubelet of the machine holding node reports once it has
// registered in this boot: the one the bound key registered with (NodeRegistered).
func (e *env) nodeBootID(t testing.TB, node string) string {
	t.Helper()
	ms, err := e.store.ByNodeName(context.Background(), node)
	if err != nil || len(ms) == 0 {
		t.Fatalf("no machine holds node %s: %v", node, err)
	}
	for _, m := range ms {
		if id := m.BoundBootID(); id != "" {
			return id
		}
	}
	return ""
}
