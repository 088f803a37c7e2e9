package components

import (
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"

	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterconfig"
	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterpki"
)

// Component names, which are also the names of their pinned binaries.
const (
	Etcd              = "etcd"
	APIServer         = "kube-apiserver"
	ControllerManager = "kube-controller-manager"
	Scheduler         = "kube-scheduler"
)

// Names lists the components in start order (stop in reverse).
var Names = []string{Etcd, APIServer, ControllerManager, Scheduler}

// Port is one TCP address a component listens on.
type Port struct {
	Host  string
	Port  int
	Field string // the cluster.yaml field that sets it
}

// Addr is host:port.
func (p Port) Addr() string { return net.JoinHostPort(p.Host, strconv.Itoa(p.Port)) }

// Component is one control-plane process: what to run and how to check it.
type Component struct {
	Name string
	// Args are the command-line flags, sorted by name.
	Args []string
	// Env is what the component's environment adds (KEY=VALUE): settings a program
	// takes only from there (the registry's OpenTelemetry exporter).
	Env []string
	// Ports are the addresses it listens on.
	Ports []Port
	// HealthURL answers 200 "ok" (or etcd's {"health":"true"}) when healthy.
	HealthURL string
	// HealthText, when set, is what HealthURL's body holds when healthy instead of "ok".
	HealthText string
	// HealthAnyValue: a 200 from HealthURL is healthy, whatever its body (the
	// registry's "/" answers with none).
	HealthAnyValue bool
	// Reads are files named in the component's own configuration file rather than in
	// its flags (the registry's certificates), for Using.
	Reads []string
	// Writes are folders outside the cluster directory it writes (registry.storage),
	// which its systemd unit's sandbox lets it write.
	Writes []string
	// Self is set for a component that is this program (controlplane-bootstrap) run
	// with a subcommand, Args[0], rather than a pinned binary: the log gateway.
	Self bool
	// Capabilities are the capabilities its systemd unit keeps (CAP_NET_ADMIN); the
	// others keep none (decision 0690). Only the floating address's holder has any.
	Capabilities []string
	// AddressFamilies are the socket families its systemd unit allows besides
	// AF_INET, AF_INET6, AF_UNIX and AF_NETLINK (AF_PACKET for ARP).
	AddressFamilies []string
}

// Specs returns the components for cfg laid out in l, in start order: the four of the
// control plane, the floating API address's holder when apiServer.vip has an address,
// then Alertmanager, kube-state-metrics and Prometheus when monitoring is enabled, Kueue
// when queues are, and the image registry when it is.
func Specs(cfg *clusterconfig.Config, l Layout) []Component {
	core := []Component{etcdSpec(cfg, l), apiserverSpec(cfg, l), controllerManagerSpec(cfg, l), schedulerSpec(cfg, l)}
	specs := append(append(append(core, vipSpecs(cfg, l)...), monitoringSpecs(cfg, l)...), queueSpecs(cfg, l)...)
	return append(specs, registrySpecs(cfg, l)...)
}

// Spec returns the component called name.
func Spec(cfg *clusterconfig.Config, l Layout, name string) (Component, bool) {
	for _, c := range Specs(cfg, l) {
		if c.Name == name {
			return c, true
		}
	}
	return Component{}, false
}

// leaderElect is the controller-manager's and the scheduler's --leader-elect: on with
// several control-plane hosts, where each host runs one and one must act; off with
// one, where a restarted controller-manager would otherwise wait out its own lease
// (it does not release it on exit) before acting again.
func leaderElect(cfg *clusterconfig.Config) string { return strconv.FormatBool(cfg.HA()) }

func hostPort(host string, port int) string { return net.JoinHostPort(host, strconv.Itoa(port)) }

