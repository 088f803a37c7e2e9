package pki

import (
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strings"
	"unicode"
)

// Role is what a certificate issued by the gpurack CA lets its holder do. It
// is carried in the certificate subject's O field (docs/contracts.md §4).
type Role string

// The gpurack roles (docs/contracts.md §4).
const (
	// RoleServers is gpuboot's serving certificate (serverAuth).
	RoleServers Role = "gpurack:servers"
	// RoleAgents is a node's gpuagent: CN = node name, clientAuth +
	// serverAuth, SANs = node name + the address gpuboot saw its GetJoinBundle call come
	// from.
	RoleAgents Role = "gpurack:agents"
	// RoleOperators is a person or tool using AdminService, the REST API
	// or the rack view (clientAuth).
	RoleOperators Role = "gpurack:operators"
)

// ServerCommonName is the CN of gpuboot's serving certificate.
const ServerCommonName = "gpuboot"

// RoleOf returns the gpurack role named in cert's subject O field, or ""
// when it names none or more than one (a certificate that claims two roles
// is treated as having none).
func RoleOf(cert *x509.Certificate) Role {
	if cert == nil {
		return ""
	}
	var found Role
	for _, o := range cert.Subject.Organization {
		switch r := Role(o); r {
		case RoleServers, RoleAgents, RoleOperators:
			if found != "" && found != r {
				return ""
			}
			found = r
		}
	}
	return found
}

// PeerHasRole checks, in a tls.Config's VerifyConnection after the chain was verified,
// that the peer's certificate carries role want (CONTRACTS §4: every gpurack party checks
// its peer's role, since all roles chain to the one gpurack CA).
func PeerHasRole(cs tls.ConnectionState, want Role) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("the peer sent no certificate")
	}
	c := cs.PeerCertificates[0]
	if r := RoleOf(c); r != want {
		return fmt.Errorf("certificate %q has role %q, not %s", c.Subject.CommonName, r, want)
	}
	return nil
}

// IssueServer issues gpuboot's serving certificate: role RoleServers,
// serverAuth, with each of hosts (as given to `gpuboot init --advertise`) as
// an IP SAN if it parses as an IP address and as a DNS SAN otherwise.
func IssueServer(ca *CA, hosts []string) (*KeyPair, error) {
	var dns []string
	var ips []net.IP
	seen := map[string]bool{}
	for _, h := range hosts {
		h = strings.TrimSpace(h)
		ip := net.ParseIP(h)
		key := strings.ToLower(h)
		if ip != nil {
			key = ip.String()
		}
		if h == "" || seen[key] {
			continue
		}
		seen[key] = true
		if ip != nil {
			ips = append(ips, ip)
			continue
		}
		if err := checkDNSName(h); err != nil {
			return nil, fmt.Errorf("issue server certificate: advertised host %q: %w", h, err)
		}
		dns = append(dns, strings.ToLower(h))
	}
	if len(dns) == 0 && len(ips) == 0 {
		return nil, errors.New("issue server certificate: no hosts: give the names and IP addresses agents use to reach gpuboot (--advertise HOST,IP,…)")
	}
	return ca.Issue(CertRequest{
		CommonName:    ServerCommonName,
		Organizations: []string{string(RoleServers)},
		DNSNames:      dns,
		IPs:           ips,
		Usages:        []Usage{ServerAuth},
	})
}

// IssueAgent issues a node's agent certificate with a fresh key: role RoleAgents, CN
// = nodeName, clientAuth + serverAuth, SANs = nodeName and ips.
func IssueAgent(ca *CA, nodeName string, ips []net.IP) (*KeyPair, error) {
	req, err := agentRequest(nodeName, ips)
	if err != nil {
		return nil, err
	}
	return ca.Issue(req)
}

// CertifyAgent certifies the agent's own key pub (its ed25519 key, which stays on the
// node): the certificate IssueAgent makes, for pub. gpuboot calls it when it releases
// a JoinBundle.
func CertifyAgent(ca *CA, nodeName string, ips []net.IP, pub crypto.PublicKey) (*x509.Certificate, error) {
	return CertifyAgentFor(ca, nodeName, ips, pub, 0)
}

