//go:build linux

package qemu

import (
	"context"
	"crypto/sha256"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	machinev1 "github.com/gpurack/gpurack/api/machine/v1"
	"github.com/gpurack/gpurack/internal/nodecontract"
	"github.com/gpurack/gpurack/internal/testreq"
)

// The data disks of TestRack's machine B (docs/storage.md): /dev/vda, a blank qcow2
// the agent prepares, and /dev/vdb, a raw disk holding an ext4 filesystem with a file,
// which the agent must refuse and leave byte-for-byte as it was until an operator wipes
// it. The tiny profile of the rig selects every virtio disk (rigimage.Profile).
const (
	dataDiskSerial    = "GPR-DATA-0001"
	foreignDiskSerial = "GPR-FOREIGN-01"
)

// rackDisks are B's disk images, and the sha256 of the foreign one before power-on.
type rackDisks struct {
	disks         []QEMUDisk
	foreign       string
	foreignBefore [32]byte
}

// makeRackDisks makes B's two disks in dir.
func makeRackDisks(t *testing.T, dir string) rackDisks {
	t.Helper()
	qemuImg := testreq.Tool(t, "qemu-img", "apt-get install qemu-utils (make deps installs it)")
	mkfs := testreq.Tool(t, "mkfs.ext4", "apt-get install e2fsprogs (make deps installs it)")
	data := filepath.Join(dir, "data.qcow2")
	if out, err := exec.Command(qemuImg, "create", "-q", "-f", "qcow2", data, "2G").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img create: %v\n%s", err, out)
	}
	content := filepath.Join(dir, "foreign-content")
	if err := os.MkdirAll(content, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(content, "results.csv"), []byte("someone else's data\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	foreign := filepath.Join(dir, "foreign.raw")
	if err := os.WriteFile(foreign, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(foreign, 512<<20); err != nil { // XFS wants over 300 MiB once it is wiped and prepared
		t.Fatal(err)
	}
	if out, err := exec.Command(mkfs, "-q", "-F", "-L", "scratch", "-d", content, foreign).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4 the foreign disk: %v\n%s", err, out)
	}
	return rackDisks{foreign: foreign, foreignBefore: sha256File(t, foreign), disks: []QEMUDisk{
		{File: data, Format: "qcow2", Serial: dataDiskSerial},
		{File: foreign, Format: "raw", Serial: foreignDiskSerial},
	}}
}

// checkDataDisks is TestRack's data-disk subtest on machine m: the blank disk is
// prepared and mounted, the foreign one refused (in gpuboot's inventory, on the console
// and as an Event on the Node) and unchanged; a wipe naming the wrong serial is refused
// by gpuboot; one naming the right serial is carried out by the agent on its next
// heartbeat, recorded in the history, and the disk is then prepared.
//
// It returns the disks as they stand at its end.
func checkDataDisks(t *testing.T, ctx context.Context, g *namespacedGpuboot, admin kubernetes.Interface, m *RackMachine, d rackDisks) map[string]*machinev1.DataDisk {
	disks := waitDataDisks(t, g, m, func(dd map[string]*machinev1.DataDisk) bool {
		return dd["/dev/vda"].GetState() == machinev1.DataDiskState_DATA_DISK_STATE_READY &&
			dd["/dev/vdb"].GetState() == machinev1.DataDiskState_DATA_DISK_STATE_REFUSED
	})
	vda, vdb := disks["/dev/vda"], disks["/dev/vdb"]
	t.Logf("gpuboot's inventory: /dev/vda %s at %s (prepared now: %v); /dev/vdb %s: %s", vda.GetState(), vda.GetMountPoint(), vda.GetPreparedNow(), vdb.GetState(), vdb.GetDetail())
	if vda.GetSerial() != dataDiskSerial || vda.GetTransport() != "virtio" || vda.GetSizeBytes() != 2<<30 || !strings.HasPrefix(vda.GetMountPoint(), "/var/lib/gpurack/datadisks/") {
		t.Errorf("the data disk as reported: %v", vda)
	}
	if !strings.Contains(vdb.GetDetail(), `ext4 filesystem (label "scratch")`) || vdb.GetSerial() != foreignDiskSerial {
		t.Errorf("the foreign disk as reported: %v", vdb)
	}
	if want := "data disk /dev/vdb (serial " + foreignDiskSerial + ") refused: it holds ext4"; !strings.Contains(m.con.text(), want) {
		t.Errorf("%s's console lacks %q", m.Node, want)
	}
	requireNodeEvent(t, ctx, admin, m.Node, "DataDiskRefused", "/dev/vdb")
	if after := sha256File(t, d.foreign); after != d.foreignBefore {
		t.Fatalf("the foreign disk changed while the agent looked at it: sha256 %x before power-on, %x now", d.foreignBefore, after)
	}
	t.Logf("the foreign disk's image is byte-identical after boot and preparation (sha256 %x)", d.foreignBefore)

	out, err := g.env.Run(g.ns, g.bin, "machines", "wipe-disk", m.MAC, "--disk", "/dev/vdb", "--serial", "GPR-WRONG", "--reason", "TestRack: wrong serial",
		"--server", joinTLS, "--credentials", g.creds)
	if err == nil || !strings.Contains(out+err.Error(), "serial") {
		t.Fatalf("a wipe naming the wrong serial: err %v, output %s", err, out)
	}
	time.Sleep(15 * time.Second) // more than a heartbeat: nothing may have been handed to the agent
	if after := sha256File(t, d.foreign); after != d.foreignBefore {
		t.Fatalf("the foreign disk changed after a wipe with the wrong serial")
	}
	g.cli(t, "machines", "wipe-disk", m.MAC, "--disk", "/dev/vdb", "--serial", foreignDiskSerial, "--reason", "TestRack: the operator frees the disk")
	disks = waitDataDisks(t, g, m, func(dd map[string]*machinev1.DataDisk) bool {
		return dd["/dev/vdb"].GetState() == machinev1.DataDiskState_DATA_DISK_STATE_READY
	})
	if !disks["/dev/vdb"].GetPreparedNow() {
		t.Errorf("after the wipe /dev/vdb is ready but was not prepared afresh: %v", disks["/dev/vdb"])
	}
	requireHistoryAction(t, g.machine(t, m.MAC), "wipe-data-disk requested", "wipe-data-disk done")
	requireNodeEvent(t, ctx, admin, m.Node, "DataDiskWiped", "/dev/vdb")
	if want := "data disk /dev/vdb (serial " + foreignDiskSerial + ") wiped"; !strings.Contains(m.con.text(), want) {
		t.Errorf("%s's console lacks %q", m.Node, want)
	}
	return disks
}

// waitDataDisks polls gpuboot's record of m until done holds for its data disks (by
// path), for up to 4 minutes, and returns them.
func waitDataDisks(t *testing.T, g *namespacedGpuboot, m *RackMachine, done func(map[string]*machinev1.DataDisk) bool) map[string]*machinev1.DataDisk {
	t.Helper()
	return waitDataDisksFor(t, g, m, 4*time.Minute, func(_ *machinev1.DataDisks, dd map[string]*machinev1.DataDisk) bool { return done(dd) })
}

// waitDataDisksFor polls gpuboot's record of m until done holds, for up to limit.
func waitDataDisksFor(t *testing.T, g *namespacedGpuboot, m *RackMachine, limit time.Duration, done func(*machinev1.DataDisks, map[string]*machinev1.DataDisk) bool) map[string]*machinev1.DataDisk {
	t.Helper()
	var last *bootv1.Machine
	for deadline := time.Now().Add(limit); time.Now().Before(deadline); time.Sleep(3 * time.Second) {
		last = g.machine(t, m.MAC)
		dd := map[string]*machinev1.DataDisk{}
		for _, d := range last.GetDataDisks().GetDisks() {
			dd[d.GetPath()] = d
		}
		if done(last.GetDataDisks(), dd) {
			return dd
		}
	}
	t.Fatalf("gpuboot's record of %s's data disks did not get there in %s; last: %v (pending wipe %v)", m.Node, limit, last.GetDataDisks(), last.GetPendingWipe())
	return nil
}

// requireHistoryAction checks that m's history records each action, in order.
func requireHistoryAction(t *testing.T, m *bootv1.Machine, actions ...string) {
	t.Helper()
	var got []string
	for _, tr := range m.GetHistory() {
		if tr.GetAction() != "" {
			got = append(got, tr.GetAction()+" ("+tr.GetActor()+": "+tr.GetReason()+")")
		}
	}
	i := 0
	for _, g := range got {
		if i < len(actions) && strings.HasPrefix(g, actions[i]+" ") {
			i++
		}
	}
	if i != len(actions) {
		t.Errorf("the history's actions %q lack %q in order", got, actions)
	}
}

// requireNodeEvent checks that Node node has an Event with reason whose message names
// what.
func requireNodeEvent(t *testing.T, ctx context.Context, admin kubernetes.Interface, node, reason, what string) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(2 * time.Second) {
		got := eventMessages(ctx, admin, metav1.NamespaceDefault, "Node", node, reason)
		if strings.Contains(got, what) {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("no %s Event on Node %s naming %s (events: %s)", reason, node, what, got)
			return
		}
	}
}

