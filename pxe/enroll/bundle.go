package enroll

import (
	"context"
	"crypto/ed25519"
	"crypto/subtle"
	"crypto/x509"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"sort"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	machinev1 "github.com/gpurack/gpurack/api/machine/v1"
	"github.com/gpurack/gpurack/internal/disksel"
	"github.com/gpurack/gpurack/internal/pki"
	"github.com/gpurack/gpurack/pxe/inventory"
	"github.com/gpurack/gpurack/pxe/policy"
	"github.com/gpurack/gpurack/pxe/protoconv"
)

// GossipPort is memberlist's port on every agent (CONTRACTS §3).
const GossipPort = 7946

// maxSeeds is how many gossip seeds a bundle lists.
const maxSeeds = 5

// GetJoinBundle implements EnrollmentService.GetJoinBundle (CONTRACTS §2.5, §4): the
// bundle goes once, to the holder of the key the token was issued to, for an approved
// machine only.
func (s *Service) GetJoinBundle(ctx context.Context, req *bootv1.GetJoinBundleRequest) (*bootv1.GetJoinBundleResponse, error) {
	resp, err := s.getJoinBundle(ctx, req)
	s.stats.mu.Lock()
	if err != nil {
		s.stats.BundlesRefused[status.Code(err).String()]++
	} else {
		s.stats.BundlesReleased++
	}
	s.stats.mu.Unlock()
	return resp, err
}

func (s *Service) getJoinBundle(ctx context.Context, req *bootv1.GetJoinBundleRequest) (*bootv1.GetJoinBundleResponse, error) {
	now := s.cfg.Now()
	pub, err := bootv1.VerifyRequest(bootv1.EnrollmentService_GetJoinBundle_FullMethodName, req, now)
	if err != nil {
		return nil, status.Error(codes.Unauthenticated, err.Error())
	}
	token := req.GetToken()
	id, _, ok := strings.Cut(token, ".")
	if !ok || id == "" || len(token) > 128 {
		return nil, status.Error(codes.NotFound, "unknown or expired token: call Register again")
	}
	// Look the machine up before taking its lock: a lock made for every token id a
	// caller invents would be kept forever (machine locks are never dropped).
	if _, err := s.store.Get(ctx, id); errors.Is(err, inventory.ErrNotFound) {
		return nil, status.Error(codes.NotFound, "unknown or expired token: call Register again")
	} else if err != nil {
		return nil, status.Errorf(codes.Internal, "join bundle: %v", err)
	}
	lock := s.machineLock(id)
	lock.Lock()
	defer lock.Unlock()
	m, err := s.store.Get(ctx, id) // again, under the lock
	if err != nil {
		return nil, status.Errorf(codes.Internal, "join bundle: %v", err)
	}
	fp := bootv1.KeyFingerprint(pub)
	if err := checkRedeem(m, token, fp, pub, req.GetSignature(), now); err != nil {
		s.log.Warn("join bundle refused", "machine", m.ID, "key", short(fp), "remote", remoteOf(ctx), "err", err)
		return nil, err
	}
	if m.NodeName == "" {
		name, err := s.assignNodeName(ctx, m)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "join bundle: %v", err)
		}
		m.NodeName = name
	}

	// Credentials are made outside the transaction (I/O); if the transaction then
	// fails they are withdrawn.
	var facts machinev1.MachineFacts
	_ = proto.Unmarshal(m.Facts, &facts)
	// The agent's own key is certified (JoinBundle.agent_key_ref): it never travels. Its
	// IP SANs are the address gpuboot saw the call come from, never the facts' (issue 14).
	cert, err := pki.CertifyAgentFor(s.cfg.CA, m.NodeName, observedIPs(ctx), pub, s.cfg.AgentCertValidity)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "join bundle: %v", err)
	}
	serial := cert.SerialNumber.Text(16)
	var tokenID, bootstrapToken string
	if s.cfg.Cluster != nil {
		tokenID, bootstrapToken, err = s.cfg.Cluster.MintBootstrapToken(ctx, m.NodeName, s.cfg.BootstrapTTL)
		if err != nil {
			s.revoke(serial)
			return nil, status.Errorf(codes.Unavailable, "join bundle: mint bootstrap token: %v", err)
		}
	}
	nodeName := m.NodeName
	m, err = s.update(ctx, id, func(m *inventory.Machine) ([]inventory.Transition, error) {
		if err := checkRedeem(m, token, fp, pub, req.GetSignature(), now); err != nil {
			return nil, err
		}
		m.NodeName = nodeName
		m.Approval.Used = true
		m.Keys[m.FindKey(fp)].BundleReleased = true
		m.Keys[m.FindKey(fp)].LastSeen = now.UTC()
		m.AgentCertSerials = append(m.AgentCertSerials, serial)
		if tokenID != "" {
			m.BootstrapTokenIDs = append(m.BootstrapTokenIDs, tokenID)
		}
		t, err := inventory.Move(m, inventory.Joining, agentActor(fp), fmt.Sprintf("JoinBundle released for node %s", nodeName), now)
		if err != nil {
			return nil, err
		}
		return []inventory.Transition{t}, nil
	})
	if err != nil {
		s.revoke(serial)
		if tokenID != "" {
			_ = s.cfg.Cluster.DeleteBootstrapToken(context.WithoutCancel(ctx), tokenID)
		}
		if _, ok := status.FromError(err); ok {
			return nil, err
		}
		return nil, status.Errorf(codes.Internal, "join bundle: %v", err)
	}
	b, err := s.bundle(ctx, m, cert, bootstrapToken, fp, now)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "join bundle: %v", err)
	}
	s.log.Info("join bundle released", "machine", m.ID, "node", m.NodeName, "key", short(fp))
	return &bootv1.GetJoinBundleResponse{Bundle: b}, nil
}

