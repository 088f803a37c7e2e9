// Package build is gpuimage's pipeline: lock a profile with apt, fetch the locked .debs
// into the sha256-keyed cache, build the root filesystem with mmdebstrap, customise it,
// assemble squashfs and initramfs, and write the signed manifest and SBOM. Each stage
// is a function with its inputs spelled out; the cobra commands only wire flags.
package build

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"

	"github.com/gpurack/gpurack/imagebuilder/apt"
	"github.com/gpurack/gpurack/imagebuilder/debcache"
	"github.com/gpurack/gpurack/internal/profile"
)

// DefaultCacheDir is $GPURACK_CACHE/imagebuilder, or ~/.cache/gpurack/imagebuilder.
func DefaultCacheDir() string {
	if d := os.Getenv("GPURACK_CACHE"); d != "" {
		return filepath.Join(d, "imagebuilder")
	}
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "gpurack", "imagebuilder")
	}
	return filepath.Join(os.TempDir(), "gpurack-imagebuilder")
}

// EtcApt is the host apt configuration read for its Debian sources; tests point it
// elsewhere.
var EtcApt = "/etc/apt"

// Sources returns the archive sources for p: its base.mirror, or the host's configured
// Debian sources re-pointed at p's suite.
func Sources(p *profile.Profile) ([]apt.Source, error) {
	comps := p.Base.Components
	if len(comps) == 0 {
		comps = []string{"main", "contrib", "non-free", "non-free-firmware"}
	}
	if p.Base.Mirror != "" {
		return apt.MirrorSources(p.Base.Mirror, p.Base.Suite, comps), nil
	}
	return apt.HostDebianSources(EtcApt, p.Base.Suite, comps)
}

// AptEnv prepares (and updates) the private apt directory for p under cacheDir. The
// directory is keyed by the sources and pins, so profiles share lists when they can.
func AptEnv(ctx context.Context, cacheDir string, p *profile.Profile) (*apt.Env, error) {
	srcs, err := Sources(p)
	if err != nil {
		return nil, err
	}
	pins := apt.DriverPins(p)
	h := sha256.New()
	for _, s := range srcs {
		fmt.Fprintln(h, s.Line())
	}
	h.Write([]byte(pins))
	dir := filepath.Join(cacheDir, "apt", hex.EncodeToString(h.Sum(nil))[:16])
	env, err := apt.NewEnv(dir, srcs, pins)
	if err != nil {
		return nil, err
	}
	if err := env.Update(ctx); err != nil {
		return nil, err
	}
	return env, nil
}

// Lock resolves p and returns its lock.
func Lock(ctx context.Context, cacheDir string, p *profile.Profile) (*profile.Lock, error) {
	env, err := AptEnv(ctx, cacheDir, p)
	if err != nil {
		return nil, err
	}
	return apt.Resolve(ctx, env, p)
}

// CheckLock reports why l is stale for p; an empty list means it is fresh.
func CheckLock(ctx context.Context, cacheDir string, p *profile.Profile, l *profile.Lock) ([]string, error) {
	env, err := AptEnv(ctx, cacheDir, p)
	if err != nil {
		return nil, err
	}
	avail, err := env.Available(ctx, append(append([]profile.LockedPackage{}, l.Packages...), l.Build...))
	if err != nil {
		return nil, err
	}
	c := &debcache.Cache{Dir: filepath.Join(cacheDir, "debs")}
	return apt.Stale(l, p.Digest(), avail, c.Has), nil
}

// Bases are the archive base URLs the .debs of p are fetched from.
func Bases(p *profile.Profile) ([]string, error) {
	srcs, err := Sources(p)
	if err != nil {
		return nil, err
	}
	var out []string
	seen := map[string]bool{}
	for _, s := range srcs {
		if !seen[s.URI] {
			seen[s.URI] = true
			out = append(out, s.URI)
		}
	}
	return out, nil
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}
