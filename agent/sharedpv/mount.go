package sharedpv

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpurack/gpurack/internal/sharedvol"
)

// mountTimeout bounds one mount of an export: a server that does not answer makes
// the claim's provisioning fail with the mount's error, and it is tried again.
const mountTimeout = 60 * time.Second

// Mounter mounts the exports the elected agent provisions on, each once, at
// sharedvol.MountDir, with mount(8) (nfs-common's mount.nfs) and the class's mount
// options, "hard" made "soft": a server that stops answering then fails the
// provisioner's mkdir or rename after its retries, instead of holding it for good.
type Mounter struct {
	// Command is the mount program ("mount" when empty).
	Command string
	mu      sync.Mutex
	mounted []string
}

// Mount implements Provisioner.Mount.
func (m *Mounter) Mount(ctx context.Context, server, share string, options []string) (string, error) {
	if err := sharedvol.CheckServer(server); err != nil {
		return "", err
	}
	if err := sharedvol.CheckShare(share); err != nil {
		return "", err
	}
	dir := sharedvol.MountDir(server, share)
	m.mu.Lock()
	defer m.mu.Unlock()
	if slices.Contains(m.mounted, dir) {
		return dir, nil
	}
	if ok, err := mountedAt(dir); err != nil || ok {
		if ok { // mounted by an earlier run of this agent
			m.mounted = append(m.mounted, dir)
		}
		return dir, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, mountTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, cmp.Or(m.Command, "mount"), "-t", "nfs", "-o", strings.Join(provisionerOptions(options), ","), server+":"+share, dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("mount %s:%s at %s: %w: %s", server, share, dir, err, strings.TrimSpace(string(out)))
	}
	m.mounted = append(m.mounted, dir)
	return dir, nil
}

// UnmountAll unmounts what Mount mounted (lazily: a stuck server does not hold it).
func (m *Mounter) UnmountAll(log *slog.Logger) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, dir := range m.mounted {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			log.Warn("unmount an NFS export", "dir", dir, "err", err)
		}
	}
	m.mounted = nil
}

// provisionerOptions are the class's mount options with "hard" made "soft" (and
// "soft" added when neither is there), and without "ro": a read-only volume's options
// carry it (Delete mounts with the volume's options), but the provisioner writes.
func provisionerOptions(class []string) []string {
	var out []string
	soft := false
	for _, o := range class {
		for _, part := range strings.Split(o, ",") {
			switch part {
			case "", "hard", "ro":
				continue
			case "soft", "softerr":
				soft = true
			}
			out = append(out, part)
		}
	}
	if !soft {
		out = append(out, "soft")
	}
	return out
}

// mountedAt says whether something is mounted at dir (/proc/self/mountinfo).
func mountedAt(dir string) (bool, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return false, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if fields := strings.Fields(sc.Text()); len(fields) > 4 && fields[4] == dir {
			return true, nil
		}
	}
	return false, sc.Err()
}
