// Package httpboot is gpuboot's plain-HTTP side (docs/contracts.md §3, port
// 8080): what firmware, iPXE and Prometheus fetch.
//
//	GET /boot.ipxe                         script that makes iPXE send its identity
//	GET /boot.ipxe?mac=…&uuid=…&serial=…   the machine's script: boot an image, or wait
//	GET /images/<image-id>/<file>          content-addressed image files (Range, ETag)
//	GET /ipxe/<file>                       iPXE binaries, for UEFI HTTP boot (optional)
//	GET /metrics                           Prometheus metrics
//
// Which script a machine gets is not decided here: NewHandler takes a
// Booter, declared in this package, which the inventory and policy
// implement (pxe/inventory, pxe/policy). httpboot turns the query into an
// identity.Identity (docs/contracts.md §1 normalisation), asks the Booter for a
// Target, and renders it with pxe/ipxe, appending the docs/contracts.md §3
// kernel arguments (initrd=initrd.img, gpurack.rootfs=, BOOTIF=,
// gpurack.enroll=, gpurack.enroll.ca=).
//
// Images are served only as bytes whose digest matches the signed
// manifest. Verification reads the directory through an os.Root (no link
// leads outside it), checks the manifest's ed25519 signature by one of the
// configured keys, and copies every artifact into a private, unlinked file
// while hashing it; an artifact whose size or sha256 differs fails the
// image. Files and the cmdline of /boot.ipxe come from those copies, so a
// file of the store rewritten after verification is never served, even with
// its size and modification time restored. The verdict is cached per image
// id and recomputed when the directory's modification time changes or a
// store file's stamp (size, mtime, ctime, inode) differs from the one
// verified. An image that fails is refused with 403 and never booted.
// Files are served with http.ServeContent (Range, If-None-Match; sendfile
// for whole files); the ETag is the artifact's sha256 from the signed
// manifest, and responses are marked immutable, since an image id names
// fixed content (docs/contracts.md §7).
//
// Nothing served here is secret; the threat model is docs/contracts.md §7. The
// TLS listener (enrollment, admin, REST, rack view) is not this package.
package httpboot

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/gpurack/gpurack/pxe/identity"
)

// Action is what a Target tells the machine to do.
type Action int

const (
	// Boot boots the image Target.ImageID.
	Boot Action = iota + 1
	// Hold shows "waiting for approval" and asks again every 30 s.
	Hold
)

// Target is a Booter's answer for one machine.
type Target struct {
	Action Action
	// ImageID is the image to boot (Boot only): 40 lowercase hex digits,
	// a directory of the image store.
	ImageID string
	// ExtraArgs are kernel arguments added after the image's cmdline.
	ExtraArgs []string
}

// Booter decides what a machine that asks for /boot.ipxe boots. The
// inventory implements it: it records an unknown identity as discovered
// and, for a known one, only the time of the boot: an unauthenticated boot
// request never ends a key, revokes a certificate or moves the lifecycle
// (decision 0405). remote is the client's address, for logs only: it must
// never decide anything about trust. An error makes the machine retry.
type Booter interface {
	BootTarget(ctx context.Context, id identity.Identity, remote netip.Addr) (Target, error)
}

// BooterFunc adapts a function to Booter.
type BooterFunc func(ctx context.Context, id identity.Identity, remote netip.Addr) (Target, error)

// BootTarget implements Booter.
func (f BooterFunc) BootTarget(ctx context.Context, id identity.Identity, remote netip.Addr) (Target, error) {
	return f(ctx, id, remote)
}

