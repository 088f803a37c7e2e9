package build

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/gpurack/gpurack/imagebuilder/apt"
	"github.com/gpurack/gpurack/imagebuilder/debcache"
	"github.com/gpurack/gpurack/imagebuilder/ociimage"
	"github.com/gpurack/gpurack/imagebuilder/rootfs"
	"github.com/gpurack/gpurack/internal/manifest"
	"github.com/gpurack/gpurack/internal/profile"
)

// ContainerOptions are one workload image build's inputs (docs/workload-images.md).
type ContainerOptions struct {
	Profile string // a container profile (kind: container)
	Lock    string // default beside the profile
	// Out is the OCI image-layout tar archive to write; its signature goes to Out.sig.
	Out   string
	Cache string
	Key   string // ed25519 private key; default Cache/signing-key.pem, as for node images
	// Epoch is SOURCE_DATE_EPOCH; 0: the newest Release date in the lock.
	Epoch int64
	// Push, when set, is the reference the image is pushed to after the archive is
	// written, with CA and AuthFile (ociimage.PushOptions).
	Push, CA, AuthFile string
	Reporter           *Reporter
}

// ContainerResult is what a workload image build produced.
type ContainerResult struct {
	Archive   string
	Signature string
	Ref       string
	// Digest is the image manifest's digest, "sha256:HEX": the same profile and lock
	// give the same digest.
	Digest  string
	Size    int64 // of the archive
	Layer   int64 // compressed layer size
	Pushed  string
	Timings map[string]time.Duration
}

// containerBase is what every workload image installs besides its packages: Debian's
// Essential set, what mmdebstrap --variant=essential installs.
var containerBase = []string{"?essential"}

// containerNode is the node-profile shape of c that the apt environment reads: only
// the name and base are used.
func containerNode(c *profile.Container) *profile.Profile {
	return &profile.Profile{Name: c.Name, Base: c.Base}
}

// LockContainer resolves c with apt, like Lock for a node profile: the Essential set
// and c's packages, every one pinned by version and sha256.
func LockContainer(ctx context.Context, cacheDir string, c *profile.Container) (*profile.Lock, error) {
	env, err := AptEnv(ctx, cacheDir, containerNode(c))
	if err != nil {
		return nil, err
	}
	inst, err := env.Simulate(ctx, append(append([]string{}, containerBase...), c.Packages...))
	if err != nil {
		return nil, err
	}
	pkgs, err := env.Lock(ctx, inst)
	if err != nil {
		return nil, err
	}
	rel, err := env.Releases()
	if err != nil {
		return nil, err
	}
	return &profile.Lock{SchemaVersion: profile.LockSchemaVersion, Profile: c.Name, ProfileDigest: c.Digest(),
		Release: rel, Packages: pkgs, Build: []profile.LockedPackage{}, ExtraDebs: []profile.LockedExtraDeb{}}, nil
}

// CheckContainerLock is CheckLock for a container profile.
func CheckContainerLock(ctx context.Context, cacheDir string, c *profile.Container, l *profile.Lock) ([]string, error) {
	env, err := AptEnv(ctx, cacheDir, containerNode(c))
	if err != nil {
		return nil, err
	}
	avail, err := env.Available(ctx, l.Packages)
	if err != nil {
		return nil, err
	}
	cache := &debcache.Cache{Dir: filepath.Join(cacheDir, "debs")}
	return apt.Stale(l, c.Digest(), avail, cache.Has), nil
}

// containerBuild is one run of BuildContainer, filled stage by stage.
type containerBuild struct {
	o     ContainerOptions
	rep   *Reporter
	c     *profile.Container
	lock  *profile.Lock
	epoch int64
	key   ed25519.PrivateKey
	work  string
	debs  map[string]profile.LockedPackage
	tree  string
	layer *ociimage.LayerFile
	img   v1.Image
	res   *ContainerResult
}

var containerStages = []struct {
	name string
	run  func(*containerBuild, context.Context) error
}{
	{"inputs", (*containerBuild).inputs},
	{"fetch .debs", (*containerBuild).fetch},
	{"rootfs (mmdebstrap)", (*containerBuild).rootfs},
	{"image files and user", (*containerBuild).customize},
	{"layer", (*containerBuild).makeLayer},
	{"OCI archive + signature", (*containerBuild).archive},
	{"push", (*containerBuild).push},
}

// BuildContainer builds a workload image from a container profile and its lock: the
// locked .debs (from the same cache as node images) installed by mmdebstrap into a
// tree, the profile's files and user added, one deterministic layer, an OCI image
// archive at o.Out with an ed25519 signature of the manifest digest at o.Out.sig, and
// optionally a push. Nothing is written to o.Out until the archive is complete.
func BuildContainer(ctx context.Context, o ContainerOptions) (*ContainerResult, error) {
	defer pinUmask()()
	if o.Reporter == nil {
		o.Reporter = NewReporter(os.Stderr)
	}
	b := &containerBuild{o: o, rep: o.Reporter, res: &ContainerResult{Timings: map[string]time.Duration{}}}
	defer func() {
		if b.work != "" {
			os.RemoveAll(b.work)
		}
	}()
	for i, st := range containerStages {
		b.rep.Stage(i+1, len(containerStages), st.name)
		start := time.Now()
		if err := st.run(b, ctx); err != nil {
			return nil, err
		}
		b.res.Timings[st.name] = time.Since(start)
		b.rep.Done()
	}
	return b.res, nil
}

