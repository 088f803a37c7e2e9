// Package server wires `gpuboot serve`: it turns a pxe/config.Config into running
// parts (CONTRACTS §3): DHCP (67, 4011) and TFTP (69) on the configured interfaces,
// plain HTTP (:8080: /boot.ipxe, /images, /metrics) and TLS (:8443: EnrollmentService,
// AdminService with server reflection, the REST API and the rack view), the inventory,
// the enrollment service and, with an enroller kubeconfig, the node controller. It
// also holds `gpuboot init` and operator certificate issuance.
//
// It holds no protocol or lifecycle logic; the packages it wires do.
package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc"
	"google.golang.org/grpc/reflection"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/internal/manifest"
	"github.com/gpurack/gpurack/internal/pki"
	"github.com/gpurack/gpurack/pxe/admin"
	"github.com/gpurack/gpurack/pxe/config"
	"github.com/gpurack/gpurack/pxe/dhcp"
	"github.com/gpurack/gpurack/pxe/enroll"
	"github.com/gpurack/gpurack/pxe/httpboot"
	"github.com/gpurack/gpurack/pxe/identity"
	"github.com/gpurack/gpurack/pxe/inventory"
	"github.com/gpurack/gpurack/pxe/nodecontrol"
	"github.com/gpurack/gpurack/pxe/policy"
	"github.com/gpurack/gpurack/pxe/report"
	"github.com/gpurack/gpurack/pxe/tftp"
)