func sha256File(t *testing.T, path string) [32]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return [32]byte(h.Sum(nil))
}

// dataFile is what a pod writes on the data disk before the power cycle and checks
// after it: 200 MiB of random bytes and their sha256 (sha256sum's check file).
const dataFile = "gpurack-test-keep.bin"

// writeDataDiskFile writes dataFile and its checksum on the data disk mounted at mount
// on node, from a privileged pod with the node's root (the provisioner that will give
// pods volumes there is not built yet), and returns how long the write took.
func writeDataDiskFile(t *testing.T, ctx context.Context, admin kubernetes.Interface, node *corev1.Node, mount string) time.Duration {
	t.Helper()
	start := time.Now()
	script := "cd " + mount + " && head -c 200M /dev/urandom > " + dataFile + " && sha256sum " + dataFile + " > " + dataFile + ".sha256 && sync && cat " + dataFile + ".sha256"
	p := waitPodSucceeded(t, ctx, admin, hostRootPod(node, "datadisk-write", script), 5*time.Minute)
	t.Logf("wrote 200 MiB on %s's data disk (%s) in %s: %s", node.Name, mount, time.Since(start).Round(time.Second), podLog(ctx, admin, p))
	return time.Since(start)
}

// verifyDataDiskFile checks dataFile against its checksum from a pod on node.
func verifyDataDiskFile(t *testing.T, ctx context.Context, admin kubernetes.Interface, node *corev1.Node, mount string) {
	t.Helper()
	p, err := runPodToEnd(ctx, admin, hostRootPod(node, "datadisk-verify", "cd "+mount+" && sha256sum -c "+dataFile+".sha256"), 5*time.Minute)
	if err != nil {
		t.Fatalf("the file written on the data disk before the power cycle does not verify: %v\n%s", err, terminationMessage(p))
	}
	t.Logf("after the power cycle: %s", podLog(ctx, admin, p))
}

