// Package admin is gpuboot's operator surface on its TLS listener (CONTRACTS §3, §4):
// gpurack.boot.v1.AdminService (gRPC), a read-only REST API over the inventory, an
// HTML rack view with no external assets, the graphs page (package graphs: per-GPU
// series from the metrics server), and the webhook Alertmanager posts the
// active alerts to (for the rack report), and gpuboot's own /metrics for the metrics
// server (decision 0693). Every request must come from an operator:
// a client certificate of the gpurack CA with O=gpurack:operators (not revoked), or,
// for the REST API and the rack view, an operator bearer token. Each call needs an
// operator level (viewer, operator, admin, or alert-sender for the webhook alone and
// metrics-reader for /metrics alone; pki.OperatorLevel), given by one table (levels.go) that refuses what it does not list.
//
// It decides nothing about machines itself: lifecycle actions go to pxe/enroll, reads
// to the inventory (through Lifecycle and Inventory, the two small interfaces declared
// here), reports to pxe/report.
package admin

import (
	"context"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"math/big"
	"net/http"
	"sort"
	"strconv"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	machinev1 "github.com/gpurack/gpurack/api/machine/v1"
	"github.com/gpurack/gpurack/internal/pki"
	"github.com/gpurack/gpurack/pxe/bmc"
	"github.com/gpurack/gpurack/pxe/graphs"
	"github.com/gpurack/gpurack/pxe/inventory"
	"github.com/gpurack/gpurack/pxe/machineops"
	"github.com/gpurack/gpurack/pxe/protoconv"
	"github.com/gpurack/gpurack/pxe/report"
)

// Lifecycle carries out operators' actions on machines; pxe/enroll.Service implements
// it. Every change goes through the enrollment logic, never straight to the inventory.
type Lifecycle interface {
	// Resolve finds the machine an id, node name or boot MAC names.
	Resolve(ctx context.Context, ref string) (*inventory.Machine, error)
	Approve(ctx context.Context, ref string, o machineops.ApproveOptions) (*inventory.Machine, error)
	Reject(ctx context.Context, ref, actor, reason string) (*inventory.Machine, error)
	// Decommission returns the machine and an error when it was decommissioned but
	// cleaning up the cluster failed.
	Decommission(ctx context.Context, ref, actor, reason string) (*inventory.Machine, error)
	ResolveConflict(ctx context.Context, ref, winner, actor, reason string) (*inventory.Machine, error)
	// WipeDataDisk asks the machine's agent to wipe the data disk at path, serial
	// being the operator's confirmation; the request waits on the machine for the
	// agent's next heartbeat over mutual TLS.
	WipeDataDisk(ctx context.Context, ref, path, serial, actor, reason string) (*inventory.Machine, error)
	// PowerMachine does action to the machine through its BMC and waits for the
	// outcome; the Result says what the BMC did, also alongside an error.
	PowerMachine(ctx context.Context, ref string, action bmc.Action, actor, reason string) (*inventory.Machine, bmc.Result, error)
}

// GossipKeys rotates the racks' gossip keys; the enrollment service implements it.
type GossipKeys interface {
	RotateGossipKey(ctx context.Context, rack string) (*bootv1.GossipKeyStatus, error)
	GossipKeyStatus(ctx context.Context, rack string) (*bootv1.GossipKeyStatus, error)
}

// OperatorCredentials revokes operators' certificates and tokens and keeps the audit
// record of revocations.
type OperatorCredentials interface {
	// RevokeOperator revokes r.Operator's recorded certificates and r.Serials, and
	// removes r.Operator's tokens; it returns the serials revoked and the tokens
	// removed, and appends what it did (or what failed) to the audit record.
	RevokeOperator(ctx context.Context, r Revocation) ([]string, int, error)
	// OperatorAudit returns the audit record, oldest first: the last limit entries,
	// all for 0.
	OperatorAudit(ctx context.Context, limit int) ([]*bootv1.OperatorAuditEntry, error)
}

