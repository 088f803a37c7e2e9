// Package clusterconfig is the schema of cluster.yaml, the file an operator
// gives `controlplane-bootstrap init`: its defaults, its strict decoding and its
// validation. Every error names the file, the line and the dotted field path,
// and says what to write instead.
//
// It is pure: it parses bytes and never touches the disk or the network. It is
// not the kubeadm configuration format; the kubeadm-config ConfigMap that stock
// `kubeadm join` reads is rendered from it by package joinconfig.
package clusterconfig

import (
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

// APIVersion and Kind identify a cluster.yaml document.
const (
	APIVersion = "gpurack.io/v1alpha1"
	Kind       = "ClusterConfig"
)

// KubernetesVersion is the version of the pinned binaries (`make k8s-bins`).
const KubernetesVersion = "v1.34.2"

// Config is cluster.yaml. Zero values are replaced by the defaults of Default.
type Config struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	// ClusterName names the cluster in kubeconfigs and the kubeadm-config ConfigMap.
	ClusterName string `yaml:"clusterName"`
	// KubernetesVersion must equal the version of the pinned binaries.
	KubernetesVersion string `yaml:"kubernetesVersion"`
	// NodeName is this control-plane host's name (etcd member name, SANs).
	NodeName string `yaml:"nodeName"`
	// ControlPlane is how many control-plane hosts the cluster has (hosts.go).
	ControlPlane      ControlPlane      `yaml:"controlPlane"`
	APIServer         APIServer         `yaml:"apiServer"`
	Etcd              Etcd              `yaml:"etcd"`
	ControllerManager ControllerManager `yaml:"controllerManager"`
	Scheduler         Scheduler         `yaml:"scheduler"`
	Networking        Networking        `yaml:"networking"`
	BootstrapTokens   BootstrapTokens   `yaml:"bootstrapTokens"`
	Monitoring        Monitoring        `yaml:"monitoring"`
	// Queues is Kueue, the tenants' job queues (queues.go).
	Queues Queues `yaml:"queues"`
	// Registry is the cluster's image registry (registry.go).
	Registry Registry `yaml:"registry"`
	// Storage is the shared storage, an NFS export (storage.go).
	Storage Storage `yaml:"storage"`
	// BinDir overrides where the pinned binaries are looked up.
	BinDir string `yaml:"binDir"`
}

// APIServer configures kube-apiserver.
type APIServer struct {
	// AdvertiseAddress is the IP the apiserver advertises to the cluster.
	AdvertiseAddress string `yaml:"advertiseAddress"`
	// BindAddress is the IP the apiserver listens on (0.0.0.0 for all).
	BindAddress string `yaml:"bindAddress"`
	Port        int    `yaml:"port"`
	// Endpoint is the host:port that nodes and gpuboot use to reach the API
	// (a load balancer or the floating address, VIP, for several control-plane
	// nodes). Default: VIP's address and the port when VIP is set, else the
	// advertise address and port.
	Endpoint string `yaml:"endpoint"`
	// CertSANs are extra DNS names or IPs for the serving certificate.
	CertSANs []string `yaml:"certSANs"`
	// VIP, when its Address is set, is a floating API address that the vip
	// component holds on one control-plane host at a time (vip.go).
	VIP VIP `yaml:"vip"`
	// OIDC, when IssuerURL is set, lets the apiserver accept ID tokens of
	// an OpenID Connect identity provider (docs/tenants.md).
	OIDC OIDC `yaml:"oidc"`
	// ExtraArgs are added to (or override) the generated flags, without "--".
	ExtraArgs map[string]string `yaml:"extraArgs"`
}

