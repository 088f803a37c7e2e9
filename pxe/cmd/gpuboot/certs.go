package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpurack/gpurack/internal/pki"
	"github.com/gpurack/gpurack/pxe/admin"
	"github.com/gpurack/gpurack/pxe/server"
)

func newCertsCommand() *cobra.Command {
	certs := &cobra.Command{
		Use:   "certs",
		Short: "Issue, renew, revoke and check certificates of the gpurack CA",
		Long: `Certificates of the gpurack CA (gpuboot's state directory, pki/). Every leaf is valid for
a year; agents renew theirs through gpuboot by themselves (enrollment.agentCertValidity).
  operator NAME           issue an operator certificate at a level
  server                  reissue gpuboot's serving certificate, with new names
  renew operator NAME     a new certificate for an operator, at the same level
  revoke operator NAME    the same as gpuboot operators revoke
  check-expiration        the CA, the server and the operators' certificates, with
                          the time left
See docs/enrollment.md, "Certificates and their renewal".`,
	}
	var f clientFlags
	revoke := &cobra.Command{Use: "revoke", Short: "Revoke certificates (AdminService, an admin's certificate)"}
	f.register(revoke)
	revoke.AddCommand(newOperatorRevokeCommand(&f, "operator NAME [--serial HEX]... [--reason TEXT]"))
	renew := &cobra.Command{Use: "renew", Short: "Renew certificates from the gpurack CA (on gpuboot's host: reads pki/ca.key)"}
	renew.AddCommand(newCertsRenewOperatorCommand())
	certs.AddCommand(newCertsOperatorCommand(), newCertsServerCommand(), renew, revoke, newCertsCheckExpirationCommand())
	return certs
}

