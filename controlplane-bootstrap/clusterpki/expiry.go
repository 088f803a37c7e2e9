package clusterpki

import (
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/gpurack/gpurack/internal/pki"
)

// PKIDirName is the PKI directory inside a cluster directory (components.Layout.PKIDir).
const PKIDirName = "pki"

// Directories, under the PKI directory, where kube-controller-manager and kube-scheduler
// keep the serving certificates they make for themselves (their --cert-dir).
const (
	ControllerManagerServingDir = "controller-manager-serving"
	SchedulerServingDir         = "scheduler-serving"
)

// Names of the certificate authorities (kubeadm's).
const (
	ClusterCAName    = "ca"
	EtcdCAName       = "etcd-ca"
	FrontProxyCAName = "front-proxy-ca"
)

// Authority is one of the cluster's CAs; Cert and Key are relative to the PKI directory.
type Authority struct {
	Name, Cert, Key string
}

// Authorities are the cluster's CAs, in kubeadm's order.
var Authorities = []Authority{
	{ClusterCAName, CACert, CAKey},
	{EtcdCAName, EtcdCACert, EtcdCAKey},
	{FrontProxyCAName, FrontProxyCACert, FrontProxyCAKey},
}

// CertKind says where a certificate is kept, and so how it is renewed.
type CertKind int

const (
	// PKIPair is a .crt and .key pair in the PKI directory.
	PKIPair CertKind = iota + 1
	// KubeconfigCert is the client certificate and key embedded in a kubeconfig.
	KubeconfigCert
	// SelfSigned is a serving certificate a component made for itself in its --cert-dir
	// (kube-controller-manager, kube-scheduler). Renewing it means deleting it: the
	// component makes a new one when it starts.
	SelfSigned
)

// Certificate is one leaf certificate of the control plane. Cert and Key are relative to
// the cluster directory; Key is empty for a kubeconfig, which holds both.
type Certificate struct {
	Name      string // kubeadm's name where kubeadm has one: "apiserver", "admin.conf"
	Kind      CertKind
	Cert, Key string
	Authority string // the name of the signing CA; "" for SelfSigned
}

func inPKI(rel string) string { return filepath.Join(PKIDirName, rel) }

// Certificates lists every leaf certificate of a control plane made by init, sorted by
// name. The service-account key is a key, not a certificate, and is not listed.
var Certificates = []Certificate{
	{AdminKubeconfig, KubeconfigCert, AdminKubeconfig, "", ClusterCAName},
	{"apiserver", PKIPair, inPKI(APIServerCert), inPKI(APIServerKey), ClusterCAName},
	{"apiserver-etcd-client", PKIPair, inPKI(APIServerEtcdCert), inPKI(APIServerEtcdKey), EtcdCAName},
	{"apiserver-kubelet-client", PKIPair, inPKI(APIServerKubeletCert), inPKI(APIServerKubeletKey), ClusterCAName},
	{ControllerManagerKubeconfig, KubeconfigCert, ControllerManagerKubeconfig, "", ClusterCAName},
	{"controller-manager-serving", SelfSigned, inPKI(ControllerManagerServingDir + "/kube-controller-manager.crt"), inPKI(ControllerManagerServingDir + "/kube-controller-manager.key"), ""},
	{"etcd-healthcheck-client", PKIPair, inPKI(EtcdHealthcheckCert), inPKI(EtcdHealthcheckKey), EtcdCAName},
	{"etcd-peer", PKIPair, inPKI(EtcdPeerCert), inPKI(EtcdPeerKey), EtcdCAName},
	{"etcd-server", PKIPair, inPKI(EtcdServerCert), inPKI(EtcdServerKey), EtcdCAName},
	{"front-proxy-client", PKIPair, inPKI(FrontProxyClientCert), inPKI(FrontProxyClientKey), FrontProxyCAName},
	{KubeStateMetricsKubeconfig, KubeconfigCert, KubeStateMetricsKubeconfig, "", ClusterCAName},
	{"kueue-webhook", PKIPair, inPKI(KueueServingCert), inPKI(KueueServingKey), ClusterCAName},
	{KueueKubeconfig, KubeconfigCert, KueueKubeconfig, "", ClusterCAName},
	{"logs-gateway", PKIPair, inPKI(LogsGatewayCert), inPKI(LogsGatewayKey), ClusterCAName},
	{"monitoring-client", PKIPair, inPKI(MonitoringClientCert), inPKI(MonitoringClientKey), ClusterCAName},
	{"registry", PKIPair, inPKI(RegistryCert), inPKI(RegistryKey), ClusterCAName},
	{SchedulerKubeconfig, KubeconfigCert, SchedulerKubeconfig, "", ClusterCAName},
	{"scheduler-serving", SelfSigned, inPKI(SchedulerServingDir + "/kube-scheduler.crt"), inPKI(SchedulerServingDir + "/kube-scheduler.key"), ""},
}

