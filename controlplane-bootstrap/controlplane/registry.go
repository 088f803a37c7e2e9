package controlplane

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterconfig"
	"github.com/gpurack/gpurack/controlplane-bootstrap/components"
	"github.com/gpurack/gpurack/controlplane-bootstrap/registryauth"
	"github.com/gpurack/gpurack/internal/atomicfile"
)

// writeRegistryFiles writes what the image registry reads (registry.enabled): the token
// issuer's signing pair (made once, kept), its HTTP secret (the same), its configuration
// and its storage folder. Without the signing certificate the registry would refuse
// every token, and it does not start.
func writeRegistryFiles(l components.Layout, cfg *clusterconfig.Config) error {
	if !cfg.Registry.Enabled {
		return nil
	}
	if _, err := registryauth.EnsureSigningKey(l.PKIDir()); err != nil {
		return fmt.Errorf("registry: the token issuer's signing key: %w", err)
	}
	if _, err := os.Stat(l.PKI(components.RegistryTokenCert)); err != nil {
		return fmt.Errorf("registry: the token issuer's signing certificate %s is missing (%w): the registry trusts only tokens signed with its key; it is made with the token issuer (package registryauth), or set registry.enabled: false", l.PKI(components.RegistryTokenCert), errors.Unwrap(err))
	}
	secret, err := ensureRegistrySecret(l)
	if err != nil {
		return err
	}
	if err := writeRegistryConfig(l, cfg, secret, false); err != nil {
		return err
	}
	if err := os.MkdirAll(components.RegistryStorage(cfg, l), 0o700); err != nil {
		return fmt.Errorf("registry.storage: %w", err)
	}
	return nil
}

// ensureRegistrySecret returns the registry's HTTP secret, DIR/pki/registry-http.secret,
// made of 32 random bytes the first time. It signs the state of an upload in progress,
// so it stays the same across restarts.
func ensureRegistrySecret(l components.Layout) (string, error) {
	path := l.PKI(components.RegistryHTTPSecret)
	data, err := os.ReadFile(path)
	if err == nil && len(strings.TrimSpace(string(data))) >= 32 {
		return strings.TrimSpace(string(data)), nil
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("registry: %w", err)
	}
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("registry: HTTP secret: %w", err)
	}
	secret := hex.EncodeToString(b)
	if err := atomicfile.WriteMkdirAll(path, []byte(secret+"\n"), 0o600, 0o700); err != nil {
		return "", fmt.Errorf("registry: %w", err)
	}
	return secret, nil
}

// writeRegistryConfig writes DIR/config/registry.yml, read-only or not.
func writeRegistryConfig(l components.Layout, cfg *clusterconfig.Config, secret string, readOnly bool) error {
	data, err := components.RegistryConfig(cfg, l, secret, readOnly)
	if err != nil {
		return err
	}
	return atomicfile.WriteMkdirAll(l.RegistryConfigFile(), data, 0o600, 0o755)
}

// GCOptions configure CollectGarbage.
type GCOptions struct {
	// DryRun lists what would be deleted and deletes nothing; the registry keeps
	// running as it is.
	DryRun bool
	// Out receives progress lines; nil discards them.
	Out io.Writer
	// whileReadOnly, when set, runs once the registry is read-only, before the
	// collection (tests look at the registry then).
	whileReadOnly func() error
}

// GCResult is what CollectGarbage did.
type GCResult struct {
	// ReadOnly is set when the registry was running and was switched to read-only
	// for the collection, and back.
	ReadOnly bool
	// Marked, Blobs and Manifests are garbage-collect's counts: blobs in use, and blobs
	// and manifests eligible for deletion (deleted unless DryRun).
	Marked, Blobs, Manifests int
	// LogFile holds garbage-collect's full output (every blob it marked or deleted).
	LogFile string
}

// registryRun is how the registry of a cluster directory runs now.
type registryRun int

const (
	registryStopped registryRun = iota
	registrySupervised
	registryUnit
)