// checkRedeem decides whether the token, key and signature redeem m's approval now.
// It is pure; the errors are gRPC statuses as enroll.proto documents them.
func checkRedeem(m *inventory.Machine, token, fp string, pub ed25519.PublicKey, sig []byte, now time.Time) error {
	a := m.Approval
	if a == nil || subtle.ConstantTimeCompare([]byte(a.Token), []byte(token)) != 1 {
		return status.Error(codes.NotFound, "unknown or expired token: call Register again")
	}
	if a.Used {
		return status.Error(codes.FailedPrecondition, "the JoinBundle for this token was already released")
	}
	if !now.Before(a.ExpiresAt) {
		return status.Error(codes.NotFound, "unknown or expired token: call Register again")
	}
	if a.KeyFingerprint != fp || m.BoundKey != fp || m.FindKey(fp) < 0 {
		return status.Error(codes.PermissionDenied, "the token was issued to another key")
	}
	if err := bootv1.VerifyJoinBundle(pub, a.Challenge, token, sig); err != nil {
		return status.Error(codes.PermissionDenied, err.Error())
	}
	if m.State != inventory.Approved {
		return status.Errorf(codes.FailedPrecondition, "machine is %s, not approved", m.State)
	}
	return nil
}

func (s *Service) revoke(serial string) {
	n, ok := new(big.Int).SetString(serial, 16)
	if !ok {
		return
	}
	if s.cfg.Revocations.Revoke(n) && s.cfg.RevocationsPath != "" {
		if err := s.cfg.Revocations.Save(s.cfg.RevocationsPath); err != nil {
			s.log.Error("save revocation list", "path", s.cfg.RevocationsPath, "err", err)
		}
	}
}

// bundle assembles the JoinBundle (CONTRACTS §4).
func (s *Service) bundle(ctx context.Context, m *inventory.Machine, cert *x509.Certificate, bootstrapToken, fp string, now time.Time) (*bootv1.JoinBundle, error) {
	ring, _ := s.rings.get(m.Rack)
	b := &bootv1.JoinBundle{
		BootstrapToken:      bootstrapToken,
		NodeName:            m.NodeName,
		AgentCertificatePem: string(pki.EncodeCertPEM(cert)),
		AgentKeyRef:         fp,
		GpurackCaPem:        string(pki.EncodeCertPEM(s.cfg.CA.Cert)),
		Gossip:              &bootv1.GossipConfig{Key: append([]byte(nil), ring.Primary...), AcceptedKeys: ring.Accepted(), Rack: m.Rack},
		ImageId:             m.ImageID,
		ExpiresAt:           timestamppb.New(now.Add(s.cfg.BootstrapTTL)),
		IssuedAt:            timestamppb.New(now),
		Identity:            protoconv.IdentityProto(m.Identity),
		ClusterDns:          s.cfg.ClusterDNS,
		ClusterDomain:       s.cfg.ClusterDomain,
	}
	if pn := s.cfg.PodNetwork; pn.GetSubnet() != "" || pn.GetBackend() != "" {
		b.PodNetwork = &bootv1.PodNetwork{Subnet: pn.GetSubnet(), Backend: pn.GetBackend()}
	}
	if sel, ok := policy.Select(s.cfg.Selectors, Labels(m)); ok {
		b.NodeLabels = sel.NodeLabels
		for _, raw := range sel.NodeTaints {
			if t, err := policy.ParseTaint(raw); err == nil {
				b.NodeTaints = append(b.NodeTaints, &bootv1.Taint{Key: t.Key, Value: t.Value, Effect: t.Effect})
			}
		}
		b.DataDisks = dataDiskRules(sel.DataDisks)
	}
	if s.cfg.Cluster != nil {
		b.ApiServerEndpoint = s.cfg.Cluster.Endpoint()
		b.ClusterCaPem = s.cfg.Cluster.CAPEM()
		b.ApiServers = apiServers(b.ApiServerEndpoint, s.cfg.APIServers)
	}
	b.LogsEndpoint = s.cfg.LogsEndpoint
	b.Registry = s.cfg.Registry
	seeds, err := s.gossipSeeds(ctx, m)
	if err != nil {
		return nil, err
	}
	b.Gossip.Seeds = seeds
	return b, nil
}

