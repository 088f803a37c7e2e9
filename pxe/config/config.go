// Package config is gpuboot's configuration file (gpuboot.yaml): its schema, defaults,
// strict parsing (package strictyaml: unknown fields, wrong types and duplicate keys are
// errors) and validation. Every error names the file, the line and the field, and says
// what to fix. See
// docs/examples/gpuboot.yaml for a commented example.
//
// It only describes settings; pxe/server turns them into running parts.
package config

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/gpurack/gpurack/internal/profile"
	"github.com/gpurack/gpurack/internal/strictyaml"
	"github.com/gpurack/gpurack/pxe/policy"
)

// Config is gpuboot.yaml.
type Config struct {
	// StateDir holds gpuboot's state: inventory.db, the gpurack CA and server
	// certificate (pki/), per-rack gossip keys (gossip/), the revocation list and the
	// operator token file. `gpuboot init` fills it.
	StateDir string `yaml:"stateDir"`
	// Advertise is the host (IP or name) machines reach gpuboot at: it goes into the
	// iPXE script URLs, the DHCP answers and gpurack.enroll=.
	Advertise string `yaml:"advertise"`
	Listen    Listen `yaml:"listen"`
	// Interfaces DHCP and TFTP serve on.
	Interfaces []Interface `yaml:"interfaces"`
	DHCP       DHCP        `yaml:"dhcp"`
	TFTP       TFTP        `yaml:"tftp"`
	Images     Images      `yaml:"images"`
	Enrollment Enrollment  `yaml:"enrollment"`
	Policy     Policy      `yaml:"policy"`
	// Racks gpuboot serves; DefaultRack is where machines the allowlist does not
	// place go (default: the only rack).
	Racks       []Rack            `yaml:"racks"`
	DefaultRack string            `yaml:"defaultRack"`
	Selectors   []policy.Selector `yaml:"selectors"`
	Cluster     Cluster           `yaml:"cluster"`
	Inventory   Inventory         `yaml:"inventory"`
	Admin       Admin             `yaml:"admin"`
	Metrics     Metrics           `yaml:"metrics"`
	// LogLevel: debug, info (default), warn, error.
	LogLevel string `yaml:"logLevel"`

	// Source is the file the configuration was read from (not a YAML field).
	Source string `yaml:"-"`
	// pos locates fields in Source for Validate's errors; nil for a Config built in code.
	pos strictyaml.Positions
}

// Inventory says where gpuboot keeps its machines (docs/contracts.md §21).
type Inventory struct {
	// Store: bbolt (default), the file STATEDIR/inventory.db of one gpuboot; or
	// cluster, Machine objects in the cluster that cluster.kubeconfig reaches, which
	// several gpuboot replicas share (decision 0704). `gpuboot inventory migrate`
	// moves a bbolt inventory into the cluster.
	Store string `yaml:"store"`
}

// Inventory stores.
const (
	InventoryBolt    = "bbolt"
	InventoryCluster = "cluster"
)

// Listen are the listener addresses (CONTRACTS §3).
type Listen struct {
	// HTTP serves /boot.ipxe and /images in plain HTTP (and /metrics with
	// metrics.plainHTTP); default ":8080".
	HTTP string `yaml:"http"`
	// TLS serves EnrollmentService, AdminService, the REST API and the rack view;
	// default ":8443".
	TLS string `yaml:"tls"`
}

// Interface is one network interface DHCP and TFTP serve on.
type Interface struct {
	Name string `yaml:"name"`
}

// DHCP configures the DHCPv4 side.
type DHCP struct {
	// Enabled: default true.
	Enabled *bool `yaml:"enabled"`
	// Mode: proxy (default) or full.
	Mode string `yaml:"mode"`
	// EFIBootFile: snponly.efi (default) or ipxe.efi.
	EFIBootFile  string `yaml:"efiBootFile"`
	BIOSBootFile string `yaml:"biosBootFile"`
	// Full mode only.
	Pool         *Pool         `yaml:"pool"`
	Reservations []Reservation `yaml:"reservations"`
}

// Pool is full mode's address pool.
type Pool struct {
	Start     string        `yaml:"start"`
	End       string        `yaml:"end"`
	Netmask   string        `yaml:"netmask"`
	Routers   []string      `yaml:"routers"`
	DNS       []string      `yaml:"dns"`
	LeaseTime time.Duration `yaml:"leaseTime"`
}

