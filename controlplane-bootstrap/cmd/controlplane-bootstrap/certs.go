package main

import (
	"fmt"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterconfig"
	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterpki"
	"github.com/gpurack/gpurack/controlplane-bootstrap/components"
	"github.com/gpurack/gpurack/controlplane-bootstrap/controlplane"
	"github.com/gpurack/gpurack/internal/pki"
)

func newCertsCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "certs",
		Short: "Check when the control plane's certificates expire, and renew them",
		Long: `The leaf certificates of the control plane (kube-apiserver's, etcd's, the kubeconfigs'
credentials) are valid for a year, its CAs for ten. Running init again does not renew
them: certs check-expiration shows what is left, certs renew issues them again and
restarts the components that read them. See docs/controlplane.md, "Certificates:
checking and renewing".`,
	}
	cmd.AddCommand(newCertsCheckExpirationCommand(), newCertsRenewCommand())
	return cmd
}

func newCertsCheckExpirationCommand() *cobra.Command {
	var dir, textfile string
	var asJSON bool
	var kubeconfigs []string
	cmd := &cobra.Command{
		Use:   "check-expiration --dir DIR [--json] [--kubeconfig FILE]... [--textfile FILE]",
		Short: "List every certificate of the control plane and its CAs with when it expires",
		Long: `check-expiration reads every certificate of the control plane in DIR and prints, as
kubeadm certs check-expiration does: its name, when it expires, the time left, the CA
that signed it and whether it is externally managed (that CA's key is not in DIR/pki,
so certs renew cannot renew it); then its common name and file. The certificates
embedded in admin.conf, controller-manager.conf, scheduler.conf,
kube-state-metrics.conf and kueue.conf are included, and the serving certificates
kube-controller-manager and kube-scheduler make for themselves. A second table lists
the CAs.

A file that is missing is marked !MISSING!, one that cannot be read or whose key does
not match it !INVALID!, with the reason below the tables.

--kubeconfig adds kubeconfigs kept outside DIR, such as the enroller's
(join-config --out) or users', by their file name.

--json prints the same for scripts: {"certificates": [...], "certificateAuthorities":
[...]}, each with kubeadm's fields (name, expirationDate, residualTime in seconds,
caName, externallyManaged, missing) and file, commonName, serial and problem.

--textfile also writes gpurack_certificate_expiry_timestamp_seconds{component=
"controlplane", name=NAME} for node_exporter's textfile collector, which the
GpurackCertificateExpiringSoon alert watches.

It reads files only, and works whether the control plane runs or not.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			r, err := clusterpki.CheckExpiration(dir, kubeconfigs...)
			if err != nil {
				return err
			}
			now := time.Now()
			out := cmd.OutOrStdout()
			if asJSON {
				data, err := r.JSON(now)
				if err != nil {
					return err
				}
				_, err = out.Write(data)
				if err != nil {
					return err
				}
			} else if err := r.WriteTable(out, now); err != nil {
				return err
			}
			if textfile != "" {
				if err := prometheus.WriteToTextfile(textfile, r.Registry()); err != nil {
					return fmt.Errorf("write %s: %w", textfile, err)
				}
			}
			return nil
		},
	}
	dirFlag(cmd, &dir)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON instead of the tables")
	cmd.Flags().StringArrayVar(&kubeconfigs, "kubeconfig", nil, "also check the client certificate of this kubeconfig (repeatable)")
	cmd.Flags().StringVar(&textfile, "textfile", "", "also write the expiry times as Prometheus gauges to this file (node_exporter's textfile collector format)")
	return cmd
}

func newCertsRenewCommand() *cobra.Command {
	var dir string
	var validity time.Duration
	cmd := &cobra.Command{
		Use:   "renew all|NAME... --dir DIR [--validity DURATION]",
		Short: "Issue certificates of the control plane again and restart the components that read them",
		Long: `renew issues the named certificates again from the CA that signed them, with the same
subject, names (SANs) and usages, read from each certificate, a new key, and a new
validity (--validity, a year by default). "all" renews every one. The CA keys must be in
DIR/pki; if one that is needed is missing or unreadable, renew says which file and
writes nothing: every certificate is made in memory first, then each file is replaced
whole. The CAs themselves are not renewed (they are valid for ten years).

The names, their files in DIR, and the components restarted after renewing them:

` + renewTable() + `
Then it restarts every running component that reads a renewed file, in start order
(etcd before kube-apiserver), each healthy before the next: through the supervisor of
` + "`init --foreground`" + ` (its socket DIR/run/supervisor.sock), or by restarting the
systemd units. It checks that kube-apiserver and etcd then serve their new certificates. When the
control plane is stopped, the components read the new files when init starts them; when
they cannot be restarted from here, it says which command does it.

Copies of admin.conf elsewhere (~/.kube/config) and the enroller kubeconfig keep their
old certificates: copy admin.conf again; reissue the enroller's with join-config --out
and restart gpuboot.`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) == 0 {
				return fmt.Errorf("name the certificates to renew: %s, or one or more of %s", clusterpki.RenewAll, strings.Join(clusterpki.CertificateNames(), ", "))
			}
			return nil
		},
		ValidArgs: append([]string{clusterpki.RenewAll}, clusterpki.CertificateNames()...),
		RunE: func(cmd *cobra.Command, args []string) error {
			if validity <= 0 {
				return fmt.Errorf("--validity %s: give a positive duration, such as 8760h for a year", validity)
			}
			_, err := controlplane.RenewCertificates(cmd.Context(), dir, controlplane.RenewOptions{
				Names: args, Validity: validity, Out: cmd.OutOrStdout(),
			})
			return err
		},
	}
	dirFlag(cmd, &dir)
	cmd.Flags().DurationVar(&validity, "validity", pki.DefaultLeafValidity, "how long the new certificates are valid (capped at the CA's expiry)")
	return cmd
}

// renewTable lists, for --help, each certificate's name, file and the components that
// read it, as Using finds them for a default configuration with monitoring, queues and
// the registry enabled (kube-state-metrics and Kueue read their kubeconfigs).
func renewTable() string {
	cfg := clusterconfig.Default()
	cfg.Monitoring.Enabled = true
	cfg.Queues.Enabled = true
	cfg.Registry.Enabled = true
	l := components.Layout{Dir: "DIR"}
	specs := components.Specs(&cfg, l)
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	for _, c := range clusterpki.Certificates {
		using := components.Using(specs, []string{filepath.Join(l.Dir, c.Cert)})
		restarts := strings.Join(using, ", ")
		if len(using) == 0 {
			restarts = "(none)"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", c.Name, c.Cert, restarts)
	}
	tw.Flush()
	return b.String()
}