func etcdSpec(cfg *clusterconfig.Config, l Layout) Component {
	adv := cfg.APIServer.AdvertiseAddress
	clientURL := "https://" + hostPort(adv, cfg.Etcd.ClientPort)
	peerURL := "https://" + hostPort(adv, cfg.Etcd.PeerPort)
	listenClient := "https://" + hostPort("127.0.0.1", cfg.Etcd.ClientPort)
	if adv != "127.0.0.1" {
		listenClient += "," + clientURL
	}
	flags := map[string]string{
		"name":                        cfg.NodeName,
		"data-dir":                    l.EtcdDataDir(),
		"listen-client-urls":          listenClient,
		"advertise-client-urls":       clientURL,
		"listen-peer-urls":            peerURL,
		"initial-advertise-peer-urls": peerURL,
		"initial-cluster":             cfg.NodeName + "=" + peerURL,
		"initial-cluster-state":       "new",
		"listen-metrics-urls":         "http://" + hostPort("127.0.0.1", cfg.Etcd.MetricsPort),
		"client-cert-auth":            "true",
		"trusted-ca-file":             l.PKI(clusterpki.EtcdCACert),
		"cert-file":                   l.PKI(clusterpki.EtcdServerCert),
		"key-file":                    l.PKI(clusterpki.EtcdServerKey),
		"peer-client-cert-auth":       "true",
		"peer-trusted-ca-file":        l.PKI(clusterpki.EtcdCACert),
		"peer-cert-file":              l.PKI(clusterpki.EtcdPeerCert),
		"peer-key-file":               l.PKI(clusterpki.EtcdPeerKey),
		"snapshot-count":              "10000",
	}
	if j := cfg.Etcd.Join.InitialCluster; j != "" {
		// This member joined a cluster (join --control-plane): etcd reads these two
		// only on its first start, when the data directory is empty.
		flags["initial-cluster"], flags["initial-cluster-state"] = j, "existing"
	}
	ports := []Port{
		{"127.0.0.1", cfg.Etcd.ClientPort, "etcd.clientPort"},
		{adv, cfg.Etcd.PeerPort, "etcd.peerPort"},
		{"127.0.0.1", cfg.Etcd.MetricsPort, "etcd.metricsPort"},
	}
	if adv != "127.0.0.1" {
		ports = append(ports, Port{adv, cfg.Etcd.ClientPort, "etcd.clientPort"})
	}
	return Component{
		Name:      Etcd,
		Args:      render(flags, cfg.Etcd.ExtraArgs),
		Ports:     ports,
		HealthURL: "http://" + hostPort("127.0.0.1", cfg.Etcd.MetricsPort) + "/health",
	}
}

func apiserverSpec(cfg *clusterconfig.Config, l Layout) Component {
	flags := map[string]string{
		"advertise-address":                  cfg.APIServer.AdvertiseAddress,
		"bind-address":                       cfg.APIServer.BindAddress,
		"secure-port":                        strconv.Itoa(cfg.APIServer.Port),
		"allow-privileged":                   "true",
		"anonymous-auth":                     "true", // kubeadm discovery reads kube-public/cluster-info anonymously
		"authorization-mode":                 "Node,RBAC",
		"enable-admission-plugins":           "NodeRestriction",
		"enable-bootstrap-token-auth":        "true",
		"client-ca-file":                     l.PKI(clusterpki.CACert),
		"tls-cert-file":                      l.PKI(clusterpki.APIServerCert),
		"tls-private-key-file":               l.PKI(clusterpki.APIServerKey),
		"kubelet-client-certificate":         l.PKI(clusterpki.APIServerKubeletCert),
		"kubelet-client-key":                 l.PKI(clusterpki.APIServerKubeletKey),
		"kubelet-preferred-address-types":    "InternalIP,ExternalIP,Hostname",
		"etcd-servers":                       "https://" + hostPort("127.0.0.1", cfg.Etcd.ClientPort),
		"etcd-cafile":                        l.PKI(clusterpki.EtcdCACert),
		"etcd-certfile":                      l.PKI(clusterpki.APIServerEtcdCert),
		"etcd-keyfile":                       l.PKI(clusterpki.APIServerEtcdKey),
		"service-account-issuer":             "https://kubernetes.default.svc." + cfg.Networking.DNSDomain,
		"service-account-key-file":           l.PKI(clusterpki.SAPub),
		"service-account-signing-key-file":   l.PKI(clusterpki.SAKey),
		"service-cluster-ip-range":           cfg.Networking.ServiceSubnet,
		"requestheader-client-ca-file":       l.PKI(clusterpki.FrontProxyCACert),
		"requestheader-allowed-names":        clusterpki.FrontProxyClientUser,
		"requestheader-extra-headers-prefix": "X-Remote-Extra-",
		"requestheader-group-headers":        "X-Remote-Group",
		"requestheader-username-headers":     "X-Remote-User",
		"proxy-client-cert-file":             l.PKI(clusterpki.FrontProxyClientCert),
		"proxy-client-key-file":              l.PKI(clusterpki.FrontProxyClientKey),
		"encryption-provider-config":         l.EncryptionConfig(),
		"audit-policy-file":                  l.AuditPolicy(),
		"audit-log-path":                     l.AuditLog(),
		"audit-log-maxage":                   "30",
		"audit-log-maxbackup":                "10",
		"audit-log-maxsize":                  "100",
		// On SIGTERM, close watches and wait at most this long for them: otherwise the
		// controller-manager's and scheduler's watches hold shutdown (and a restart onto
		// renewed certificates) for the full request timeout, a minute.
		"shutdown-watch-termination-grace-period": "5s",
	}
	for k, v := range cfg.APIServer.OIDC.Flags() {
		flags[k] = v
	}
	if cfg.LoopbackAdvertised() {
		// The kubernetes Service's Endpoints may not point at loopback
		// ("may not be in the loopback range"): measured in
		// research/k8s-feasibility.md §4.
		flags["endpoint-reconciler-type"] = "none"
	}
	probeHost := cfg.APIServer.BindAddress
	if ip := net.ParseIP(probeHost); ip == nil || ip.IsUnspecified() {
		probeHost = "127.0.0.1"
	}
	return Component{
		Name:      APIServer,
		Args:      render(flags, cfg.APIServer.ExtraArgs),
		Ports:     []Port{{cfg.APIServer.BindAddress, cfg.APIServer.Port, "apiServer.port"}},
		HealthURL: "https://" + hostPort(probeHost, cfg.APIServer.Port) + "/readyz",
	}
}