// OIDC configures kube-apiserver's OpenID Connect authenticator (its
// --oidc-* flags). Tenant roles are bound to the groups
// gpurack:tenant:NAME:users and gpurack:tenant:NAME:admins, so an identity
// provider that sends groups such as "vision:users" with GroupsPrefix
// "gpurack:tenant:" places its users in tenants.
type OIDC struct {
	// IssuerURL is the provider's https URL (--oidc-issuer-url).
	IssuerURL string `yaml:"issuerURL"`
	// ClientID is the audience the ID tokens must have (--oidc-client-id).
	ClientID string `yaml:"clientID"`
	// UsernameClaim is the claim that names the user; default "sub".
	UsernameClaim string `yaml:"usernameClaim"`
	// UsernamePrefix is put before every user name; default "oidc:", so
	// that no token can pose as a certificate user or a system identity.
	UsernamePrefix string `yaml:"usernamePrefix"`
	// GroupsClaim is the claim that lists the user's groups; empty: none.
	GroupsClaim string `yaml:"groupsClaim"`
	// GroupsPrefix is put before every group; required with GroupsClaim
	// (for example "gpurack:tenant:").
	GroupsPrefix string `yaml:"groupsPrefix"`
	// CAFile is a PEM bundle on the control-plane host that verifies the
	// provider's TLS certificate; empty: the host's roots.
	CAFile string `yaml:"caFile"`
	// RequiredClaims must be present in the token with these values.
	RequiredClaims map[string]string `yaml:"requiredClaims"`
}