// gossipSeeds lists the first address of up to maxSeeds other machines of the rack
// that hold a bundle, ordered by node name.
func (s *Service) gossipSeeds(ctx context.Context, self *inventory.Machine) ([]string, error) {
	all, err := s.store.List(ctx)
	if err != nil {
		return nil, err
	}
	sort.Slice(all, func(i, j int) bool { return all[i].NodeName < all[j].NodeName })
	var seeds []string
	for _, m := range all {
		if m.ID == self.ID || m.Rack != self.Rack || len(seeds) >= maxSeeds {
			continue
		}
		switch m.State {
		case inventory.Joining, inventory.Commissioning, inventory.Ready, inventory.Quarantined:
		default:
			continue
		}
		var f machinev1.MachineFacts
		if proto.Unmarshal(m.Facts, &f) != nil {
			continue
		}
		if ips := factsIPs(&f); len(ips) > 0 {
			seeds = append(seeds, net.JoinHostPort(ips[0].String(), fmt.Sprint(GossipPort)))
		}
	}
	return seeds, nil
}

// observedIPs is the agent's address as gpuboot itself observed it: the source address
// of this call, unless it is loopback, link-local or unspecified. The addresses a machine
// reports in its facts are its own claim: one naming gpuboot's address would otherwise
// get a certificate a client could take for gpuboot's.
func observedIPs(ctx context.Context) []net.IP {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return nil
	}
	ap, err := netip.ParseAddrPort(p.Addr.String())
	if err != nil {
		return nil
	}
	a := ap.Addr().Unmap()
	if a.IsLoopback() || a.IsLinkLocalUnicast() || a.IsUnspecified() {
		return nil
	}
	return []net.IP{net.IP(a.AsSlice())}
}

func factsIPs(f *machinev1.MachineFacts) []net.IP {
	var ips []net.IP
	for _, s := range f.GetIps() {
		if ip := net.ParseIP(s); ip != nil && !ip.IsLoopback() && !ip.IsLinkLocalUnicast() {
			if v4 := ip.To4(); v4 != nil {
				ip = v4
			}
			ips = append(ips, ip)
		}
	}
	return ips
}

// assignNodeName picks the node name for m: "<prefix>-<rack>-<slot>" when the slot is
// known and the name is free, else "<prefix>-<rack>-<id>" (sanitised to an RFC 1123
// subdomain).
func (s *Service) assignNodeName(ctx context.Context, m *inventory.Machine) (string, error) {
	s.names.Lock()
	defer s.names.Unlock()
	rack := m.Rack
	if rack == "" {
		rack = "rack"
	}
	if m.Slot != "" {
		if n := nodeName(s.cfg.NodeNamePrefix, rack, m.Slot); n != "" {
			holders, err := s.store.ByNodeName(ctx, n)
			if err != nil {
				return "", err
			}
			taken := false
			for _, o := range holders {
				taken = taken || (o.ID != m.ID && o.State != inventory.Decommissioned)
			}
			if !taken {
				return n, nil
			}
		}
	}
	return nodeName(s.cfg.NodeNamePrefix, rack, m.ID), nil
}

// nodeName joins parts into a lowercase RFC 1123 label sequence.
func nodeName(parts ...string) string {
	var b strings.Builder
	for _, p := range parts {
		p = strings.ToLower(p)
		if b.Len() > 0 {
			b.WriteByte('-')
		}
		for _, r := range p {
			if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
				b.WriteRune(r)
			} else if r == '-' || r == '_' || r == ' ' || r == '.' || r == '/' {
				b.WriteByte('-')
			}
		}
	}
	n := strings.Trim(b.String(), "-")
	for strings.Contains(n, "--") {
		n = strings.ReplaceAll(n, "--", "-")
	}
	if len(n) > 63 {
		n = strings.Trim(n[:63], "-")
	}
	return n
}

// dataDiskRules is a selector's dataDisks for the JoinBundle; nil when it sets none (the
// profile's rules apply).
func dataDiskRules(specs []disksel.RuleSpec) *bootv1.DataDiskRules {
	if len(specs) == 0 {
		return nil
	}
	out := &bootv1.DataDiskRules{}
	for _, r := range specs {
		out.Rules = append(out.Rules, &bootv1.DataDiskRule{Path: r.Path, Model: r.Model, MinSize: r.MinSize, MaxSize: r.MaxSize, Transport: r.Transport})
	}
	return out
}

// apiServers is every API server as HOST:PORT: endpoint's (a URL such as
// https://10.0.0.2:6443) first, then others, each once.
func apiServers(endpoint string, others []string) []string {
	var out []string
	if u, err := url.Parse(endpoint); err == nil && u.Host != "" {
		out = append(out, u.Host)
	}
	for _, o := range others {
		if !slices.Contains(out, o) {
			out = append(out, o)
		}
	}
	return out
}