// newCertsOperatorCommand is `gpuboot certs operator NAME`: a first (or another)
// operator certificate at a level.
func newCertsOperatorCommand() *cobra.Command {
	var stateDir, out string
	var token bool
	var tokenTTL time.Duration
	var levelName string
	op := &cobra.Command{
		Use:   "operator NAME [--level viewer|operator|admin|alert-sender|metrics-reader]",
		Short: "Issue an operator certificate (O=gpurack:operators) for AdminService, the REST API and the rack view",
		Long: `Issue an operator certificate at a level (in the certificate; the levels nest):
  viewer    reads: machines, history, rack reports, gossip key status, the REST API
            and the rack view; on an agent, its status, GPUs and events (the default)
  operator  also decides on machines: approve, reject, decommission, resolve a
            conflict, rotate a rack's gossip key; on an agent, run checks
  admin     also manages operators: revoke one, read the revocation audit
            (gpuboot operators audit); on a simulated agent, inject faults
and apart from them:
  alert-sender  Alertmanager's credential: posts its notifications to
            POST /api/v1/alerts, for the rack report's active alerts, and nothing
            else (no read, no decision; no viewer, operator or admin may post
            alerts). Give its operator.crt, operator.key and ca.crt to
            Alertmanager's gpuboot receiver (docs/monitoring.md, "Alert routing").
  metrics-reader  the metrics server's credential: reads gpuboot's GET /metrics on
            this port, and nothing else. Give its files to controlplane-bootstrap
            (cluster.yaml monitoring.gpubootTLS; docs/monitoring.md, "Scrape credentials").
The first operator gpuboot init makes is an admin. A certificate issued before levels
carries none and counts as an admin's: revoke it and issue one at the level needed.
To change an operator's level, revoke NAME (gpuboot operators revoke NAME, which
revokes every certificate recorded for the name), then issue NAME again at the new level.
A --token acts as a viewer whatever --level says: tokens reach only the read-only REST
API and rack view.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			level, err := pki.ParseOperatorLevel(levelName)
			if err != nil {
				return fmt.Errorf("--level: %w", err)
			}
			if token && level == pki.LevelAlertSender {
				return fmt.Errorf("--token with --level %s: a token acts as a viewer, which an alert sender is not; Alertmanager uses the certificate", level.Name())
			}
			if token && level == pki.LevelMetricsReader {
				return fmt.Errorf("--token with --level %s: a token acts as a viewer, which cannot read /metrics; the metrics server uses the certificate", level.Name())
			}
			if out == "" {
				out = filepath.Join(stateDir, "operators", name)
			}
			if err := server.IssueOperator(stateDir, name, level, out); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "operator %s (level %s): credentials in %s (ca.crt, operator.crt, operator.key)\n", name, level.Name(), out)
			if token {
				if tokenTTL <= 0 {
					return fmt.Errorf("--token-ttl %s: tokens expire; give a positive duration", tokenTTL)
				}
				expires := time.Now().Add(tokenTTL)
				tok, line, err := admin.NewToken(name, expires)
				if err != nil {
					return err
				}
				f, err := os.OpenFile(filepath.Join(stateDir, "operator-tokens"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
				if err != nil {
					return err
				}
				defer f.Close()
				if _, err := f.WriteString(line); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "operator token (shown once; valid until %s; gpuboot serve picks it up within a second): %s\n", expires.UTC().Format(time.RFC3339), tok)
			}
			return nil
		},
	}
	op.Flags().StringVar(&stateDir, "state-dir", defaultStateDir, "gpuboot's state directory holding pki/ca.key")
	op.Flags().StringVar(&out, "out", "", "directory for the credentials (default STATEDIR/operators/NAME)")
	op.Flags().StringVar(&levelName, "level", pki.LevelViewer.Name(), "what the certificate may do: viewer, operator, admin, alert-sender (Alertmanager's) or metrics-reader (the metrics server's)")
	op.Flags().BoolVar(&token, "token", false, "also create a bearer token for the REST API and rack view (it acts as a viewer)")
	op.Flags().DurationVar(&tokenTTL, "token-ttl", admin.DefaultTokenTTL, "how long the token is valid")
	return op
}

// newCertsServerCommand is `gpuboot certs server`: gpuboot's serving certificate issued
// again with the names given.
func newCertsServerCommand() *cobra.Command {
	var stateDir, advertise string
	cmd := &cobra.Command{
		Use:   "server --advertise HOST,IP,… [--state-dir DIR]",
		Short: "Reissue gpuboot's serving certificate from the gpurack CA, with new names (advertise addresses)",
		Long: `Reissue STATEDIR/pki/server.crt and server.key from the gpurack CA, valid for a year,
for the host names and IP addresses in --advertise plus localhost and 127.0.0.1 (as
gpuboot init does). Use it when gpuboot moves to a new host or address (then also set
advertise in gpuboot.yaml), or to renew the certificate before it expires (gpuboot
certs check-expiration).

It runs on gpuboot's host, with read access to pki/ca.key. The CA is read and the
certificate made before anything is written: a missing CA key names the file and
leaves the old pair. Each file is replaced whole. A running gpuboot serve takes the
new certificate for new connections within a second, without a restart; agents and
operators keep trusting it, since they pin the CA, not the certificate.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cert, err := server.ReissueServer(stateDir, advertiseHosts(advertise))
			if err != nil {
				return err
			}
			names := append([]string(nil), cert.DNSNames...)
			for _, ip := range cert.IPAddresses {
				names = append(names, ip.String())
			}
			fmt.Fprintf(cmd.OutOrStdout(), "server certificate %s: serial %s, names %s, valid until %s\n",
				filepath.Join(stateDir, "pki", server.ServerCertFile), cert.SerialNumber.Text(16), strings.Join(names, ", "), cert.NotAfter.UTC().Format(time.RFC3339))
			return nil
		},
	}
	cmd.Flags().StringVar(&stateDir, "state-dir", defaultStateDir, "gpuboot's state directory holding pki/ca.key")
	cmd.Flags().StringVar(&advertise, "advertise", "", "comma-separated host names and IP addresses machines reach gpuboot at (required)")
	cmd.MarkFlagRequired("advertise")
	return cmd
}

