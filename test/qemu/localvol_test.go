//go:build linux

package qemu

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpurack/gpurack/internal/localvol"
)

// The gpurack-local checks (docs/storage.md) run on TestRack's machine B once its data
// disks are prepared: claims are provisioned by B's agent on its data disks, the
// scheduler reads the capacity it publishes, and the volume's quota holds. Every pod
// here is scheduled (no nodeName): only B has data disks, so a claim that binds went
// through the scheduler's capacity check to B.

const (
	localNS = "localvol-test"
	// keepClaim holds keepFile, written here and checked again after B's power cycle.
	keepClaim = "keep"
	keepFile  = "/data/keep.bin"
)

// localVolume is a claim of class and size in localNS.
func localClaim(name, class, size string) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: localNS},
		Spec: corev1.PersistentVolumeClaimSpec{
			StorageClassName: &class,
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}},
		},
	}
}

// volumePod runs probe with args, claim mounted at /data, wherever the scheduler puts it.
func volumePod(name, claim string, args ...string) *corev1.Pod {
	p := probePodIn(localNS, &corev1.Node{}, name, args...)
	p.Spec.NodeName = ""
	p.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
		PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}}
	p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}
	return p
}

// kubeletRestart keeps the pods of B's data disk checks apart from the kubelet
// restart of B's GPU checks, which run beside them. A pod whose task kubelet is creating
// when it restarts fails for good (StartError "failed to create shim task: context
// canceled", restartPolicy Never): kubelet's behaviour, and nothing to do with what
// those checks look at. Their pods hold it for reading while they run
// (runPodBesideRestart); the GPU checks hold it for writing from the restart until a
// pod has run again.
var kubeletRestart sync.RWMutex

// runPodBesideRestart is runPodToEnd outside B's kubelet restart (kubeletRestart).
func runPodBesideRestart(ctx context.Context, admin kubernetes.Interface, p *corev1.Pod, limit time.Duration) (*corev1.Pod, error) {
	kubeletRestart.RLock()
	defer kubeletRestart.RUnlock()
	return runPodToEnd(ctx, admin, p, limit)
}

// runVolumePod runs p to its end and deletes it; it returns the pod as it ended.
func runVolumePod(t *testing.T, ctx context.Context, admin kubernetes.Interface, p *corev1.Pod) (*corev1.Pod, error) {
	t.Helper()
	got, err := runPodBesideRestart(ctx, admin, p, 5*time.Minute)
	deletePodsIn(t, ctx, admin, localNS, p.Name)
	return got, err
}

// checkLocalVolumes is TestRack's gpurack-local subtest on B. It leaves keepClaim
// bound with keepFile on it, for the power cycle, and fullClaim filled and mounted,
// for the disk alert (*full, set as soon as it is).
func checkLocalVolumes(t *testing.T, ctx context.Context, admin kubernetes.Interface, b *corev1.Node, full **volumeFault) {
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: localNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	requireCapacity(t, ctx, admin, b.Name)
	// First, as its alert holds for 5 minutes: checked in TestRack's "metrics and alerts".
	*full = fillLocalVolume(t, ctx, admin)
	pv := bindKeep(t, ctx, admin, b.Name)
	p, err := runVolumePod(t, ctx, admin, volumePod("vol-overfill", keepClaim, "write", "/data/fill.bin", "200"))
	if err == nil || !strings.Contains(terminationMessage(p), "no space left on device") {
		t.Errorf("writing 200 MiB more on a 300Mi volume holding 200 MiB: %v; want ENOSPC (no space left on device)\n%s", err, terminationMessage(p))
	} else {
		t.Logf("past the quota: %s", strings.TrimSpace(terminationMessage(p)))
	}
	if p, err := runVolumePod(t, ctx, admin, volumePod("vol-verify", keepClaim, "verify", keepFile)); err != nil {
		t.Errorf("a new pod on the same claim: %v", err)
	} else {
		t.Logf("a new pod on the same claim: %s", strings.TrimSpace(terminationMessage(p)))
	}
	t.Run("a claim no node can hold", func(t *testing.T) { unplaceableClaim(t, ctx, admin) })
	t.Run("a StorageClass parameter typo", func(t *testing.T) { classTypo(t, ctx, admin) })
	t.Run("delete and retain", func(t *testing.T) { deleteAndRetain(t, ctx, admin, b, pv) })
	t.Run("a training checkpoint on a full volume", func(t *testing.T) { fullCheckpointVolume(t, ctx, admin) })
}

