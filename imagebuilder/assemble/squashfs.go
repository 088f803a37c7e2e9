package assemble

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
)

// Squashfs converts a root-filesystem tarball into a zstd squashfs with mksquashfs,
// which clamps every time to SOURCE_DATE_EPOCH (epoch) and writes entries in sorted
// order, so the same tarball gives the same bytes. The tarball's "./" entry is ignored by
// mksquashfs -tar, which would make the root directory 0777: it is set to 0755.
func Squashfs(tarball, out string, epoch int64) error {
	in, err := os.Open(tarball)
	if err != nil {
		return err
	}
	defer in.Close()
	os.Remove(out)
	cmd := exec.Command("mksquashfs", "-", out, "-tar", "-comp", "zstd", "-root-mode", "755", "-noappend", "-quiet", "-no-progress")
	cmd.Stdin = in
	cmd.Env = append(os.Environ(), "SOURCE_DATE_EPOCH="+strconv.FormatInt(epoch, 10))
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Run(); err != nil {
		if _, lerr := exec.LookPath("mksquashfs"); lerr != nil {
			return fmt.Errorf("mksquashfs is not installed: apt-get install squashfs-tools (hack/deps.sh)")
		}
		return fmt.Errorf("mksquashfs: %v\n%s", err, filterWarnings(stderr.String()))
	}
	return nil
}

// filterWarnings drops mksquashfs's known harmless warnings (POSIX ACL xattrs, which
// squashfs cannot store, and the tar's "./" entry).
func filterWarnings(s string) string {
	var keep []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, "Unrecognised tar xattr prefix") || strings.Contains(l, "Empty tar filename") || strings.TrimSpace(l) == "" {
			continue
		}
		keep = append(keep, l)
	}
	return strings.Join(keep, "\n")
}