// Revocation is one RevokeOperator call: who (Actor, "operator:NAME", at ActorLevel)
// revokes whom (Operator, and the extra Serials), and why.
type Revocation struct {
	Actor      string
	ActorLevel pki.OperatorLevel
	Operator   string
	Serials    []string
	Reason     string
}

// Inventory is what the operator surface reads; an inventory.Store implements it.
type Inventory interface {
	// List returns every machine.
	List(ctx context.Context) ([]*inventory.Machine, error)
	// History returns a machine's transitions (every machine's for id ""), oldest first.
	History(ctx context.Context, id string) ([]inventory.Transition, error)
}

// Config configures a Server.
type Config struct {
	Lifecycle Lifecycle
	Inventory Inventory
	// CA is the gpurack CA certificate: operator client certificates must be signed by
	// it. Revoked reports whether a certificate serial number is revoked.
	CA      *x509.Certificate
	Revoked func(serial *big.Int) bool
	// Racks are the configured rack names: the index and the rack report know them
	// even before a machine is in them.
	Racks []string
	// Tokens are the operator bearer tokens; nil: client certificates only.
	Tokens *Tokens
	// Gossip rotates gossip keys; nil: RotateGossipKey and GetGossipKeyStatus answer
	// UNIMPLEMENTED.
	Gossip GossipKeys
	// Operators revokes operator credentials; nil: RevokeOperator answers UNIMPLEMENTED.
	Operators OperatorCredentials
	// Quotas reads the tenants' GPU quotas for the rack report; nil: the report shows
	// none (gpuboot has no cluster credential).
	Quotas func(context.Context) (map[string]report.Quota, error)
	// Rollouts runs image rollouts; nil: the rollout methods answer UNIMPLEMENTED.
	Rollouts Rollouts
	// NextImage says which image a machine gets at its next boot and why, for
	// GetMachine; nil: GetMachine leaves next_image out.
	NextImage func(*inventory.Machine) *bootv1.ImageChoice
	// Alerts keeps the alerts Alertmanager posts (POST /api/v1/alerts) for the rack
	// report; nil: the route answers 501 and reports list no alerts.
	Alerts AlertStore
	// PrometheusURL is the metrics server the graphs page (/graphs) draws from
	// (gpuboot.yaml metrics.prometheusURL); empty: the page says it is not configured.
	PrometheusURL string
	// Metrics serves gpuboot's Prometheus metrics at GET /metrics, to the
	// metrics-reader level alone (decision 0693); nil: the route answers 404.
	Metrics http.Handler
}

// Server implements AdminService and the HTTP handlers.
type Server struct {
	bootv1.UnimplementedAdminServiceServer
	life    Lifecycle
	inv     Inventory
	ca      *x509.Certificate
	revoked func(*big.Int) bool
	known   []string // configured rack names
	tokens  *Tokens
	gossip  GossipKeys
	ops     OperatorCredentials
	quotas  func(context.Context) (map[string]report.Quota, error)
	roll    Rollouts
	next    func(*inventory.Machine) *bootv1.ImageChoice
	alerts  AlertStore
	metrics http.Handler
	graphs  *graphs.Graphs
	now     func() time.Time
}

// New returns a Server over cfg.
func New(cfg Config) (*Server, error) {
	switch {
	case cfg.Lifecycle == nil:
		return nil, errors.New("admin: no Lifecycle (the enrollment service)")
	case cfg.Inventory == nil:
		return nil, errors.New("admin: no Inventory (the inventory store)")
	case cfg.CA == nil:
		return nil, errors.New("admin: no gpurack CA certificate (run `gpuboot init` first)")
	case cfg.Revoked == nil:
		return nil, errors.New("admin: no revocation check")
	}
	s := &Server{life: cfg.Lifecycle, inv: cfg.Inventory, ca: cfg.CA, revoked: cfg.Revoked,
		known: append([]string(nil), cfg.Racks...), tokens: cfg.Tokens, gossip: cfg.Gossip, ops: cfg.Operators, quotas: cfg.Quotas,
		roll: cfg.Rollouts, next: cfg.NextImage, alerts: cfg.Alerts, metrics: cfg.Metrics, now: time.Now}
	g, err := graphs.New(graphs.Config{PrometheusURL: cfg.PrometheusURL, KnownNode: s.knownNode,
		Operator: func(r *http.Request) string { name, _ := r.Context().Value(operatorKey{}).(string); return name }})
	if err != nil {
		return nil, fmt.Errorf("admin: graphs: %w", err)
	}
	s.graphs = g
	return s, nil
}