// requireCapacity: B publishes a capacity for gpurack-local with room; a node
// without data disks publishes none free.
func requireCapacity(t *testing.T, ctx context.Context, admin kubernetes.Interface, node string) {
	t.Helper()
	var caps []storagev1.CSIStorageCapacity
	waitFor(t, ctx, 2*time.Minute, "a gpurack-local capacity with room for node "+node, func() bool {
		l, err := admin.StorageV1().CSIStorageCapacities(localvol.Namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		caps = l.Items
		for _, c := range l.Items {
			if c.Labels[localvol.LabelNode] == node && c.StorageClassName == localvol.StorageClass && c.MaximumVolumeSize != nil && c.MaximumVolumeSize.Value() > 300<<20 {
				return true
			}
		}
		return false
	})
	for _, c := range caps {
		t.Logf("capacity %s: class %s, node %s, capacity %s, largest volume %s", c.Name, c.StorageClassName, c.Labels[localvol.LabelNode], c.Capacity, c.MaximumVolumeSize)
	}
}

// bindKeep makes keepClaim, checks it waits for its first consumer, then has a pod
// write keepFile on it; it returns the volume, checked to be B's.
func bindKeep(t *testing.T, ctx context.Context, admin kubernetes.Interface, node string) *corev1.PersistentVolume {
	t.Helper()
	if _, err := admin.CoreV1().PersistentVolumeClaims(localNS).Create(ctx, localClaim(keepClaim, localvol.StorageClass, "300Mi"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Second)
	if c, err := admin.CoreV1().PersistentVolumeClaims(localNS).Get(ctx, keepClaim, metav1.GetOptions{}); err != nil || c.Spec.VolumeName != "" {
		t.Fatalf("claim %s before any pod: %v %v; want Pending, waiting for its first consumer", keepClaim, c.Spec.VolumeName, err)
	}
	start := time.Now()
	p, err := runVolumePod(t, ctx, admin, volumePod("vol-write", keepClaim, "write", keepFile, "200"))
	if err != nil {
		t.Fatalf("writing 200 MiB on a new gpurack-local volume: %v", err)
	}
	c, err := admin.CoreV1().PersistentVolumeClaims(localNS).Get(ctx, keepClaim, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pv, err := admin.CoreV1().PersistentVolumes().Get(ctx, c.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("claim %s bound to %s (created %s after the pod) on node %s, path %s; pod: %s", keepClaim, pv.Name,
		pv.CreationTimestamp.Sub(start).Round(time.Second), p.Spec.NodeName, pv.Spec.Local.Path, strings.TrimSpace(terminationMessage(p)))
	terms := pv.Spec.NodeAffinity.Required.NodeSelectorTerms
	if p.Spec.NodeName != node || pv.Labels[localvol.LabelNode] != node || len(terms) != 1 || terms[0].MatchExpressions[0].Values[0] != node ||
		!strings.HasPrefix(pv.Spec.Local.Path, localvol.MountRoot+"/") || pv.Annotations[localvol.AnnProvisionedBy] != localvol.Provisioner {
		t.Errorf("volume %s: pod on %s, labels %v, affinity %v, path %s, annotations %v; want all of it node %s's, under %s",
			pv.Name, p.Spec.NodeName, pv.Labels, terms, pv.Spec.Local.Path, pv.Annotations, node, localvol.MountRoot)
	}
	return pv
}

// unplaceableClaim: a claim bigger than any node's free space stays Pending with its
// pod, and B's agent says what the largest free space is.
func unplaceableClaim(t *testing.T, ctx context.Context, admin kubernetes.Interface) {
	if _, err := admin.CoreV1().PersistentVolumeClaims(localNS).Create(ctx, localClaim("huge", localvol.StorageClass, "50Gi"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := volumePod("vol-huge", "huge", "verify", "/data/none")
	if _, err := admin.CoreV1().Pods(localNS).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ev := requireEvent(t, ctx, admin, localNS, "PersistentVolumeClaim", "huge", "NoNodeHasRoom", "the largest free space")
	t.Logf("claim huge (50Gi): %s", ev)
	if p, err := admin.CoreV1().Pods(localNS).Get(ctx, pod.Name, metav1.GetOptions{}); err != nil || p.Status.Phase != corev1.PodPending || p.Spec.NodeName != "" {
		t.Errorf("pod of the 50Gi claim: %v %v; want Pending, on no node", podStatus(p), err)
	}
	if sched := eventMessages(ctx, admin, localNS, "Pod", pod.Name, "FailedScheduling"); sched != "" {
		t.Logf("scheduler: %s", sched)
	}
	deletePodsIn(t, ctx, admin, localNS, pod.Name)
	_ = admin.CoreV1().PersistentVolumeClaims(localNS).Delete(ctx, "huge", metav1.DeleteOptions{})
}

// classTypo: a claim of a class with a misspelt parameter gets an event naming it.
func classTypo(t *testing.T, ctx context.Context, admin kubernetes.Interface) {
	wffc := storagev1.VolumeBindingWaitForFirstConsumer
	sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "gpurack-local-typo"}, Provisioner: localvol.Provisioner,
		VolumeBindingMode: &wffc, Parameters: map[string]string{"directoryMod": "0750"}}
	if _, err := admin.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer admin.StorageV1().StorageClasses().Delete(context.WithoutCancel(ctx), sc.Name, metav1.DeleteOptions{})
	if _, err := admin.CoreV1().PersistentVolumeClaims(localNS).Create(ctx, localClaim("typo", sc.Name, "16Mi"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := volumePod("vol-typo", "typo", "verify", "/data/none")
	if _, err := admin.CoreV1().Pods(localNS).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Logf("claim typo: %s", requireEvent(t, ctx, admin, localNS, "PersistentVolumeClaim", "typo", "ProvisioningFailed", `unknown parameter "directoryMod"`))
	deletePodsIn(t, ctx, admin, localNS, pod.Name)
	_ = admin.CoreV1().PersistentVolumeClaims(localNS).Delete(ctx, "typo", metav1.DeleteOptions{})
}

// deleteAndRetain: deleting a claim of gpurack-local (reclaim Delete) removes its
// volume and directory; under a Retain class the volume is Released and its directory
// stays.
func deleteAndRetain(t *testing.T, ctx context.Context, admin kubernetes.Interface, b *corev1.Node, keep *corev1.PersistentVolume) {
	retain := corev1.PersistentVolumeReclaimRetain
	wffc := storagev1.VolumeBindingWaitForFirstConsumer
	sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "gpurack-local-retain"}, Provisioner: localvol.Provisioner,
		VolumeBindingMode: &wffc, ReclaimPolicy: &retain}
	if _, err := admin.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer admin.StorageV1().StorageClasses().Delete(context.WithoutCancel(ctx), sc.Name, metav1.DeleteOptions{})
	paths := map[string]string{}
	for claim, class := range map[string]string{"scratch": localvol.StorageClass, "retained": sc.Name} {
		if _, err := admin.CoreV1().PersistentVolumeClaims(localNS).Create(ctx, localClaim(claim, class, "16Mi"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := runVolumePod(t, ctx, admin, volumePod("vol-"+claim, claim, "write", "/data/x.bin", "1")); err != nil {
			t.Fatalf("claim %s: %v", claim, err)
		}
		c, _ := admin.CoreV1().PersistentVolumeClaims(localNS).Get(ctx, claim, metav1.GetOptions{})
		pv, err := admin.CoreV1().PersistentVolumes().Get(ctx, c.Spec.VolumeName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		paths[claim] = pv.Spec.Local.Path
		if err := admin.CoreV1().PersistentVolumeClaims(localNS).Delete(ctx, claim, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, ctx, 2*time.Minute, "volume "+pv.Name+" of claim "+claim+" reclaimed ("+string(*sc.ReclaimPolicy)+" or Delete)", func() bool {
			got, err := admin.CoreV1().PersistentVolumes().Get(ctx, pv.Name, metav1.GetOptions{})
			if class == sc.Name {
				return err == nil && got.Status.Phase == corev1.VolumeReleased
			}
			return err != nil
		})
	}
	script := fmt.Sprintf("test ! -e %s && test -f %s/x.bin && test -f %s && echo scratch gone, retained kept, keep intact", paths["scratch"], paths["retained"], keep.Spec.Local.Path+"/keep.bin")
	if p, err := runPodBesideRestart(ctx, admin, hostRootPod(b, "vol-reclaimed", script), 3*time.Minute); err != nil {
		t.Errorf("on the node: %v %s", err, terminationMessage(p))
	} else {
		t.Logf("on the node: %s", podLog(ctx, admin, p))
	}
}

// requireEvent waits up to 2 minutes for an Event of reason on the object whose message
// holds what, and returns its message.
func requireEvent(t *testing.T, ctx context.Context, admin kubernetes.Interface, ns, kind, name, reason, what string) string {
	t.Helper()
	var got string
	waitFor(t, ctx, 2*time.Minute, fmt.Sprintf("a %s Event on %s %s/%s naming %q", reason, kind, ns, name, what), func() bool {
		got = eventMessages(ctx, admin, ns, kind, name, reason)
		return strings.Contains(got, what)
	}, func() string { return "events: " + eventMessages(ctx, admin, ns, kind, name, "") })
	return got
}

// eventMessages joins the messages of the events on one object (of reason, when set).
func eventMessages(ctx context.Context, admin kubernetes.Interface, ns, kind, name, reason string) string {
	sel := "involvedObject.kind=" + kind + ",involvedObject.name=" + name
	if reason != "" {
		sel += ",reason=" + reason
	}
	l, err := admin.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, e := range l.Items {
		out = append(out, e.Reason+": "+e.Message)
	}
	return strings.Join(out, " | ")
}

// benchLocalVolume is the storage bench (make bench-storage, GPURACK_STORAGE_FIGURES=FILE):
// a pod on B does O_DIRECT sequential writes and reads of 128 MiB through a gpurack-local
// volume and through a directory on the same data disk mounted directly (hostPath),
// alternating, three runs each (probe bench), and the figures go to FILE as
// "name<TAB>MiB/s" lines, with the claim's time from its pod's creation to its volume's.
func benchLocalVolume(t *testing.T, ctx context.Context, admin kubernetes.Interface, b *corev1.Node, figures string) {
	if _, err := admin.CoreV1().PersistentVolumeClaims(localNS).Create(ctx, localClaim("bench", localvol.StorageClass, "512Mi"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := runVolumePod(t, ctx, admin, volumePod("vol-bench-bind", "bench", "write", "/data/x.bin", "1")); err != nil {
		t.Fatal(err)
	}
	c, err := admin.CoreV1().PersistentVolumeClaims(localNS).Get(ctx, "bench", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pv, err := admin.CoreV1().PersistentVolumes().Get(ctx, c.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	bound := pv.CreationTimestamp.Sub(start.Truncate(time.Second)).Seconds()
	disk := strings.TrimSuffix(pv.Spec.Local.Path, "/"+localvol.VolumesDir+"/"+pv.Name)
	p := volumePod("vol-bench", "bench", "bench", "/data", "/direct", "3", "128")
	dir := corev1.HostPathDirectoryOrCreate
	p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "direct", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: disk + "/bench-direct", Type: &dir}}})
	p.Spec.Containers[0].VolumeMounts = append(p.Spec.Containers[0].VolumeMounts, corev1.VolumeMount{Name: "direct", MountPath: "/direct"})
	privileged, root := true, int64(0) // the hostPath directory is root's
	p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: &privileged, RunAsUser: &root}
	got, err := runVolumePod(t, ctx, admin, p)
	if err != nil {
		t.Fatalf("storage bench: %v", err)
	}
	out := terminationMessage(got)
	t.Logf("storage bench on %s (A: gpurack-local volume %s, B: %s/bench-direct; MiB/s, O_DIRECT):\n%s\nclaim to volume: %.0f s", b.Name, pv.Name, disk, out, bound)
	rows := benchRows(t, out, "local", "direct")
	rows = append(rows, fmt.Sprintf("storage-claim-bound\t%.0f", bound))
	if err := appendFigures(figures, rows); err != nil {
		t.Error(err)
	}
	if err := admin.CoreV1().PersistentVolumeClaims(localNS).Delete(ctx, "bench", metav1.DeleteOptions{}); err != nil {
		t.Error(err)
	}
}

// benchRows are the figures of `probe bench DIR-A DIR-B 3 MIB` in out, as
// "storage-<a or b>-<write or read>\tMiB/s" rows for appendFigures (A's named a, B's
// b); fewer than the 12 three runs make fails t.
func benchRows(t *testing.T, out, a, b string) []string {
	t.Helper()
	var rows []string
	for _, line := range strings.Split(out, "\n") {
		var side, kind string
		var run int
		var v float64
		if n, _ := fmt.Sscanf(line, "bench %s %s %d %f", &side, &kind, &run, &v); n == 4 {
			rows = append(rows, fmt.Sprintf("storage-%s-%s\t%.1f", map[string]string{"A": a, "B": b}[side], kind, v))
		}
	}
	if len(rows) != 12 {
		t.Fatalf("storage bench: %d figures in the output, want 12", len(rows))
	}
	return rows
}
