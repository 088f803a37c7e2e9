// Package nfsexport sets up a storage host's NFS export for gpurack-shared
// (docs/storage.md "The storage host"): it makes the export's volumes/ and archived/
// directories and writes one exports(5) file for Debian's nfs-kernel-server, then
// has exportfs(8) load it. `controlplane-bootstrap nfs-exports` runs it on the storage
// host; cluster.yaml's storage.nfs then names the same server and share.
package nfsexport

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/gpurack/gpurack/internal/atomicfile"
	"github.com/gpurack/gpurack/internal/sharedvol"
)

// DefaultExportsFile is where Setup writes the export: a file of its own in
// /etc/exports.d, which exportfs reads beside /etc/exports.
const DefaultExportsFile = "/etc/exports.d/gpurack.exports"

// Options is what Setup needs.
type Options struct {
	// Share is the exported directory (made when missing).
	Share string
	// Clients are the networks whose hosts may mount it: the nodes' networks.
	Clients []netip.Prefix
	// FSID, when not 0, is the export's fsid= (needed for a filesystem without a
	// UUID, such as tmpfs).
	FSID int
	// ExportsFile is the file written (DefaultExportsFile when empty).
	ExportsFile string
	// Exportfs is the exportfs program ("exportfs" when empty); NoReload skips it.
	Exportfs string
	NoReload bool
	// DryRun prints the file and changes nothing.
	DryRun bool
	Out    io.Writer
}

// Options every client gets, and why:
//   - rw: volumes are written;
//   - sync: the server answers a write once it is on its disk, so a checkpoint a job
//     saw written survives the server's crash;
//   - no_subtree_check: subtree checking breaks a file handle when its directory is
//     renamed, and deleting a volume renames its directory under archived/;
//   - no_root_squash: the provisioning agent (root on its node) makes each volume's
//     directory with the mode its class asks, and pods running as root write as root.
//     Root on any client host is root over the export, so Clients must be the nodes'
//     networks only, and tenants' pods may not mount NFS directly (the tenants'
//     admission policy);
//   - sec=sys: AUTH_SYS, user and group ids as the client says (no Kerberos).
var clientOptions = []string{"rw", "sync", "no_subtree_check", "no_root_squash", "sec=sys"}

// File is the exports file for o: a header saying who wrote it and one line.
func File(o Options) ([]byte, error) {
	if err := sharedvol.CheckShare(o.Share); err != nil {
		return nil, err
	}
	if len(o.Clients) == 0 {
		return nil, fmt.Errorf("no clients: name the nodes' networks (--clients 10.10.0.0/16)")
	}
	opts := clientOptions
	if o.FSID < 0 {
		return nil, fmt.Errorf("fsid %d: want a positive number (or 0 for none)", o.FSID)
	}
	if o.FSID > 0 {
		opts = append(opts[:len(opts):len(opts)], "fsid="+strconv.Itoa(o.FSID))
	}
	var b bytes.Buffer
	b.WriteString("# gpurack-shared's NFS export, written by controlplane-bootstrap nfs-exports;\n")
	b.WriteString("# run it again to change this file: edits here are overwritten.\n")
	b.WriteString(o.Share)
	for _, c := range o.Clients {
		if !c.IsValid() || c != c.Masked() {
			return nil, fmt.Errorf("client network %s: want a network address such as 10.10.0.0/16 (host bits zero)", c)
		}
		fmt.Fprintf(&b, " %s(%s)", c, strings.Join(opts, ","))
	}
	b.WriteString("\n")
	return b.Bytes(), nil
}

// Setup makes the share's directories, writes the exports file and reloads the
// exports. It prints each step to o.Out.
func Setup(ctx context.Context, o Options) error {
	data, err := File(o)
	if err != nil {
		return err
	}
	path := o.ExportsFile
	if path == "" {
		path = DefaultExportsFile
	}
	if o.DryRun {
		fmt.Fprintf(o.Out, "would make %s/%s and %s/%s, and write %s:\n%s", o.Share, sharedvol.VolumesDir, o.Share, sharedvol.ArchiveDir, path, data)
		return nil
	}
	for _, d := range []string{sharedvol.VolumesDir, sharedvol.ArchiveDir} {
		if err := os.MkdirAll(filepath.Join(o.Share, d), 0o755); err != nil {
			return fmt.Errorf("the share's %s directory: %w", d, err)
		}
	}
	fmt.Fprintf(o.Out, "made %s/{%s,%s}\n", o.Share, sharedvol.VolumesDir, sharedvol.ArchiveDir)
	if err := atomicfile.WriteMkdirAll(path, data, 0o644, 0o755); err != nil {
		return err
	}
	fmt.Fprintf(o.Out, "wrote %s:\n%s", path, data)
	if o.NoReload {
		fmt.Fprintln(o.Out, "not reloaded (--no-reload): run exportfs -ra")
		return nil
	}
	prog := o.Exportfs
	if prog == "" {
		prog = "exportfs"
	}
	out, err := exec.CommandContext(ctx, prog, "-ra").CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s -ra: %w: %s (is nfs-kernel-server installed and nfs-server.service running? apt-get install nfs-kernel-server)", prog, err, strings.TrimSpace(string(out)))
	}
	fmt.Fprintf(o.Out, "exportfs -ra: exports loaded\n")
	return nil
}
