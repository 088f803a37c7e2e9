// Package api_test checks the generated APIs end to end against the real servers:
// gpuboot's EnrollmentService and AdminService (pxe/enroll, pxe/admin, a bbolt
// inventory) and gpuagent's AgentService (agent/server on the simulator backend), on a
// real gRPC server with TLS on loopback and server reflection, as the binaries register
// them. The clients are the generated ones, signing as bootv1.SignRequest does, so a
// change that breaks the wire contract between an agent and gpuboot fails here. What each
// service decides in depth is tested in its own package.
package api_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/reflection"
	reflectionv1 "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/gpurack/gpurack/agent/gossip"
	"github.com/gpurack/gpurack/agent/gpu/sim"
	"github.com/gpurack/gpurack/agent/monitor"
	"github.com/gpurack/gpurack/agent/server"
	agentv1 "github.com/gpurack/gpurack/api/agent/v1"
	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	machinev1 "github.com/gpurack/gpurack/api/machine/v1"
	"github.com/gpurack/gpurack/internal/pki"
	"github.com/gpurack/gpurack/internal/profile"
	"github.com/gpurack/gpurack/pxe/admin"
	"github.com/gpurack/gpurack/pxe/enroll"
	"github.com/gpurack/gpurack/pxe/inventory"
	"github.com/gpurack/gpurack/pxe/policy"
)

const (
	nodeName   = "gpu-r1-07"
	rackImage  = "3f9a0c1d5e7b2a4c6e8f0a1b3c5d7e9f1a2b4c6d"
	h100Config = "../profiles/debian12-nvidia535.yaml"
)

// rig is the three services on one TLS listener, with the simulator behind the agent.
type rig struct {
	addr   string
	ca     *pki.CA
	sim    *sim.Sim
	broker *monitor.Broker
}

func newRig(t *testing.T) *rig {
	t.Helper()
	ca, err := pki.NewCA(pki.CARequest{CommonName: "gpurack api test CA"})
	if err != nil {
		t.Fatal(err)
	}
	srvKP, err := pki.IssueServer(ca, []string{"127.0.0.1", "localhost"})
	if err != nil {
		t.Fatal(err)
	}
	store, err := inventory.OpenBolt(filepath.Join(t.TempDir(), "inventory.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	svc, err := enroll.New(ctx, enroll.Config{
		Store:       store,
		Policy:      policy.Policy{Mode: policy.Manual},
		Racks:       map[string]enroll.Rack{"r1": {Name: "r1", DefaultImage: rackImage, GossipKey: []byte("0123456789abcdef0123456789abcdef")}},
		DefaultRack: "r1",
		CA:          ca,
	})
	if err != nil {
		t.Fatal(err)
	}

	p, err := profile.Load(h100Config)
	if err != nil {
		t.Fatal(err)
	}
	s, err := sim.New("dgxh100", sim.Options{DriverVersion: p.GPU.Driver.Version, Seed: nodeName})
	if err != nil {
		t.Fatal(err)
	}
	mon := monitor.New(monitor.Config{Backend: s, Profile: p, Interval: time.Minute, ClearAfter: time.Second})
	mon.RunChecks(monitor.PhaseContinuous) // the agent's first run, before it serves
	go mon.Run(ctx)
	agent := &server.Service{Monitor: mon, Faults: s, ImageID: rackImage, StartedAt: time.Now(),
		NodeName: func() string { return nodeName }}

	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen on loopback: %v", err)
	}
	gs := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{srvKP.TLSCertificate(ca.Cert)},
		ClientAuth:   tls.VerifyClientCertIfGiven,
		ClientCAs:    ca.CertPool(),
		MinVersion:   tls.VersionTLS12,
	})))
	agentv1.RegisterAgentServiceServer(gs, agent)
	bootv1.RegisterEnrollmentServiceServer(gs, svc)
	adm, err := admin.New(admin.Config{Lifecycle: svc, Inventory: store, CA: ca.Cert, Revoked: svc.Revoked, Racks: []string{"r1"}})
	if err != nil {
		t.Fatal(err)
	}
	bootv1.RegisterAdminServiceServer(gs, adm)
	reflection.Register(gs)
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	return &rig{addr: lis.Addr().String(), ca: ca, sim: s, broker: mon.Broker()}
}

