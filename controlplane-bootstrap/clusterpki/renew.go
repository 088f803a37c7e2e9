package clusterpki

import (
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/gpurack/gpurack/internal/atomicfile"
	"github.com/gpurack/gpurack/internal/pki"
)

// RenewAll, given as the only name to PlanRenewal, renews every certificate.
const RenewAll = "all"

// Renewal is a set of certificates issued again in memory by PlanRenewal, written by
// Write. Nothing touches the disk before Write.
type Renewal struct {
	Renewed []Renewed
	writes  []fileWrite
	removes []string
}

// Renewed is one certificate of a Renewal.
type Renewed struct {
	Certificate
	// File is the certificate's absolute path.
	File       string
	CommonName string
	Serial     string // hexadecimal; empty for SelfSigned
	NotAfter   time.Time
	// Paths are the absolute paths written or removed.
	Paths []string
}

type fileWrite struct {
	path string
	data []byte
	mode fs.FileMode
}

// Paths returns every path Write writes or removes, to find the components that read
// them.
func (r *Renewal) Paths() []string {
	var ps []string
	for _, rn := range r.Renewed {
		ps = append(ps, rn.Paths...)
	}
	return ps
}

// PlanRenewal issues again, in memory, each certificate named (CertificateNames, or
// RenewAll alone) of the control plane in clusterDir, from the CA that signs it now in
// kubeadm's layout. Each keeps its subject, SANs and usages, which are read from the
// certificate itself, and gets a new ECDSA P-256 key (as kubeadm's renewal does; see
// docs/decisions/0682-control-plane-certificate-renewal.md) and validity (zero: one
// year, pki.DefaultLeafValidity). A SelfSigned certificate is planned for removal, so
// that its component makes a new one when it restarts.
//
// It writes nothing. An unknown name, a missing or unreadable CA key, or a certificate
// that cannot be read is an error that names the file, and then nothing is renewed.
func PlanRenewal(clusterDir string, names []string, validity time.Duration) (*Renewal, error) {
	if err := LooksLikeClusterDir(clusterDir); err != nil {
		return nil, err
	}
	if validity < 0 {
		return nil, fmt.Errorf("validity %s is negative", validity)
	}
	certs, err := selectCertificates(names)
	if err != nil {
		return nil, err
	}
	pkiDir := filepath.Join(clusterDir, PKIDirName)
	cas := map[string]*pki.CA{}
	r := &Renewal{}
	for _, c := range certs {
		if c.Kind == SelfSigned {
			rn := Renewed{Certificate: c, File: filepath.Join(clusterDir, c.Cert)}
			for _, rel := range []string{c.Cert, c.Key} {
				rn.Paths = append(rn.Paths, filepath.Join(clusterDir, rel))
			}
			r.removes = append(r.removes, rn.Paths...)
			r.Renewed = append(r.Renewed, rn)
			continue
		}
		ca, ok := cas[c.Authority]
		if !ok {
			if ca, err = loadAuthority(pkiDir, c.Authority); err != nil {
				return nil, fmt.Errorf("cannot renew %s: %w; nothing was written", c.Name, err)
			}
			cas[c.Authority] = ca
		}
		if err := r.plan(clusterDir, c, ca, validity); err != nil {
			return nil, fmt.Errorf("cannot renew %s: %w; nothing was written", c.Name, err)
		}
	}
	return r, nil
}

// selectCertificates resolves the names PlanRenewal takes.
func selectCertificates(names []string) ([]Certificate, error) {
	valid := "valid names: " + RenewAll + " (alone), " + strings.Join(CertificateNames(), ", ")
	if len(names) == 0 {
		return nil, errors.New("name the certificates to renew; " + valid)
	}
	if slices.Contains(names, RenewAll) {
		if len(names) > 1 {
			return nil, fmt.Errorf("%q renews every certificate and takes no other name; %s", RenewAll, valid)
		}
		return slices.Clone(Certificates), nil
	}
	var out []Certificate
	for _, c := range Certificates {
		if slices.Contains(names, c.Name) {
			out = append(out, c)
		}
	}
	for _, n := range names {
		if !slices.Contains(CertificateNames(), n) {
			return nil, fmt.Errorf("unknown certificate %q; %s", n, valid)
		}
	}
	return out, nil
}

// loadAuthority reads the CA called name and its key, with errors that name the file.
func loadAuthority(pkiDir, name string) (*pki.CA, error) {
	i := slices.IndexFunc(Authorities, func(a Authority) bool { return a.Name == name })
	if i < 0 {
		return nil, fmt.Errorf("no CA called %q", name)
	}
	a := Authorities[i]
	certPath, keyPath := filepath.Join(pkiDir, a.Cert), filepath.Join(pkiDir, a.Key)
	if _, err := os.ReadFile(keyPath); errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("CA %s: its key %s is missing: certificates are signed with it, so restore it from a backup (if the CA is managed outside this host, renew there)", a.Name, keyPath)
	} else if err != nil {
		return nil, fmt.Errorf("CA %s: its key %s cannot be read: %w", a.Name, keyPath, err)
	}
	kp, err := pki.LoadKeyPair(certPath, keyPath)
	if err != nil {
		return nil, fmt.Errorf("CA %s: %w", a.Name, err)
	}
	if !kp.Cert.IsCA {
		return nil, fmt.Errorf("CA %s: %s is not a CA certificate", a.Name, certPath)
	}
	return &pki.CA{Cert: kp.Cert, Key: kp.Key}, nil
}