// Reservation pins an address to a MAC in full mode.
type Reservation struct {
	MAC string `yaml:"mac"`
	IP  string `yaml:"ip"`
}

// TFTP configures the TFTP server.
type TFTP struct {
	Enabled *bool `yaml:"enabled"`
	// Dir holds the iPXE binaries; default /usr/lib/ipxe (Debian's ipxe package).
	Dir        string `yaml:"dir"`
	SinglePort bool   `yaml:"singlePort"`
}

// Images configures the image store.
type Images struct {
	// Store is the directory of <image-id>/ directories (CONTRACTS §7).
	Store string `yaml:"store"`
	// TrustedKeys are PKIX PEM ed25519 public keys; only images signed by one are
	// served.
	TrustedKeys []string `yaml:"trustedKeys"`
}

// Defaults of the per-source bound on Register and Heartbeat: an agent heartbeats
// every 10 s and registers a few times per boot, so 5 per second with a burst of 50
// never slows a real machine and caps what one address can make gpuboot write.
const (
	DefaultSourceRate  = 5.0
	DefaultSourceBurst = 50
)

// MinAgentCertValidity is the shortest enrollment.agentCertValidity gpuboot.yaml may
// set: an agent renews at two thirds of it and needs a few round trips to gpuboot.
const MinAgentCertValidity = time.Minute

// Enrollment configures the enrollment flow (CONTRACTS §2).
type Enrollment struct {
	// UnknownMachines: discover (default) or hold.
	UnknownMachines string `yaml:"unknownMachines"`
	// Reenroll: auto (default) or manual.
	Reenroll string `yaml:"reenroll"`
	// Identity is what a machine's identity rests on (decisions 0650, 0651):
	// mac-uuid-serial (default: what gpuboot did before, TPMs are ignored), tpm
	// (every agent proves its TPM 2.0 Endorsement Key; one without a TPM is
	// refused) or tpm-or-fallback (agents with a TPM prove it, others enroll as with
	// mac-uuid-serial; an identity bound to an EK is taken only by that EK).
	Identity string `yaml:"identity"`
	// EKRoots are PEM files of TPM vendors' certificates (roots, and the intermediates
	// between them and EK certificates). With them, under identity tpm or
	// tpm-or-fallback, a TPM is believed only when its EK certificate chains to one
	// of these roots (decision 0653). Without them the EK is trusted on first use.
	EKRoots []string `yaml:"ekRoots"`
	// Bounds on records unauthenticated traffic creates.
	MaxUnapproved int     `yaml:"maxUnapproved"`
	CreateRate    float64 `yaml:"createRate"`
	CreateBurst   int     `yaml:"createBurst"`
	// MaxUnapprovedBytes bounds the bytes those records hold (facts, checklists,
	// health; default 64 MiB): past it new strangers are refused, bound machines never.
	MaxUnapprovedBytes int64 `yaml:"maxUnapprovedBytes"`
	// SourceRate and SourceBurst bound the enrollment calls (Register, Heartbeat,
	// GetJoinBundle, ReportCommissioning) from one source address (an IPv6 /64 counts
	// as one): calls per second and burst, a token bucket per source. Defaults 5 and
	// 50.
	SourceRate  float64 `yaml:"sourceRate"`
	SourceBurst int     `yaml:"sourceBurst"`
	// NodeNamePrefix starts generated node names; default "gpu".
	NodeNamePrefix string `yaml:"nodeNamePrefix"`
	// AllowSimulated lets a machine whose commissioning report says it ran on the
	// simulator GPU backend become ready (CONTRACTS §11). Off by default: such a
	// machine goes quarantined. For labs and demos only; gpuboot warns at every start
	// while it is on.
	AllowSimulated bool `yaml:"allowSimulated"`
	// AgentCertValidity is how long an agent certificate is valid, in the JoinBundle and
	// at each renewal; agents renew theirs at two thirds of it (CONTRACTS §2.10).
	// Default one year; at least a minute (labs and tests use minutes).
	AgentCertValidity time.Duration `yaml:"agentCertValidity"`
}