// newCertsRenewOperatorCommand is `gpuboot certs renew operator NAME`.
func newCertsRenewOperatorCommand() *cobra.Command {
	var stateDir, out string
	cmd := &cobra.Command{
		Use:   "operator NAME [--state-dir DIR] [--out DIR]",
		Short: "Issue an operator a new certificate at the level of its current one",
		Long: `Issue operator NAME a new certificate, valid for a year, at the level its current
certificate (OUT/operator.crt) carries, and replace OUT's ca.crt, operator.crt and
operator.key (each file whole). OUT is STATEDIR/operators/NAME unless --out says
otherwise. The new certificate is recorded like any issued one, so gpuboot operators
revoke NAME covers it. The old certificate stays valid until it expires: to cut it off
at once, revoke NAME (that revokes every certificate recorded for NAME, the new one
too) and issue NAME again with gpuboot certs operator NAME --level LEVEL.

It runs on gpuboot's host, with read access to pki/ca.key; a missing CA key names the
file and writes nothing.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if out == "" {
				out = filepath.Join(stateDir, "operators", name)
			}
			old, cert, err := server.RenewOperator(stateDir, name, out)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "operator %s (level %s): new certificate serial %s valid until %s in %s; the old one (serial %s) stays valid until %s unless revoked\n",
				name, pki.OperatorLevelOf(cert).Name(), cert.SerialNumber.Text(16), cert.NotAfter.UTC().Format(time.RFC3339), out,
				old.SerialNumber.Text(16), old.NotAfter.UTC().Format(time.RFC3339))
			return nil
		},
	}
	cmd.Flags().StringVar(&stateDir, "state-dir", defaultStateDir, "gpuboot's state directory holding pki/ca.key")
	cmd.Flags().StringVar(&out, "out", "", "directory holding the operator's credentials (default STATEDIR/operators/NAME)")
	return cmd
}

// newCertsCheckExpirationCommand is `gpuboot certs check-expiration`.
func newCertsCheckExpirationCommand() *cobra.Command {
	var stateDir string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "check-expiration [--state-dir DIR] [--json]",
		Short: "List the gpurack CA, the server and the operators' certificates with their expiry and the time left",
		Long: `List the certificates in gpuboot's state directory: the gpurack CA (pki/ca.crt), the
serving certificate (pki/server.crt) and every operator certificate under
STATEDIR/operators/NAME/operator.crt, with serial, expiry, the time left and whether
the serial is revoked. It reads certificates only (no key), so it runs wherever the
state directory is readable. Agent certificates renew themselves; their expiry is on
each agent's /metrics (gpurack_certificate_expiry_timestamp_seconds).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			list, err := server.CertificateExpiries(stateDir, time.Now())
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(list)
			}
			printCertificateExpiries(cmd.OutOrStdout(), list)
			return nil
		},
	}
	cmd.Flags().StringVar(&stateDir, "state-dir", defaultStateDir, "gpuboot's state directory")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func printCertificateExpiries(w io.Writer, list []server.CertificateExpiry) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CERTIFICATE\tSUBJECT\tLEVEL\tSERIAL\tEXPIRES\tRESIDUAL\tSTATUS")
	for _, e := range list {
		if e.Error != "" {
			fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t-\tunreadable: %s\n", e.Name, e.Error)
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", e.Name, e.Subject, dash(e.Level), e.Serial,
			e.NotAfter.Format(time.RFC3339), residual(time.Duration(e.Residual*float64(time.Second))), expiryStatus(e))
	}
	tw.Flush()
}

// residual is the time left as kubeadm prints it: 364d, 23h, 59m, or "expired".
func residual(d time.Duration) string {
	switch {
	case d <= 0:
		return "expired"
	case d >= 48*time.Hour:
		return fmt.Sprintf("%dd", int(d/(24*time.Hour)))
	case d >= 2*time.Hour:
		return fmt.Sprintf("%dh", int(d/time.Hour))
	default:
		return fmt.Sprintf("%dm", int(d/time.Minute))
	}
}

// expiringSoon is when check-expiration says "renew": the alert's 14 days.
const expiringSoon = 14 * 24 * time.Hour

func expiryStatus(e server.CertificateExpiry) string {
	left := time.Duration(e.Residual * float64(time.Second))
	switch {
	case e.Revoked:
		return "revoked"
	case left <= 0:
		return "EXPIRED"
	case left < expiringSoon:
		return "renew now"
	}
	return "ok"
}
