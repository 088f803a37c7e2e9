//go:build linux

package qemu

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpurack/gpurack/internal/sharedvol"
)

// The gpurack-shared checks (docs/storage.md) run at the end of node A's branch of
// TestRack. Node A plays the storage host: its image (the rig's, rigimage) carries
// Debian's nfs-kernel-server and the nfsd module, and it exports a tmpfs that clients
// mount as sharedShare, with the line `controlplane-bootstrap nfs-exports` writes. The
// rig's cluster.yaml names that export (storage.nfs), so init made gpurack-shared,
// and the agents elected one of themselves to provision it.

const (
	sharedShare = "/srv/gpurack"
	sharedNS    = "shared-test"
	// sharedRoot is where the storage host keeps the NFSv4 root (serveExport).
	sharedRoot = "/nfsroot"
	// sharedClients is the rig's boot network, which both nodes are on.
	sharedClients = "10.0.2.0/24"
)

// nodeScript runs script as root in node's own mount, PID and network namespaces
// (PID 1's: systemctl, mounts and exportfs act on the node itself) and returns its
// output.
func nodeScript(t *testing.T, ctx context.Context, admin kubernetes.Interface, node *corev1.Node, name, script string) string {
	t.Helper()
	p := hostRootPod(node, name, "nsenter -t 1 -m -- sh -ec '"+strings.ReplaceAll(script, "'", `'"'"'`)+"'")
	p.Spec.HostNetwork, p.Spec.HostPID = true, true
	got, err := runPodToEnd(ctx, admin, p, 4*time.Minute)
	defer deletePodsIn(t, ctx, admin, p.Namespace, p.Name)
	if err != nil {
		t.Fatalf("%s on %s: %v\n%s", name, node.Name, err, terminationMessage(got))
	}
	return podLog(ctx, admin, got)
}

// serveExport makes node a the storage host. The node's root is an overlay, which nfsd
// cannot export, and NFSv4 clients reach an export through its parent directories: on
// a host with a disk-backed root nfsd makes those parents a read-only pseudo
// filesystem by itself, but on this one it cannot, and mounts fail with "No such file
// or directory". So the test gives the server an explicit NFSv4 root (fsid=0) on a
// tmpfs at sharedRoot, a test-only line; the share is a second tmpfs at sharedRoot +
// sharedShare, so that clients mount sharedShare as a site's do, exported with the
// line `controlplane-bootstrap nfs-exports --dry-run` prints. Both are loaded by the
// node's own nfs-server.service and exportfs. The NFSv4 grace period after each start
// of the server, in which clients may not open new files, is cut from 90 s to 15 s
// (nfs.conf's grace-time), a test's setting only.
func serveExport(t *testing.T, r *Rack, a *corev1.Node) {
	served := sharedRoot + sharedShare
	out, err := exec.CommandContext(r.ctx, r.bins.controlplane, "nfs-exports", "--share", served, "--clients", sharedClients, "--fsid", "1", "--dry-run").CombinedOutput()
	if err != nil {
		t.Fatalf("controlplane-bootstrap nfs-exports --dry-run: %v\n%s", err, out)
	}
	_, file, ok := strings.Cut(string(out), ":\n")
	if !ok || !strings.Contains(file, served+" "+sharedClients+"(") {
		t.Fatalf("controlplane-bootstrap nfs-exports --dry-run printed no exports file:\n%s", out)
	}
	script := fmt.Sprintf(`mkdir -p %[1]s
mountpoint -q %[1]s || mount -t tmpfs -o size=1m,mode=0755 gpurack-nfs-root %[1]s
mkdir -p %[2]s
mountpoint -q %[2]s || mount -t tmpfs -o size=768m,mode=0755 gpurack-export %[2]s
mkdir -p %[2]s/volumes %[2]s/archived /etc/exports.d /etc/nfs.conf.d
printf '%%s\n' '%[1]s %[3]s(ro,fsid=0,no_subtree_check,sec=sys)' > /etc/exports.d/gpurack-test-root.exports
cat > /etc/exports.d/gpurack.exports <<'EOF'
%[4]sEOF
printf '[nfsd]\ngrace-time=15\n' > /etc/nfs.conf.d/gpurack-test.conf
systemctl restart nfs-server.service
exportfs -ra
exportfs -v`, sharedRoot, served, sharedClients, file)
	t.Logf("node %s exports (nfs-kernel-server; the share's line is the one nfs-exports writes):\n%s", a.Name, strings.TrimSpace(nodeScript(t, r.ctx, r.admin, a, "nfs-serve", script)))
}