// knownNode says whether a machine in the inventory has node name name, for the
// graphs page.
func (s *Server) knownNode(ctx context.Context, name string) (bool, error) {
	all, err := s.inv.List(ctx)
	if err != nil {
		return false, err
	}
	for _, m := range all {
		if m.NodeName == name {
			return true, nil
		}
	}
	return false, nil
}

// OperatorFromCert returns the operator a verified client certificate chain's leaf
// names, with the level it carries: issued by the gpurack CA, role gpurack:operators,
// not revoked. The level is checked per call (levels).
func (s *Server) OperatorFromCert(certs []*x509.Certificate) (Caller, error) {
	if len(certs) == 0 {
		return Caller{}, status.Error(codes.Unauthenticated, "an operator client certificate is required (gpuboot certs operator NAME)")
	}
	leaf := certs[0]
	if err := leaf.CheckSignatureFrom(s.ca); err != nil {
		return Caller{}, status.Error(codes.Unauthenticated, "client certificate not issued by the gpurack CA")
	}
	if s.revoked(leaf.SerialNumber) {
		return Caller{}, status.Error(codes.Unauthenticated, "client certificate revoked")
	}
	if now := s.now(); now.After(leaf.NotAfter) || now.Before(leaf.NotBefore) {
		return Caller{}, status.Error(codes.Unauthenticated, "client certificate expired or not yet valid")
	}
	if r := pki.RoleOf(leaf); r != pki.RoleOperators {
		return Caller{}, status.Errorf(codes.PermissionDenied, "client certificate role %q; AdminService takes operators (%s) only", r, pki.RoleOperators)
	}
	return Caller{Name: leaf.Subject.CommonName, Level: pki.OperatorLevelOf(leaf)}, nil
}

// operatorCert authenticates the gRPC caller by its client certificate.
func (s *Server) operatorCert(ctx context.Context) (Caller, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return Caller{}, status.Error(codes.Unauthenticated, "no peer")
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return Caller{}, status.Error(codes.Unauthenticated, "an operator client certificate over TLS is required")
	}
	return s.OperatorFromCert(ti.State.PeerCertificates)
}

func grpcError(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	switch {
	case errors.Is(err, inventory.ErrNotFound):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, machineops.ErrInvalid), errors.Is(err, machineops.ErrAmbiguous):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, machineops.ErrPrecondition), errors.Is(err, inventory.ErrIllegalTransition):
		return status.Error(codes.FailedPrecondition, err.Error())
	}
	return status.Error(codes.Internal, err.Error())
}