// podLog is p's log, trimmed, or why it could not be read.
func podLog(ctx context.Context, admin kubernetes.Interface, p *corev1.Pod) string {
	b, err := admin.CoreV1().Pods(p.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil {
		return "(log: " + err.Error() + ")"
	}
	return strings.TrimSpace(string(b))
}

// hostRootPod runs script with the node's own root (probe chroot) as root, privileged;
// its output is the termination message when it fails (FallbackToLogsOnError), and a
// success's is in the pod's log (podLog). The data-disk checks and the network
// diagnostics use it.
func hostRootPod(node *corev1.Node, name, script string) *corev1.Pod {
	p := probePod(node, name, "chroot", "/host", "/bin/sh", "-c", script)
	privileged, root := true, int64(0)
	dir := corev1.HostPathDirectory
	p.Spec.Volumes = []corev1.Volume{{Name: "host", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/", Type: &dir}}}}
	p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: &privileged, RunAsUser: &root}
	p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "host", MountPath: "/host"}}
	return p
}

// powerCycleDataDisks writes a file on B's prepared disk and rolls B out to another
// image (rollOut: gpuboot drains it and power-cycles it through its Redfish BMC) with
// the same disks: it re-enrolls on its own (reenroll: auto), joins on the new image, and
// its agent mounts both data disks as they are (same partitions, nothing prepared), and
// the file written before the cycle verifies, and so does the gpurack-local volume's
// (keepClaim, when the local-volume subtest left it: withVolume), from a pod the
// scheduler sends to B by the volume's node affinity.
func powerCycleDataDisks(t *testing.T, r *Rack, b *RackMachine, before map[string]*machinev1.DataDisk, withVolume bool) {
	writeDataDiskFile(t, r.ctx, r.admin, b.node, before["/dev/vda"].GetMountPoint())
	booted := time.Now()
	b2, next := rollOut(t, r, b)
	disks := waitDataDisksAfter(t, r.g, b2, booted, func(dd map[string]*machinev1.DataDisk) bool {
		return dd["/dev/vda"].GetState() == machinev1.DataDiskState_DATA_DISK_STATE_READY &&
			dd["/dev/vdb"].GetState() == machinev1.DataDiskState_DATA_DISK_STATE_READY
	})
	for _, path := range []string{"/dev/vda", "/dev/vdb"} {
		if d := disks[path]; d.GetPreparedNow() || d.GetPartitionGuid() != before[path].GetPartitionGuid() {
			t.Errorf("after the power cycle %s is %v; want the partition %s mounted as it was, nothing prepared", path, d, before[path].GetPartitionGuid())
		}
	}
	t.Logf("%s powered on again: both data disks mounted as they were, %s after power-on", b.Node, time.Since(booted).Round(time.Second))
	var node *corev1.Node
	waitFor(t, r.ctx, approveToNode, "Node "+b.Node+" Ready again after the power cycle (a new boot id)", func() bool {
		n, err := r.admin.CoreV1().Nodes().Get(r.ctx, b.Node, metav1.GetOptions{})
		if err != nil || !nodeReady(n) || n.Status.NodeInfo.BootID == b.node.Status.NodeInfo.BootID {
			return false
		}
		node = n
		return true
	}, r.nodeNames, b2.con.tail)
	if got := node.Labels[nodecontract.LabelImage]; got != next {
		t.Errorf("after the rollout Node %s has %s=%s, want the new image %s", b.Node, nodecontract.LabelImage, got, next)
	}
	verifyDataDiskFile(t, r.ctx, r.admin, node, disks["/dev/vda"].GetMountPoint())
	if !withVolume {
		t.Error("the gpurack-local subtest failed or did not run: no volume to check after the power cycle")
		return
	}
	p, err := runVolumePod(t, r.ctx, r.admin, volumePod("vol-after-cycle", keepClaim, "verify", keepFile))
	if err != nil {
		t.Fatalf("the gpurack-local volume after the power cycle: %v", err)
	}
	t.Logf("the gpurack-local volume after the power cycle, on %s: %s", p.Spec.NodeName, strings.TrimSpace(terminationMessage(p)))
}

// waitDataDisksAfter is waitDataDisks for a look the agent made after since.
func waitDataDisksAfter(t *testing.T, g *namespacedGpuboot, m *RackMachine, since time.Time, done func(map[string]*machinev1.DataDisk) bool) map[string]*machinev1.DataDisk {
	t.Helper()
	return waitDataDisksFor(t, g, m, 6*time.Minute, func(md *machinev1.DataDisks, dd map[string]*machinev1.DataDisk) bool {
		return md.GetCheckedAt().AsTime().After(since) && done(dd)
	})
}

// nodeReady reports n's Ready condition.
func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