func (b *containerBuild) inputs(ctx context.Context) error {
	o := &b.o
	c, err := profile.LoadContainer(o.Profile)
	if err != nil {
		return err
	}
	if o.Lock == "" {
		o.Lock = profile.LockPath(o.Profile)
	}
	if err := checkOut(o.Out); err != nil {
		return err
	}
	l, err := profile.LoadLock(o.Lock)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%s has no lock file %s: run gpuimage lock %s", o.Profile, o.Lock, o.Profile)
	}
	if err != nil {
		return err
	}
	if l.ProfileDigest != c.Digest() {
		return fmt.Errorf("%s is stale: the profile changed since it was locked (lock has %s, profile is %s); run gpuimage lock %s",
			o.Lock, l.ProfileDigest, c.Digest(), o.Profile)
	}
	b.epoch = o.Epoch
	if b.epoch == 0 {
		if b.epoch, err = lockEpoch(l); err != nil {
			return err
		}
	}
	if o.Cache == "" {
		o.Cache = DefaultCacheDir()
	}
	if err := mkdirMode(o.Cache, 0o755); err != nil {
		return err
	}
	if b.key, err = signingKey(o.Key, o.Cache, b.rep); err != nil {
		return err
	}
	if b.work, err = os.MkdirTemp(o.Cache, "work-"); err != nil {
		return err
	}
	b.c, b.lock = c, l
	b.res.Ref = c.Ref()
	b.rep.Logf("image %s: profile %s, %d packages, SOURCE_DATE_EPOCH=%d", c.Ref(), c.Name, len(l.Packages), b.epoch)
	return nil
}

// checkOut fails, before anything is built, unless out can be an archive: a path in an
// existing directory that is not itself a directory.
func checkOut(out string) error {
	if out == "" {
		return fmt.Errorf("no output archive given (--out NAME.oci.tar)")
	}
	if st, err := os.Stat(filepath.Dir(out)); err != nil || !st.IsDir() {
		return fmt.Errorf("--out %s: the directory %s does not exist; make it first", out, filepath.Dir(out))
	}
	if st, err := os.Stat(out); err == nil && st.IsDir() {
		return fmt.Errorf("--out %s is a directory; name the archive file", out)
	}
	return nil
}

func (b *containerBuild) fetch(ctx context.Context) error {
	bases, err := Bases(containerNode(b.c))
	if err != nil {
		return err
	}
	b.debs = map[string]profile.LockedPackage{}
	_, err = fetchDebs(ctx, b.rep, b.o.Cache, bases, b.lock.Packages, func(path string, lp profile.LockedPackage) { b.debs[path] = lp })
	return err
}

// rootfs installs exactly the locked .debs into a directory tree (maintainer scripts
// run, so alternatives such as libblas.so.3 exist) and checks dpkg's installed list
// against the lock.
func (b *containerBuild) rootfs(ctx context.Context) error {
	repo := filepath.Join(b.work, "repo")
	if err := debcache.WriteRepo(repo, b.c.Base.Suite, b.debs); err != nil {
		return err
	}
	var names []string
	for _, lp := range b.debs {
		names = append(names, lp.Name)
	}
	sort.Strings(names)
	b.tree = filepath.Join(b.work, "tree")
	mm := &rootfs.Mmdebstrap{Suite: b.c.Base.Suite, Repo: repo, Packages: names, Variant: "essential", Directory: true,
		Commands: containerHooks, Epoch: b.epoch, Out: b.tree,
		Log: func(l string) { b.rep.Progress("%s", truncate(l, 100)) }}
	if err := mm.Run(ctx); err != nil {
		return err
	}
	installed := filepath.Join(b.work, "installed.txt")
	out, err := runOutput(ctx, "dpkg-query", "--admindir="+filepath.Join(b.tree, "var/lib/dpkg"), "-W", "-f=${Package} ${Version} ${Architecture}\n")
	if err != nil {
		return err
	}
	if err := os.WriteFile(installed, out, 0o644); err != nil {
		return err
	}
	return checkInstalled(installed, b.debs)
}

// containerHooks leave out of the tree what differs between builds or is only the
// build's: apt's lists and caches, logs, the ldconfig and debconf caches' old copies.
var containerHooks = []string{
	`rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin "$1"/var/cache/ldconfig/aux-cache "$1"/var/log/* "$1"/var/cache/debconf/*-old "$1"/var/lib/dpkg/*-old`,
	`rm -f "$1/etc/machine-id" "$1/etc/hostname" "$1/etc/resolv.conf" "$1/etc/apt/sources.list"`,
}