func controllerManagerSpec(cfg *clusterconfig.Config, l Layout) Component {
	kc := l.Kubeconfig(clusterpki.ControllerManagerKubeconfig)
	flags := map[string]string{
		"kubeconfig":                       kc,
		"authentication-kubeconfig":        kc,
		"authorization-kubeconfig":         kc,
		"bind-address":                     "127.0.0.1",
		"secure-port":                      strconv.Itoa(cfg.ControllerManager.Port),
		"cert-dir":                         l.PKI(clusterpki.ControllerManagerServingDir),
		"client-ca-file":                   l.PKI(clusterpki.CACert),
		"requestheader-client-ca-file":     l.PKI(clusterpki.FrontProxyCACert),
		"root-ca-file":                     l.PKI(clusterpki.CACert),
		"cluster-name":                     cfg.ClusterName,
		"cluster-signing-cert-file":        l.PKI(clusterpki.CACert),
		"cluster-signing-key-file":         l.PKI(clusterpki.CAKey),
		"service-account-private-key-file": l.PKI(clusterpki.SAKey),
		"use-service-account-credentials":  "true",
		// bootstrapsigner signs kube-public/cluster-info with every token;
		// tokencleaner deletes expired tokens. Both are off by default.
		"controllers":              "*,bootstrapsigner,tokencleaner",
		"leader-elect":             leaderElect(cfg),
		"allocate-node-cidrs":      "true",
		"cluster-cidr":             cfg.Networking.PodSubnet,
		"service-cluster-ip-range": cfg.Networking.ServiceSubnet,
	}
	return Component{
		Name:      ControllerManager,
		Args:      render(flags, cfg.ControllerManager.ExtraArgs),
		Ports:     []Port{{"127.0.0.1", cfg.ControllerManager.Port, "controllerManager.port"}},
		HealthURL: "https://" + hostPort("127.0.0.1", cfg.ControllerManager.Port) + "/healthz",
	}
}

func schedulerSpec(cfg *clusterconfig.Config, l Layout) Component {
	kc := l.Kubeconfig(clusterpki.SchedulerKubeconfig)
	flags := map[string]string{
		"kubeconfig":                kc,
		"authentication-kubeconfig": kc,
		"authorization-kubeconfig":  kc,
		"bind-address":              "127.0.0.1",
		"secure-port":               strconv.Itoa(cfg.Scheduler.Port),
		"cert-dir":                  l.PKI(clusterpki.SchedulerServingDir),
		"leader-elect":              leaderElect(cfg),
	}
	return Component{
		Name:      Scheduler,
		Args:      render(flags, cfg.Scheduler.ExtraArgs),
		Ports:     []Port{{"127.0.0.1", cfg.Scheduler.Port, "scheduler.port"}},
		HealthURL: "https://" + hostPort("127.0.0.1", cfg.Scheduler.Port) + "/healthz",
	}
}

// Using returns the names of the components in specs, in their order, that read one of
// paths: one of their flags names the path, or a directory above it (--cert-dir), or
// their Reads list it. These are the components to restart after the files change.
func Using(specs []Component, paths []string) []string {
	var names []string
	for _, c := range specs {
		if slices.ContainsFunc(c.Reads, func(r string) bool { return slices.Contains(paths, r) }) {
			names = append(names, c.Name)
			continue
		}
		if slices.ContainsFunc(c.Args, func(arg string) bool {
			_, value, ok := strings.Cut(arg, "=")
			return ok && value != "" && slices.ContainsFunc(paths, func(p string) bool {
				return p == value || strings.HasPrefix(p, strings.TrimSuffix(value, "/")+"/")
			})
		}) {
			names = append(names, c.Name)
		}
	}
	return names
}

// render merges extra over flags and returns "--name=value" sorted by name.
func render(flags, extra map[string]string) []string {
	all := maps.Clone(flags)
	maps.Copy(all, extra)
	names := slices.Sorted(maps.Keys(all))
	args := make([]string, 0, len(names))
	for _, n := range names {
		args = append(args, fmt.Sprintf("--%s=%s", strings.TrimLeft(n, "-"), all[n]))
	}
	return args
}