// CertificateNames returns the names of Certificates, the names `certs renew` takes.
func CertificateNames() []string {
	names := make([]string, len(Certificates))
	for i, c := range Certificates {
		names[i] = c.Name
	}
	return names
}

// Expiry is one certificate as check-expiration reports it.
type Expiry struct {
	Name string
	// File is the file's absolute path.
	File       string
	CommonName string
	Serial     string // hexadecimal
	NotAfter   time.Time
	// Authority names the CA that signed it: one of Authorities, "self-signed", or
	// "unknown" (signed by none of this cluster's CAs). Empty for a CA.
	Authority string
	// ExternallyManaged, as kubeadm defines it: the signing CA's key is not in the PKI
	// directory, so this tool cannot renew the certificate.
	ExternallyManaged bool
	// Missing: the file does not exist. A SelfSigned certificate is missing until its
	// component first starts.
	Missing bool
	// Problem says why a file that exists could not be read as a certificate.
	Problem string
}

// Residual is the time left until NotAfter.
func (e Expiry) Residual(now time.Time) time.Duration { return e.NotAfter.Sub(now) }

// ExpirationReport is what `certs check-expiration` prints.
type ExpirationReport struct {
	Certificates []Expiry
	Authorities  []Expiry
}

// LooksLikeClusterDir reports an error unless dir holds a cluster PKI (pki/ca.crt), the
// check before any certificate command touches it.
func LooksLikeClusterDir(dir string) error {
	if _, err := os.Stat(filepath.Join(dir, PKIDirName, CACert)); err != nil {
		return fmt.Errorf("%s is not a control-plane directory (no %s: %v): give the --dir that `controlplane-bootstrap init` used", dir, filepath.Join(PKIDirName, CACert), errors.Unwrap(err))
	}
	return nil
}

// CheckExpiration reads every certificate of the control plane in clusterDir, its CAs,
// and the client certificates of the extra kubeconfigs (for example the enroller's,
// which `join-config --out` writes outside the cluster directory). It reports what it
// cannot read in Expiry.Missing and Expiry.Problem; the error is for a clusterDir that
// holds no control plane.
func CheckExpiration(clusterDir string, extraKubeconfigs ...string) (ExpirationReport, error) {
	var r ExpirationReport
	if err := LooksLikeClusterDir(clusterDir); err != nil {
		return r, err
	}
	if abs, err := filepath.Abs(clusterDir); err == nil {
		clusterDir = abs
	}
	pkiDir := filepath.Join(clusterDir, PKIDirName)
	cas := map[string]*x509.Certificate{}
	var caOrder []string
	for _, a := range Authorities {
		e := Expiry{Name: a.Name, File: filepath.Join(pkiDir, a.Cert), ExternallyManaged: !exists(filepath.Join(pkiDir, a.Key))}
		if certs := readCertificates(&e, func() ([]byte, error) { return os.ReadFile(e.File) }); certs != nil {
			cas[a.Name] = certs[0]
			caOrder = append(caOrder, a.Name)
		}
		r.Authorities = append(r.Authorities, e)
	}
	externallyManaged := func(ca string) bool {
		if ca == "unknown" {
			return true
		}
		for _, a := range r.Authorities {
			if a.Name == ca {
				return a.ExternallyManaged
			}
		}
		return false
	}
	for _, c := range Certificates {
		e := Expiry{Name: c.Name, File: filepath.Join(clusterDir, c.Cert), Authority: c.Authority}
		read := func() ([]byte, error) { return os.ReadFile(e.File) }
		if c.Kind == KubeconfigCert {
			read = func() ([]byte, error) { return kubeconfigClientCert(e.File) }
		}
		if certs := readCertificates(&e, read); certs != nil {
			e.Authority = signer(certs, cas, caOrder)
			if c.Kind == PKIPair {
				// A renewal interrupted between a pair's two files leaves them apart.
				if _, err := pki.LoadKeyPair(e.File, filepath.Join(clusterDir, c.Key)); err != nil {
					e.Problem = err.Error()
				}
			}
		}
		e.ExternallyManaged = externallyManaged(e.Authority)
		r.Certificates = append(r.Certificates, e)
	}
	for _, path := range extraKubeconfigs {
		abs, err := filepath.Abs(path)
		if err != nil {
			abs = path
		}
		e := Expiry{Name: filepath.Base(path), File: abs}
		if certs := readCertificates(&e, func() ([]byte, error) { return kubeconfigClientCert(abs) }); certs != nil {
			e.Authority = signer(certs, cas, caOrder)
		}
		e.ExternallyManaged = externallyManaged(e.Authority)
		r.Certificates = append(r.Certificates, e)
	}
	return r, nil
}