// CollectGarbage deletes the blobs and untagged manifests of the registry in dir that
// no tag references: distribution's `registry garbage-collect --delete-untagged`. A push
// during the collection could lose its layers, so a running registry is first
// restarted read-only (maintenance.readonly: pulls go on, pushes and deletes are
// refused), through the supervisor of `init --foreground` or its systemd unit, and
// restarted read-write afterwards, also when the collection fails. A stopped registry
// is collected as it is. A registry that answers on its port but that neither runs is
// refused: the operator stops it first. A dry run deletes nothing and leaves the
// registry as it is.
func CollectGarbage(ctx context.Context, dir string, opts GCOptions) (res *GCResult, err error) {
	out := opts.Out
	if out == nil {
		out = io.Discard
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	if cfg, err := clusterconfig.Load(components.Layout{Dir: abs}.ConfigFile()); err != nil {
		return nil, fmt.Errorf("%s holds no control plane (give the --dir init used): %w", abs, err)
	} else if !cfg.Registry.Enabled {
		return nil, fmt.Errorf("%s: registry.enabled is false, so there is no registry to collect", components.Layout{Dir: abs}.ConfigFile())
	}
	cp, err := Open(abs)
	if err != nil {
		return nil, err
	}
	l, cfg := cp.Layout, cp.Config
	bin, err := components.FindBinary(components.BinDir(cfg.BinDir), components.Registry)
	if err != nil {
		return nil, err
	}
	spec, _ := components.Spec(cfg, l, components.Registry)
	secret, err := readRegistrySecret(l)
	if err != nil {
		return nil, err
	}
	run, err := cp.registryRunning(ctx, spec)
	if err != nil {
		return nil, err
	}
	res = &GCResult{LogFile: l.LogFile("registry-gc")}
	if opts.DryRun {
		fmt.Fprintln(out, "dry run: nothing is deleted and the registry is left as it is")
		return res, cp.garbageCollect(ctx, bin, opts, res, out)
	}
	if run == registryStopped {
		fmt.Fprintf(out, "the registry is stopped; collecting with %s\n", l.RegistryConfigFile())
		if err := cp.garbageCollect(ctx, bin, opts, res, out); err != nil {
			return res, err
		}
		// A configuration an interrupted gc left read-only is turned back.
		return res, writeRegistryConfig(l, cfg, secret, false)
	}
	if err := cp.switchRegistry(ctx, run, spec, secret, true, out); err != nil {
		return res, errors.Join(err, cp.switchRegistry(context.WithoutCancel(ctx), run, spec, secret, false, out))
	}
	res.ReadOnly = true
	defer func() {
		// Back to read-write even when the collection failed or was interrupted.
		err = errors.Join(err, cp.switchRegistry(context.WithoutCancel(ctx), run, spec, secret, false, out))
	}()
	if opts.whileReadOnly != nil {
		if err := opts.whileReadOnly(); err != nil {
			return res, err
		}
	}
	return res, cp.garbageCollect(ctx, bin, opts, res, out)
}

// readRegistrySecret reads the HTTP secret init made.
func readRegistrySecret(l components.Layout) (string, error) {
	data, err := os.ReadFile(l.PKI(components.RegistryHTTPSecret))
	if err != nil {
		return "", fmt.Errorf("registry: %w: run `controlplane-bootstrap init --dir %s` with registry.enabled, which makes it", err, l.Dir)
	}
	return strings.TrimSpace(string(data)), nil
}

// registryRunning finds how the registry runs: under the live supervisor of the
// directory, as its running systemd unit, or not at all. Something else that answers
// on the registry's port is an error that says to stop it.
func (cp *ControlPlane) registryRunning(ctx context.Context, spec components.Component) (registryRun, error) {
	l := cp.Layout
	if _, alive := runningSupervisor(l); alive {
		return registrySupervised, nil
	}
	unit := components.UnitName(components.Registry)
	if data, err := os.ReadFile(l.SystemdMarker()); err == nil && slices.Contains(strings.Fields(string(data)), unit) {
		running, err := (components.SystemdUnits{}).Running(ctx, []string{unit})
		if err != nil {
			return registryStopped, err
		}
		if _, ok := running[unit]; ok {
			return registryUnit, nil
		}
	}
	addr := spec.Ports[0].Addr()
	conn, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return registryStopped, nil
	}
	conn.Close()
	return registryStopped, fmt.Errorf("something answers on the registry's port %s, but neither a supervisor of %s nor its unit %s runs it, so it cannot be made read-only for the collection: stop it, then run `controlplane-bootstrap registry gc --dir %s` again", addr, l.Dir, unit, l.Dir)
}