// agentRequest is the request of an agent certificate (CONTRACTS §4); repeated and
// nil IPs are dropped.
func agentRequest(nodeName string, ips []net.IP) (CertRequest, error) {
	if err := checkNodeName(nodeName); err != nil {
		return CertRequest{}, fmt.Errorf("issue agent certificate: %w", err)
	}
	var sans []net.IP
	seen := map[string]bool{}
	for _, ip := range ips {
		if ip == nil {
			continue
		}
		if len(ip) != net.IPv4len && len(ip) != net.IPv6len {
			return CertRequest{}, fmt.Errorf("issue agent certificate for %s: invalid IP address %v", nodeName, ip)
		}
		if k := ip.String(); !seen[k] {
			seen[k] = true
			sans = append(sans, ip)
		}
	}
	return CertRequest{
		CommonName:    nodeName,
		Organizations: []string{string(RoleAgents)},
		DNSNames:      []string{nodeName},
		IPs:           sans,
		Usages:        []Usage{ClientAuth, ServerAuth},
	}, nil
}

// OperatorLevel is what an operator certificate lets its holder do, carried in the
// subject's OU field beside the operator role (CONTRACTS §4). The levels of Levels nest:
// an admin may do all an operator may, an operator all a viewer may. A level of
// SeparateLevels stands apart: it allows what needs exactly it, and nothing else.
type OperatorLevel string

const (
	// LevelViewer reads: machines, history, reports, gossip key status; on an agent,
	// Status, ListGPUs and WatchEvents.
	LevelViewer OperatorLevel = "gpurack:level:viewer"
	// LevelOperator also changes machines: approve, reject, decommission, resolve a
	// conflict, rotate a gossip key; on an agent, RunChecks.
	LevelOperator OperatorLevel = "gpurack:level:operator"
	// LevelAdmin also manages credentials (revokes operators and serials) and, on a
	// simulated agent, injects and clears faults.
	LevelAdmin OperatorLevel = "gpurack:level:admin"
	// LevelAlertSender posts Alertmanager's notifications to gpuboot (POST
	// /api/v1/alerts) and does nothing else: it is Alertmanager's credential, so a
	// stolen one can neither read machines nor change them. It is not in Levels'
	// order: no viewer, operator or admin call allows it, and it allows none of them.
	LevelAlertSender OperatorLevel = "gpurack:level:alert-sender"
	// LevelMetricsReader reads gpuboot's /metrics on its operator port (GET /metrics)
	// and does nothing else: it is the metrics server's scrape credential (decision
	// 0693), apart from the nested levels as LevelAlertSender is.
	LevelMetricsReader OperatorLevel = "gpurack:level:metrics-reader"
)

// Levels lists the nested operator levels from least to most allowed.
var Levels = []OperatorLevel{LevelViewer, LevelOperator, LevelAdmin}

// SeparateLevels lists the levels outside Levels' order: each allows only the calls
// that need exactly it.
var SeparateLevels = []OperatorLevel{LevelAlertSender, LevelMetricsReader}

// levelWords is what ParseOperatorLevel and the refusals offer.
const levelWords = "viewer, operator, admin, alert-sender or metrics-reader"

// ParseOperatorLevel reads a level as a person writes it: "viewer", "operator",
// "admin", "alert-sender" or "metrics-reader" (or the full OU value).
func ParseOperatorLevel(s string) (OperatorLevel, error) {
	for _, l := range append(append([]OperatorLevel(nil), Levels...), SeparateLevels...) {
		if s == string(l) || s == l.Name() {
			return l, nil
		}
	}
	return "", fmt.Errorf("operator level %q: use %s", s, levelWords)
}

// Name is the level as a person writes it: viewer, operator, admin, alert-sender or
// metrics-reader.
func (l OperatorLevel) Name() string { return strings.TrimPrefix(string(l), "gpurack:level:") }

// Allows reports whether level l may do what need requires: a nested level what
// needs it or a level below it; a separate level (SeparateLevels) what needs exactly
// it, and no nested level what needs a separate one.
func (l OperatorLevel) Allows(need OperatorLevel) bool {
	if l.separate() || need.separate() {
		return l == need && l.separate()
	}
	return l.rank() >= need.rank() && need.rank() > 0
}

