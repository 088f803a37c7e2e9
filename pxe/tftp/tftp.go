// Package tftp is gpuboot's read-only TFTP server (RFC 1350) for the iPXE
// binaries that PXE firmware loads: undionly.kpxe, ipxe.efi, snponly.efi.
// Everything after iPXE travels over HTTP (pxe/httpboot), so this server
// only ever serves a handful of files of under 1 MiB.
//
// It wraps github.com/pin/tftp/v3, which negotiates blksize (RFC 2348,
// clamped to the interface MTU) and tsize (RFC 2349), and can run in
// single-port mode (every transfer on port 69, for NAT and firewalls).
// Write requests are refused.
//
// Resolve, the pure half, maps a requested name to a file: it accepts only
// names of regular files (or links to them) that were at the top level of
// the directory when the server started, after stripping leading slashes; it refuses "..",
// backslashes, NUL and anything else with a TFTP ERROR packet. pin/tftp
// sends every handler error with error code 1 ("file not found"); the
// message says why.
//
// This package does not serve kernels or images (HTTP does) and does not
// watch the directory for new files.
package tftp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/pin/tftp/v3"
	"github.com/prometheus/client_golang/prometheus"
)

// DefaultDir is where the Debian ipxe package installs its binaries.
const DefaultDir = "/usr/lib/ipxe"

// DefaultSinglePortBlockSize caps blksize in single-port mode: an
// Ethernet MTU of 1500 minus the IP, UDP and TFTP headers.
const DefaultSinglePortBlockSize = 1468

// Config configures a Server.
type Config struct {
	// Dir holds the files to serve; "" means DefaultDir.
	Dir string
	// SinglePort serves every transfer from the listening port instead of
	// a new port per transfer.
	SinglePort bool
	// MaxBlockSize caps the negotiated blksize (0: the interface MTU caps
	// it, or DefaultSinglePortBlockSize in single-port mode).
	MaxBlockSize int
	// Timeout is the per-packet retransmission timeout (0: 1 s).
	Timeout time.Duration
	// Retries is how often a packet is retransmitted (0: 5).
	Retries int
}

// Errors from Resolve.
var (
	ErrForbidden = errors.New("access violation")
	ErrNotFound  = errors.New("file not found")
)

// maxName bounds a requested file name (RFC 1350 has no limit; a packet
// holds at most 512 bytes of it by default).
const maxName = 255

// Resolve maps a requested TFTP file name to the name of a served file.
// served is the set of file names the server offers. Leading "/" are
// stripped (some ROMs send "/undionly.kpxe"); any other path structure,
// "..", backslash, NUL, control characters or an empty name is refused
// with ErrForbidden, and a clean name that is not served with ErrNotFound.
func Resolve(name string, served map[string]bool) (string, error) {
	if len(name) > maxName {
		return "", fmt.Errorf("%w: name of %d bytes", ErrForbidden, len(name))
	}
	clean := strings.TrimLeft(name, "/")
	if clean == "" {
		return "", fmt.Errorf("%w: empty file name", ErrForbidden)
	}
	for i := 0; i < len(clean); i++ {
		if c := clean[i]; c < 0x21 || c >= 0x7f || c == '\\' {
			return "", fmt.Errorf("%w: %q has a forbidden byte at %d", ErrForbidden, name, i)
		}
	}
	if strings.Contains(clean, "/") || clean == "." || clean == ".." || path.Clean(clean) != clean {
		return "", fmt.Errorf("%w: %q is not a plain file name; only the boot files are served", ErrForbidden, name)
	}
	if !served[clean] {
		return "", fmt.Errorf("%w: %q is not one of the served boot files", ErrNotFound, name)
	}
	return clean, nil
}

// Metrics are the TFTP counters.
type Metrics struct {
	Bytes     prometheus.Counter
	Transfers *prometheus.CounterVec // label result: ok, refused, aborted (client ended it after OACK, as UEFI does for tsize), failed
}

// NewMetrics creates the TFTP metrics and registers them with reg (nil:
// not registered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Bytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gpuboot_tftp_bytes_total", Help: "Bytes of file data sent over TFTP.",
		}),
		Transfers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gpuboot_tftp_transfers_total", Help: "TFTP read requests by result.",
		}, []string{"result"}),
	}
	for _, r := range []string{"ok", "refused", "aborted", "failed"} {
		m.Transfers.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(m.Bytes, m.Transfers)
	}
	return m
}

// Server serves the files of one directory.
type Server struct {
	cfg     Config
	files   map[string]string // served name → resolved path
	served  map[string]bool
	metrics *Metrics
	log     *slog.Logger
	srv     *tftp.Server
}