// switchRegistry rewrites the registry's configuration read-only or read-write and
// restarts it onto it, healthy before it returns.
func (cp *ControlPlane) switchRegistry(ctx context.Context, run registryRun, spec components.Component, secret string, readOnly bool, out io.Writer) error {
	l := cp.Layout
	state := "read-write"
	if readOnly {
		state = "read-only (pulls go on; pushes and deletes are refused)"
	}
	fmt.Fprintf(out, "restarting the registry %s\n", state)
	if err := writeRegistryConfig(l, cp.Config, secret, readOnly); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, cp.readyTimeout+restartGrace)
	defer cancel()
	switch run {
	case registrySupervised:
		if err := requestRestart(ctx, l, []string{components.Registry}, out); err != nil {
			return fmt.Errorf("restart the registry %s: %w", state, err)
		}
	case registryUnit:
		unit := components.UnitName(components.Registry)
		if err := (components.SystemdUnits{}).Restart(ctx, []string{unit}); err != nil {
			return fmt.Errorf("restart the registry %s: %w; run `systemctl restart %s`", state, err, unit)
		}
		if err := cp.waitHealthy(ctx, spec, cp.readyTimeout, nil); err != nil {
			return fmt.Errorf("the registry %s: %w; see `journalctl -u %s`", state, err, unit)
		}
	}
	fmt.Fprintf(out, "the registry runs %s\n", strings.SplitN(state, " ", 2)[0])
	return nil
}

// gcSummary is garbage-collect's last line.
var gcSummary = regexp.MustCompile(`^(\d+) blobs marked, (\d+) blobs and (\d+) manifests eligible for deletion`)

// garbageCollect runs `registry garbage-collect --delete-untagged` on the registry's
// configuration, its output into the log file, and reads its counts.
func (cp *ControlPlane) garbageCollect(ctx context.Context, bin string, opts GCOptions, res *GCResult, out io.Writer) error {
	args := []string{"garbage-collect", "--delete-untagged"}
	if opts.DryRun {
		args = append(args, "--dry-run")
	}
	args = append(args, cp.Layout.RegistryConfigFile())
	if err := os.MkdirAll(cp.Layout.LogDir(), 0o755); err != nil {
		return err
	}
	logf, err := os.Create(res.LogFile)
	if err != nil {
		return err
	}
	defer logf.Close()
	fmt.Fprintf(out, "running %s %s (its output: %s)\n", bin, strings.Join(args, " "), res.LogFile)
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	began := time.Now()
	runErr := cmd.Run()
	if _, err := logf.Seek(0, io.SeekStart); err != nil {
		return err
	}
	summary := ""
	sc := bufio.NewScanner(logf)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if m := gcSummary.FindStringSubmatch(sc.Text()); m != nil {
			summary = m[0]
			fmt.Sscan(m[1], &res.Marked)
			fmt.Sscan(m[2], &res.Blobs)
			fmt.Sscan(m[3], &res.Manifests)
		}
	}
	if runErr != nil {
		return fmt.Errorf("registry garbage-collect failed (%v); the end of %s:\n  %s", runErr, res.LogFile,
			strings.ReplaceAll(components.TailFile(res.LogFile, 8), "\n", "\n  "))
	}
	if summary == "" {
		return fmt.Errorf("registry garbage-collect printed no summary line; see %s", res.LogFile)
	}
	verb := "deleted"
	if opts.DryRun {
		verb = "would be deleted"
	}
	fmt.Fprintf(out, "garbage-collect took %s: %d blobs in use; %d blobs and %d untagged manifests %s (each is listed in %s)\n",
		time.Since(began).Round(time.Millisecond), res.Marked, res.Blobs, res.Manifests, verb, res.LogFile)
	return nil
}