// Flags returns the kube-apiserver flags (without "--") of o, or nil when
// no issuer is set.
func (o OIDC) Flags() map[string]string {
	if o.IssuerURL == "" {
		return nil
	}
	f := map[string]string{
		"oidc-issuer-url":      o.IssuerURL,
		"oidc-client-id":       o.ClientID,
		"oidc-username-claim":  o.UsernameClaim,
		"oidc-username-prefix": o.UsernamePrefix,
	}
	if o.GroupsClaim != "" {
		f["oidc-groups-claim"] = o.GroupsClaim
		f["oidc-groups-prefix"] = o.GroupsPrefix
	}
	if o.CAFile != "" {
		f["oidc-ca-file"] = o.CAFile
	}
	if len(o.RequiredClaims) > 0 {
		keys := make([]string, 0, len(o.RequiredClaims))
		for k := range o.RequiredClaims {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var kv []string
		for _, k := range keys {
			kv = append(kv, k+"="+o.RequiredClaims[k])
		}
		f["oidc-required-claim"] = strings.Join(kv, ",")
	}
	return f
}

// Etcd configures the local (stacked) etcd member.
type Etcd struct {
	ClientPort  int               `yaml:"clientPort"`
	PeerPort    int               `yaml:"peerPort"`
	MetricsPort int               `yaml:"metricsPort"`
	ExtraArgs   map[string]string `yaml:"extraArgs"`
	// Join is set by `join --control-plane` on a host whose member joined an
	// existing cluster (hosts.go); empty on the first host.
	Join EtcdJoin `yaml:"join,omitempty"`
}

// ControllerManager configures kube-controller-manager.
type ControllerManager struct {
	Port      int               `yaml:"port"`
	ExtraArgs map[string]string `yaml:"extraArgs"`
}

// Scheduler configures kube-scheduler.
type Scheduler struct {
	Port      int               `yaml:"port"`
	ExtraArgs map[string]string `yaml:"extraArgs"`
}

// Networking holds the cluster's address ranges.
type Networking struct {
	ServiceSubnet string `yaml:"serviceSubnet"`
	PodSubnet     string `yaml:"podSubnet"`
	DNSDomain     string `yaml:"dnsDomain"`
}

// BootstrapTokens sets the defaults of `token create`.
type BootstrapTokens struct {
	// TTL is how long a token created without --ttl lives (Go duration).
	TTL string `yaml:"ttl"`
}

// Default returns the configuration of a single-node control plane on
// loopback with the ports kubeadm uses.
func Default() Config {
	return Config{
		APIVersion:        APIVersion,
		Kind:              Kind,
		ClusterName:       "gpurack",
		KubernetesVersion: KubernetesVersion,
		NodeName:          "control-plane-1",
		ControlPlane:      ControlPlane{Hosts: 1},
		APIServer: APIServer{
			AdvertiseAddress: "127.0.0.1",
			BindAddress:      "127.0.0.1",
			Port:             6443,
		},
		Etcd:              Etcd{ClientPort: 2379, PeerPort: 2380, MetricsPort: 2381},
		ControllerManager: ControllerManager{Port: 10257},
		Scheduler:         Scheduler{Port: 10259},
		Networking: Networking{
			ServiceSubnet: "10.96.0.0/12",
			PodSubnet:     "10.244.0.0/16",
			DNSDomain:     "cluster.local",
		},
		BootstrapTokens: BootstrapTokens{TTL: "24h"},
		Monitoring:      defaultMonitoring(),
		Registry:        defaultRegistry(),
	}
}

// applyDefaults fills every zero field of c from Default.
func (c *Config) applyDefaults() {
	d := Default()
	str := func(p *string, v string) {
		if *p == "" {
			*p = v
		}
	}
	num := func(p *int, v int) {
		if *p == 0 {
			*p = v
		}
	}
	str(&c.APIVersion, d.APIVersion)
	str(&c.Kind, d.Kind)
	str(&c.ClusterName, d.ClusterName)
	str(&c.KubernetesVersion, d.KubernetesVersion)
	str(&c.NodeName, d.NodeName)
	str(&c.APIServer.AdvertiseAddress, d.APIServer.AdvertiseAddress)
	str(&c.APIServer.BindAddress, d.APIServer.BindAddress)
	num(&c.ControlPlane.Hosts, d.ControlPlane.Hosts)
	num(&c.APIServer.Port, d.APIServer.Port)
	num(&c.Etcd.ClientPort, d.Etcd.ClientPort)
	num(&c.Etcd.PeerPort, d.Etcd.PeerPort)
	num(&c.Etcd.MetricsPort, d.Etcd.MetricsPort)
	num(&c.ControllerManager.Port, d.ControllerManager.Port)
	num(&c.Scheduler.Port, d.Scheduler.Port)
	str(&c.Networking.ServiceSubnet, d.Networking.ServiceSubnet)
	str(&c.Networking.PodSubnet, d.Networking.PodSubnet)
	str(&c.Networking.DNSDomain, d.Networking.DNSDomain)
	str(&c.BootstrapTokens.TTL, d.BootstrapTokens.TTL)
	c.Monitoring.applyDefaults()
	c.Queues.applyDefaults()
	c.Registry.applyDefaults()
	c.Storage.applyDefaults()
	c.APIServer.VIP.applyDefaults()
	// The log gateway serves nodes where the API server does.
	str(&c.Monitoring.Logs.Gateway.ListenAddress, c.APIServer.BindAddress)
	if c.APIServer.OIDC.IssuerURL != "" {
		str(&c.APIServer.OIDC.UsernameClaim, "sub")
		str(&c.APIServer.OIDC.UsernamePrefix, "oidc:")
	}
	if c.APIServer.Endpoint == "" {
		c.APIServer.Endpoint = c.APIServer.defaultEndpoint()
	}
}

// defaultEndpoint is apiServer.endpoint when it is not given: the floating address
// when apiServer.vip has a valid one (so that nodes, gpuboot and cluster-info reach the
// API on whichever host holds it), else the advertise address; with apiServer.port.
func (a *APIServer) defaultEndpoint() string {
	host := a.AdvertiseAddress
	if ip, ok := a.VIP.IP(); ok {
		host = ip.String()
	}
	return net.JoinHostPort(host, strconv.Itoa(a.Port))
}

// FieldError is one invalid field: its dotted path and what to fix.
type FieldError struct {
	Field string
	Msg   string
}

var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
var dnsName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
var flagName = regexp.MustCompile(`^[a-z0-9][a-z0-9-]*$`)

// problems collects FieldErrors.
type problems []FieldError

func (p *problems) add(field, format string, args ...any) {
	*p = append(*p, FieldError{Field: field, Msg: fmt.Sprintf(format, args...)})
}

// Validate checks a defaulted configuration and returns every problem.
func (c *Config) Validate() []FieldError {
	var p problems
	if c.APIVersion != APIVersion {
		p.add("apiVersion", "is %q; write %q", c.APIVersion, APIVersion)
	}
	if c.Kind != Kind {
		p.add("kind", "is %q; write %q", c.Kind, Kind)
	}
	if !dnsLabel.MatchString(c.ClusterName) || len(c.ClusterName) > 63 {
		p.add("clusterName", "%q is not a DNS label (lowercase letters, digits and '-', at most 63)", c.ClusterName)
	}
	if c.KubernetesVersion != KubernetesVersion {
		p.add("kubernetesVersion", "is %q, but the pinned binaries are %s: write %s (other versions need a different `make k8s-bins` pin)", c.KubernetesVersion, KubernetesVersion, KubernetesVersion)
	}
	if !dnsName.MatchString(c.NodeName) || len(c.NodeName) > 253 {
		p.add("nodeName", "%q is not a DNS name (lowercase letters, digits, '-' and '.')", c.NodeName)
	}
	c.ControlPlane.validate(&p)
	c.Etcd.Join.validate(&p, c.NodeName)
	c.APIServer.validate(&p)
	c.APIServer.OIDC.validate(&p)
	c.validatePorts(&p)
	c.Networking.validate(&p)
	c.Monitoring.validate(&p)
	c.Queues.validate(&p)
	c.Registry.validate(&p)
	c.Storage.validate(&p)
	if d, err := time.ParseDuration(c.BootstrapTokens.TTL); err != nil || d <= 0 {
		p.add("bootstrapTokens.ttl", "%q is not a positive duration (for example 24h or 15m)", c.BootstrapTokens.TTL)
	}
	for _, ea := range []struct {
		field string
		m     map[string]string
	}{
		{"apiServer.extraArgs", c.APIServer.ExtraArgs},
		{"etcd.extraArgs", c.Etcd.ExtraArgs},
		{"controllerManager.extraArgs", c.ControllerManager.ExtraArgs},
		{"scheduler.extraArgs", c.Scheduler.ExtraArgs},
	} {
		for k := range ea.m {
			if !flagName.MatchString(k) {
				p.add(ea.field+"["+k+"]", "%q is not a flag name: write it without leading dashes, for example audit-log-maxage", k)
			}
		}
	}
	return p
}

// validate checks the addresses, the endpoint, the certificate SANs and the floating
// address (the ports are validatePorts').
func (a *APIServer) validate(p *problems) {
	adv, err := netip.ParseAddr(a.AdvertiseAddress)
	switch {
	case err != nil:
		p.add("apiServer.advertiseAddress", "%q is not an IP address", a.AdvertiseAddress)
	case adv.IsUnspecified():
		p.add("apiServer.advertiseAddress", "%q is unspecified: give the address other hosts reach this one on", a.AdvertiseAddress)
	}
	if _, err := netip.ParseAddr(a.BindAddress); err != nil {
		p.add("apiServer.bindAddress", "%q is not an IP address (0.0.0.0 listens on all)", a.BindAddress)
	}
	derived := a.Endpoint == a.defaultEndpoint()
	if derived && (a.Port < 1 || a.Port > 65535) {
		// The default endpoint repeats apiServer.port, reported by validatePorts.
	} else if host, port, err := net.SplitHostPort(a.Endpoint); err != nil || host == "" {
		p.add("apiServer.endpoint", "%q is not host:port (for example 192.0.2.10:6443)", a.Endpoint)
	} else if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		p.add("apiServer.endpoint", "%q: port %q is not 1-65535", a.Endpoint, port)
	}
	for i, san := range a.CertSANs {
		if _, err := netip.ParseAddr(san); err == nil {
			continue
		}
		if !dnsName.MatchString(san) {
			p.add(fmt.Sprintf("apiServer.certSANs[%d]", i), "%q is neither an IP address nor a DNS name", san)
		}
	}
	a.VIP.validate(p, a.AdvertiseAddress, a.BindAddress)
}

