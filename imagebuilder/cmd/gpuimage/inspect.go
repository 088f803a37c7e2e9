package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gpurack/gpurack/imagebuilder/sqfs"
	"github.com/gpurack/gpurack/internal/manifest"
)

func newInspectCommand() *cobra.Command {
	var top int
	cmd := &cobra.Command{
		Use:   "inspect DIR",
		Short: "Summarise an image: kernel, driver, packages and sizes, largest files",
		Long: `inspect prints what an image directory holds, read from manifest.json and from the
root filesystem itself: rootfs.squashfs is opened read-only and decoded in Go (its dpkg
database and its regular files), so it needs neither squashfs-tools nor root. It does not
check the signature; gpuimage verify does.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return inspect(cmd.OutOrStdout(), args[0], top)
		},
	}
	cmd.Flags().IntVar(&top, "top", 15, "how many of the largest packages and files to list")
	return cmd
}

func inspect(w io.Writer, dir string, top int) error {
	data, err := os.ReadFile(filepath.Join(dir, manifest.ManifestFile))
	if err != nil {
		return err
	}
	m, err := manifest.Parse(data)
	if err != nil {
		return fmt.Errorf("%s: %w", filepath.Join(dir, manifest.ManifestFile), err)
	}
	fmt.Fprintf(w, "image       %s\nprofile     %s (%s)\nlock        %s\nbuilder     %s, SOURCE_DATE_EPOCH=%d\n", m.ImageID, m.Profile, m.ProfileDigest, m.LockDigest, m.BuilderVersion, m.SourceDateEpoch)
	fmt.Fprintf(w, "kernel      %s (%s)\n", m.Kernel.Version, m.Kernel.Package)
	switch {
	case m.Driver != nil:
		fmt.Fprintf(w, "driver      NVIDIA %s %s, vermagic %q\n", m.Driver.Version, m.Driver.Flavor, m.Driver.Vermagic)
	case m.GPUSimulator != "":
		fmt.Fprintf(w, "driver      none: SIMULATED GPUs (simulator %s; the GPU container runtime, no driver)\n", m.GPUSimulator)
	default:
		fmt.Fprintf(w, "driver      none (no GPU section)\n")
	}
	fmt.Fprintf(w, "kubernetes  %s\n", m.KubernetesVersion)
	names := make([]string, 0, len(m.Binaries))
	for n := range m.Binaries {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Fprintln(w, "binaries")
	for _, n := range names {
		fmt.Fprintf(w, "  %-14s %10s  sha256:%s\n", n, human(m.Binaries[n].Size), m.Binaries[n].SHA256)
	}
	fmt.Fprintln(w, "artifacts")
	for _, a := range m.Artifacts {
		fmt.Fprintf(w, "  %-16s %10s  sha256:%s\n", a.Name, human(a.Size), a.SHA256)
	}
	sq := filepath.Join(dir, manifest.ArtifactRootfs)
	im, err := sqfs.Open(sq)
	if err != nil {
		return fmt.Errorf("open the root filesystem: %w", err)
	}
	defer im.Close()
	status, err := im.ReadFile("/var/lib/dpkg/status")
	if err != nil {
		return fmt.Errorf("read the dpkg database: %w", err)
	}
	type pkg struct {
		name, version string
		kib           int64
	}
	var pkgs []pkg
	var cur pkg
	var total int64
	sc := bufio.NewScanner(strings.NewReader(string(status) + "\n"))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		switch {
		case l == "":
			if cur.name != "" {
				pkgs = append(pkgs, cur)
				total += cur.kib
			}
			cur = pkg{}
		case strings.HasPrefix(l, "Package: "):
			cur.name = l[9:]
		case strings.HasPrefix(l, "Version: "):
			cur.version = l[9:]
		case strings.HasPrefix(l, "Installed-Size: "):
			cur.kib, _ = strconv.ParseInt(l[16:], 10, 64)
		}
	}
	sort.Slice(pkgs, func(i, j int) bool {
		return pkgs[i].kib > pkgs[j].kib || pkgs[i].kib == pkgs[j].kib && pkgs[i].name < pkgs[j].name
	})
	fmt.Fprintf(w, "packages    %d installed, %s (dpkg Installed-Size); largest:\n", len(pkgs), human(total<<10))
	for i := 0; i < len(pkgs) && i < top; i++ {
		fmt.Fprintf(w, "  %-34s %-28s %10s\n", pkgs[i].name, pkgs[i].version, human(pkgs[i].kib<<10))
	}
	files, count, err := im.LargestFiles(top)
	if err != nil {
		return fmt.Errorf("list the root filesystem: %w", err)
	}
	fmt.Fprintf(w, "files       %d regular files; largest:\n", count)
	for _, f := range files {
		fmt.Fprintf(w, "  %10s  %s\n", human(f.Size), f.Path)
	}
	return nil
}

func human(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