// ToProto converts an inventory machine (and optionally its history) for the API.
func ToProto(m *inventory.Machine, history []inventory.Transition) *bootv1.Machine {
	p := &bootv1.Machine{
		Id: m.ID, Identity: protoconv.IdentityProto(m.Identity), State: protoconv.StateProto(m.State),
		NodeName: m.NodeName, Rack: m.Rack, Slot: m.Slot, Labels: m.Labels, Profile: m.Profile, ImageId: m.ImageID,
		KeyFingerprint: m.BoundKey, CreatedAt: ts(m.CreatedAt), UpdatedAt: ts(m.UpdatedAt), LastHeartbeatAt: ts(m.LastHeartbeat),
		EkHash: m.EKHash, Bmc: m.BMC,
	}
	if len(m.Facts) > 0 {
		p.Facts = new(machinev1.MachineFacts)
		_ = proto.Unmarshal(m.Facts, p.Facts)
	}
	if len(m.Checklist) > 0 {
		p.Checklist = new(machinev1.Checklist)
		_ = proto.Unmarshal(m.Checklist, p.Checklist)
	}
	if len(m.Health) > 0 {
		p.Health = new(machinev1.HealthSummary)
		_ = proto.Unmarshal(m.Health, p.Health)
	}
	if !m.GPUAllocationAt.IsZero() {
		p.GpuAllocation = new(machinev1.GPUAllocation)
		_ = proto.Unmarshal(m.GPUAllocation, p.GpuAllocation)
	}
	if !m.DataDisksAt.IsZero() {
		p.DataDisks = new(machinev1.DataDisks)
		_ = proto.Unmarshal(m.DataDisks, p.DataDisks)
	}
	p.PendingWipe = protoconv.WipeProto(m.PendingWipe)
	for _, k := range m.Keys {
		p.Keys = append(p.Keys, &bootv1.RegisteredKey{Fingerprint: k.Fingerprint, PublicKey: k.PublicKey, Bound: k.Fingerprint == m.BoundKey,
			RegisteredAt: ts(k.RegisteredAt), LastSeenAt: ts(k.LastSeen), BootId: k.BootID, RemoteAddress: k.Remote, EkHash: k.EKHash})
	}
	if p.KeyFingerprint == "" && len(m.Keys) == 1 {
		p.KeyFingerprint = m.Keys[0].Fingerprint
	}
	for _, t := range history {
		p.History = append(p.History, TransitionProto(t))
	}
	return p
}

// TransitionProto converts a transition.
func TransitionProto(t inventory.Transition) *bootv1.Transition {
	return &bootv1.Transition{MachineId: t.MachineID, From: protoconv.StateProto(t.From), To: protoconv.StateProto(t.To),
		Time: ts(t.Time), Actor: t.Actor, Reason: t.Reason, Action: t.Action}
}