// Run serves until ctx is done or a listener fails.
func Run(ctx context.Context, cfg *config.Config, log *slog.Logger) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	ca, err := pki.LoadCA(cfg.PKIDir())
	if err != nil {
		return fmt.Errorf("%w (run `gpuboot init --state-dir %s --advertise …` first)", err, cfg.StateDir)
	}
	serverKP, err := pki.LoadKeyPair(cfg.ServerCertPath(), cfg.ServerKeyPath())
	if err != nil {
		return fmt.Errorf("server certificate: %w", err)
	}
	revoked := pki.NewRevocationList()
	if _, err := os.Stat(cfg.RevocationsPath()); err == nil {
		if revoked, err = pki.LoadRevocationList(cfg.RevocationsPath()); err != nil {
			return err
		}
	}
	bolt, err := inventory.OpenBolt(cfg.InventoryPath())
	if err != nil {
		return err
	}
	defer bolt.Close()
	// Every write goes through store, which keeps the machines-by-state gauge.
	store, err := newCountingStore(ctx, bolt)
	if err != nil {
		return err
	}

	mode, _ := policy.ParseMode(cfg.Policy.Approval)
	pol := policy.Policy{Mode: mode}
	if cfg.Policy.Allowlist != "" {
		if pol.List, err = policy.LoadList(cfg.Policy.Allowlist); err != nil {
			return err
		}
	}
	if w := pol.Warning(); w != "" {
		log.Warn(w)
	}
	if cfg.Enrollment.AllowSimulated {
		log.Warn("enrollment.allowSimulated is on: machines whose agent runs the simulator GPU backend (no real GPUs) can become ready; use it only in labs and demos")
	}
	racks := map[string]enroll.Rack{}
	for _, r := range cfg.Racks {
		p, key, err := EnsureGossipKey(cfg.StateDir, r.Name)
		if err != nil {
			return err
		}
		racks[r.Name] = enroll.Rack{Name: r.Name, DefaultImage: r.DefaultImage, GossipKey: key}
		log.Debug("gossip key", "rack", r.Name, "file", p)
	}

	var cluster *nodecontrol.Cluster
	var ctl *nodecontrol.Controller
	var ctlMu sync.Mutex
	var ekRoots *enroll.EKRoots
	if len(cfg.Enrollment.EKRoots) > 0 {
		if ekRoots, err = enroll.LoadEKRoots(cfg.Enrollment.EKRoots); err != nil {
			return err
		}
		log.Info("TPMs must be certified by a vendor: EK certificates must chain to enrollment.ekRoots", "roots", ekRoots.Roots())
	}
	ecfg := enroll.Config{
		Store: store, Policy: pol, Selectors: cfg.Selectors, Racks: racks, DefaultRack: cfg.DefaultRack,
		GossipKeyDir:    filepath.Join(cfg.StateDir, "gossip"),
		UnknownMachines: enroll.UnknownMachines(cfg.Enrollment.UnknownMachines), Reenroll: enroll.Reenroll(cfg.Enrollment.Reenroll),
		Identity: enroll.IdentityMode(cfg.Enrollment.Identity), EKRoots: ekRoots,
		CA: ca, Revocations: revoked, RevocationsPath: cfg.RevocationsPath(),
		ClusterDNS: cfg.Cluster.DNS, ClusterDomain: cfg.Cluster.Domain, NodeNamePrefix: cfg.Enrollment.NodeNamePrefix,
		PodNetwork:    &bootv1.PodNetwork{Subnet: cfg.Cluster.PodNetwork.Subnet, Backend: cfg.Cluster.PodNetwork.Backend},
		MaxUnapproved: cfg.Enrollment.MaxUnapproved, CreateRate: cfg.Enrollment.CreateRate, CreateBurst: cfg.Enrollment.CreateBurst,
		MaxUnapprovedBytes: cfg.Enrollment.MaxUnapprovedBytes,
		AllowSimulated:     cfg.Enrollment.AllowSimulated,
		Log:                log,
		OnChange: func(m *inventory.Machine) {
			ctlMu.Lock()
			defer ctlMu.Unlock()
			if ctl != nil {
				ctl.Enqueue(m.NodeName)
			}
		},
	}
	if cfg.Cluster.Kubeconfig != "" {
		if cluster, err = nodecontrol.Load(cfg.Cluster.Kubeconfig); err != nil {
			return err
		}
		ecfg.Cluster = cluster
	} else {
		log.Warn("no cluster.kubeconfig: JoinBundles carry no Kubernetes endpoint or bootstrap token, and the node controller does not run")
	}
	for _, w := range enroll.StartWarnings(ecfg) {
		log.Warn(w)
	}
	svc, err := enroll.New(ctx, ecfg)
	if err != nil {
		return err
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	reg.MustRegister(newInventoryCollector(svc, store.byClass))

	errc := make(chan error, 8)
	var wg sync.WaitGroup
	start := func(name string, f func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(); err != nil && ctx.Err() == nil {
				errc <- fmt.Errorf("%s: %w", name, err)
			}
		}()
	}

	if cluster != nil {
		ctlMu.Lock()
		if cfg.Cluster.ClearAfter != 0 {
			log.Warn("cluster.clearAfter is ignored: the taint follows GPUHealthy and the agent's --clear-after is the only hysteresis (decision 0205); remove it from the configuration")
		}
		ctl = nodecontrol.NewController(cluster, svc, nodecontrol.Options{
			Effect: corev1Effect(cfg.Cluster.UnhealthyEffect), Log: log})
		ctlMu.Unlock()
		start("node controller", func() error { return ctl.Run(ctx) })
	}

	// Plain HTTP: /boot.ipxe, /images, /metrics.
	_, tlsPort, _ := net.SplitHostPort(cfg.Listen.TLS)
	_, httpPort, _ := net.SplitHostPort(cfg.Listen.HTTP)
	keys, err := manifest.LoadPublicKeys(cfg.Images.TrustedKeys...)
	if err != nil {
		return fmt.Errorf("images.trustedKeys: %w", err)
	}
	ipxeDir := ""
	if cfg.TFTPEnabled() {
		ipxeDir = tftpDir(cfg)
	}
	hb, err := httpboot.NewHandler(httpboot.Config{
		ImageStore: cfg.Images.Store, TrustedKeys: keys,
		// Verified artifacts are served from private copies (unlinked, so the
		// directory stays empty): the store's files may change after verification.
		VerifiedCopies: filepath.Join(cfg.StateDir, "verified-images"),
		BaseURL:        "http://" + net.JoinHostPort(cfg.Advertise, httpPort),
		EnrollAddr:     net.JoinHostPort(cfg.Advertise, tlsPort), EnrollCAPin: ca.Pin(),
		IPXEDir: ipxeDir, Registry: reg, Log: log,
	}, httpboot.BooterFunc(func(ctx context.Context, id identity.Identity, remote netip.Addr) (httpboot.Target, error) {
		d, err := svc.DecideBoot(ctx, id, remote)
		if err != nil {
			return httpboot.Target{}, err
		}
		if d.Action == enroll.BootHold {
			return httpboot.Target{Action: httpboot.Hold}, nil
		}
		return httpboot.Target{Action: httpboot.Boot, ImageID: d.ImageID}, nil
	}))
	if err != nil {
		return err
	}
	httpLis, err := net.Listen("tcp", cfg.Listen.HTTP)
	if err != nil {
		return fmt.Errorf("listen.http: %w", err)
	}
	httpSrv := newHTTPServer(hb, defaultHTTPLimits)
	start("http", func() error { return httpSrv.Serve(httpLis) })

	// TLS: gRPC (Enrollment, Admin, reflection) and the REST API + rack view.
	gs := grpc.NewServer(grpcServerOptions(newSourceLimiter(cfg.Enrollment.SourceRate, cfg.Enrollment.SourceBurst))...)
	bootv1.RegisterEnrollmentServiceServer(gs, svc)
	rackNames := make([]string, 0, len(cfg.Racks))
	for _, r := range cfg.Racks {
		rackNames = append(rackNames, r.Name)
	}
	adm, err := admin.New(admin.Config{Lifecycle: svc, Inventory: store, CA: ca.Cert, Revoked: svc.Revoked,
		Racks: rackNames, Tokens: mustTokens(cfg, log), Gossip: svc,
		Operators: &operatorCreds{stateDir: cfg.StateDir, tokensFile: cfg.Admin.TokensFile, svc: svc, log: log},
		Quotas:    tenantQuotas(cluster)})
	if err != nil {
		return err
	}
	bootv1.RegisterAdminServiceServer(gs, adm)
	reflection.Register(gs)
	restHandler := adm.Handler()
	tlsCfg := &tls.Config{
		MinVersion:       tls.VersionTLS12,
		Certificates:     []tls.Certificate{serverKP.TLSCertificate(ca.Cert)},
		ClientAuth:       tls.VerifyClientCertIfGiven,
		ClientCAs:        ca.CertPool(),
		VerifyConnection: revoked.VerifyConnection,
		NextProtos:       []string{"h2", "http/1.1"},
	}
	tlsLis, err := net.Listen("tcp", cfg.Listen.TLS)
	if err != nil {
		return fmt.Errorf("listen.tls: %w", err)
	}
	tlsSrv := newHTTPServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor == 2 && strings.HasPrefix(r.Header.Get("Content-Type"), "application/grpc") {
			gs.ServeHTTP(w, r)
			return
		}
		restHandler.ServeHTTP(w, r)
	}), defaultHTTPLimits)
	tlsSrv.TLSConfig = tlsCfg
	start("tls", func() error { return tlsSrv.ServeTLS(tlsLis, "", "") })

	// DHCP and TFTP.
	if cfg.DHCPEnabled() {
		if err := startDHCP(ctx, cfg, hb.ScriptURL(), ipxeDir != "", httpPort, reg, log, start); err != nil {
			return err
		}
	}
	if cfg.TFTPEnabled() {
		ts, err := tftp.New(tftp.Config{Dir: ipxeDir, SinglePort: cfg.TFTP.SinglePort}, tftp.NewMetrics(reg), log)
		if err != nil {
			return err
		}
		conn, err := tftp.Listen(":69")
		if err != nil {
			return err
		}
		start("tftp", func() error { return ts.Serve(ctx, conn) })
	}

	log.Info("gpuboot serving", "http", httpLis.Addr().String(), "tls", tlsLis.Addr().String(), "advertise", cfg.Advertise,
		"approval", pol.Mode, "unknownMachines", cfg.Enrollment.UnknownMachines, "reenroll", cfg.Enrollment.Reenroll, "identity", cfg.Enrollment.Identity,
		"ca_pin", ca.Pin(), "cluster", cluster != nil)

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-errc:
		cancel()
	}
	shutdown, stop := context.WithTimeout(context.Background(), 5*time.Second)
	defer stop()
	httpSrv.Shutdown(shutdown)
	if tlsSrv.Shutdown(shutdown) != nil {
		tlsSrv.Close()
	}
	gs.Stop()
	wg.Wait()
	return runErr
}