// readCertificates fills e from the first certificate read returns and returns them all
// (the leaf, then any chain), or sets e.Missing or e.Problem and returns nil.
func readCertificates(e *Expiry, read func() ([]byte, error)) []*x509.Certificate {
	data, err := read()
	if errors.Is(err, fs.ErrNotExist) {
		e.Missing = true
		return nil
	}
	if err != nil {
		e.Problem = err.Error()
		return nil
	}
	certs, err := pki.DecodeCertsPEM(data)
	if err != nil {
		e.Problem = err.Error()
		return nil
	}
	cert := certs[0]
	e.CommonName = cert.Subject.CommonName
	if e.CommonName == "" { // the CAs made by talos machinery name an organization, or nothing
		e.CommonName = cert.Subject.String()
	}
	if e.CommonName == "" {
		e.CommonName = "(empty subject)"
	}
	e.Serial = cert.SerialNumber.Text(16)
	e.NotAfter = cert.NotAfter.UTC()
	return certs
}

// signer names the CA in cas (tried in order) that signed certs[0]: "self-signed" when
// it signed itself or was signed by a certificate of its own file (as
// kube-controller-manager's and kube-scheduler's are), "unknown" otherwise.
func signer(certs []*x509.Certificate, cas map[string]*x509.Certificate, order []string) string {
	leaf := certs[0]
	for _, name := range order {
		if leaf.CheckSignatureFrom(cas[name]) == nil {
			return name
		}
	}
	if leaf.CheckSignature(leaf.SignatureAlgorithm, leaf.RawTBSCertificate, leaf.Signature) == nil {
		return "self-signed"
	}
	for _, c := range certs[1:] {
		if leaf.CheckSignatureFrom(c) == nil {
			return "self-signed"
		}
	}
	return "unknown"
}

// kubeconfigClientCert returns the PEM client certificate embedded in the kubeconfig at
// path, for its current context's user.
func kubeconfigClientCert(path string) ([]byte, error) {
	if _, err := os.Stat(path); err != nil {
		return nil, err
	}
	_, ai, err := currentUser(path)
	if err != nil {
		return nil, err
	}
	if len(ai.ClientCertificateData) == 0 {
		return nil, fmt.Errorf("%s: its current user has no embedded client certificate (client-certificate-data)", path)
	}
	return ai.ClientCertificateData, nil
}