func (o *OIDC) validate(p *problems) {
	if o.IssuerURL == "" {
		if o.ClientID != "" || o.GroupsClaim != "" || o.CAFile != "" || len(o.RequiredClaims) > 0 {
			p.add("apiServer.oidc.issuerURL", "is required when any other apiServer.oidc field is set")
		}
		return
	}
	u, err := url.Parse(o.IssuerURL)
	if err != nil || u.Scheme != "https" || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		p.add("apiServer.oidc.issuerURL", "%q is not an https URL without query or fragment (for example https://idp.example.com/realms/gpu)", o.IssuerURL)
	}
	if o.ClientID == "" {
		p.add("apiServer.oidc.clientID", "is required with issuerURL: the audience of the ID tokens")
	}
	if o.GroupsClaim != "" && (o.GroupsPrefix == "" || strings.HasPrefix(o.GroupsPrefix, "system:")) {
		p.add("apiServer.oidc.groupsPrefix", "%q: give a prefix such as gpurack:tenant: so that the provider cannot name groups like system:masters", o.GroupsPrefix)
	}
	if o.UsernamePrefix == "-" || strings.HasPrefix(o.UsernamePrefix, "system:") {
		p.add("apiServer.oidc.usernamePrefix", "%q: give a prefix such as oidc: so that tokens cannot pose as certificate or system users", o.UsernamePrefix)
	}
	for k, v := range o.RequiredClaims {
		if k == "" || strings.ContainsAny(k+v, ",=") {
			p.add("apiServer.oidc.requiredClaims["+k+"]", "claim names and values may not be empty or contain ',' or '='")
		}
	}
}

