// Package rootfs builds an image's root filesystem with mmdebstrap (which runs
// maintainer scripts the way Debian does) from a local repository holding exactly the
// locked .debs, then lays the node's own files over it (CONTRACTS §6). It needs root
// (mmdebstrap --mode=root: chroot and device nodes); see docs/imagebuilder.md.
package rootfs

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"

	"github.com/gpurack/gpurack/internal/linewriter"
)

// Mmdebstrap describes one mmdebstrap run.
type Mmdebstrap struct {
	Suite string
	// Repo is a flat repository directory (debcache.WriteRepo) with exactly the .debs
	// to install.
	Repo string
	// Packages are installed by name; with only locked versions in Repo, apt can pick
	// nothing else, so the installed set is the lock.
	Packages []string
	// Overlay is copied over the tree, then Commands run with $1 as the tree.
	Overlay  string
	Commands []string
	Epoch    int64
	Out      string // a .tar, or an empty or absent directory when Directory is set
	// Directory writes a plain directory tree (the module build chroot) instead
	// of a tarball.
	Directory bool
	// Variant is mmdebstrap's --variant; empty means minbase (a node). Workload images
	// use essential: Essential:yes packages and the listed ones, no apt.
	Variant string
	// Log receives mmdebstrap's output lines.
	Log func(string)
}

// Run runs mmdebstrap.
func (m *Mmdebstrap) Run(ctx context.Context) error {
	if _, err := exec.LookPath("mmdebstrap"); err != nil {
		return fmt.Errorf("mmdebstrap is not installed: apt-get install mmdebstrap (hack/deps.sh)")
	}
	if os.Geteuid() != 0 {
		return fmt.Errorf("building a root filesystem needs root (mmdebstrap --mode=root runs maintainer scripts in a chroot); run gpuimage build as root")
	}
	variant := m.Variant
	if variant == "" {
		variant = "minbase"
	}
	format := "tar"
	if m.Directory {
		format = "directory"
	}
	args := []string{
		"--mode=root", "--variant=" + variant, "--format=" + format, "--architectures=amd64",
		"--include=" + strings.Join(m.Packages, ","),
		"--aptopt=Acquire::Languages \"none\"",
		"--dpkgopt=path-exclude=/usr/share/man/*",
		"--dpkgopt=path-exclude=/usr/share/locale/*",
		"--dpkgopt=path-include=/usr/share/locale/locale.alias",
		"--dpkgopt=path-exclude=/usr/share/doc/*",
		"--dpkgopt=path-include=/usr/share/doc/*/copyright",
		"--dpkgopt=path-exclude=/usr/share/info/*",
	}
	if m.Overlay != "" {
		args = append(args, "--customize-hook=cp -a "+shellQuote(m.Overlay)+"/. \"$1\"/")
	}
	for _, c := range m.Commands {
		args = append(args, "--customize-hook="+c)
	}
	args = append(args, m.Suite, m.Out, "deb [trusted=yes] copy://"+m.Repo+" ./")
	cmd := exec.CommandContext(ctx, "mmdebstrap", args...)
	cmd.Env = append(os.Environ(), "SOURCE_DATE_EPOCH="+strconv.FormatInt(m.Epoch, 10), "LC_ALL=C.UTF-8", "TMPDIR="+os.TempDir())
	var out bytes.Buffer
	w := &linewriter.Writer{Buf: &out, Line: m.Log}
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("mmdebstrap: %v\n%s", err, linewriter.Tail(out.String(), 30))
	}
	return nil
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