func ts(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

// sortMachines orders by rack, slot, node name, id.
func sortMachines(ms []*inventory.Machine) {
	sort.Slice(ms, func(i, j int) bool {
		a, b := ms[i], ms[j]
		if a.Rack != b.Rack {
			return a.Rack < b.Rack
		}
		if a.Slot != b.Slot {
			return a.Slot < b.Slot
		}
		if a.NodeName != b.NodeName {
			return a.NodeName < b.NodeName
		}
		return a.ID < b.ID
	})
}

// ListMachines implements AdminService.
func (s *Server) ListMachines(ctx context.Context, req *bootv1.ListMachinesRequest) (*bootv1.ListMachinesResponse, error) {
	if _, err := s.operator(ctx, bootv1.AdminService_ListMachines_FullMethodName); err != nil {
		return nil, err
	}
	return s.list(ctx, req)
}

func (s *Server) list(ctx context.Context, req *bootv1.ListMachinesRequest) (*bootv1.ListMachinesResponse, error) {
	all, err := s.inv.List(ctx)
	if err != nil {
		return nil, grpcError(err)
	}
	want := map[inventory.State]bool{}
	for _, st := range req.GetStates() {
		want[protoconv.StateFromProto(st)] = true
	}
	var ms []*inventory.Machine
	for _, m := range all {
		if (len(want) == 0 || want[m.State]) && (req.GetRack() == "" || req.GetRack() == m.Rack) {
			ms = append(ms, m)
		}
	}
	sortMachines(ms)
	start := 0
	if tok := req.GetPageToken(); tok != "" {
		b, err := base64.RawURLEncoding.DecodeString(tok)
		n, err2 := strconv.Atoi(string(b))
		if err != nil || err2 != nil || n < 0 || n > len(ms) {
			return nil, status.Error(codes.InvalidArgument, "bad page_token: pass next_page_token from the previous page")
		}
		start = n
	}
	size := int(req.GetPageSize())
	if size == 0 || size > 500 {
		size = 500
	}
	end := min(start+size, len(ms))
	resp := &bootv1.ListMachinesResponse{}
	for _, m := range ms[start:end] {
		resp.Machines = append(resp.Machines, ToProto(m, nil))
	}
	if end < len(ms) {
		resp.NextPageToken = base64.RawURLEncoding.EncodeToString([]byte(strconv.Itoa(end)))
	}
	return resp, nil
}

// GetMachine implements AdminService.
func (s *Server) GetMachine(ctx context.Context, req *bootv1.GetMachineRequest) (*bootv1.Machine, error) {
	if _, err := s.operator(ctx, bootv1.AdminService_GetMachine_FullMethodName); err != nil {
		return nil, err
	}
	return s.get(ctx, req.GetMachine())
}

func (s *Server) get(ctx context.Context, ref string) (*bootv1.Machine, error) {
	m, err := s.life.Resolve(ctx, ref)
	if err != nil {
		return nil, grpcError(err)
	}
	h, err := s.inv.History(ctx, m.ID)
	if err != nil {
		return nil, grpcError(err)
	}
	p := ToProto(m, h)
	if s.next != nil {
		p.NextImage = s.next(m)
	}
	return p, nil
}

// Approve implements AdminService.
func (s *Server) Approve(ctx context.Context, req *bootv1.ApproveRequest) (*bootv1.Machine, error) {
	op, err := s.operator(ctx, bootv1.AdminService_Approve_FullMethodName)
	if err != nil {
		return nil, err
	}
	m, err := s.life.Approve(ctx, req.GetMachine(), machineops.ApproveOptions{Actor: "operator:" + op.Name, Reason: req.GetReason(),
		NodeName: req.GetNodeName(), Rack: req.GetRack(), Slot: req.GetSlot()})
	if err != nil {
		return nil, grpcError(err)
	}
	return ToProto(m, nil), nil
}

// Reject implements AdminService.
func (s *Server) Reject(ctx context.Context, req *bootv1.RejectRequest) (*bootv1.Machine, error) {
	op, err := s.operator(ctx, bootv1.AdminService_Reject_FullMethodName)
	if err != nil {
		return nil, err
	}
	m, err := s.life.Reject(ctx, req.GetMachine(), "operator:"+op.Name, req.GetReason())
	if err != nil {
		return nil, grpcError(err)
	}
	return ToProto(m, nil), nil
}

// Decommission implements AdminService.
func (s *Server) Decommission(ctx context.Context, req *bootv1.DecommissionRequest) (*bootv1.Machine, error) {
	op, err := s.operator(ctx, bootv1.AdminService_Decommission_FullMethodName)
	if err != nil {
		return nil, err
	}
	m, err := s.life.Decommission(ctx, req.GetMachine(), "operator:"+op.Name, req.GetReason())
	if err != nil && m == nil {
		return nil, grpcError(err)
	}
	if err != nil {
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	return ToProto(m, nil), nil
}

// ResolveConflict implements AdminService.
func (s *Server) ResolveConflict(ctx context.Context, req *bootv1.ResolveConflictRequest) (*bootv1.Machine, error) {
	op, err := s.operator(ctx, bootv1.AdminService_ResolveConflict_FullMethodName)
	if err != nil {
		return nil, err
	}
	m, err := s.life.ResolveConflict(ctx, req.GetMachine(), req.GetWinningKeyFingerprint(), "operator:"+op.Name, req.GetReason())
	if err != nil {
		return nil, grpcError(err)
	}
	return ToProto(m, nil), nil
}

// WipeDataDisk implements AdminService.
func (s *Server) WipeDataDisk(ctx context.Context, req *bootv1.WipeDataDiskRequest) (*bootv1.Machine, error) {
	op, err := s.operator(ctx, bootv1.AdminService_WipeDataDisk_FullMethodName)
	if err != nil {
		return nil, err
	}
	m, err := s.life.WipeDataDisk(ctx, req.GetMachine(), req.GetPath(), req.GetSerial(), "operator:"+op.Name, req.GetReason())
	if err != nil {
		return nil, grpcError(err)
	}
	return ToProto(m, nil), nil
}

// History implements AdminService.
func (s *Server) History(ctx context.Context, req *bootv1.HistoryRequest) (*bootv1.HistoryResponse, error) {
	if _, err := s.operator(ctx, bootv1.AdminService_History_FullMethodName); err != nil {
		return nil, err
	}
	return s.history(ctx, req)
}

func (s *Server) history(ctx context.Context, req *bootv1.HistoryRequest) (*bootv1.HistoryResponse, error) {
	var ts []inventory.Transition
	if req.GetMachine() != "" {
		m, err := s.life.Resolve(ctx, req.GetMachine())
		if err != nil {
			return nil, grpcError(err)
		}
		if ts, err = s.inv.History(ctx, m.ID); err != nil {
			return nil, grpcError(err)
		}
	} else {
		all, err := s.inv.History(ctx, "")
		if err != nil {
			return nil, grpcError(err)
		}
		inRack := map[string]bool{}
		if req.GetRack() != "" {
			ms, err := s.inv.List(ctx)
			if err != nil {
				return nil, grpcError(err)
			}
			for _, m := range ms {
				inRack[m.ID] = m.Rack == req.GetRack()
			}
		}
		for _, t := range all {
			if req.GetRack() == "" || inRack[t.MachineID] {
				ts = append(ts, t)
			}
		}
	}
	resp := &bootv1.HistoryResponse{}
	for _, t := range ts {
		if req.GetSince() != nil && t.Time.Before(req.GetSince().AsTime()) {
			continue
		}
		resp.Transitions = append(resp.Transitions, TransitionProto(t))
	}
	if n := int(req.GetLimit()); n > 0 && len(resp.Transitions) > n {
		resp.Transitions = resp.Transitions[len(resp.Transitions)-n:]
	}
	return resp, nil
}

// RotateGossipKey implements AdminService.
func (s *Server) RotateGossipKey(ctx context.Context, req *bootv1.RotateGossipKeyRequest) (*bootv1.GossipKeyStatus, error) {
	if _, err := s.operator(ctx, bootv1.AdminService_RotateGossipKey_FullMethodName); err != nil {
		return nil, err
	}
	if s.gossip == nil {
		return nil, status.Error(codes.Unimplemented, "this gpuboot does not manage gossip keys")
	}
	if req.GetRack() == "" {
		return nil, status.Error(codes.InvalidArgument, "name the rack whose gossip key to rotate")
	}
	st, err := s.gossip.RotateGossipKey(ctx, req.GetRack())
	return st, grpcError(err)
}

// GetGossipKeyStatus implements AdminService.
func (s *Server) GetGossipKeyStatus(ctx context.Context, req *bootv1.GetGossipKeyStatusRequest) (*bootv1.GossipKeyStatus, error) {
	if _, err := s.operator(ctx, bootv1.AdminService_GetGossipKeyStatus_FullMethodName); err != nil {
		return nil, err
	}
	if s.gossip == nil {
		return nil, status.Error(codes.Unimplemented, "this gpuboot does not manage gossip keys")
	}
	if req.GetRack() == "" {
		return nil, status.Error(codes.InvalidArgument, "name the rack")
	}
	st, err := s.gossip.GossipKeyStatus(ctx, req.GetRack())
	return st, grpcError(err)
}

// RevokeOperator implements AdminService.
func (s *Server) RevokeOperator(ctx context.Context, req *bootv1.RevokeOperatorRequest) (*bootv1.RevokeOperatorResponse, error) {
	caller, err := s.operator(ctx, bootv1.AdminService_RevokeOperator_FullMethodName)
	if err != nil {
		return nil, err
	}
	if s.ops == nil {
		return nil, status.Error(codes.Unimplemented, "this gpuboot does not manage operator credentials")
	}
	if req.GetName() == "" {
		return nil, status.Error(codes.InvalidArgument, "name the operator to revoke")
	}
	if req.GetName() == caller.Name {
		return nil, status.Errorf(codes.FailedPrecondition, "operator %s cannot revoke itself: use another admin's credentials (gpuboot certs operator NAME --level admin issues one)", caller.Name)
	}
	serials, tokens, err := s.ops.RevokeOperator(ctx, Revocation{Actor: "operator:" + caller.Name, ActorLevel: caller.Level,
		Operator: req.GetName(), Serials: req.GetSerials(), Reason: req.GetReason()})
	if err != nil {
		return nil, grpcError(err)
	}
	return &bootv1.RevokeOperatorResponse{Serials: serials, TokensRemoved: int32(tokens)}, nil
}

// ListOperatorAudit implements AdminService.
func (s *Server) ListOperatorAudit(ctx context.Context, req *bootv1.ListOperatorAuditRequest) (*bootv1.ListOperatorAuditResponse, error) {
	if _, err := s.operator(ctx, bootv1.AdminService_ListOperatorAudit_FullMethodName); err != nil {
		return nil, err
	}
	if s.ops == nil {
		return nil, status.Error(codes.Unimplemented, "this gpuboot does not manage operator credentials")
	}
	if req.GetLimit() < 0 {
		return nil, status.Error(codes.InvalidArgument, "limit: give 0 (all) or a positive number")
	}
	entries, err := s.ops.OperatorAudit(ctx, int(req.GetLimit()))
	if err != nil {
		return nil, grpcError(err)
	}
	return &bootv1.ListOperatorAuditResponse{Entries: entries}, nil
}

// RackReport implements AdminService.
func (s *Server) RackReport(ctx context.Context, req *bootv1.RackReportRequest) (*bootv1.RackReportResponse, error) {
	if _, err := s.operator(ctx, bootv1.AdminService_RackReport_FullMethodName); err != nil {
		return nil, err
	}
	return s.rackReport(ctx, req.GetRack(), req.GetFormat())
}

func (s *Server) rackReport(ctx context.Context, rack string, f bootv1.ReportFormat) (*bootv1.RackReportResponse, error) {
	all, err := s.inv.List(ctx)
	if err != nil {
		return nil, grpcError(err)
	}
	if rack == "" {
		racks := s.racks(all)
		if len(racks) != 1 {
			return nil, status.Errorf(codes.InvalidArgument, "gpuboot serves %d racks (%v): name one", len(racks), racks)
		}
		rack = racks[0]
	}
	var ms []*bootv1.Machine
	for _, m := range all {
		ms = append(ms, ToProto(m, nil))
	}
	d := report.Build(rack, ms, s.now())
	if s.alerts != nil {
		report.AddAlerts(d, ms, s.alerts.Active(s.now()))
	}
	if s.quotas != nil {
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		q, err := s.quotas(qctx)
		cancel()
		if err != nil {
			d.QuotaError = err.Error()
		} else {
			report.AddQuotas(d, q)
		}
	}
	content, ct, name, err := report.Render(d, f)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "render report: %v", err)
	}
	return &bootv1.RackReportResponse{Content: content, ContentType: ct, Filename: name, Data: d}, nil
}

// racks lists the configured racks and those machines are in, sorted.
func (s *Server) racks(ms []*inventory.Machine) []string {
	set := map[string]bool{}
	for _, name := range s.known {
		set[name] = true
	}
	for _, m := range ms {
		if m.Rack != "" {
			set[m.Rack] = true
		}
	}
	var out []string
	for r := range set {
		out = append(out, r)
	}
	sort.Strings(out)
	return out
}
