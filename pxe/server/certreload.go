package server

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpurack/gpurack/internal/pki"
)

// certCheckEvery bounds how often the server certificate's files are looked at: once
// per handshake or scrape at most this often.
const certCheckEvery = time.Second

// serverCertificate is gpuboot's serving certificate as `gpuboot serve` uses it: read
// from pki/server.crt and pki/server.key at start, and read again when either file
// changes (`gpuboot certs server` reissues them), so that new TLS connections get the
// new certificate without a restart (tls.Config.GetCertificate). A pair that does not
// load (a half-replaced pair, a certificate from another CA) is logged and the one in
// use is kept.
type serverCertificate struct {
	certPath, keyPath string
	ca                *x509.Certificate
	log               *slog.Logger

	mu      sync.Mutex
	cur     *tls.Certificate
	stamp   string    // the files' stamp cur was read at
	failed  string    // the stamp that last failed to load, logged once
	checked time.Time // when the files were last looked at
}

// loadServerCertificate reads the pair; an error names the files.
func loadServerCertificate(certPath, keyPath string, ca *x509.Certificate, log *slog.Logger) (*serverCertificate, error) {
	s := &serverCertificate{certPath: certPath, keyPath: keyPath, ca: ca, log: log}
	stamp := s.fileStamp()
	c, err := s.load()
	if err != nil {
		return nil, err
	}
	s.cur, s.stamp, s.checked = c, stamp, time.Now()
	return s, nil
}

// fileStamp names the state of both files: size, modification time and inode, so that a
// rename into place shows even within one second.
func (s *serverCertificate) fileStamp() string {
	var out string
	for _, p := range []string{s.certPath, s.keyPath} {
		fi, err := os.Stat(p)
		if err != nil {
			out += "missing;"
			continue
		}
		out += fmt.Sprintf("%d/%d/%v;", fi.Size(), fi.ModTime().UnixNano(), fileID(fi))
	}
	return out
}

// load reads and checks the pair: it belongs together, is a server certificate
// (role gpurack:servers) and chains to the gpurack CA.
func (s *serverCertificate) load() (*tls.Certificate, error) {
	kp, err := pki.LoadKeyPair(s.certPath, s.keyPath)
	if err != nil {
		return nil, fmt.Errorf("server certificate: %w", err)
	}
	if r := pki.RoleOf(kp.Cert); r != pki.RoleServers {
		return nil, fmt.Errorf("server certificate %s has role %q, not %s: reissue it with `gpuboot certs server`", s.certPath, r, pki.RoleServers)
	}
	if err := kp.Cert.CheckSignatureFrom(s.ca); err != nil {
		return nil, fmt.Errorf("server certificate %s is not issued by the gpurack CA: reissue it with `gpuboot certs server`: %w", s.certPath, err)
	}
	c := kp.TLSCertificate(s.ca)
	return &c, nil
}

// current returns the certificate in use, reading the files again first when they
// changed (looked at most once per certCheckEvery).
func (s *serverCertificate) current() *tls.Certificate {
	s.mu.Lock()
	defer s.mu.Unlock()
	if time.Since(s.checked) < certCheckEvery {
		return s.cur
	}
	s.checked = time.Now()
	stamp := s.fileStamp()
	if stamp == s.stamp || stamp == s.failed {
		return s.cur
	}
	c, err := s.load()
	if err != nil {
		s.failed = stamp
		s.log.Warn("server certificate changed but does not load; still serving the previous one", "err", err,
			"serving_not_after", s.cur.Leaf.NotAfter.UTC().Format(time.RFC3339))
		return s.cur
	}
	s.cur, s.stamp, s.failed = c, stamp, ""
	s.log.Info("server certificate reloaded", "file", s.certPath, "serial", c.Leaf.SerialNumber.Text(16),
		"dns", c.Leaf.DNSNames, "ips", c.Leaf.IPAddresses, "not_after", c.Leaf.NotAfter.UTC().Format(time.RFC3339))
	return c
}

// GetCertificate is tls.Config.GetCertificate.
func (s *serverCertificate) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return s.current(), nil
}

// certificateCollector exports gpurack_certificate_expiry_timestamp_seconds for the
// gpurack CA, the server certificate in use and each operator, with the name and the
// component and name labels the agent's own certificate has on its /metrics
// (agent/server), so that one alert (GpurackCertificateExpiringSoon) watches all.
type certificateCollector struct {
	ca       *x509.Certificate
	server   *serverCertificate
	stateDir string
	revoked  *pki.RevocationList
	log      *slog.Logger
	desc     *prometheus.Desc
}

func newCertificateCollector(ca *x509.Certificate, server *serverCertificate, stateDir string, revoked *pki.RevocationList, log *slog.Logger) *certificateCollector {
	return &certificateCollector{ca: ca, server: server, stateDir: stateDir, revoked: revoked, log: log,
		desc: prometheus.NewDesc("gpurack_certificate_expiry_timestamp_seconds",
			"When a certificate expires (its NotAfter), seconds since the epoch; component gpuboot: name ca (the gpurack CA), server (the serving certificate in use) and operator/NAME (the latest certificate gpuboot issued to NAME and did not revoke).",
			[]string{"component", "name"}, nil)}
}

func (c *certificateCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *certificateCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(c.ca.NotAfter.Unix()), "gpuboot", "ca")
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(c.server.current().Leaf.NotAfter.Unix()), "gpuboot", "server")
	ops, err := operatorExpiries(c.stateDir, c.revoked)
	if err != nil {
		c.log.Warn("operator certificate expiry not exported", "err", err)
	}
	for name, t := range ops {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(t.Unix()), "gpuboot", "operator/"+name)
	}
}

// operatorExpiries reads gpuboot's record of issued operator certificates
// (STATEDIR/operators/issued) and returns, for each operator, the latest NotAfter of
// the certificates not revoked: when that operator's access by certificate ends. An
// operator whose certificates are all revoked is left out.
func operatorExpiries(stateDir string, revoked *pki.RevocationList) (map[string]time.Time, error) {
	data, err := os.ReadFile(filepath.Join(stateDir, "operators", issuedFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	out := map[string]time.Time{}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 3 {
			continue
		}
		serial, ok := new(big.Int).SetString(f[1], 16)
		notAfter, err := time.Parse(time.RFC3339, f[2])
		if !ok || err != nil || revoked.Contains(serial) {
			continue
		}
		if notAfter.After(out[f[0]]) {
			out[f[0]] = notAfter
		}
	}
	return out, nil
}

// fileID is the file's inode (0 where the platform has none).
func fileID(fi os.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Ino
	}
	return 0
}