// separate reports whether l is one of SeparateLevels.
func (l OperatorLevel) separate() bool {
	for _, x := range SeparateLevels {
		if x == l {
			return true
		}
	}
	return false
}

// known reports whether l is a level gpurack defines.
func (l OperatorLevel) known() bool { return l.rank() > 0 || l.separate() }

func (l OperatorLevel) rank() int {
	for i, x := range Levels {
		if x == l {
			return i + 1
		}
	}
	return 0
}

// OperatorLevelOf returns the level of an operator certificate: the one level its
// subject OU names. An operator certificate that names none was issued before levels
// existed and is an admin's (every operator could do everything then); one that names
// two different levels, or any certificate without the operator role, has none ("").
func OperatorLevelOf(cert *x509.Certificate) OperatorLevel {
	if RoleOf(cert) != RoleOperators {
		return ""
	}
	var found OperatorLevel
	for _, ou := range cert.Subject.OrganizationalUnit {
		l := OperatorLevel(ou)
		if !l.known() {
			continue
		}
		if found != "" && found != l {
			return ""
		}
		found = l
	}
	if found == "" {
		return LevelAdmin
	}
	return found
}

// IssueOperator issues an admin's client certificate (`gpuboot init`'s first operator):
// IssueOperatorLevel with LevelAdmin.
func IssueOperator(ca *CA, name string) (*KeyPair, error) {
	return IssueOperatorLevel(ca, name, LevelAdmin)
}

// IssueOperatorLevel issues an operator's client certificate (`gpuboot certs operator
// NAME --level L`): role RoleOperators, level in the OU, CN = name, clientAuth.
func IssueOperatorLevel(ca *CA, name string, level OperatorLevel) (*KeyPair, error) {
	if name == "" || len(name) > 64 {
		return nil, fmt.Errorf("issue operator certificate: name %q must be 1 to 64 characters", name)
	}
	for _, r := range name {
		if !unicode.IsPrint(r) {
			return nil, fmt.Errorf("issue operator certificate: name %q contains a non-printable character", name)
		}
	}
	if !level.known() {
		return nil, fmt.Errorf("issue operator certificate: level %q: use %s", level, levelWords)
	}
	return ca.Issue(CertRequest{
		CommonName:          name,
		Organizations:       []string{string(RoleOperators)},
		OrganizationalUnits: []string{string(level)},
		Usages:              []Usage{ClientAuth},
	})
}

// checkNodeName accepts a Kubernetes node name: an RFC 1123 subdomain
// (lowercase letters, digits, '-' and '.', each label starting and ending
// with a letter or digit, at most 253 characters).
func checkNodeName(name string) error {
	if name == "" || len(name) > 253 {
		return fmt.Errorf("node name %q must be 1 to 253 characters", name)
	}
	for _, label := range strings.Split(name, ".") {
		if label == "" || len(label) > 63 {
			return fmt.Errorf("node name %q: each dot-separated part must be 1 to 63 characters", name)
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			alnum := c >= 'a' && c <= 'z' || c >= '0' && c <= '9'
			if !alnum && (c != '-' || i == 0 || i == len(label)-1) {
				return fmt.Errorf("node name %q is not a valid Kubernetes node name: use lowercase letters, digits, '-' and '.', starting and ending with a letter or digit", name)
			}
		}
	}
	return nil
}

// checkDNSName accepts a host name for a DNS SAN: letters, digits, '-' and
// '.', with an optional leading "*." wildcard.
func checkDNSName(name string) error {
	if strings.Contains(name, ":") {
		return errors.New("not a host name or IP address (drop any port or scheme)")
	}
	name = strings.TrimPrefix(name, "*.")
	if name == "" || len(name) > 253 {
		return errors.New("a host name must be 1 to 253 characters")
	}
	for _, label := range strings.Split(name, ".") {
		if label == "" || len(label) > 63 {
			return errors.New("each dot-separated part of a host name must be 1 to 63 characters")
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-'
			if !ok {
				return errors.New("a host name may hold only letters, digits, '-' and '.'")
			}
		}
	}
	return nil
}