// dial connects as an agent does: TLS pinned to the gpurack CA, with certs as the
// client certificate when given.
func (r *rig) dial(t *testing.T, certs ...tls.Certificate) *grpc.ClientConn {
	t.Helper()
	cfg := pki.ClientConfigPinned(r.ca.Pin())
	cfg.Certificates = certs
	conn, err := grpc.NewClient(r.addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatalf("dial %s: %v", r.addr, err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// operator connects with an operator's client certificate, as gpuboot's CLI does.
func (r *rig) operator(t *testing.T) *grpc.ClientConn {
	t.Helper()
	kp, err := pki.IssueOperator(r.ca, "alice")
	if err != nil {
		t.Fatal(err)
	}
	return r.dial(t, kp.TLSCertificate())
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// --- reflection -----------------------------------------------------------------------

func TestReflectionListsServices(t *testing.T) {
	ctx := testContext(t)
	conn := newRig(t).dial(t)
	stream, err := reflectionv1.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatalf("open reflection stream: %v", err)
	}
	ask := func(req *reflectionv1.ServerReflectionRequest) *reflectionv1.ServerReflectionResponse {
		t.Helper()
		if err := stream.Send(req); err != nil {
			t.Fatalf("reflection send: %v", err)
		}
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("reflection recv: %v", err)
		}
		if e := resp.GetErrorResponse(); e != nil {
			t.Fatalf("reflection error %d: %s", e.GetErrorCode(), e.GetErrorMessage())
		}
		return resp
	}

	var names []string
	for _, s := range ask(&reflectionv1.ServerReflectionRequest{
		MessageRequest: &reflectionv1.ServerReflectionRequest_ListServices{ListServices: ""},
	}).GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	for _, want := range []string{
		"gpurack.agent.v1.AgentService",
		"gpurack.boot.v1.EnrollmentService",
		"gpurack.boot.v1.AdminService",
	} {
		if !slices.Contains(names, want) {
			t.Errorf("reflection lists %v, missing %s", names, want)
		}
	}

	// What grpcurl does next: fetch each service's file with its dependencies and
	// resolve it. This fails if an import (a well-known type, machine.proto) is missing.
	methods := map[string][]string{
		"gpurack.agent.v1.AgentService":     {"Status", "ListGPUs", "RunChecks", "WatchEvents", "InjectFault", "ClearFaults"},
		"gpurack.boot.v1.EnrollmentService": {"Register", "GetJoinBundle", "ReportCommissioning", "Heartbeat", "RenewAgentCertificate"},
		"gpurack.boot.v1.AdminService":      {"ListMachines", "GetMachine", "Approve", "Reject", "Decommission", "History", "ResolveConflict", "RackReport", "RotateGossipKey", "GetGossipKeyStatus", "RevokeOperator", "ListOperatorAudit", "WipeDataDisk", "PowerMachine", "StartRollout", "GetRollout", "PauseRollout", "ResumeRollout", "RollbackRollout", "ReleaseRollout"},
	}
	files := map[string]*descriptorpb.FileDescriptorProto{}
	for svc := range methods {
		resp := ask(&reflectionv1.ServerReflectionRequest{
			MessageRequest: &reflectionv1.ServerReflectionRequest_FileContainingSymbol{FileContainingSymbol: svc},
		})
		for _, raw := range resp.GetFileDescriptorResponse().GetFileDescriptorProto() {
			fd := &descriptorpb.FileDescriptorProto{}
			if err := proto.Unmarshal(raw, fd); err != nil {
				t.Fatalf("decode file descriptor for %s: %v", svc, err)
			}
			files[fd.GetName()] = fd
		}
	}
	set := &descriptorpb.FileDescriptorSet{}
	for _, fd := range files {
		set.File = append(set.File, fd)
	}
	reg, err := protodesc.NewFiles(set)
	if err != nil {
		t.Fatalf("resolve descriptors served by reflection: %v", err)
	}
	for svc, want := range methods {
		d, err := reg.FindDescriptorByName(protoreflect.FullName(svc))
		if err != nil {
			t.Fatalf("find %s in reflected descriptors: %v", svc, err)
		}
		var got []string
		ms := d.(protoreflect.ServiceDescriptor).Methods()
		for i := range ms.Len() {
			got = append(got, string(ms.Get(i).Name()))
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s methods = %v, want %v", svc, got, want)
		}
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatalf("close reflection stream: %v", err)
	}
}

// --- AgentService ---------------------------------------------------------------------

func TestAgentService(t *testing.T) {
	ctx := testContext(t)
	client := agentv1.NewAgentServiceClient(newRig(t).dial(t))

	st, err := client.Status(ctx, &agentv1.StatusRequest{})
	if err != nil {
		t.Fatalf("Status: %v", err)
	}
	if st.GetNodeName() != nodeName || !st.GetSimulated() || st.GetBackend() != "sim:dgxh100" || st.GetImageId() != rackImage {
		t.Errorf("Status node/backend/image = %q/%q/%q simulated=%v", st.GetNodeName(), st.GetBackend(), st.GetImageId(), st.GetSimulated())
	}
	if st.GetHealth().GetState() != machinev1.HealthState_HEALTH_STATE_HEALTHY || st.GetHealth().GetGpuCount() != 8 {
		t.Errorf("health of a healthy simulated node = %v", st.GetHealth())
	}
	// Node-level results (no GPU) and per-GPU results (GPU 0 included) stay distinct
	// through the optional gpu_index.
	var node, gpu0 int
	for _, r := range st.GetLastChecklist().GetResults() {
		switch {
		case r.GpuIndex == nil:
			node++
		case r.GetGpuIndex() == 0:
			gpu0++
		}
	}
	if node == 0 || gpu0 == 0 {
		t.Errorf("last checklist has %d node-level and %d GPU 0 results, want both: %v", node, gpu0, st.GetLastChecklist())
	}

	gpus, err := client.ListGPUs(ctx, &agentv1.ListGPUsRequest{})
	if err != nil || len(gpus.GetGpus()) != 8 || gpus.GetGpus()[3].GetGpu().GetUuid() == "" {
		t.Errorf("ListGPUs = %d GPUs, %v; want 8 with UUIDs", len(gpus.GetGpus()), err)
	}
	if _, err := client.RunChecks(ctx, &agentv1.RunChecksRequest{CheckIds: []string{"gpu.nope"}}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("RunChecks(gpu.nope): err = %v, want INVALID_ARGUMENT", err)
	}
	if _, err := client.InjectFault(ctx, &agentv1.InjectFaultRequest{Fault: &agentv1.FaultSpec{Spec: "xid:79@gpu9"}}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("InjectFault on GPU 9 of 8: err = %v, want INVALID_ARGUMENT", err)
	}
}

// watch collects a WatchEvents stream's events on a channel until the stream ends.
func watch(t *testing.T, ctx context.Context, client agentv1.AgentServiceClient, kinds ...agentv1.EventKind) <-chan *agentv1.Event {
	t.Helper()
	stream, err := client.WatchEvents(ctx, &agentv1.WatchEventsRequest{Kinds: kinds})
	if err != nil {
		t.Fatalf("WatchEvents: %v", err)
	}
	out := make(chan *agentv1.Event, 256)
	go func() {
		defer close(out)
		for {
			ev, err := stream.Recv()
			if err != nil {
				return // the test's end; a missing event shows as a timeout
			}
			out <- ev
		}
	}()
	return out
}

// subscribed publishes pings until each watch has seen one, so that what follows is
// not published before a watch subscribed.
func (r *rig) subscribed(t *testing.T, watches ...<-chan *agentv1.Event) {
	t.Helper()
	for _, w := range watches {
		deadline := time.After(20 * time.Second)
		tick := time.NewTicker(20 * time.Millisecond)
	wait:
		for {
			r.broker.Publish(monitor.Event{Time: time.Now(), Member: &monitor.MemberChange{Change: gossip.Joined, Member: gossip.Member{Name: "gpu-r1-ping"}}})
			select {
			case ev, ok := <-w:
				if !ok {
					t.Fatal("watch ended before its first event")
				}
				if ev.GetMemberChanged().GetMember().GetNodeName() == "gpu-r1-ping" {
					break wait
				}
			case <-tick.C:
			case <-deadline:
				t.Fatal("a watch saw no ping in 20 s")
			}
		}
		tick.Stop()
	}
	// Drain the surplus pings.
	for _, w := range watches {
		for drained := false; !drained; {
			select {
			case <-w:
			case <-time.After(100 * time.Millisecond):
				drained = true
			}
		}
	}
}

// TestAgentWatchEvents injects XID 79 on GPU 3 through the API and follows it on two
// watches: every kind, and XID events only.
func TestAgentWatchEvents(t *testing.T) {
	ctx := testContext(t)
	r := newRig(t)
	client := agentv1.NewAgentServiceClient(r.dial(t))
	all := watch(t, ctx, client)
	xids := watch(t, ctx, client, agentv1.EventKind_EVENT_KIND_XID, agentv1.EventKind_EVENT_KIND_GOSSIP_MEMBER)
	r.subscribed(t, all, xids)

	inj, err := client.InjectFault(ctx, &agentv1.InjectFaultRequest{Fault: &agentv1.FaultSpec{Spec: "xid:79@gpu3"}})
	if err != nil || inj.GetFaultId() == "" || inj.GetFault().GetKind() != agentv1.FaultKind_FAULT_KIND_XID || inj.GetFault().GetGpuIndex() != 3 {
		t.Fatalf("InjectFault(xid:79@gpu3) = %v, %v", inj, err)
	}

	var sawXID, sawUnhealthy bool
	var last uint64
	for !sawXID || !sawUnhealthy {
		select {
		case ev := <-all:
			if ev.GetSequence() <= last || ev.GetNodeName() != nodeName || ev.GetTime() == nil {
				t.Errorf("event sequence %d after %d, node %q, time %v", ev.GetSequence(), last, ev.GetNodeName(), ev.GetTime())
			}
			last = ev.GetSequence()
			if x := ev.GetXid(); x != nil && x.GetXid() == 79 && x.GetGpuIndex() == 3 && x.GetFatal() {
				sawXID = true
			}
			// A fatal XID withdraws that GPU alone (decision 0630): the node is degraded,
			// not unhealthy, and GPU 3 is named.
			if h := ev.GetHealthChanged(); h != nil && h.GetCurrent().GetState() != machinev1.HealthState_HEALTH_STATE_HEALTHY {
				sawUnhealthy = slices.Contains(h.GetCurrent().GetUnhealthyGpuIndexes(), 3)
			}
		case <-ctx.Done():
			t.Fatalf("after XID 79 on GPU 3: saw the XID %v, saw GPU 3 withdrawn %v", sawXID, sawUnhealthy)
		}
	}
	select {
	case ev := <-xids:
		if ev.GetXid().GetXid() != 79 || ev.GetSequence() == 0 {
			t.Errorf("the XID-only watch's first event after the pings = %v", ev)
		}
	case <-ctx.Done():
		t.Fatal("the XID-only watch saw no XID")
	}
	for drained := false; !drained; {
		select {
		case ev := <-xids:
			if ev.GetXid() == nil && ev.GetMemberChanged() == nil {
				t.Errorf("the XID-only watch got %v", ev)
			}
		case <-time.After(200 * time.Millisecond):
			drained = true
		}
	}

	// An XID is an instant; a lasting fault is listed until cleared.
	inj, err = client.InjectFault(ctx, &agentv1.InjectFaultRequest{Fault: &agentv1.FaultSpec{Kind: agentv1.FaultKind_FAULT_KIND_PCIE_LINK_WIDTH, GpuIndex: proto.Int32(1), Value: 8}})
	if err != nil || inj.GetFault().GetSpec() != "pcie-width:8@gpu1" {
		t.Fatalf("InjectFault(PCIe width 8 on GPU 1) = %v, %v", inj, err)
	}
	st, err := client.Status(ctx, &agentv1.StatusRequest{})
	if err != nil || len(st.GetActiveFaults()) != 1 || st.GetActiveFaults()[0].GetFaultId() != inj.GetFaultId() {
		t.Errorf("Status active faults = %v, %v; want the injected one", st.GetActiveFaults(), err)
	}
	cl, err := client.ClearFaults(ctx, &agentv1.ClearFaultsRequest{})
	if err != nil || cl.GetCleared() != 1 {
		t.Errorf("ClearFaults = %v, %v; want 1 cleared", cl, err)
	}
}

// --- EnrollmentService and AdminService -----------------------------------------------

// TestEnrollmentFlow walks one machine through the real gpuboot services as an agent
// and an operator: Register (refused when tampered or signed for another method),
// a pre-approval report, approval over AdminService, Register again for the token,
// GetJoinBundle, and heartbeats with the agent certificate from the bundle.
func TestEnrollmentFlow(t *testing.T) {
	ctx := testContext(t)
	r := newRig(t)
	client := bootv1.NewEnrollmentServiceClient(r.dial(t))
	adminClient := bootv1.NewAdminServiceClient(r.operator(t))
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	sign := func(method string, req bootv1.AuthenticatedRequest) {
		t.Helper()
		if err := bootv1.SignRequest(key, method, req, time.Now()); err != nil {
			t.Fatalf("sign %s: %v", method, err)
		}
	}
	identity := &machinev1.MachineIdentity{BootMac: "52:54:00:12:34:07", SmbiosUuid: "6b2e1c8a-3f4d-4e5a-9b7c-0d1e2f3a4b5c", Serial: "R1-07"}

	reg := &bootv1.RegisterRequest{
		Facts: &machinev1.MachineFacts{
			Identity: identity,
			Hostname: "localhost",
			Ips:      []string{"10.0.0.17"},
			Gpus:     []*machinev1.GPU{{Index: 0, Uuid: "GPU-0", PcieMaxGen: 5, PcieMaxWidth: 16}},
		},
		PublicKey: pub,
	}
	sign(bootv1.EnrollmentService_Register_FullMethodName, reg)

	// A request changed after signing, or signed for another method, is refused.
	tampered := proto.Clone(reg).(*bootv1.RegisterRequest)
	tampered.Facts.Hostname = "evil"
	if _, err := client.Register(ctx, tampered); status.Code(err) != codes.Unauthenticated {
		t.Errorf("Register with a request changed after signing: err = %v, want UNAUTHENTICATED", err)
	}
	wrongMethod := proto.Clone(reg).(*bootv1.RegisterRequest)
	sign(bootv1.EnrollmentService_Heartbeat_FullMethodName, wrongMethod)
	if _, err := client.Register(ctx, wrongMethod); status.Code(err) != codes.Unauthenticated {
		t.Errorf("Register signed for Heartbeat: err = %v, want UNAUTHENTICATED", err)
	}

	resp, err := client.Register(ctx, reg)
	if err != nil || resp.GetStatus() != bootv1.RegisterStatus_REGISTER_STATUS_PENDING || resp.GetToken() != "" {
		t.Fatalf("Register under manual approval = %v, %v; want PENDING without a token", resp, err)
	}

	report := &bootv1.ReportCommissioningRequest{Report: &machinev1.Checklist{
		Identity: identity,
		Phase:    machinev1.CheckPhase_CHECK_PHASE_PRE_APPROVAL,
		Overall:  machinev1.CheckStatus_CHECK_STATUS_FAIL,
		Results:  []*machinev1.CheckResult{{Id: "gpu.pcie.link-width", Status: machinev1.CheckStatus_CHECK_STATUS_FAIL, GpuIndex: proto.Int32(0), Observed: "x8", Expected: "x16"}},
	}}
	sign(bootv1.EnrollmentService_ReportCommissioning_FullMethodName, report)
	if rc, err := client.ReportCommissioning(ctx, report); err != nil || rc.GetMachineState() != bootv1.MachineState_MACHINE_STATE_REGISTERED {
		t.Errorf("pre-approval ReportCommissioning = %v, %v; want stored, REGISTERED", rc, err)
	}

	// The operator sees it waiting and approves it; an agent's connection cannot.
	list, err := adminClient.ListMachines(ctx, &bootv1.ListMachinesRequest{States: []bootv1.MachineState{bootv1.MachineState_MACHINE_STATE_REGISTERED}})
	if err != nil || len(list.GetMachines()) != 1 || list.GetMachines()[0].GetIdentity().GetSerial() != "R1-07" {
		t.Fatalf("ListMachines(registered) = %v, %v; want the machine", list, err)
	}
	machineID := list.GetMachines()[0].GetId()
	if _, err := bootv1.NewAdminServiceClient(r.dial(t)).Approve(ctx, &bootv1.ApproveRequest{Machine: machineID}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("Approve without an operator certificate: err = %v, want UNAUTHENTICATED", err)
	}
	if m, err := adminClient.Approve(ctx, &bootv1.ApproveRequest{Machine: machineID, Reason: "api test"}); err != nil || m.GetState() != bootv1.MachineState_MACHINE_STATE_APPROVED {
		t.Fatalf("Approve = %v, %v", m, err)
	}

	sign(bootv1.EnrollmentService_Register_FullMethodName, reg)
	resp, err = client.Register(ctx, reg)
	if err != nil {
		t.Fatalf("Register after approval: %v", err)
	}
	if resp.GetStatus() != bootv1.RegisterStatus_REGISTER_STATUS_APPROVED || resp.GetToken() == "" || len(resp.GetChallenge()) != bootv1.ChallengeSize || resp.GetTtl().AsDuration() <= 0 {
		t.Fatalf("Register after approval = %v, want APPROVED with a token, a %d-byte challenge and a ttl", resp, bootv1.ChallengeSize)
	}

	get := &bootv1.GetJoinBundleRequest{Token: resp.GetToken(), Signature: bootv1.SignJoinBundle(key, resp.GetChallenge(), resp.GetToken())}
	sign(bootv1.EnrollmentService_GetJoinBundle_FullMethodName, get)
	jb, err := client.GetJoinBundle(ctx, get)
	if err != nil {
		t.Fatalf("GetJoinBundle: %v", err)
	}
	bundle := jb.GetBundle()
	if bundle.GetAgentKeyRef() != bootv1.KeyFingerprint(pub) {
		t.Errorf("agent_key_ref = %q, want the agent's key %q", bundle.GetAgentKeyRef(), bootv1.KeyFingerprint(pub))
	}
	if bundle.GetNodeName() == "" || bundle.GetImageId() != rackImage || bundle.GetGossip().GetRack() != "r1" || len(bundle.GetGossip().GetKey()) != 32 ||
		bundle.GetIdentity().GetSerial() != "R1-07" || bundle.GetExpiresAt() == nil {
		t.Errorf("bundle = %v", bundle)
	}
	checkBundleFileForms(t, bundle)

	// From here the agent uses mutual TLS: the bundle's certificate with its own key.
	cert, err := pki.DecodeCertPEM([]byte(bundle.GetAgentCertificatePem()))
	if err != nil {
		t.Fatalf("agent certificate in the bundle: %v", err)
	}
	mtls := bootv1.NewEnrollmentServiceClient(r.dial(t, tls.Certificate{Certificate: [][]byte{cert.Raw}, PrivateKey: key, Leaf: cert}))
	hb := &bootv1.HeartbeatRequest{Identity: identity, Health: &machinev1.HealthSummary{State: machinev1.HealthState_HEALTH_STATE_HEALTHY, GpuHealthy: true}, Sequence: 1, SentAt: timestamppb.Now()}
	hr, err := mtls.Heartbeat(ctx, hb)
	if err != nil || hr.GetMachineState() != bootv1.MachineState_MACHINE_STATE_JOINING || hr.GetInterval().AsDuration() <= 0 {
		t.Errorf("mTLS Heartbeat = %v, %v; want JOINING with an interval", hr, err)
	}
	if _, err := client.Heartbeat(ctx, hb); status.Code(err) != codes.Unauthenticated {
		t.Errorf("Heartbeat with neither auth nor a certificate: err = %v, want UNAUTHENTICATED", err)
	}

	m, err := adminClient.GetMachine(ctx, &bootv1.GetMachineRequest{Machine: machineID})
	if err != nil || m.GetState() != bootv1.MachineState_MACHINE_STATE_JOINING || len(m.GetHistory()) < 3 {
		t.Errorf("GetMachine = %v, %v; want JOINING with its history", m, err)
	}
	if _, err := adminClient.GetMachine(ctx, &bootv1.GetMachineRequest{Machine: "nope"}); status.Code(err) != codes.NotFound {
		t.Errorf("GetMachine(nope): err = %v, want NOT_FOUND", err)
	}
	rep, err := adminClient.RackReport(ctx, &bootv1.RackReportRequest{Rack: "r1", Format: bootv1.ReportFormat_REPORT_FORMAT_MARKDOWN})
	if err != nil || !strings.HasPrefix(rep.GetContentType(), "text/markdown") || rep.GetData().GetRack() != "r1" || rep.GetData().GetMachinesByState()["joining"] != 1 {
		t.Errorf("RackReport = %v, %v", rep, err)
	}
}

// checkBundleFileForms: the agent reads the bundle from a file in protojson form
// (gpuagent run --join-bundle), written with JSON or proto field names.
func checkBundleFileForms(t *testing.T, bundle *bootv1.JoinBundle) {
	t.Helper()
	data, err := protojson.MarshalOptions{Multiline: true}.Marshal(bundle)
	if err != nil {
		t.Fatalf("protojson marshal JoinBundle: %v", err)
	}
	for _, field := range []string{`"agentKeyRef"`, `"expiresAt"`, `"gossip"`} {
		if !strings.Contains(string(data), field) {
			t.Errorf("protojson JoinBundle lacks %s:\n%s", field, data)
		}
	}
	path := filepath.Join(t.TempDir(), "joinbundle.json")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	fromFile, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	back := &bootv1.JoinBundle{}
	if err := protojson.Unmarshal(fromFile, back); err != nil {
		t.Fatalf("protojson unmarshal JoinBundle file: %v", err)
	}
	if !proto.Equal(back, bundle) {
		t.Errorf("JoinBundle changed through protojson:\n got %v\nwant %v", back, bundle)
	}
	snake, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(bundle)
	if err != nil {
		t.Fatal(err)
	}
	back.Reset()
	if err := protojson.Unmarshal(snake, back); err != nil || !proto.Equal(back, bundle) {
		t.Errorf("JoinBundle with proto field names: err %v, equal %v", err, proto.Equal(back, bundle))
	}
}

// The documented file form of a JoinBundle stays readable, with no unknown fields.
func TestJoinBundleExampleFile(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "joinbundle.json"))
	if err != nil {
		t.Fatal(err)
	}
	b := &bootv1.JoinBundle{}
	if err := protojson.Unmarshal(data, b); err != nil {
		t.Fatalf("testdata/joinbundle.json: %v", err)
	}
	if n := len(b.GetGossip().GetKey()); n != 32 {
		t.Errorf("example gossip key is %d bytes, want 32", n)
	}
	if b.GetNodeName() == "" || b.GetExpiresAt().AsTime().IsZero() || len(b.GetNodeTaints()) != 1 {
		t.Errorf("example bundle incomplete: %v", b)
	}
}
