// Package api_test checks the generated APIs end to end: each service is served over a
// real gRPC connection on a loopback listener by a tiny in-test implementation, with
// server reflection registered as gpuagent and gpuboot register it.
package api_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/reflection"
	reflectionv1 "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentv1 "github.com/gpurack/gpurack/api/agent/v1"
	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	machinev1 "github.com/gpurack/gpurack/api/machine/v1"
)

// dial serves the three services and reflection on 127.0.0.1 and returns a client
// connection to them.
func dial(t *testing.T, enroll *enrollServer) *grpc.ClientConn {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen on loopback: %v", err)
	}
	s := grpc.NewServer()
	agentv1.RegisterAgentServiceServer(s, agentServer{})
	bootv1.RegisterEnrollmentServiceServer(s, enroll)
	bootv1.RegisterAdminServiceServer(s, adminServer{})
	reflection.Register(s)
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)

	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("dial %s: %v", lis.Addr(), err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// --- reflection -----------------------------------------------------------------------

func TestReflectionListsServices(t *testing.T) {
	ctx := testContext(t)
	conn := dial(t, newEnrollServer())
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
		"gpurack.boot.v1.EnrollmentService": {"Register", "GetJoinBundle", "ReportCommissioning", "Heartbeat"},
		"gpurack.boot.v1.AdminService":      {"ListMachines", "GetMachine", "Approve", "Reject", "Decommission", "History", "ResolveConflict", "RackReport"},
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

// agentServer is an agent with the NVML backend: a fixed status and a fixed sequence of
// events.
type agentServer struct {
	agentv1.UnimplementedAgentServiceServer
}

func fixedHealth() *machinev1.HealthSummary {
	return &machinev1.HealthSummary{
		State:               machinev1.HealthState_HEALTH_STATE_UNHEALTHY,
		FailingCheckIds:     []string{"gpu.xid.fatal"},
		HealthyGpuCount:     7,
		GpuCount:            8,
		UnhealthyGpuIndexes: []int32{3},
		GpuHealthy:          false,
		GpuHealthyReason:    "XidFatal",
		GpuHealthyMessage:   "GPU 3 reported fatal XID 79.",
	}
}

func (agentServer) Status(context.Context, *agentv1.StatusRequest) (*agentv1.StatusResponse, error) {
	return &agentv1.StatusResponse{
		NodeName:      "gpu-r1-07",
		ImageId:       "3f9a0c1d5e7b2a4c6e8f0a1b3c5d7e9f1a2b4c6d",
		DriverVersion: "570.195.03",
		Backend:       "nvml",
		Enrollment: &agentv1.EnrollmentStatus{
			State:        agentv1.EnrollmentState_ENROLLMENT_STATE_JOINED,
			MachineState: "ready",
		},
		Health: fixedHealth(),
		LastChecklist: &machinev1.Checklist{
			Phase:   machinev1.CheckPhase_CHECK_PHASE_CONTINUOUS,
			Overall: machinev1.CheckStatus_CHECK_STATUS_FAIL,
			Results: []*machinev1.CheckResult{
				{Id: "gpu.count", Status: machinev1.CheckStatus_CHECK_STATUS_PASS, Observed: "8", Expected: "8"},
				{Id: "gpu.xid.fatal", Status: machinev1.CheckStatus_CHECK_STATUS_FAIL, GpuIndex: proto.Int32(3), Observed: "XID 79"},
			},
		},
		Rack: &agentv1.RackView{
			Rack: "r1",
			Members: []*agentv1.RackMember{
				{NodeName: "gpu-r1-07", State: agentv1.MemberState_MEMBER_STATE_ALIVE, Self: true, Health: fixedHealth()},
				{NodeName: "gpu-r1-08", State: agentv1.MemberState_MEMBER_STATE_SUSPECT},
			},
		},
	}, nil
}

func (agentServer) WatchEvents(req *agentv1.WatchEventsRequest, stream grpc.ServerStreamingServer[agentv1.Event]) error {
	all := []struct {
		kind agentv1.EventKind
		ev   *agentv1.Event
	}{
		{agentv1.EventKind_EVENT_KIND_XID, &agentv1.Event{Payload: &agentv1.Event_Xid{Xid: &agentv1.XIDEvent{GpuIndex: proto.Int32(3), Xid: 79, Fatal: true}}}},
		{agentv1.EventKind_EVENT_KIND_CHECK_RESULT, &agentv1.Event{Payload: &agentv1.Event_CheckResultChanged{CheckResultChanged: &agentv1.CheckResultChanged{
			Current: &machinev1.CheckResult{Id: "gpu.xid.fatal", Status: machinev1.CheckStatus_CHECK_STATUS_FAIL, GpuIndex: proto.Int32(3)},
		}}}},
		{agentv1.EventKind_EVENT_KIND_HEALTH, &agentv1.Event{Payload: &agentv1.Event_HealthChanged{HealthChanged: &agentv1.HealthChanged{Current: fixedHealth()}}}},
		{agentv1.EventKind_EVENT_KIND_GOSSIP_MEMBER, &agentv1.Event{Payload: &agentv1.Event_MemberChanged{MemberChanged: &agentv1.GossipMemberChanged{
			Change: agentv1.MemberChange_MEMBER_CHANGE_FAILED,
			Member: &agentv1.RackMember{NodeName: "gpu-r1-08", State: agentv1.MemberState_MEMBER_STATE_DEAD},
		}}}},
	}
	var seq uint64
	for _, e := range all {
		if len(req.GetKinds()) > 0 && !slices.Contains(req.GetKinds(), e.kind) {
			continue
		}
		seq++
		e.ev.Sequence = seq
		e.ev.NodeName = "gpu-r1-07"
		e.ev.Time = timestamppb.Now()
		if err := stream.Send(e.ev); err != nil {
			return err
		}
	}
	return nil // a real agent streams until the client cancels
}

func (agentServer) InjectFault(context.Context, *agentv1.InjectFaultRequest) (*agentv1.InjectFaultResponse, error) {
	return nil, status.Error(codes.FailedPrecondition, "fault injection needs the simulator backend; this agent runs nvml")
}

func TestAgentService(t *testing.T) {
	ctx := testContext(t)
	client := agentv1.NewAgentServiceClient(dial(t, newEnrollServer()))

	st, err := client.Status(ctx, &agentv1.StatusRequest{})
	if err != nil {
		t.Fatalf("Status: %v", err)
	}
	if st.GetNodeName() != "gpu-r1-07" || st.GetSimulated() || st.GetBackend() != "nvml" {
		t.Errorf("Status node/backend = %q/%q simulated=%v", st.GetNodeName(), st.GetBackend(), st.GetSimulated())
	}
	if got := st.GetEnrollment().GetState(); got != agentv1.EnrollmentState_ENROLLMENT_STATE_JOINED {
		t.Errorf("enrollment state = %v, want JOINED", got)
	}
	if !proto.Equal(st.GetHealth(), fixedHealth()) {
		t.Errorf("health = %v, want %v", st.GetHealth(), fixedHealth())
	}
	results := st.GetLastChecklist().GetResults()
	if len(results) != 2 || results[0].GpuIndex != nil || results[1].GetGpuIndex() != 3 {
		t.Errorf("results lost node-level vs per-GPU distinction: %v", results)
	}
	if m := st.GetRack().GetMembers(); len(m) != 2 || !m[0].GetSelf() || m[1].GetState() != agentv1.MemberState_MEMBER_STATE_SUSPECT {
		t.Errorf("rack members = %v", m)
	}

	_, err = client.InjectFault(ctx, &agentv1.InjectFaultRequest{Fault: &agentv1.FaultSpec{Spec: "xid:79@gpu3"}})
	if status.Code(err) != codes.FailedPrecondition {
		t.Errorf("InjectFault on nvml backend: err = %v, want FAILED_PRECONDITION", err)
	}
}

func TestAgentWatchEvents(t *testing.T) {
	ctx := testContext(t)
	client := agentv1.NewAgentServiceClient(dial(t, newEnrollServer()))

	recv := func(req *agentv1.WatchEventsRequest) []*agentv1.Event {
		t.Helper()
		stream, err := client.WatchEvents(ctx, req)
		if err != nil {
			t.Fatalf("WatchEvents: %v", err)
		}
		var evs []*agentv1.Event
		for {
			ev, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				return evs
			}
			if err != nil {
				t.Fatalf("WatchEvents recv after %d events: %v", len(evs), err)
			}
			evs = append(evs, ev)
		}
	}

	evs := recv(&agentv1.WatchEventsRequest{})
	if len(evs) != 4 {
		t.Fatalf("got %d events, want 4: %v", len(evs), evs)
	}
	for i, ev := range evs {
		if ev.GetSequence() != uint64(i+1) || ev.GetNodeName() != "gpu-r1-07" || ev.GetTime() == nil {
			t.Errorf("event %d: sequence %d node %q time %v", i, ev.GetSequence(), ev.GetNodeName(), ev.GetTime())
		}
	}
	if x := evs[0].GetXid(); x.GetXid() != 79 || x.GetGpuIndex() != 3 || !x.GetFatal() {
		t.Errorf("first event = %v, want fatal XID 79 on GPU 3", evs[0])
	}
	if c := evs[1].GetCheckResultChanged(); c.GetPrevious() != nil || c.GetCurrent().GetId() != "gpu.xid.fatal" {
		t.Errorf("second event = %v, want gpu.xid.fatal result change", evs[1])
	}
	if h := evs[2].GetHealthChanged(); h.GetCurrent().GetState() != machinev1.HealthState_HEALTH_STATE_UNHEALTHY {
		t.Errorf("third event = %v, want health change to UNHEALTHY", evs[2])
	}
	if m := evs[3].GetMemberChanged(); m.GetChange() != agentv1.MemberChange_MEMBER_CHANGE_FAILED || m.GetMember().GetNodeName() != "gpu-r1-08" {
		t.Errorf("fourth event = %v, want gpu-r1-08 failed", evs[3])
	}

	only := recv(&agentv1.WatchEventsRequest{Kinds: []agentv1.EventKind{agentv1.EventKind_EVENT_KIND_GOSSIP_MEMBER}})
	if len(only) != 1 || only[0].GetMemberChanged() == nil || only[0].GetSequence() != 1 {
		t.Errorf("filtered to gossip events, got %v", only)
	}
}

// --- EnrollmentService ----------------------------------------------------------------

// enrollServer approves every registration at once, verifying the request signatures
// the way gpuboot must.
type enrollServer struct {
	bootv1.UnimplementedEnrollmentServiceServer
	challenge []byte
	key       ed25519.PublicKey // registered by Register
}

func newEnrollServer() *enrollServer {
	c := make([]byte, bootv1.ChallengeSize)
	_, _ = rand.Read(c)
	return &enrollServer{challenge: c}
}

const testToken = "tok-0123456789"

func verify(ctx context.Context, req bootv1.AuthenticatedRequest) (ed25519.PublicKey, error) {
	method, _ := grpc.Method(ctx)
	pub, err := bootv1.VerifyRequest(method, req, time.Now())
	if err != nil {
		return nil, status.Error(codes.Unauthenticated, err.Error())
	}
	return pub, nil
}

func (s *enrollServer) Register(ctx context.Context, req *bootv1.RegisterRequest) (*bootv1.RegisterResponse, error) {
	pub, err := verify(ctx, req)
	if err != nil {
		return nil, err
	}
	if !pub.Equal(ed25519.PublicKey(req.GetPublicKey())) {
		return nil, status.Error(codes.Unauthenticated, "auth.public_key differs from public_key")
	}
	s.key = pub
	return &bootv1.RegisterResponse{
		Status:       bootv1.RegisterStatus_REGISTER_STATUS_APPROVED,
		Token:        testToken,
		Challenge:    s.challenge,
		Ttl:          durationpb.New(5 * time.Minute),
		MachineState: bootv1.MachineState_MACHINE_STATE_APPROVED,
	}, nil
}

func (s *enrollServer) GetJoinBundle(ctx context.Context, req *bootv1.GetJoinBundleRequest) (*bootv1.GetJoinBundleResponse, error) {
	if _, err := verify(ctx, req); err != nil {
		return nil, err
	}
	if req.GetToken() != testToken {
		return nil, status.Error(codes.NotFound, "unknown token")
	}
	if err := bootv1.VerifyJoinBundle(s.key, s.challenge, req.GetToken(), req.GetSignature()); err != nil {
		return nil, status.Error(codes.PermissionDenied, err.Error())
	}
	return &bootv1.GetJoinBundleResponse{Bundle: &bootv1.JoinBundle{
		ApiServerEndpoint:   "https://10.0.0.2:6443",
		ClusterCaPem:        "-----BEGIN CERTIFICATE-----\nY2x1c3Rlcg==\n-----END CERTIFICATE-----\n",
		BootstrapToken:      "07401b.f395accd246ae52d",
		NodeName:            "gpu-r1-07",
		AgentCertificatePem: "-----BEGIN CERTIFICATE-----\nYWdlbnQ=\n-----END CERTIFICATE-----\n",
		AgentKeyRef:         bootv1.KeyFingerprint(s.key),
		GpurackCaPem:        "-----BEGIN CERTIFICATE-----\nZ3B1cmFjaw==\n-----END CERTIFICATE-----\n",
		Gossip: &bootv1.GossipConfig{
			Key:   []byte("0123456789abcdef0123456789abcdef"),
			Seeds: []string{"10.0.0.11:7946", "10.0.0.12:7946"},
			Rack:  "r1",
		},
		ImageId:       "3f9a0c1d5e7b2a4c6e8f0a1b3c5d7e9f1a2b4c6d",
		ExpiresAt:     timestamppb.New(time.Date(2025, 1, 1, 12, 15, 0, 0, time.UTC)),
		IssuedAt:      timestamppb.New(time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)),
		Identity:      &machinev1.MachineIdentity{BootMac: "52:54:00:12:34:07", Serial: "R1-07"},
		NodeLabels:    map[string]string{"example.com/pool": "training", "example.com/zone": "a"},
		NodeTaints:    []*bootv1.Taint{{Key: "nvidia.com/gpu", Value: "present", Effect: "NoSchedule"}},
		ClusterDns:    []string{"10.96.0.10"},
		ClusterDomain: "cluster.local",
	}}, nil
}