// sharedClaimIn is a claim of gpurack-shared in sharedNS.
func sharedClaimIn(name string, mode corev1.PersistentVolumeAccessMode, viewOf string) *corev1.PersistentVolumeClaim {
	class := sharedvol.StorageClass
	c := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: sharedNS},
		Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &class, AccessModes: []corev1.PersistentVolumeAccessMode{mode},
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("64Mi")}}},
	}
	if viewOf != "" {
		c.Annotations = map[string]string{sharedvol.AnnViewOf: viewOf}
	}
	return c
}

// sharedPod runs probe with args on node with claim mounted at /data.
func sharedPod(node *corev1.Node, name, claim string, args ...string) *corev1.Pod {
	p := probePodIn(sharedNS, node, name, args...)
	p.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
		PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}}
	p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}
	return p
}

// runSharedPod runs p to its end, deletes it, and fails t when it did not succeed
// (want "") or when its message lacks want.
func runSharedPod(t *testing.T, r *Rack, p *corev1.Pod, want string) string {
	t.Helper()
	got, err := runPodBesideRestart(r.ctx, r.admin, p, 4*time.Minute)
	deletePodsIn(t, r.ctx, r.admin, sharedNS, p.Name)
	msg := strings.TrimSpace(terminationMessage(got))
	switch {
	case want == "" && err != nil:
		t.Fatalf("%s on %s: %v", p.Name, p.Spec.NodeName, err)
	case want != "" && (err == nil || !strings.Contains(msg, want)):
		t.Fatalf("%s on %s: %v, message %q; want it to fail saying %q", p.Name, p.Spec.NodeName, err, msg, want)
	}
	return msg
}

// awaitBound waits for claim name in sharedNS to be Bound and returns its volume.
func awaitBound(t *testing.T, r *Rack, name string) *corev1.PersistentVolume {
	t.Helper()
	var pv *corev1.PersistentVolume
	waitFor(t, r.ctx, 3*time.Minute, "claim "+sharedNS+"/"+name+" Bound", func() bool {
		c, err := r.admin.CoreV1().PersistentVolumeClaims(sharedNS).Get(r.ctx, name, metav1.GetOptions{})
		if err != nil || c.Status.Phase != corev1.ClaimBound {
			return false
		}
		pv, err = r.admin.CoreV1().PersistentVolumes().Get(r.ctx, c.Spec.VolumeName, metav1.GetOptions{})
		return err == nil
	}, func() string {
		return "events: " + eventMessages(r.ctx, r.admin, sharedNS, "PersistentVolumeClaim", name, "")
	})
	return pv
}