// validatePorts checks that every component's port is a port and its own.
func (c *Config) validatePorts(p *problems) {
	ports := []struct {
		field string
		v     int
	}{
		{"apiServer.port", c.APIServer.Port},
		{"etcd.clientPort", c.Etcd.ClientPort},
		{"etcd.peerPort", c.Etcd.PeerPort},
		{"etcd.metricsPort", c.Etcd.MetricsPort},
		{"controllerManager.port", c.ControllerManager.Port},
		{"scheduler.port", c.Scheduler.Port},
	}
	if c.APIServer.VIP.Enabled() {
		ports = append(ports, struct {
			field string
			v     int
		}{"apiServer.vip.healthPort", c.APIServer.VIP.HealthPort})
	}
	if c.Monitoring.Enabled {
		ports = append(ports, []struct {
			field string
			v     int
		}{
			{"monitoring.prometheus.port", c.Monitoring.Prometheus.Port},
			{"monitoring.alertmanager.port", c.Monitoring.Alertmanager.Port},
			{"monitoring.kubeStateMetrics.port", c.Monitoring.KubeStateMetrics.Port},
			{"monitoring.kubeStateMetrics.telemetryPort", c.Monitoring.KubeStateMetrics.TelemetryPort},
		}...)
	}
	if c.Queues.Enabled {
		ports = append(ports, []struct {
			field string
			v     int
		}{
			{"queues.webhookPort", c.Queues.WebhookPort},
			{"queues.healthPort", c.Queues.HealthPort},
			{"queues.metricsPort", c.Queues.MetricsPort},
		}...)
	}
	if c.Monitoring.LogsEnabled() {
		ports = append(ports, []struct {
			field string
			v     int
		}{
			{"monitoring.logs.port", c.Monitoring.Logs.Port},
			{"monitoring.logs.gateway.port", c.Monitoring.Logs.Gateway.Port},
		}...)
	}
	if c.Registry.Enabled {
		ports = append(ports, []struct {
			field string
			v     int
		}{
			{"registry.port", c.Registry.Port},
			{"registry.authPort", c.Registry.AuthPort},
			{"registry.metricsPort", c.Registry.MetricsPort},
		}...)
	}
	seen := map[int]string{}
	for _, port := range ports {
		if port.v < 1 || port.v > 65535 {
			p.add(port.field, "%d is not a port (1-65535)", port.v)
			continue
		}
		if other, ok := seen[port.v]; ok {
			p.add(port.field, "%d is also %s: give each component its own port", port.v, other)
		}
		seen[port.v] = port.field
	}
}