// currentUser loads the kubeconfig at path and returns it with its current context's
// user.
func currentUser(path string) (*clientcmdapi.Config, *clientcmdapi.AuthInfo, error) {
	cfg, err := clientcmd.LoadFromFile(path)
	if err != nil {
		return nil, nil, err
	}
	ctx := cfg.Contexts[cfg.CurrentContext]
	if ctx == nil || cfg.AuthInfos[ctx.AuthInfo] == nil {
		return nil, nil, fmt.Errorf("%s: current context %q names no user", path, cfg.CurrentContext)
	}
	return cfg, cfg.AuthInfos[ctx.AuthInfo], nil
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// FormatResidual is the time left as kubeadm prints it (364d, 9y, 23h, 59m), or EXPIRED.
func FormatResidual(d time.Duration) string {
	if d < 0 {
		return "EXPIRED"
	}
	return duration.ShortHumanDuration(d)
}

// kubeadm's date format in check-expiration.
const expiresLayout = "Jan 02, 2006 15:04 MST"

// WriteTable prints r as two tables, the certificates and the CAs, with kubeadm's
// columns first (so that its readers find them where they expect), then the common name
// and the file. A row that could not be read is marked !MISSING! or !INVALID!, and the
// reasons follow the tables.
func (r ExpirationReport) WriteTable(w io.Writer, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 3, ' ', 0)
	fmt.Fprintln(tw, "CERTIFICATE\tEXPIRES\tRESIDUAL TIME\tCERTIFICATE AUTHORITY\tEXTERNALLY MANAGED\tCOMMON NAME\tFILE")
	var problems []string
	for _, e := range r.Certificates {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", rowName(e), expires(e), residual(e, now), e.Authority, yesNo(e.ExternallyManaged), e.CommonName, e.File)
		if e.Problem != "" {
			problems = append(problems, e.Name+": "+e.Problem)
		}
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "CERTIFICATE AUTHORITY\tEXPIRES\tRESIDUAL TIME\tEXTERNALLY MANAGED\tCOMMON NAME\tFILE")
	for _, e := range r.Authorities {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", rowName(e), expires(e), residual(e, now), yesNo(e.ExternallyManaged), e.CommonName, e.File)
		if e.Problem != "" {
			problems = append(problems, e.Name+": "+e.Problem)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(problems) > 0 {
		_, err := fmt.Fprintf(w, "\nunreadable:\n  %s\n", strings.Join(problems, "\n  "))
		return err
	}
	return nil
}

func rowName(e Expiry) string {
	switch {
	case e.Missing:
		return "!MISSING! " + e.Name
	case e.Problem != "":
		return "!INVALID! " + e.Name
	}
	return e.Name
}

func expires(e Expiry) string {
	if e.NotAfter.IsZero() {
		return ""
	}
	return e.NotAfter.UTC().Format(expiresLayout)
}

func residual(e Expiry, now time.Time) string {
	if e.NotAfter.IsZero() {
		return ""
	}
	return FormatResidual(e.Residual(now))
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// expiryJSON is one entry of the JSON report: kubeadm's field names (its
// output.kubeadm.k8s.io CertificateExpirationInfo), and the file, common name and serial.
type expiryJSON struct {
	Name              string     `json:"name"`
	File              string     `json:"file"`
	CommonName        string     `json:"commonName,omitempty"`
	Serial            string     `json:"serial,omitempty"`
	ExpirationDate    *time.Time `json:"expirationDate"`
	ResidualTime      int64      `json:"residualTime"` // seconds; negative once expired
	ExternallyManaged bool       `json:"externallyManaged"`
	CAName            string     `json:"caName,omitempty"`
	Missing           bool       `json:"missing"`
	Problem           string     `json:"problem,omitempty"`
}

// JSON renders r for scripts and monitoring: {"certificates": [...],
// "certificateAuthorities": [...]}, with the residual time in seconds at now.
func (r ExpirationReport) JSON(now time.Time) ([]byte, error) {
	conv := func(es []Expiry) []expiryJSON {
		out := make([]expiryJSON, 0, len(es))
		for _, e := range es {
			j := expiryJSON{Name: e.Name, File: e.File, CommonName: e.CommonName, Serial: e.Serial,
				ExternallyManaged: e.ExternallyManaged, CAName: e.Authority, Missing: e.Missing, Problem: e.Problem}
			if !e.NotAfter.IsZero() {
				t := e.NotAfter.UTC()
				j.ExpirationDate = &t
				j.ResidualTime = int64(e.Residual(now) / time.Second)
			}
			out = append(out, j)
		}
		return out
	}
	data, err := json.MarshalIndent(struct {
		Certificates []expiryJSON `json:"certificates"`
		Authorities  []expiryJSON `json:"certificateAuthorities"`
	}{conv(r.Certificates), conv(r.Authorities)}, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(data, '\n'), nil
}

// Registry holds r's expiry times as gpurack_certificate_expiry_timestamp_seconds
// {component="controlplane", name=NAME}, the series gpuboot and gpuagent export for
// their certificates and the GpurackCertificateExpiringSoon alert watches
// (docs/monitoring/gpurack-alerts.yaml). A certificate that could not be read has no
// sample.
func (r ExpirationReport) Registry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "gpurack_certificate_expiry_timestamp_seconds",
		Help: "When a certificate expires (its NotAfter), seconds since the epoch; component controlplane: the control plane's certificates and CAs by their check-expiration names.",
	}, []string{"component", "name"})
	reg.MustRegister(g)
	for _, e := range append(slices.Clone(r.Certificates), r.Authorities...) {
		if !e.NotAfter.IsZero() {
			g.WithLabelValues("controlplane", e.Name).Set(float64(e.NotAfter.Unix()))
		}
	}
	return reg
}