// Config configures the handler.
type Config struct {
	// ImageStore is the directory holding <image-id>/ directories
	// (docs/contracts.md §7). Required.
	ImageStore string
	// TrustedKeys are the public keys of trusted image signers; an image
	// is served if one of them signed its manifest. Required.
	TrustedKeys []ed25519.PublicKey
	// BaseURL is the advertised absolute URL of this listener, as booting
	// machines reach it, for example "http://10.0.0.1:8080". Required.
	BaseURL string
	// EnrollAddr is host:port of gpuboot's TLS listener and EnrollCAPin
	// the gpurack CA pin ("sha256:<hex>"), for the kernel command line.
	// Empty EnrollAddr leaves gpurack.enroll* out (the agent then does not
	// enroll).
	EnrollAddr  string
	EnrollCAPin string
	// VerifiedCopies is the directory where verified artifacts are copied to be
	// served from (each copy is unlinked at once and lives as long as its
	// verdict). It should be private to gpuboot and on disk: a rootfs is
	// copied whole. Empty means the system's temporary directory.
	VerifiedCopies string
	// IPXEDir, if set, is served at /ipxe/<file> (the iPXE binaries, for
	// UEFI HTTP boot clients that DHCP points at /ipxe/ipxe.efi).
	IPXEDir string
	// Registry receives the HTTP metrics and is served at /metrics; nil
	// means a new registry. Pass gpuboot's shared registry so /metrics also
	// shows DHCP, TFTP and inventory metrics.
	Registry *prometheus.Registry
	// NoMetrics leaves /metrics out (404): gpuboot serves it on its operator TLS port
	// to a metrics-reader certificate instead, unless metrics.plainHTTP (decision 0693).
	NoMetrics bool
	// Log receives one line per script and per refused request; nil means
	// slog.Default().
	Log *slog.Logger
}

// Handler serves the routes listed in the package comment.
type Handler struct {
	cfg     Config
	booter  Booter
	images  *imageCache
	ipxe    map[string]string // served name → path
	metrics *metrics
	log     *slog.Logger
	mux     *http.ServeMux
}

// NewHandler checks cfg and returns the handler.
func NewHandler(cfg Config, b Booter) (*Handler, error) {
	if cfg.ImageStore == "" {
		return nil, errors.New("httpboot: the image store directory is not configured")
	}
	if len(cfg.TrustedKeys) == 0 {
		return nil, errors.New("httpboot: no trusted image signing keys configured: no image could be served")
	}
	u, err := url.Parse(cfg.BaseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
		return nil, fmt.Errorf("httpboot: advertised base URL %q: want http://HOST:PORT as booting machines reach this server", cfg.BaseURL)
	}
	cfg.BaseURL = strings.TrimSuffix(cfg.BaseURL, "/")
	if b == nil {
		return nil, errors.New("httpboot: no Booter")
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	m, err := newMetrics(cfg.Registry)
	if err != nil {
		return nil, err
	}
	h := &Handler{
		cfg:     cfg,
		booter:  b,
		images:  newImageCache(cfg.ImageStore, cfg.TrustedKeys, cfg.VerifiedCopies),
		metrics: m,
		log:     cfg.Log,
		mux:     http.NewServeMux(),
	}
	if h.log == nil {
		h.log = slog.Default()
	}
	if cfg.VerifiedCopies != "" {
		if err := os.MkdirAll(cfg.VerifiedCopies, 0o700); err != nil {
			return nil, fmt.Errorf("httpboot: directory for verified image copies: %w", err)
		}
	}
	if cfg.IPXEDir != "" {
		if h.ipxe, err = listFiles(cfg.IPXEDir); err != nil {
			return nil, fmt.Errorf("httpboot: iPXE directory: %w", err)
		}
	}
	h.mux.HandleFunc("GET /boot.ipxe", h.serveScript)
	h.mux.HandleFunc("GET /images/{id}/{file}", h.serveImageFile)
	h.mux.HandleFunc("GET /ipxe/{file}", h.serveIPXE)
	if !cfg.NoMetrics {
		h.mux.Handle("GET /metrics", promhttp.HandlerFor(cfg.Registry, promhttp.HandlerOpts{}))
	}
	return h, nil
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.mux.ServeHTTP(w, r)
}

// ScriptURL is the absolute URL of /boot.ipxe, for DHCP's iPXE answer.
func (h *Handler) ScriptURL() string { return h.cfg.BaseURL + "/boot.ipxe" }

// remoteAddr extracts the client IP from r.RemoteAddr (never from headers).
func remoteAddr(r *http.Request) netip.Addr {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
}