func (n *Networking) validate(p *problems) {
	svc, err := netip.ParsePrefix(n.ServiceSubnet)
	if err != nil {
		p.add("networking.serviceSubnet", "%q is not a CIDR (for example 10.96.0.0/12)", n.ServiceSubnet)
	} else if svc.Addr().Is4() && svc.Bits() < 12 {
		p.add("networking.serviceSubnet", "%q is larger than /12, which kube-apiserver refuses", n.ServiceSubnet)
	}
	pod, err := netip.ParsePrefix(n.PodSubnet)
	if err != nil {
		p.add("networking.podSubnet", "%q is not a CIDR (for example 10.244.0.0/16)", n.PodSubnet)
	} else if svc.IsValid() && pod.Overlaps(svc) {
		p.add("networking.podSubnet", "%q overlaps networking.serviceSubnet %q", n.PodSubnet, n.ServiceSubnet)
	}
	if !dnsName.MatchString(n.DNSDomain) {
		p.add("networking.dnsDomain", "%q is not a DNS name", n.DNSDomain)
	}
}

// TokenTTL returns BootstrapTokens.TTL as a duration; call it on a valid Config.
func (c *Config) TokenTTL() time.Duration {
	d, _ := time.ParseDuration(c.BootstrapTokens.TTL)
	return d
}

// APIServerURL is the URL that local clients (the admin kubeconfig, the
// controller-manager and the scheduler) use: the advertise address.
func (c *Config) APIServerURL() string {
	return "https://" + net.JoinHostPort(c.APIServer.AdvertiseAddress, strconv.Itoa(c.APIServer.Port))
}

// EndpointURL is the URL nodes and gpuboot use (APIServer.Endpoint).
func (c *Config) EndpointURL() string {
	return "https://" + c.APIServer.Endpoint
}

// LoopbackAdvertised reports whether the apiserver advertises a loopback
// address, which needs --endpoint-reconciler-type=none (the kubernetes
// Service's Endpoints may not point at loopback).
func (c *Config) LoopbackAdvertised() bool {
	a, err := netip.ParseAddr(c.APIServer.AdvertiseAddress)
	return err == nil && a.IsLoopback()
}

// AdvertiseWarning is what to tell an operator whose nodes reach the apiserver on
// a non-loopback endpoint while it advertises loopback: the kubernetes Service then
// has no endpoints (--endpoint-reconciler-type=none), so pods on the nodes, the
// cluster DNS among them, cannot reach the apiserver through its ClusterIP. Empty
// when there is nothing to say (a loopback-only cluster, or a real advertise address).
func (c *Config) AdvertiseWarning() string {
	if !c.LoopbackAdvertised() {
		return ""
	}
	host, _, err := net.SplitHostPort(c.APIServer.Endpoint)
	if err != nil {
		return ""
	}
	if a, err := netip.ParseAddr(host); (err == nil && a.IsLoopback()) || host == "localhost" {
		return ""
	}
	return fmt.Sprintf("apiServer.advertiseAddress is %s (loopback) while nodes reach the apiserver at %s: the kubernetes Service gets no endpoints, so pods on the nodes (CoreDNS among them) cannot reach the apiserver; set apiServer.advertiseAddress to this host's address that the nodes reach",
		c.APIServer.AdvertiseAddress, c.APIServer.Endpoint)
}

// ServiceIP returns the first address of the service subnet (the ClusterIP of
// the kubernetes Service, a SAN of the apiserver certificate).
func (c *Config) ServiceIP() net.IP {
	p, err := netip.ParsePrefix(c.Networking.ServiceSubnet)
	if err != nil {
		return nil
	}
	return net.IP(p.Masked().Addr().Next().AsSlice())
}