func (s *enrollServer) ReportCommissioning(ctx context.Context, req *bootv1.ReportCommissioningRequest) (*bootv1.ReportCommissioningResponse, error) {
	if _, err := verify(ctx, req); err != nil {
		return nil, err
	}
	st := bootv1.MachineState_MACHINE_STATE_READY
	if req.GetReport().GetOverall() == machinev1.CheckStatus_CHECK_STATUS_FAIL {
		st = bootv1.MachineState_MACHINE_STATE_QUARANTINED
	}
	return &bootv1.ReportCommissioningResponse{MachineState: st}, nil
}

func (s *enrollServer) Heartbeat(ctx context.Context, req *bootv1.HeartbeatRequest) (*bootv1.HeartbeatResponse, error) {
	if _, err := verify(ctx, req); err != nil {
		return nil, err
	}
	return &bootv1.HeartbeatResponse{MachineState: bootv1.MachineState_MACHINE_STATE_READY, Interval: durationpb.New(10 * time.Second)}, nil
}

func TestEnrollmentFlow(t *testing.T) {
	ctx := testContext(t)
	client := bootv1.NewEnrollmentServiceClient(dial(t, newEnrollServer()))
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
	if err != nil {
		t.Fatalf("Register: %v", err)
	}
	if resp.GetStatus() != bootv1.RegisterStatus_REGISTER_STATUS_APPROVED || len(resp.GetChallenge()) != bootv1.ChallengeSize || resp.GetTtl().AsDuration() != 5*time.Minute {
		t.Fatalf("Register = %v, want APPROVED with a 32-byte challenge and a 5 min ttl", resp)
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

	// The agent reads the bundle from a file in protojson form (gpuagent run --join-bundle).
	data, err := protojson.MarshalOptions{Multiline: true}.Marshal(bundle)
	if err != nil {
		t.Fatalf("protojson marshal JoinBundle: %v", err)
	}
	for _, field := range []string{`"apiServerEndpoint"`, `"agentKeyRef"`, `"expiresAt"`, `"2025-01-01T12:15:00Z"`} {
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
	// Files written with the proto field names read the same.
	snake, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(bundle)
	if err != nil {
		t.Fatal(err)
	}
	back.Reset()
	if err := protojson.Unmarshal(snake, back); err != nil || !proto.Equal(back, bundle) {
		t.Errorf("JoinBundle with proto field names: err %v, equal %v", err, proto.Equal(back, bundle))
	}

	report := &bootv1.ReportCommissioningRequest{Report: &machinev1.Checklist{
		Identity: identity,
		Phase:    machinev1.CheckPhase_CHECK_PHASE_COMMISSIONING,
		Overall:  machinev1.CheckStatus_CHECK_STATUS_FAIL,
		Results:  []*machinev1.CheckResult{{Id: "gpu.pcie.link-width", Status: machinev1.CheckStatus_CHECK_STATUS_FAIL, GpuIndex: proto.Int32(0), Observed: "x8", Expected: "x16"}},
	}}
	sign(bootv1.EnrollmentService_ReportCommissioning_FullMethodName, report)
	rc, err := client.ReportCommissioning(ctx, report)
	if err != nil || rc.GetMachineState() != bootv1.MachineState_MACHINE_STATE_QUARANTINED {
		t.Errorf("ReportCommissioning of a failing checklist = %v, %v; want QUARANTINED", rc, err)
	}

	hb := &bootv1.HeartbeatRequest{Identity: identity, Health: fixedHealth(), Sequence: 1, SentAt: timestamppb.Now()}
	sign(bootv1.EnrollmentService_Heartbeat_FullMethodName, hb)
	hr, err := client.Heartbeat(ctx, hb)
	if err != nil || hr.GetInterval().AsDuration() != 10*time.Second {
		t.Errorf("Heartbeat = %v, %v", hr, err)
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

// --- AdminService ---------------------------------------------------------------------

type adminServer struct {
	bootv1.UnimplementedAdminServiceServer
}

var testMachine = &bootv1.Machine{
	Id:       "m-1",
	Identity: &machinev1.MachineIdentity{BootMac: "52:54:00:12:34:07"},
	State:    bootv1.MachineState_MACHINE_STATE_READY,
	NodeName: "gpu-r1-07",
	Rack:     "r1",
	Slot:     "U7",
	Labels:   map[string]string{"site": "lab"},
}

func (adminServer) ListMachines(_ context.Context, req *bootv1.ListMachinesRequest) (*bootv1.ListMachinesResponse, error) {
	resp := &bootv1.ListMachinesResponse{}
	if (req.GetRack() == "" || req.GetRack() == testMachine.GetRack()) &&
		(len(req.GetStates()) == 0 || slices.Contains(req.GetStates(), testMachine.GetState())) {
		resp.Machines = append(resp.Machines, testMachine)
	}
	return resp, nil
}

func (adminServer) GetMachine(_ context.Context, req *bootv1.GetMachineRequest) (*bootv1.Machine, error) {
	if req.GetMachine() != testMachine.GetId() && req.GetMachine() != testMachine.GetNodeName() {
		return nil, status.Errorf(codes.NotFound, "no machine %q", req.GetMachine())
	}
	m := proto.Clone(testMachine).(*bootv1.Machine)
	m.History = []*bootv1.Transition{{
		MachineId: m.GetId(),
		From:      bootv1.MachineState_MACHINE_STATE_COMMISSIONING,
		To:        bootv1.MachineState_MACHINE_STATE_READY,
		Time:      timestamppb.Now(),
		Actor:     "agent:sha256:00",
		Reason:    "commissioning passed",
	}}
	return m, nil
}

func (adminServer) RackReport(_ context.Context, req *bootv1.RackReportRequest) (*bootv1.RackReportResponse, error) {
	if req.GetFormat() != bootv1.ReportFormat_REPORT_FORMAT_MARKDOWN {
		return nil, status.Error(codes.Unimplemented, "test server renders markdown only")
	}
	return &bootv1.RackReportResponse{
		Content:     []byte("# Rack r1\n"),
		ContentType: "text/markdown; charset=utf-8",
		Data: &bootv1.RackReportData{
			Rack:            "r1",
			MachinesByState: map[string]uint32{"ready": 1},
			Checks:          []*bootv1.CheckTally{{Id: "gpu.count", Pass: 1}},
		},
	}, nil
}

func TestAdminService(t *testing.T) {
	ctx := testContext(t)
	client := bootv1.NewAdminServiceClient(dial(t, newEnrollServer()))

	list, err := client.ListMachines(ctx, &bootv1.ListMachinesRequest{Rack: "r1", States: []bootv1.MachineState{bootv1.MachineState_MACHINE_STATE_READY}})
	if err != nil || len(list.GetMachines()) != 1 || !proto.Equal(list.GetMachines()[0], testMachine) {
		t.Errorf("ListMachines(ready, r1) = %v, %v", list, err)
	}
	list, err = client.ListMachines(ctx, &bootv1.ListMachinesRequest{States: []bootv1.MachineState{bootv1.MachineState_MACHINE_STATE_QUARANTINED}})
	if err != nil || len(list.GetMachines()) != 0 {
		t.Errorf("ListMachines(quarantined) = %v, %v; want none", list, err)
	}

	m, err := client.GetMachine(ctx, &bootv1.GetMachineRequest{Machine: "gpu-r1-07"})
	if err != nil || len(m.GetHistory()) != 1 || m.GetHistory()[0].GetTo() != bootv1.MachineState_MACHINE_STATE_READY {
		t.Errorf("GetMachine = %v, %v", m, err)
	}
	if _, err := client.GetMachine(ctx, &bootv1.GetMachineRequest{Machine: "nope"}); status.Code(err) != codes.NotFound {
		t.Errorf("GetMachine(nope): err = %v, want NOT_FOUND", err)
	}
	if _, err := client.Approve(ctx, &bootv1.ApproveRequest{Machine: "m-1"}); status.Code(err) != codes.Unimplemented {
		t.Errorf("Approve on a server without it: err = %v, want UNIMPLEMENTED", err)
	}

	rep, err := client.RackReport(ctx, &bootv1.RackReportRequest{Rack: "r1", Format: bootv1.ReportFormat_REPORT_FORMAT_MARKDOWN})
	if err != nil {
		t.Fatalf("RackReport: %v", err)
	}
	if string(rep.GetContent()) != "# Rack r1\n" || rep.GetContentType() != "text/markdown; charset=utf-8" || rep.GetData().GetMachinesByState()["ready"] != 1 {
		t.Errorf("RackReport = %v", rep)
	}
}