// checkSharedVolumes: one ReadWriteMany volume written and read by pods on both nodes;
// a ReadOnlyMany view of it read on both, where writes fail; deleting the claims
// archives the directory on the storage host; with nfs-server stopped, a pod's mount
// fails with an event within mount.nfs's bound, and the pod runs once it is back.
func checkSharedVolumes(t *testing.T, r *Rack, a, b *corev1.Node) {
	serveExport(t, r, a)
	if _, err := r.admin.CoreV1().Namespaces().Create(r.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: sharedNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	claims := r.admin.CoreV1().PersistentVolumeClaims(sharedNS)
	t0 := time.Now()
	if _, err := claims.Create(r.ctx, sharedClaimIn("datasets", corev1.ReadWriteMany, ""), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pv := awaitBound(t, r, "datasets")
	t.Logf("claim datasets (ReadWriteMany) Bound in %s: %s:%s, mount options %v", time.Since(t0).Round(100*time.Millisecond), pv.Spec.NFS.Server, pv.Spec.NFS.Path, pv.Spec.MountOptions)
	t.Logf("on %s: %s", a.Name, runSharedPod(t, r, sharedPod(a, "shared-write-a", "datasets", "write", "/data/from-a.bin", "8"), ""))
	t.Logf("on %s: %s", b.Name, runSharedPod(t, r, sharedPod(b, "shared-read-b", "datasets", "verify", "/data/from-a.bin"), ""))
	t.Logf("on %s: %s", b.Name, runSharedPod(t, r, sharedPod(b, "shared-write-b", "datasets", "write", "/data/from-b.bin", "8"), ""))
	t.Logf("on %s: %s", a.Name, runSharedPod(t, r, sharedPod(a, "shared-read-a", "datasets", "verify", "/data/from-b.bin"), ""))

	if _, err := claims.Create(r.ctx, sharedClaimIn("datasets-ro", corev1.ReadOnlyMany, "datasets"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	view := awaitBound(t, r, "datasets-ro")
	if view.Spec.NFS == nil || view.Spec.NFS.Path != pv.Spec.NFS.Path || !view.Spec.NFS.ReadOnly {
		t.Errorf("view datasets-ro: %+v; want %s read-only", view.Spec.NFS, pv.Spec.NFS.Path)
	}
	for _, n := range []*corev1.Node{a, b} {
		t.Logf("view on %s: %s", n.Name, runSharedPod(t, r, sharedPod(n, "view-read-"+n.Name, "datasets-ro", "verify", "/data/from-a.bin"), ""))
		t.Logf("view on %s, a write: %s", n.Name, runSharedPod(t, r, sharedPod(n, "view-write-"+n.Name, "datasets-ro", "write", "/data/no.bin", "1"), "read-only file system"))
	}

	dir := sharedvol.DirName(sharedNS, "datasets", pv.Name)
	for _, c := range []string{"datasets-ro", "datasets"} {
		if err := claims.Delete(r.ctx, c, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, r.ctx, 3*time.Minute, "volume "+pv.Name+" deleted (its directory archived)", func() bool {
		_, err := r.admin.CoreV1().PersistentVolumes().Get(r.ctx, pv.Name, metav1.GetOptions{})
		return err != nil
	})
	listing := nodeScript(t, r.ctx, r.admin, a, "nfs-archived", fmt.Sprintf("test ! -e %[1]s/volumes/%[2]s; ls %[1]s/archived/%[2]s.*/", sharedRoot+sharedShare, dir))
	if !strings.Contains(listing, "from-a.bin") || !strings.Contains(listing, "from-b.bin") {
		t.Errorf("on the storage host, archived/%s.*: %q; want both files", dir, listing)
	}
	t.Logf("claims deleted: %s moved to %s/archived/ with its files (%s)", dir, sharedShare, strings.Join(strings.Fields(listing), " "))
	if figures := os.Getenv("GPURACK_STORAGE_FIGURES"); figures != "" {
		benchSharedVolume(t, r, a, b, figures)
	}
	serverDown(t, r, a, b)
}

// benchSharedVolume (make bench-storage): on B, 64 MiB written and read with O_DIRECT
// through a gpurack-shared volume (A) and through a directory of the same export that
// the test mounts on B directly with the class's mount options (B, the peer),
// alternating, three times each; and the claim's time to its volume (Immediate).
func benchSharedVolume(t *testing.T, r *Rack, a, b *corev1.Node, figures string) {
	claims := r.admin.CoreV1().PersistentVolumeClaims(sharedNS)
	c, err := claims.Create(r.ctx, sharedClaimIn("bench", corev1.ReadWriteMany, ""), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pv := awaitBound(t, r, "bench")
	bound := pv.CreationTimestamp.Sub(c.CreationTimestamp.Time).Seconds()
	direct := "/mnt/gpurack-bench-nfs"
	nodeScript(t, r.ctx, r.admin, b, "nfs-bench-mount", fmt.Sprintf("mkdir -p %[1]s; mountpoint -q %[1]s || mount -t nfs -o %[2]s %[3]s:%[4]s %[1]s; mkdir -p %[1]s/bench-direct",
		direct, strings.Join(pv.Spec.MountOptions, ","), pv.Spec.NFS.Server, sharedShare))
	defer nodeScript(t, r.ctx, r.admin, b, "nfs-bench-umount", "umount "+direct)
	p := sharedPod(b, "shared-bench", "bench", "bench", "/data", "/direct", "3", "64")
	dir := corev1.HostPathDirectory
	p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "direct", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: direct + "/bench-direct", Type: &dir}}})
	p.Spec.Containers[0].VolumeMounts = append(p.Spec.Containers[0].VolumeMounts, corev1.VolumeMount{Name: "direct", MountPath: "/direct"})
	privileged, root := true, int64(0) // the directory on the export is root's
	p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: &privileged, RunAsUser: &root}
	out := runSharedPod(t, r, p, "")
	t.Logf("shared storage bench on %s (A: gpurack-shared volume %s, B: the export mounted directly at %s; MiB/s, O_DIRECT, NFS from %s):\n%s\nclaim to volume: %.0f s",
		b.Name, pv.Name, direct, a.Name, out, bound)
	rows := append(benchRows(t, out, "shared", "nfsdirect"), fmt.Sprintf("storage-shared-bound\t%.0f", bound))
	if err := appendFigures(figures, rows); err != nil {
		t.Error(err)
	}
	if err := claims.Delete(r.ctx, "bench", metav1.DeleteOptions{}); err != nil {
		t.Error(err)
	}
}

// serverDown stops nfs-server on the storage host: a new pod on B with a bound
// gpurack-shared claim gets a FailedMount event saying the mount failed, within
// mount.nfs's own retry bound; nfs-server started again, the pod runs.
func serverDown(t *testing.T, r *Rack, a, b *corev1.Node) {
	claims := r.admin.CoreV1().PersistentVolumeClaims(sharedNS)
	if _, err := claims.Create(r.ctx, sharedClaimIn("steady", corev1.ReadWriteMany, ""), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	steady := awaitBound(t, r, "steady")
	io := writeUntilFailure(t, r, b, steady)
	nodeScript(t, r.ctx, r.admin, a, "nfs-stop", "systemctl stop nfs-server.service; exportfs -v || true")
	down := time.Now()
	p := sharedPod(b, "shared-server-down", "steady", "write", "/data/after.bin", "1")
	if _, err := r.admin.CoreV1().Pods(sharedNS).Create(r.ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var ev string
	waitFor(t, r.ctx, 6*time.Minute, "a FailedMount event on "+p.Name+" while nfs-server is stopped", func() bool {
		ev = eventMessages(r.ctx, r.admin, sharedNS, "Pod", p.Name, "FailedMount")
		return ev != ""
	})
	t.Logf("nfs-server stopped -> pod %s on %s: FailedMount after %s: %s", p.Name, b.Name, time.Since(down).Round(time.Second), firstLine(ev))
	select {
	case res := <-io:
		if res.err != nil || !strings.Contains(res.out, "write failed") || !strings.Contains(res.out, "Input/output error") {
			t.Errorf("writes on %s with the class's mount options while nfs-server is stopped: %v %q; want one to fail with EIO (Input/output error)", b.Name, res.err, res.out)
		} else {
			t.Logf("nfs-server stopped -> a write on %s (the export mounted with the class's options %v) %s", b.Name, steady.Spec.MountOptions, strings.TrimSpace(res.out))
		}
	case <-time.After(time.Until(down.Add(5 * time.Minute))):
		t.Errorf("writes on %s still hang or succeed 5 minutes after nfs-server stopped; want EIO within about a minute (soft mount)", b.Name)
	}
	nodeScript(t, r.ctx, r.admin, a, "nfs-start", "systemctl start nfs-server.service; exportfs -ra")
	up := time.Now()
	waitFor(t, r.ctx, 6*time.Minute, p.Name+" ran once nfs-server is back", func() bool {
		got, err := r.admin.CoreV1().Pods(sharedNS).Get(r.ctx, p.Name, metav1.GetOptions{})
		return err == nil && podEnd(got) == corev1.PodSucceeded
	}, func() string {
		got, _ := r.admin.CoreV1().Pods(sharedNS).Get(r.ctx, p.Name, metav1.GetOptions{})
		return podStatus(got) + " events: " + eventMessages(r.ctx, r.admin, sharedNS, "Pod", p.Name, "")
	})
	t.Logf("nfs-server started again -> %s succeeded %s later (kubelet retries the mount with backoff)", p.Name, time.Since(up).Round(time.Second))
	deletePodsIn(t, r.ctx, r.admin, sharedNS, p.Name)
}

// ioResult is what writeUntilFailure's pod printed, or its error.
type ioResult struct {
	out string
	err error
}

// writeUntilFailure mounts pv's export on node (its server and share, the volume's
// mount options) and writes 64 KiB with fsync every 2 s, in the background, until a
// write fails; the result says how long after the last good write it failed and
// with what. The writes go on the node itself, so a hung one would show as a pod
// that never ends.
func writeUntilFailure(t *testing.T, r *Rack, node *corev1.Node, pv *corev1.PersistentVolume) <-chan ioResult {
	dir := "/mnt/gpurack-io-bound"
	script := fmt.Sprintf(`d=%[1]s; mkdir -p $d; mountpoint -q $d || mount -t nfs -o %[2]s %[3]s:%[4]s $d
last=$(date +%%s); i=0
while [ $i -lt 200 ]; do
  if ! out=$(dd if=/dev/zero of=$d/io-bound bs=64k count=1 conv=fsync 2>&1); then
    echo "write failed $(( $(date +%%s) - last )) s after the last good one: $(echo "$out" | head -1)"; umount -l $d; exit 0
  fi
  last=$(date +%%s); i=$((i+1)); [ $i = 1 ] && echo "first write ok"; sleep 2
done
echo "no write failed in 400 s"; umount -l $d`, dir, strings.Join(pv.Spec.MountOptions, ","), pv.Spec.NFS.Server, sharedShare)
	p := hostRootPod(node, "nfs-io-bound", "nsenter -t 1 -m -- sh -ec '"+strings.ReplaceAll(script, "'", `'"'"'`)+"'")
	p.Spec.HostNetwork, p.Spec.HostPID = true, true
	done := make(chan ioResult, 1)
	go func() {
		got, err := runPodToEnd(r.ctx, r.admin, p, 9*time.Minute)
		res := ioResult{err: err}
		if got != nil {
			res.out = podLog(r.ctx, r.admin, got)
		}
		// Not deletePodsIn: t may have ended by now.
		_ = r.admin.CoreV1().Pods(p.Namespace).Delete(context.WithoutCancel(r.ctx), p.Name, metav1.DeleteOptions{})
		done <- res
	}()
	// The loop has mounted and written once before the server stops.
	waitFor(t, r.ctx, 3*time.Minute, p.Name+"'s first write on "+node.Name, func() bool {
		got, err := r.admin.CoreV1().Pods(p.Namespace).Get(r.ctx, p.Name, metav1.GetOptions{})
		return err == nil && strings.Contains(podLog(r.ctx, r.admin, got), "first write ok")
	})
	return done
}

// firstLine is s up to its first newline.
func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}
