package logship

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
)

// KubeletClientCert is kubelet's rotated client certificate and key (one PEM file, a
// symlink kubelet moves at each rotation): CN system:node:NAME, O system:nodes,
// issued by the cluster CA. The log gateway takes the node's name from it.
const KubeletClientCert = "/var/lib/kubelet/pki/kubelet-client-current.pem"

// ClientTLS is the TLS configuration for the log store: the client certificate is read
// from certFile (certificate and key in one PEM file, kubelet's form) at each
// handshake that finds the file changed, so kubelet's rotations are followed without a
// restart; the server must present a certificate the cluster CA (caPEM) issued.
func ClientTLS(certFile string, caPEM []byte) (*tls.Config, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("log shipping: the JoinBundle's cluster_ca_pem holds no certificate")
	}
	kc := &keyPairFile{path: certFile}
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return kc.get() }}, nil
}

// keyPairFile is a certificate and key file read again when it changes.
type keyPairFile struct {
	path string
	mu   sync.Mutex
	mod  time.Time
	size int64
	cert *tls.Certificate
}

func (k *keyPairFile) get() (*tls.Certificate, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	fi, err := os.Stat(k.path)
	if err != nil {
		return nil, fmt.Errorf("kubelet's client certificate: %w (it appears once kubelet's TLS bootstrap is done)", err)
	}
	if k.cert != nil && fi.ModTime().Equal(k.mod) && fi.Size() == k.size {
		return k.cert, nil
	}
	c, err := tls.LoadX509KeyPair(k.path, k.path)
	if err != nil {
		return nil, fmt.Errorf("kubelet's client certificate %s: %w", k.path, err)
	}
	k.cert, k.mod, k.size = &c, fi.ModTime(), fi.Size()
	return k.cert, nil
}
