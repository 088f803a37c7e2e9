package controlplane

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterconfig"
	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterpki"
	"github.com/gpurack/gpurack/controlplane-bootstrap/components"
)

// RenewOptions configure RenewCertificates.
type RenewOptions struct {
	// Names are the certificates to renew: clusterpki.RenewAll, or names from
	// clusterpki.CertificateNames.
	Names []string
	// Validity of the new certificates; zero means a year.
	Validity time.Duration
	// Out receives what was renewed and the restarts' progress; nil discards it.
	Out io.Writer
}

// RenewResult is what RenewCertificates did.
type RenewResult struct {
	Renewed []clusterpki.Renewed
	// Restarted are the components restarted onto the new certificates, in order.
	Restarted []string
	// Pending are the components that read a renewed file but were not restarted here
	// (the control plane is stopped); Next says what to run.
	Pending []string
	Next    string
}

// RenewCertificates issues the named certificates of the control plane in dir again
// (clusterpki.PlanRenewal: all in memory first, so a missing CA key or an unknown name
// writes nothing), writes them, and restarts every running component that reads one of
// them, in start order: through the supervisor of an `init --foreground`, or systemd's
// units. It then checks that kube-apiserver and etcd serve their new certificates. A
// control plane that is stopped reads them when it next starts.
func RenewCertificates(ctx context.Context, dir string, opts RenewOptions) (*RenewResult, error) {
	out := opts.Out
	if out == nil {
		out = io.Discard
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	l := components.Layout{Dir: abs}
	if err := clusterpki.LooksLikeClusterDir(abs); err != nil {
		return nil, err
	}
	cfg, err := clusterconfig.Load(l.ConfigFile())
	if err != nil {
		return nil, fmt.Errorf("%s is not a control-plane directory made by init: %w", abs, err)
	}
	plan, err := clusterpki.PlanRenewal(abs, opts.Names, opts.Validity)
	if err != nil {
		return nil, err
	}
	affected := components.Using(components.Specs(cfg, l), plan.Paths())
	if err := plan.Write(); err != nil {
		return nil, err
	}
	res := &RenewResult{Renewed: plan.Renewed}
	for _, r := range plan.Renewed {
		if r.Kind == clusterpki.SelfSigned {
			fmt.Fprintf(out, "renewed %s: removed %s; the component makes a new one when it starts\n", r.Name, r.File)
			continue
		}
		fmt.Fprintf(out, "renewed %s: %s, serial %s, expires %s\n", r.Name, r.File, r.Serial, r.NotAfter.Format(time.RFC3339))
	}
	cp := &ControlPlane{Layout: l, Config: cfg, readyTimeout: 3 * time.Minute}
	if err := cp.restartRenewed(ctx, affected, res, out); err != nil {
		return res, fmt.Errorf("the certificates are renewed, but %w", err)
	}
	if len(res.Restarted) > 0 {
		if err := cp.checkServed(ctx, plan.Renewed, res.Restarted, out); err != nil {
			return res, err
		}
	}
	return res, nil
}

// restartRenewed gets the running components among names onto their new files.
func (cp *ControlPlane) restartRenewed(ctx context.Context, names []string, res *RenewResult, out io.Writer) error {
	l := cp.Layout
	restartByHand := fmt.Sprintf("`controlplane-bootstrap stop --dir %s` and then `controlplane-bootstrap init --dir %s --foreground`", l.Dir, l.Dir)
	if len(names) == 0 {
		fmt.Fprintln(out, "no component reads these certificates; nothing to restart")
		return nil
	}
	if pid, alive := runningSupervisor(l); alive {
		fmt.Fprintf(out, "asking the supervisor (pid %d) to restart %s\n", pid, strings.Join(names, ", "))
		if err := requestRestart(ctx, l, names, out); err != nil {
			return fmt.Errorf("restarting %s failed: %w\nrestart the control plane with %s", strings.Join(names, ", "), err, restartByHand)
		}
		res.Restarted = names
		return nil
	}
	if data, err := os.ReadFile(l.SystemdMarker()); err == nil && len(strings.Fields(string(data))) > 0 {
		return cp.restartUnits(ctx, names, res, out)
	}
	var running []string
	for _, name := range names {
		if pid, _ := readPIDFile(l.PIDFile(name)); pid > 0 && isComponent(pid, name) {
			running = append(running, fmt.Sprintf("%s (pid %d)", name, pid))
		}
	}
	if len(running) > 0 {
		return fmt.Errorf("%s run without a supervisor this command can ask to restart them: restart the control plane with %s", strings.Join(running, ", "), restartByHand)
	}
	res.Pending = names
	res.Next = fmt.Sprintf("controlplane-bootstrap init --dir %s --foreground", l.Dir)
	fmt.Fprintf(out, "the control plane in %s is stopped; %s read the new certificates when `%s` (or init without --foreground, for systemd units) starts them\n",
		l.Dir, strings.Join(names, ", "), res.Next)
	return nil
}

// restartUnits restarts the components' systemd units one by one, each healthy before
// the next.
func (cp *ControlPlane) restartUnits(ctx context.Context, names []string, res *RenewResult, out io.Writer) error {
	var units []string
	for _, n := range names {
		units = append(units, components.UnitName(n))
	}
	byHand := "systemctl restart " + strings.Join(units, " ")
	for _, c := range components.Specs(cp.Config, cp.Layout) {
		if !slices.Contains(names, c.Name) {
			continue
		}
		if err := (components.SystemdUnits{}).Restart(ctx, []string{components.UnitName(c.Name)}); err != nil {
			return fmt.Errorf("%w\nrestart them with `%s`", err, byHand)
		}
		if err := cp.waitHealthy(ctx, c, cp.readyTimeout, nil); err != nil {
			return fmt.Errorf("%w\nsee `journalctl -u %s`", err, components.UnitName(c.Name))
		}
		res.Restarted = append(res.Restarted, c.Name)
		fmt.Fprintf(out, "%s restarted and healthy\n", components.UnitName(c.Name))
	}
	return nil
}

// checkServed dials kube-apiserver and etcd, when restarted, and checks that each serves
// its renewed serving certificate.
func (cp *ControlPlane) checkServed(ctx context.Context, renewed []clusterpki.Renewed, restarted []string, out io.Writer) error {
	l, cfg := cp.Layout, cp.Config
	for _, r := range renewed {
		var component, addr string
		var conf *tls.Config
		var err error
		switch r.Name {
		case "apiserver":
			component, addr = components.APIServer, apiserverAddr(cfg)
			conf, err = tlsTrusting(l.PKI(clusterpki.CACert))
		case "etcd-server":
			component, addr = components.Etcd, net.JoinHostPort("127.0.0.1", strconv.Itoa(cfg.Etcd.ClientPort))
			// etcd asks for a client certificate (--client-cert-auth).
			conf, err = etcdClientTLS(l)
		default:
			continue
		}
		if !slices.Contains(restarted, component) {
			continue
		}
		if err != nil {
			return err
		}
		served, err := ServedCertificate(ctx, addr, conf)
		if err != nil {
			return fmt.Errorf("%s after its restart: %w", component, err)
		}
		if served.SerialNumber.Text(16) != r.Serial {
			return fmt.Errorf("%s at %s still serves certificate serial %s (expires %s), not the renewed %s", component, addr,
				served.SerialNumber.Text(16), served.NotAfter.Format(time.RFC3339), r.Serial)
		}
		fmt.Fprintf(out, "%s at %s serves the renewed certificate (expires %s)\n", component, addr, served.NotAfter.Format(time.RFC3339))
	}
	return nil
}

// apiserverAddr is where this host reaches kube-apiserver (its health probe's address).
func apiserverAddr(cfg *clusterconfig.Config) string {
	host := cfg.APIServer.BindAddress
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, strconv.Itoa(cfg.APIServer.Port))
}

func tlsTrusting(caFile string) (*tls.Config, error) {
	data, err := os.ReadFile(caFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("%s holds no PEM certificate", caFile)
	}
	return &tls.Config{RootCAs: pool}, nil
}

// ServedCertificate connects to addr with TLS (conf: the CA to trust, a client
// certificate if the server asks for one) and returns the leaf certificate it serves.
func ServedCertificate(ctx context.Context, addr string, conf *tls.Config) (*x509.Certificate, error) {
	d := tls.Dialer{Config: conf}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return conn.(*tls.Conn).ConnectionState().PeerCertificates[0], nil
}