// Policy is the approval policy.
type Policy struct {
	// Approval: manual (default), allowlist or auto (labs only).
	Approval string `yaml:"approval"`
	// Allowlist are the rack manifests (CSV: serial, mac, rack, slot, ekHash,
	// ekCertificate, bmc), as the vendor shipped them: one file, or a list of files
	// (one per rack) that gpuboot merges into one allowlist (policy.LoadLists).
	Allowlist Paths `yaml:"allowlist"`
}

// Rack is one rack.
type Rack struct {
	Name string `yaml:"name"`
	// DefaultImage boots machines no selector matches (image id).
	DefaultImage string `yaml:"defaultImage"`
}

// Cluster is the Kubernetes side (CONTRACTS §4, §5); optional.
type Cluster struct {
	// Kubeconfig is the enroller kubeconfig from controlplane-bootstrap
	// (DIR/enroller.kubeconfig). Empty: bundles carry no Kubernetes credentials and
	// the node controller does not run.
	Kubeconfig string   `yaml:"kubeconfig"`
	DNS        []string `yaml:"dns"`
	Domain     string   `yaml:"domain"`
	// PodNetwork goes to every node in its JoinBundle and overrides the image
	// profile's kubernetes.podNetwork: one image serves racks with either backend.
	PodNetwork PodNetwork `yaml:"podNetwork"`
	// UnhealthyEffect of gpurack.io/gpu-unhealthy: NoSchedule (default) or NoExecute.
	UnhealthyEffect string `yaml:"unhealthyEffect"`
	// ClearAfter is no longer used: the taint mirrors GPUHealthy, and the agent's
	// --clear-after is the only hysteresis (decision 0205). It is still accepted, so
	// that older files load; gpuboot warns when it is set.
	ClearAfter time.Duration `yaml:"clearAfter"`
	// LogsEndpoint is where nodes ship their journal and container logs, as HOST:PORT
	// (no scheme): the log store's authenticating gateway that controlplane-bootstrap
	// runs (docs/monitoring.md, Logs). It goes to every node in its JoinBundle
	// (logs_endpoint); the agent speaks HTTPS to it with kubelet's client certificate.
	// Empty: nodes ship no logs, and a diskless node's logs end with its boot.
	LogsEndpoint string `yaml:"logsEndpoint"`
	// Registry is the cluster's image registry as HOST:PORT (no scheme): the one
	// controlplane-bootstrap runs with registry.enabled (docs/registry.md), at
	// apiServer.advertiseAddress:registry.port. It goes to every node in its JoinBundle
	// (registry); the agent makes the node's containerd trust it with the cluster CA.
	// Empty: nodes pull from no cluster registry.
	Registry string `yaml:"registry"`
	// APIServers are the cluster's other Kubernetes API servers, as HOST:PORT, beside
	// the enroller kubeconfig's (with three control-plane hosts: the other two). Every
	// node gets them all in its JoinBundle (api_servers) and reaches the API through its
	// local load balancer over them (docs/ha.md). Empty: the kubeconfig's alone.
	APIServers []string `yaml:"apiServers"`
}

// PodNetwork is the cluster's pod network as nodes are told it; an empty field
// leaves the image profile's setting.
type PodNetwork struct {
	// Subnet is controlplane-bootstrap's networking.podSubnet, e.g. 10.244.0.0/16.
	Subnet string `yaml:"subnet"`
	// Backend is flannel's: vxlan, or host-gw for a rack on one L2 segment.
	Backend string `yaml:"backend"`
}

// Admin configures operator access.
type Admin struct {
	// TokensFile holds operator bearer tokens (hashes) for the REST API and rack view;
	// default STATEDIR/operator-tokens.
	TokensFile string `yaml:"tokensFile"`
}

// Metrics names the metrics server gpuboot's graphs page (/graphs) draws from, and
// where gpuboot serves its own /metrics.
type Metrics struct {
	// PrometheusURL is the base URL of the metrics server's HTTP API (what comes before
	// /api/v1/query_range), e.g. http://127.0.0.1:9090: controlplane-bootstrap's
	// Prometheus (decision 0692). Empty: /graphs says the metrics server is not
	// configured.
	PrometheusURL string `yaml:"prometheusURL"`
	// PlainHTTP also serves /metrics on the plain HTTP port (listen.http), to anyone
	// who reaches it. Default false: /metrics is on the operator TLS port (listen.tls)
	// only, for a metrics-reader certificate (`gpuboot certs operator NAME --level
	// metrics-reader`; decision 0693).
	PlainHTTP bool `yaml:"plainHTTP"`
}