// New lists cfg.Dir and returns a Server for its top-level regular files.
// metrics and log may be nil.
func New(cfg Config, metrics *Metrics, log *slog.Logger) (*Server, error) {
	if cfg.Dir == "" {
		cfg.Dir = DefaultDir
	}
	if metrics == nil {
		metrics = NewMetrics(nil)
	}
	if log == nil {
		log = slog.Default()
	}
	entries, err := os.ReadDir(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("tftp: list %s (install the Debian ipxe package, or configure the directory holding undionly.kpxe and snponly.efi): %w", cfg.Dir, err)
	}
	// The Debian package links some names elsewhere (ipxe.efi ->
	// /boot/ipxe.efi), so links are resolved here, once; only the names
	// listed now are ever opened.
	served, files := map[string]bool{}, map[string]string{}
	for _, e := range entries {
		p, err := filepath.EvalSymlinks(filepath.Join(cfg.Dir, e.Name()))
		if err != nil {
			continue
		}
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			served[e.Name()] = true
			files[e.Name()] = p
		}
	}
	if len(served) == 0 {
		return nil, fmt.Errorf("tftp: %s holds no files to serve", cfg.Dir)
	}
	s := &Server{cfg: cfg, files: files, served: served, metrics: metrics, log: log}
	s.srv = tftp.NewServer(s.read, nil)
	if cfg.SinglePort {
		s.srv.EnableSinglePort()
	}
	timeout := cfg.Timeout
	if timeout <= 0 {
		timeout = time.Second
	}
	s.srv.SetTimeout(timeout)
	retries := cfg.Retries
	if retries <= 0 {
		retries = 5
	}
	s.srv.SetRetries(retries)
	maxBlock := cfg.MaxBlockSize
	if maxBlock <= 0 && cfg.SinglePort {
		// pin/tftp's single-port mode caps blocks at 512 bytes unless told
		// otherwise and does not look at the MTU.
		maxBlock = DefaultSinglePortBlockSize
	}
	if maxBlock > 0 {
		s.srv.SetBlockSize(maxBlock)
	}
	return s, nil
}

// Files returns the served file names, sorted.
func (s *Server) Files() []string {
	names := make([]string, 0, len(s.served))
	for n := range s.served {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// read is pin/tftp's read handler.
func (s *Server) read(name string, rf io.ReaderFrom) error {
	clean, err := Resolve(name, s.served)
	var remote string
	if ot, ok := rf.(tftp.OutgoingTransfer); ok {
		a := ot.RemoteAddr()
		remote = a.String()
	}
	if err != nil {
		s.metrics.Transfers.WithLabelValues("refused").Inc()
		s.log.Warn("tftp: refused", "file", name, "from", remote, "err", err)
		return err
	}
	f, err := os.Open(s.files[clean])
	if err != nil {
		s.metrics.Transfers.WithLabelValues("failed").Inc()
		return fmt.Errorf("%w: %s", ErrNotFound, clean)
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil {
		if ot, ok := rf.(tftp.OutgoingTransfer); ok {
			ot.SetSize(fi.Size())
		}
	}
	n, err := rf.ReadFrom(f)
	s.metrics.Bytes.Add(float64(n))
	if err != nil {
		if strings.Contains(err.Error(), "code=8") {
			// RFC 2347 §5: the client declined the options. UEFI PXE does
			// this on purpose: it asks for tsize, aborts, then fetches.
			s.metrics.Transfers.WithLabelValues("aborted").Inc()
			s.log.Debug("tftp: client ended the transfer after the option negotiation", "file", clean, "from", remote)
			return nil
		}
		s.metrics.Transfers.WithLabelValues("failed").Inc()
		s.log.Warn("tftp: transfer failed", "file", clean, "from", remote, "bytes", n, "err", err)
		return nil // pin/tftp has already sent an ERROR for transport failures
	}
	s.metrics.Transfers.WithLabelValues("ok").Inc()
	s.log.Info("tftp: sent", "file", clean, "to", remote, "bytes", n)
	return nil
}

// Listen opens the UDP socket for Serve on addr ("10.0.0.1:69" or ":69").
func Listen(addr string) (*net.UDPConn, error) {
	a, err := net.ResolveUDPAddr("udp4", addr)
	if err != nil {
		return nil, fmt.Errorf("tftp: listen %s: %w", addr, err)
	}
	conn, err := net.ListenUDP("udp4", a)
	if err != nil {
		return nil, fmt.Errorf("tftp: listen %s: %w", addr, err)
	}
	return conn, nil
}

// Serve serves conn until ctx is done, then waits for running transfers
// (each bounded by the timeout and retries) and returns.
func (s *Server) Serve(ctx context.Context, conn *net.UDPConn) error {
	stop := context.AfterFunc(ctx, s.srv.Shutdown)
	defer stop()
	err := s.srv.Serve(conn)
	if ctx.Err() != nil {
		if s.cfg.SinglePort {
			conn.Close()
		}
		return nil
	}
	return err
}