func tftpDir(cfg *config.Config) string {
	if cfg.TFTP.Dir != "" {
		return cfg.TFTP.Dir
	}
	return tftp.DefaultDir
}

func mustTokens(cfg *config.Config, log *slog.Logger) *admin.Tokens {
	t, err := admin.LoadTokens(cfg.Admin.TokensFile)
	if err != nil {
		log.Error("operator tokens not loaded; only operator certificates are accepted", "err", err)
		return nil
	}
	if old := t.Legacy(); len(old) > 0 {
		log.Warn("operator tokens without an expiry (written by an older gpuboot): issue new ones with `gpuboot certs operator NAME --token` and remove these lines", "operators", old, "file", cfg.Admin.TokensFile)
	}
	return t
}

func startDHCP(ctx context.Context, cfg *config.Config, scriptURL string, haveIPXE bool, httpPort string, reg *prometheus.Registry, log *slog.Logger, start func(string, func() error)) error {
	metrics := dhcp.NewMetrics(reg)
	for _, in := range cfg.Interfaces {
		serverIP, err := interfaceIPv4(cfg.Advertise, in.Name)
		if err != nil {
			return err
		}
		dc := dhcp.Config{
			Mode: dhcp.Mode(cfg.DHCP.Mode), ServerIP: serverIP, ScriptURL: scriptURL,
			BIOSBootFile: cfg.DHCP.BIOSBootFile, EFIBootFile: cfg.DHCP.EFIBootFile,
		}
		if haveIPXE {
			dc.HTTPBootURL = "http://" + net.JoinHostPort(cfg.Advertise, httpPort) + "/ipxe/ipxe.efi"
		}
		if dc.Mode == dhcp.ModeFull {
			p := cfg.DHCP.Pool
			res := map[string]netip.Addr{}
			for _, r := range cfg.DHCP.Reservations {
				mac, err := identity.NormalizeMAC(r.MAC)
				if err != nil {
					return fmt.Errorf("dhcp.reservations: %w", err)
				}
				res[mac.String()] = netip.MustParseAddr(r.IP)
			}
			pool, err := dhcp.NewPool(netip.MustParseAddr(p.Start), netip.MustParseAddr(p.End), res, p.LeaseTime, time.Now)
			if err != nil {
				return fmt.Errorf("dhcp.pool: %w", err)
			}
			dc.Leases = pool
			dc.SubnetMask = net.IPMask(netip.MustParseAddr(p.Netmask).AsSlice())
			for _, r := range p.Routers {
				if a, err := netip.ParseAddr(r); err == nil {
					dc.Routers = append(dc.Routers, a)
				}
			}
			for _, r := range p.DNS {
				if a, err := netip.ParseAddr(r); err == nil {
					dc.DNS = append(dc.DNS, a)
				}
			}
			dc.LeaseTime = p.LeaseTime
		}
		if err := dc.Validate(); err != nil {
			return fmt.Errorf("dhcp on %s: %w", in.Name, err)
		}
		ports := []int{67, 4011}
		for _, port := range ports {
			conn, err := dhcp.Listen(in.Name, port)
			if err != nil {
				return err
			}
			s := &dhcp.Server{Config: dc, Metrics: metrics, Log: log}
			start(fmt.Sprintf("dhcp %s:%d", in.Name, port), func() error { return s.Serve(ctx, conn) })
		}
	}
	return nil
}