// Paths inside StateDir.
func (c *Config) InventoryPath() string   { return filepath.Join(c.StateDir, "inventory.db") }
func (c *Config) PKIDir() string          { return filepath.Join(c.StateDir, "pki") }
func (c *Config) GossipDir() string       { return filepath.Join(c.StateDir, "gossip") }
func (c *Config) RevocationsPath() string { return filepath.Join(c.StateDir, "pki", "revoked.json") }
func (c *Config) ServerCertPath() string  { return filepath.Join(c.StateDir, "pki", "server.crt") }
func (c *Config) ServerKeyPath() string   { return filepath.Join(c.StateDir, "pki", "server.key") }

// DHCPEnabled and TFTPEnabled apply the defaults.
func (c *Config) DHCPEnabled() bool { return c.DHCP.Enabled == nil || *c.DHCP.Enabled }
func (c *Config) TFTPEnabled() bool { return c.TFTP.Enabled == nil || *c.TFTP.Enabled }

// Load reads, parses and validates the file at path.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return Parse(path, data)
}

// Parse parses and validates data read from source. Decoding is strict (package
// strictyaml): an unknown field, a wrong type, a key given twice, an alias or a second
// document is an error. The error is a strictyaml.Errors: every problem, one per line,
// each as "SOURCE:LINE: FIELD: what to fix".
func Parse(source string, data []byte) (*Config, error) {
	c := &Config{}
	pos, err := strictyaml.Decode(source, data, c)
	if err != nil {
		return nil, err
	}
	c.Source = source
	c.pos = pos
	c.applyDefaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *Config) applyDefaults() {
	if c.Listen.HTTP == "" {
		c.Listen.HTTP = ":8080"
	}
	if c.Listen.TLS == "" {
		c.Listen.TLS = ":8443"
	}
	if c.DHCP.Mode == "" {
		c.DHCP.Mode = "proxy"
	}
	if c.Enrollment.UnknownMachines == "" {
		c.Enrollment.UnknownMachines = "discover"
	}
	if c.Enrollment.Reenroll == "" {
		c.Enrollment.Reenroll = "auto"
	}
	if c.Enrollment.Identity == "" {
		c.Enrollment.Identity = "mac-uuid-serial"
	}
	if c.Enrollment.SourceRate == 0 {
		c.Enrollment.SourceRate = DefaultSourceRate
	}
	if c.Enrollment.SourceBurst == 0 {
		c.Enrollment.SourceBurst = DefaultSourceBurst
	}
	if c.Policy.Approval == "" {
		c.Policy.Approval = "manual"
	}
	if c.DefaultRack == "" && len(c.Racks) == 1 {
		c.DefaultRack = c.Racks[0].Name
	}
	if c.Inventory.Store == "" {
		c.Inventory.Store = InventoryBolt
	}
	if c.Cluster.UnhealthyEffect == "" {
		c.Cluster.UnhealthyEffect = "NoSchedule"
	}
	if c.Admin.TokensFile == "" && c.StateDir != "" {
		c.Admin.TokensFile = filepath.Join(c.StateDir, "operator-tokens")
	}
	if c.LogLevel == "" {
		c.LogLevel = "info"
	}
	base := filepath.Dir(c.Source)
	rel := func(p *string) {
		if *p != "" && !filepath.IsAbs(*p) {
			*p = filepath.Join(base, *p)
		}
	}
	rel(&c.StateDir)
	rel(&c.Images.Store)
	for i := range c.Policy.Allowlist {
		rel(&c.Policy.Allowlist[i])
	}
	rel(&c.Cluster.Kubeconfig)
	rel(&c.Admin.TokensFile)
	if c.TFTP.Dir != "" {
		rel(&c.TFTP.Dir)
	}
	for i := range c.Images.TrustedKeys {
		rel(&c.Images.TrustedKeys[i])
	}
	for i := range c.Enrollment.EKRoots {
		rel(&c.Enrollment.EKRoots[i])
	}
}