func runOutput(ctx context.Context, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s %s: %v", name, strings.Join(args, " "), err)
	}
	return out, nil
}

// customize adds the profile's files (root-owned, with their modes), the user and its
// group, and the work directory owned by the user.
func (b *containerBuild) customize(ctx context.Context) error {
	u := b.c.Image.User
	for _, f := range b.c.Files {
		data, err := os.ReadFile(filepath.Join(filepath.Dir(b.o.Profile), f.Source))
		if err != nil {
			return err
		}
		dst := filepath.Join(b.tree, f.Path)
		if err := mkdirAllMode(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		os.Remove(dst)
		if err := writeFileMode(dst, data, f.FileMode()); err != nil {
			return err
		}
	}
	wd := filepath.Join(b.tree, b.c.Image.Workdir)
	if err := mkdirAllMode(wd, 0o755); err != nil {
		return err
	}
	if err := os.Lchown(wd, int(u.UID), int(u.GID)); err != nil {
		return err
	}
	id := func(n int64) string { return strconv.FormatInt(n, 10) }
	entries := map[string]string{
		"etc/passwd": u.Name + ":x:" + id(u.UID) + ":" + id(u.GID) + "::" + b.c.Image.Workdir + ":/bin/sh\n",
		"etc/group":  u.Name + ":x:" + id(u.GID) + ":\n",
		"etc/shadow": u.Name + ":!::0:99999:7:::\n",
	}
	for file, line := range entries {
		if err := appendAccount(filepath.Join(b.tree, file), line); err != nil {
			return err
		}
	}
	return nil
}

// appendAccount adds line to an account file unless its name or id is taken already.
func appendAccount(path, line string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	f := strings.Split(line, ":")
	for _, l := range strings.Split(string(data), "\n") {
		g := strings.Split(l, ":")
		if g[0] == f[0] || (len(g) > 2 && len(f) > 2 && g[2] == f[2] && !strings.HasSuffix(path, "shadow")) {
			return fmt.Errorf("%s: %q or id %s is taken by %q; choose another user name or id", filepath.Base(path), f[0], f[2], l)
		}
	}
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	return writeFileMode(path, append(data, line...), st.Mode().Perm())
}

// mkdirAllMode makes dir and its missing parents with mode, whatever the umask.
func mkdirAllMode(dir string, mode os.FileMode) error {
	if _, err := os.Lstat(dir); err == nil {
		return nil
	}
	if err := mkdirAllMode(filepath.Dir(dir), mode); err != nil {
		return err
	}
	return mkdirMode(dir, mode)
}

func (b *containerBuild) makeLayer(ctx context.Context) error {
	l, err := ociimage.WriteLayer(b.tree, filepath.Join(b.work, "layer.tar.gz"), time.Unix(b.epoch, 0))
	if err != nil {
		return err
	}
	b.layer = l
	b.res.Layer = l.Size
	b.rep.Logf("layer %s, %.1f MiB compressed", l.Digest, float64(l.Size)/(1<<20))
	return os.RemoveAll(b.tree)
}

func (b *containerBuild) archive(ctx context.Context) error {
	im := b.c.Image
	cfg := ociimage.Config{User: fmt.Sprintf("%d:%d", im.User.UID, im.User.GID), Workdir: im.Workdir, Env: im.Env,
		Entrypoint: im.Entrypoint, Cmd: im.Cmd, Ports: im.Ports, Labels: im.Labels, History: "gpurack workload profile " + b.c.Name}
	img, err := ociimage.Image(b.layer, cfg, time.Unix(b.epoch, 0))
	if err != nil {
		return err
	}
	d, err := img.Digest()
	if err != nil {
		return err
	}
	b.img, b.res.Digest = img, d.String()
	out := b.o.Out
	sig := manifest.Sign(b.key, []byte(b.res.Digest))
	sigTmp := out + ".sig.tmp"
	if err := writeFileMode(sigTmp, sig, 0o644); err != nil {
		return err
	}
	defer os.Remove(sigTmp)
	if err := ociimage.WriteArchive(img, b.c.Ref(), im.Tag, out, b.work, time.Unix(b.epoch, 0)); err != nil {
		return err
	}
	if err := os.Rename(sigTmp, out+".sig"); err != nil {
		return err
	}
	st, err := os.Stat(out)
	if err != nil {
		return err
	}
	b.res.Archive, b.res.Signature, b.res.Size = out, out+".sig", st.Size()
	return nil
}

func (b *containerBuild) push(ctx context.Context) error {
	if b.o.Push == "" {
		return nil
	}
	d, err := ociimage.Push(ctx, b.img, ociimage.PushOptions{Ref: b.o.Push, CA: b.o.CA, AuthFile: b.o.AuthFile})
	if err != nil {
		return err
	}
	b.res.Pushed = b.o.Push + "@" + d
	return nil
}