// plan issues c again from ca and records the files to write.
func (r *Renewal) plan(clusterDir string, c Certificate, ca *pki.CA, validity time.Duration) error {
	certPath := filepath.Join(clusterDir, c.Cert)
	var old []byte
	var err error
	if c.Kind == KubeconfigCert {
		old, err = kubeconfigClientCert(certPath)
	} else {
		old, err = os.ReadFile(certPath)
	}
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%s is missing, and renewing starts from the certificate in place: stop the control plane and run `controlplane-bootstrap init` on its directory, which issues missing certificates", certPath)
	}
	if err != nil {
		return fmt.Errorf("read the certificate to renew: %w", err)
	}
	oldCert, err := pki.DecodeCertPEM(old)
	if err != nil {
		return fmt.Errorf("%s: %w", certPath, err)
	}
	req, err := RequestFrom(oldCert)
	if err != nil {
		return fmt.Errorf("%s: %w", certPath, err)
	}
	req.Validity = validity
	kp, err := ca.Issue(req)
	if err != nil {
		return err
	}
	keyPEM, err := pki.EncodeKeyPEM(kp.Key)
	if err != nil {
		return err
	}
	rn := Renewed{Certificate: c, File: certPath, CommonName: kp.Cert.Subject.CommonName,
		Serial: kp.Cert.SerialNumber.Text(16), NotAfter: kp.Cert.NotAfter.UTC()}
	switch c.Kind {
	case PKIPair:
		// The key first: a crash between the two leaves a certificate that does not
		// match its key, which `certs check-expiration` flags and a second renewal
		// repairs (it reads only the certificate).
		keyPath := filepath.Join(clusterDir, c.Key)
		r.writes = append(r.writes, fileWrite{keyPath, keyPEM, 0o600}, fileWrite{certPath, pki.EncodeCertPEM(kp.Cert), 0o644})
		rn.Paths = []string{keyPath, certPath}
	case KubeconfigCert:
		data, err := replaceClientCert(certPath, pki.EncodeCertPEM(kp.Cert), keyPEM)
		if err != nil {
			return err
		}
		r.writes = append(r.writes, fileWrite{certPath, data, 0o600})
		rn.Paths = []string{certPath}
	}
	r.Renewed = append(r.Renewed, rn)
	return nil
}

// RequestFrom is the request that issues cert again: its subject (common name,
// organizations, organizational units), SANs and extended key usages. A usage other
// than serverAuth and clientAuth is an error, since CA.Issue would drop it.
func RequestFrom(cert *x509.Certificate) (pki.CertRequest, error) {
	req := pki.CertRequest{
		CommonName:          cert.Subject.CommonName,
		Organizations:       cert.Subject.Organization,
		OrganizationalUnits: cert.Subject.OrganizationalUnit,
		DNSNames:            cert.DNSNames,
		IPs:                 cert.IPAddresses,
	}
	if len(cert.URIs) > 0 || len(cert.EmailAddresses) > 0 || len(cert.UnknownExtKeyUsage) > 0 {
		return req, fmt.Errorf("certificate %q has URI or e-mail SANs or extended key usages this tool does not issue; renew it where it was made", cert.Subject.CommonName)
	}
	for _, u := range cert.ExtKeyUsage {
		switch u {
		case x509.ExtKeyUsageServerAuth:
			req.Usages = append(req.Usages, pki.ServerAuth)
		case x509.ExtKeyUsageClientAuth:
			req.Usages = append(req.Usages, pki.ClientAuth)
		default:
			return req, fmt.Errorf("certificate %q has extended key usage %d, which this tool does not issue; renew it where it was made", cert.Subject.CommonName, u)
		}
	}
	if len(req.Usages) == 0 {
		return req, fmt.Errorf("certificate %q has no serverAuth or clientAuth usage", cert.Subject.CommonName)
	}
	return req, nil
}

// replaceClientCert returns the kubeconfig at path with its current user's client
// certificate and key replaced; server, CA and names stay as they are.
func replaceClientCert(path string, certPEM, keyPEM []byte) ([]byte, error) {
	cfg, ai, err := currentUser(path)
	if err != nil {
		return nil, err
	}
	ai.ClientCertificateData, ai.ClientKeyData = certPEM, keyPEM
	return clientcmd.Write(*cfg)
}

// Write writes the renewed files, each atomically (package atomicfile), and removes the
// SelfSigned ones. A failure names the file; files written before it stay renewed.
func (r *Renewal) Write() error {
	const again = "the files before it are renewed already: fix this and renew again"
	for _, w := range r.writes {
		if err := atomicfile.Write(w.path, w.data, w.mode); err != nil {
			return fmt.Errorf("renew: %w; %s", err, again)
		}
	}
	for _, p := range r.removes {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("renew: %w; %s", err, again)
		}
	}
	return nil
}