var rackName = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$`)

// Validate checks the settings and returns every problem, one per line, each naming
// the field and what to fix, and the line of Source it is on when the Config was
// parsed.
func (c *Config) Validate() error {
	var errs strictyaml.Errors
	bad := func(field, format string, args ...any) {
		errs = append(errs, c.pos.At(c.Source, field, fmt.Sprintf(format, args...)))
	}
	c.validateServing(bad)
	c.validateDHCP(bad)
	c.validateEnrollment(bad)
	c.validateRacks(bad)
	c.validateCluster(bad)
	c.validateMetrics(bad)
	c.validateInventory(bad)
	if len(errs) > 0 {
		return errs.Sorted()
	}
	return nil
}

// validateInventory checks the inventory store: the cluster store needs the cluster.
func (c *Config) validateInventory(bad badField) {
	switch c.Inventory.Store {
	case InventoryBolt:
	case InventoryCluster:
		if c.Cluster.Kubeconfig == "" {
			bad("inventory.store", "cluster needs cluster.kubeconfig (the enroller kubeconfig): the machines are kept in that cluster")
		}
	default:
		bad("inventory.store", "%q: use bbolt (one gpuboot, STATEDIR/inventory.db) or cluster (Machine objects several gpuboot replicas share)", c.Inventory.Store)
	}
}

// badField records one problem: the field and what to fix.
type badField func(field, format string, args ...any)

// validateServing checks the state directory, the advertised address, the listeners
// and the interfaces.
func (c *Config) validateServing(bad badField) {
	if c.StateDir == "" {
		bad("stateDir", "required: the directory `gpuboot init` created")
	}
	if c.Advertise == "" {
		bad("advertise", "required: the IP address or host name machines reach gpuboot at")
	} else if strings.ContainsAny(c.Advertise, ":/ ") {
		if _, err := netip.ParseAddr(c.Advertise); err != nil {
			bad("advertise", "%q: give a host name or IP address without scheme or port", c.Advertise)
		}
	}
	for _, l := range []struct{ field, addr string }{{"listen.http", c.Listen.HTTP}, {"listen.tls", c.Listen.TLS}} {
		if _, _, err := splitHostPort(l.addr); err != nil {
			bad(l.field, "%q: want [HOST]:PORT", l.addr)
		}
	}
	if c.DHCPEnabled() || c.TFTPEnabled() {
		if len(c.Interfaces) == 0 {
			bad("interfaces", "at least one interface is needed for DHCP and TFTP (or set dhcp.enabled and tftp.enabled to false)")
		}
	}
	for i, in := range c.Interfaces {
		if in.Name == "" {
			bad(fmt.Sprintf("interfaces[%d].name", i), "required")
		}
	}
}

// validateDHCP checks dhcp and images.
func (c *Config) validateDHCP(bad badField) {
	switch c.DHCP.Mode {
	case "proxy":
		if c.DHCP.Pool != nil || len(c.DHCP.Reservations) > 0 {
			bad("dhcp.pool", "only used with dhcp.mode: full")
		}
	case "full":
		if c.DHCP.Pool == nil {
			bad("dhcp.pool", "required with dhcp.mode: full (start, end, netmask)")
		} else {
			for _, p := range []struct{ field, addr string }{{"start", c.DHCP.Pool.Start}, {"end", c.DHCP.Pool.End}} {
				if a, err := netip.ParseAddr(p.addr); err != nil || !a.Is4() {
					bad("dhcp.pool."+p.field, "%q is not an IPv4 address", p.addr)
				}
			}
			if a, err := netip.ParseAddr(c.DHCP.Pool.Netmask); err != nil || !a.Is4() {
				bad("dhcp.pool.netmask", "%q: give a dotted netmask such as 255.255.255.0", c.DHCP.Pool.Netmask)
			}
		}
		for i, r := range c.DHCP.Reservations {
			if a, err := netip.ParseAddr(r.IP); err != nil || !a.Is4() {
				bad(fmt.Sprintf("dhcp.reservations[%d].ip", i), "%q is not an IPv4 address", r.IP)
			}
			if r.MAC == "" {
				bad(fmt.Sprintf("dhcp.reservations[%d].mac", i), "required")
			}
		}
	default:
		bad("dhcp.mode", "%q: use proxy (coexists with the site's DHCP server) or full", c.DHCP.Mode)
	}
	switch c.DHCP.EFIBootFile {
	case "", "snponly.efi", "ipxe.efi":
	default:
		bad("dhcp.efiBootFile", "%q: use snponly.efi or ipxe.efi", c.DHCP.EFIBootFile)
	}
	if c.Images.Store == "" {
		bad("images.store", "required: the image store directory")
	}
	if len(c.Images.TrustedKeys) == 0 {
		bad("images.trustedKeys", "at least one image signing public key is required; unsigned images are never served")
	}
}

// validateEnrollment checks enrollment and policy.
func (c *Config) validateEnrollment(bad badField) {
	switch c.Enrollment.UnknownMachines {
	case "discover", "hold":
	default:
		bad("enrollment.unknownMachines", "%q: use discover or hold", c.Enrollment.UnknownMachines)
	}
	switch c.Enrollment.Reenroll {
	case "auto", "manual":
	default:
		bad("enrollment.reenroll", "%q: use auto or manual", c.Enrollment.Reenroll)
	}
	switch c.Enrollment.Identity {
	case "", "mac-uuid-serial", "tpm", "tpm-or-fallback": // "": a Config built in code; the default
	default:
		bad("enrollment.identity", "%q: use mac-uuid-serial, tpm or tpm-or-fallback", c.Enrollment.Identity)
	}
	if len(c.Enrollment.EKRoots) > 0 && c.Enrollment.Identity != "tpm" && c.Enrollment.Identity != "tpm-or-fallback" {
		bad("enrollment.ekRoots", "only used with identity: tpm or tpm-or-fallback (identity is %q)", cmp.Or(c.Enrollment.Identity, "mac-uuid-serial"))
	}
	if c.Enrollment.MaxUnapproved < 0 || c.Enrollment.MaxUnapprovedBytes < 0 || c.Enrollment.CreateRate < 0 || c.Enrollment.CreateBurst < 0 {
		bad("enrollment", "maxUnapproved, maxUnapprovedBytes, createRate and createBurst must not be negative")
	}
	if v := c.Enrollment.AgentCertValidity; v != 0 && v < MinAgentCertValidity {
		bad("enrollment.agentCertValidity", "%s is too short: give at least %s (agents renew at two thirds of it), or leave it out for one year", v, MinAgentCertValidity)
	}
	if c.Enrollment.SourceRate < 0 || c.Enrollment.SourceBurst < 0 {
		bad("enrollment", "sourceRate and sourceBurst must not be negative (leave them out for the defaults, %g per second with a burst of %d)", DefaultSourceRate, DefaultSourceBurst)
	}
	mode, err := policy.ParseMode(c.Policy.Approval)
	if err != nil {
		bad("policy.approval", "%v", err)
	}
	if mode == policy.Allowlist && len(c.Policy.Allowlist) == 0 {
		bad("policy.allowlist", "required with approval: allowlist (the rack manifest CSV, or a list of them, one per rack)")
	}
	seen := map[string]bool{}
	for _, p := range c.Policy.Allowlist {
		if seen[p] {
			bad("policy.allowlist", "%s is listed twice: list each rack manifest once", p)
		}
		seen[p] = true
	}
}

// validateRacks checks racks, defaultRack and selectors.
func (c *Config) validateRacks(bad badField) {
	if len(c.Racks) == 0 {
		bad("racks", "at least one rack is required")
	}
	seen := map[string]bool{}
	for i, r := range c.Racks {
		f := fmt.Sprintf("racks[%d]", i)
		if !rackName.MatchString(r.Name) {
			bad(f+".name", "%q: use 1 to 32 lowercase letters, digits and '-'", r.Name)
		}
		if seen[r.Name] {
			bad(f+".name", "rack %q listed twice", r.Name)
		}
		seen[r.Name] = true
		if r.DefaultImage != "" && !imageID.MatchString(r.DefaultImage) {
			bad(f+".defaultImage", "%q is not an image id (40 lowercase hex characters)", r.DefaultImage)
		}
	}
	if c.DefaultRack == "" && len(c.Racks) > 1 {
		bad("defaultRack", "required when several racks are configured")
	} else if c.DefaultRack != "" && !seen[c.DefaultRack] {
		bad("defaultRack", "%q is not one of racks[].name", c.DefaultRack)
	}
	if err := policy.ValidateSelectors(c.Selectors); err != nil {
		bad("selectors", "%v", err)
	}
}

// validateCluster checks cluster and logLevel.
func (c *Config) validateCluster(bad badField) {
	switch c.Cluster.UnhealthyEffect {
	case "NoSchedule", "NoExecute":
	default:
		bad("cluster.unhealthyEffect", "%q: use NoSchedule or NoExecute", c.Cluster.UnhealthyEffect)
	}
	if c.Cluster.ClearAfter < 0 {
		bad("cluster.clearAfter", "must not be negative")
	}
	if pn := c.Cluster.PodNetwork; pn.Subnet != "" && !profile.ValidPodSubnet(pn.Subnet) {
		bad("cluster.podNetwork.subnet", "%q is not a network in CIDR form like 10.244.0.0/16 (controlplane-bootstrap's networking.podSubnet)", pn.Subnet)
	}
	if b := c.Cluster.PodNetwork.Backend; !profile.ValidPodNetworkBackend(b) {
		bad("cluster.podNetwork.backend", "%q is not a pod network backend; use vxlan or host-gw", b)
	}
	if e := c.Cluster.LogsEndpoint; e != "" {
		if err := ValidLogsEndpoint(e); err != nil {
			bad("cluster.logsEndpoint", "%v", err)
		}
	}
	if e := c.Cluster.Registry; e != "" {
		if err := ValidRegistry(e); err != nil {
			bad("cluster.registry", "%v", err)
		}
	}
	seen := map[string]bool{}
	for i, e := range c.Cluster.APIServers {
		field := fmt.Sprintf("cluster.apiServers[%d]", i)
		if err := validHostPort(e, "give each API server as HOST:PORT, such as 10.0.0.3:6443 (no scheme or path)"); err != nil {
			bad(field, "%v", err)
		} else if seen[e] {
			bad(field, "%q is listed twice", e)
		}
		seen[e] = true
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		bad("logLevel", "%q: use debug, info, warn or error", c.LogLevel)
	}
}

// validateMetrics checks metrics.prometheusURL: an http or https base URL with a
// host, and nothing gpuboot would have to keep secret or drop (no user or password,
// query or fragment).
func (c *Config) validateMetrics(bad badField) {
	raw := c.Metrics.PrometheusURL
	if raw == "" {
		return
	}
	const want = "give the metrics server's base URL, such as http://127.0.0.1:9090 (no user, query or fragment)"
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		bad("metrics.prometheusURL", "%q is not a URL: %s", raw, want)
	case u.Scheme != "http" && u.Scheme != "https":
		bad("metrics.prometheusURL", "%q: scheme must be http or https; %s", raw, want)
	case u.Host == "" || u.Hostname() == "":
		bad("metrics.prometheusURL", "%q has no host; %s", raw, want)
	case u.User != nil || u.RawQuery != "" || u.ForceQuery || u.Fragment != "":
		bad("metrics.prometheusURL", "%q: %s", raw, want)
	}
}

// ValidLogsEndpoint checks a logs endpoint: HOST:PORT with a host and a port number,
// no scheme or path (the agent adds https:// and /insert/jsonline).
func ValidLogsEndpoint(e string) error {
	return validHostPort(e, "give the log gateway as HOST:PORT, such as 10.0.0.2:9428 or logs.example:9428 (no scheme or path)")
}

// ValidRegistry checks a registry address: HOST:PORT with a host and a port number,
// no scheme or path (it names containerd's hosts.toml folder; the agent adds https://).
func ValidRegistry(e string) error {
	return validHostPort(e, "give the cluster registry as HOST:PORT, such as 10.0.0.2:5000 or registry.example:5000 (no scheme or path)")
}

// validHostPort checks HOST:PORT with a host and a port number in 1-65535, no scheme
// or path; want says what to give instead.
func validHostPort(e, want string) error {
	if strings.Contains(e, "/") {
		return fmt.Errorf("%q: %s", e, want)
	}
	host, port, err := net.SplitHostPort(e)
	if err != nil {
		return fmt.Errorf("%q: %v; %s", e, err, want)
	}
	if p, err := strconv.Atoi(port); host == "" || err != nil || p < 1 || p > 65535 {
		return fmt.Errorf("%q: %s", e, want)
	}
	return nil
}

var imageID = regexp.MustCompile(`^[0-9a-f]{40}$`)

func splitHostPort(s string) (string, string, error) {
	i := strings.LastIndex(s, ":")
	if i < 0 || i == len(s)-1 {
		return "", "", errors.New("no port")
	}
	return s[:i], s[i+1:], nil
}