// interfaceIPv4 returns advertise if it is an IPv4 address, else the first IPv4 address
// of the interface.
func interfaceIPv4(advertise, iface string) (netip.Addr, error) {
	if a, err := netip.ParseAddr(advertise); err == nil && a.Is4() {
		return a, nil
	}
	in, err := net.InterfaceByName(iface)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("interface %s: %w", iface, err)
	}
	addrs, err := in.Addrs()
	if err != nil {
		return netip.Addr{}, err
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok && ip.Unmap().Is4() {
				return ip.Unmap(), nil
			}
		}
	}
	return netip.Addr{}, errors.New("interface " + iface + " has no IPv4 address: set advertise to gpuboot's IPv4 address")
}

// tenantQuotas reads the tenants' GPU quotas for the rack report with the enroller
// credential; nil without a cluster.
func tenantQuotas(c *nodecontrol.Cluster) func(context.Context) (map[string]report.Quota, error) {
	if c == nil {
		return nil
	}
	return func(ctx context.Context) (map[string]report.Quota, error) {
		qs, err := c.TenantGPUQuotas(ctx)
		if err != nil {
			return nil, err
		}
		out := make(map[string]report.Quota, len(qs))
		for t, q := range qs {
			out[t] = report.Quota{Hard: q.Hard, Used: q.Used}
		}
		return out, nil
	}
}
