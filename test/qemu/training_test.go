package qemu

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpurack/gpurack/controlplane-bootstrap/tenants"
	"github.com/gpurack/gpurack/internal/testreq"
)

// The user's day on a QEMU node (issue 30): ben, a user of tenant alpha with only the
// kubeconfig `users add` gave him and the real kubectl, queues a training Job on B's
// simulated GPUs through alpha's queue. It checkpoints every epoch to a gpurack-local
// volume; its pod is deleted mid-run and the Job's next pod goes on from the last
// checkpoint. A second Job asking for more GPUs than alpha may use waits in the queue
// with Kueue's reason, suspended, and runs once the first is done: the time from GPUs
// freed to its pod running is logged. alpha's quota is 1 GPU, and it may borrow beta's
// idle one (isolationTenants, applied by A's tenant-isolation subtest).

// trainEpochs and trainEpochTime: the training Job's length, about a minute of epochs,
// so that its pod is deleted between two checkpoints and the second Job is seen waiting
// while the next pod trains.
const (
	trainEpochs    = 20
	trainEpochTime = "3s"
)

// userKubectl runs the real kubectl in the rig's namespace with kubeconfig.
func userKubectl(t *testing.T, r *Rack, kubeconfig string) func(stdin string, args ...string) (string, error) {
	kubectl := testreq.Tool(t, "kubectl", "make k8s-bins puts the pinned kubectl in the tools directory")
	return func(stdin string, args ...string) (string, error) {
		cmd := r.env.Command(r.ns, kubectl, append([]string{"--kubeconfig", kubeconfig, "--request-timeout=2m"}, args...)...)
		cmd.Stdin = strings.NewReader(stdin)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
}

// trainingJob is a Job in alpha's queue on node, asking for gpus GPUs, running probe
// train with args; claim, when set, is mounted at /ckpt.
func trainingJob(name, node, claim string, gpus int, args ...string) string {
	volume, mount := "", ""
	if claim != "" {
		volume = "\n      volumes: [{name: ckpt, persistentVolumeClaim: {claimName: " + claim + "}}]"
		mount = "\n        volumeMounts: [{name: ckpt, mountPath: /ckpt}]"
	}
	return fmt.Sprintf(`apiVersion: batch/v1
kind: Job
metadata:
  name: %s
  namespace: alpha
  labels: {%s: %s}
spec:
  backoffLimit: 3
  template:
    spec:
      restartPolicy: Never
      nodeSelector: {kubernetes.io/hostname: %s}
      containers:
      - name: train
        image: %s
        imagePullPolicy: Never
        args: [%s]
        resources: {limits: {nvidia.com/gpu: %d}}%s%s
`, name, tenants.QueueNameLabel, tenants.LocalQueueName, node, probeImage, yamlStrings(append([]string{"train"}, args...)), gpus, mount, volume)
}

// yamlStrings writes args as a YAML flow sequence of quoted strings ("20" stays a
// string, as a container's args must be).
func yamlStrings(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = strconv.Quote(a)
	}
	return strings.Join(q, ", ")
}

// checkpointClaim is ben's gpurack-local claim for the checkpoints.
const checkpointClaim = `apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: checkpoints, namespace: alpha}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: gpurack-local
  resources: {requests: {storage: 16Mi}}
`

// queuedTraining is TestRack's user's-day subtest on B.
func queuedTraining(t *testing.T, r *Rack, b *corev1.Node) {
	waitFor(t, r.ctx, 25*time.Minute, "tenant alpha's ClusterQueue (A's tenant-isolation subtest applies the tenants)", func() bool {
		gvr := tenants.ClusterQueueGVR
		return r.admin.Discovery().RESTClient().Get().AbsPath("/apis", gvr.Group, gvr.Version, gvr.Resource, "alpha").Do(r.ctx).Error() == nil
	})
	kubeconfig := filepath.Join(t.TempDir(), "ben.kubeconfig")
	if out, err := r.env.Run(r.ns, r.bins.controlplane, "users", "add", "--dir", r.cp.dir, "ben", "--tenant", "alpha", "--role", "user", "--out", kubeconfig); err != nil {
		t.Fatalf("users add ben: %v\n%s", err, out)
	}
	kc := userKubectl(t, r, kubeconfig)
	if out, err := kc(checkpointClaim, "apply", "-f", "-"); err != nil {
		t.Fatalf("ben's checkpoint claim: %v\n%s", err, out)
	}
	defer kc("", "delete", "-n", "alpha", "pvc/checkpoints", "--wait=false")
	if out, err := kc(trainingJob("train", b.Name, "checkpoints", 1, "/ckpt", strconv.Itoa(trainEpochs), trainEpochTime), "apply", "-f", "-"); err != nil {
		t.Fatalf("ben submits the training Job: %v\n%s", err, out)
	}
	defer kc("", "delete", "-n", "alpha", "job/train", "--cascade=foreground", "--wait=false")
	first := awaitTrainingLine(t, r, kc, "train", "", regexp.MustCompile(`(?m)^epoch [2-9]/\d+ .*checkpoint saved$`), 6*time.Minute)
	t.Logf("train's pod %s has saved its second checkpoint", first)
	// Deleted mid-run: the Job's next pod goes on from the last checkpoint.
	if out, err := kc("", "delete", "-n", "alpha", "pod/"+first, "--wait=false"); err != nil {
		t.Fatalf("delete %s: %v\n%s", first, err, out)
	}

	// Meanwhile the next Job asks for 2 GPUs: alpha's 1 and beta's idle 1, of which
	// train's admission holds one.
	if out, err := kc(trainingJob("train-next", b.Name, "", 2, "/tmp", "1"), "apply", "-f", "-"); err != nil {
		t.Fatalf("ben submits train-next: %v\n%s", err, out)
	}
	defer kc("", "delete", "-n", "alpha", "job/train-next", "--wait=false")
	checkQueued(t, r, kc, "train-next")
	queuedStart := measureQueuedStart(r, "train", "train-next")

	second := awaitTrainingLine(t, r, kc, "train", first, regexp.MustCompile(`(?m)^done: \d+ epochs, computed on the CPU$`), 6*time.Minute)
	checkResumed(t, kc, first, second)
	if figure, err := queuedStart(); err != nil {
		t.Error(err)
	} else {
		t.Log(figure)
	}
	t.Run("the model served by 2 replicas behind a Service", func(t *testing.T) { serveModel(t, r, kc, kubeconfig, b.Name) })
}

// awaitTrainingLine waits until a pod of Job job other than not has printed a line
// matching re (read with kubectl logs, as ben) within limit, and returns the pod's name.
func awaitTrainingLine(t *testing.T, r *Rack, kc func(string, ...string) (string, error), job, not string, re *regexp.Regexp, limit time.Duration) string {
	t.Helper()
	var pod, logs string
	waitFor(t, r.ctx, limit, fmt.Sprintf("a pod of Job %s printing %q", job, re), func() bool {
		out, err := kc("", "get", "pods", "-n", "alpha", "-l", "job-name="+job, "-o", "jsonpath={range .items[*]}{.metadata.name}{\"\\n\"}{end}")
		if err != nil {
			logs = out
			return false
		}
		for _, p := range strings.Fields(out) {
			if p == not {
				continue
			}
			if l, err := kc("", "logs", "-n", "alpha", p); err == nil {
				pod, logs = p, l
				if re.MatchString(l) {
					return true
				}
			}
		}
		return false
	}, func() string {
		return fmt.Sprintf("pod %s's logs:\n%s\nevents: %s", pod, logs, eventMessages(r.ctx, r.admin, "alpha", "Pod", pod, ""))
	})
	return pod
}

// checkQueued: Job name waits in alpha's queue, suspended, its Workload not admitted,
// with Kueue's reason naming the GPUs; ben reads it with kubectl.
func checkQueued(t *testing.T, r *Rack, kc func(string, ...string) (string, error), name string) {
	t.Helper()
	var why string
	waitFor(t, r.ctx, 2*time.Minute, name+"'s Workload pending in alpha's queue with a reason", func() bool {
		out, err := kc("", "get", "workloads", "-n", "alpha", "-o",
			`jsonpath={range .items[*]}{.metadata.ownerReferences[0].name}{"\t"}{.status.conditions[?(@.type=="QuotaReserved")].status}{"\t"}{.status.conditions[?(@.type=="QuotaReserved")].message}{"\n"}{end}`)
		why = out
		for _, line := range strings.Split(out, "\n") {
			f := strings.SplitN(line, "\t", 3)
			if len(f) == 3 && f[0] == name && f[1] == "False" && strings.Contains(f[2], string(tenants.GPUResource)) {
				why = f[2]
				return err == nil
			}
		}
		return false
	}, func() string { return "ben's kubectl get workloads: " + why })
	if out, err := kc("", "get", "job", "-n", "alpha", name, "-o", "jsonpath={.spec.suspend}"); err != nil || out != "true" {
		t.Errorf("%s waits in the queue, yet its Job's spec.suspend is %q (%v); want true", name, out, err)
	}
	t.Logf("%s (2 GPUs) waits in alpha's queue, its Job suspended: %s", name, why)
}

// checkResumed: the deleted pod started at epoch 1; the next one says it resumed from
// the checkpoint of an epoch the first had saved, and its epochs go on from there to
// the end, never starting over; both say they computed on the CPU, CUDA unavailable.
func checkResumed(t *testing.T, kc func(string, ...string) (string, error), first, second string) {
	t.Helper()
	epochRE := regexp.MustCompile(`(?m)^epoch (\d+)/\d+ `)
	out, err := kc("", "logs", "-n", "alpha", second)
	if err != nil {
		t.Fatalf("kubectl logs %s: %v\n%s", second, err, out)
	}
	m := regexp.MustCompile(`(?m)^resumed from the checkpoint of epoch (\d+) `).FindStringSubmatch(out)
	if m == nil || strings.Contains(out, "starting at epoch 1") {
		t.Fatalf("pod %s did not resume from a checkpoint:\n%s", second, out)
	}
	from, _ := strconv.Atoi(m[1])
	var epochs []int
	for _, e := range epochRE.FindAllStringSubmatch(out, -1) {
		n, _ := strconv.Atoi(e[1])
		epochs = append(epochs, n)
	}
	for i, n := range epochs {
		if n != from+1+i {
			t.Errorf("pod %s's epochs %v after resuming from epoch %d; want %d to %d in order", second, epochs, from, from+1, trainEpochs)
			break
		}
	}
	if from < 2 || len(epochs) == 0 || epochs[len(epochs)-1] != trainEpochs {
		t.Errorf("pod %s resumed from epoch %d and ran %v; want from epoch 2 or later to %d", second, from, epochs, trainEpochs)
	}
	if !strings.Contains(out, "CUDA: unavailable") || !strings.Contains(out, "computed on the CPU") {
		t.Errorf("pod %s does not say that CUDA was unavailable and it computed on the CPU:\n%s", second, out)
	}
	t.Logf("after %s was deleted, %s resumed from the checkpoint of epoch %d and trained epochs %d to %d (simulated GPUs: CPU compute, as it says)",
		first, second, from, from+1, trainEpochs)
}

// measureQueuedStart starts polling, every 250 ms, for Job done's completion (its GPU
// freed) and then Job next's admission (unsuspended) and its pod running; the function
// it returns waits for the figure, or an error after 10 minutes.
func measureQueuedStart(r *Rack, done, next string) func() (string, error) {
	result := make(chan error, 1)
	var freed, admitted, running time.Time
	go func() {
		deadline := time.Now().Add(10 * time.Minute)
		for running.IsZero() {
			if time.Now().After(deadline) || r.ctx.Err() != nil {
				result <- fmt.Errorf("%s's pod not running 10 minutes on (%s done at %v, %s admitted at %v)", next, done, freed, next, admitted)
				return
			}
			now := time.Now()
			if j, err := r.admin.BatchV1().Jobs("alpha").Get(r.ctx, done, metav1.GetOptions{}); freed.IsZero() && err == nil && jobComplete(j) {
				freed = now
			}
			if j, err := r.admin.BatchV1().Jobs("alpha").Get(r.ctx, next, metav1.GetOptions{}); admitted.IsZero() && err == nil && j.Spec.Suspend != nil && !*j.Spec.Suspend {
				admitted = now
			}
			if pods, err := r.admin.CoreV1().Pods("alpha").List(r.ctx, metav1.ListOptions{LabelSelector: "job-name=" + next}); err == nil {
				for _, p := range pods.Items {
					if p.Status.Phase == corev1.PodRunning || p.Status.Phase == corev1.PodSucceeded {
						running = now
					}
				}
			}
			time.Sleep(250 * time.Millisecond)
		}
		result <- nil
	}()
	return func() (string, error) {
		if err := <-result; err != nil {
			return "", err
		}
		if freed.IsZero() || admitted.Before(freed) {
			return "", fmt.Errorf("%s admitted at %v, before %s freed its GPU (%v): it should have waited", next, admitted, done, freed)
		}
		return fmt.Sprintf("figure: queued %s (2 GPUs) after %s freed its GPU: admitted by Kueue in %s, its pod running in %s (QEMU node under TCG, simulated GPUs, polled every 250 ms)",
			next, done, admitted.Sub(freed).Round(10*time.Millisecond), running.Sub(freed).Round(10*time.Millisecond)), nil
	}
}

// jobComplete reports whether Job j has its Complete condition.
func jobComplete(j *batchv1.Job) bool {
	for _, c := range j.Status.Conditions {
		if c.Type == batchv1.JobComplete && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// fullCheckpointVolume (issue 30, part 6): probe train checkpoints epoch 1 on a 16Mi
// gpurack-local claim, a pod fills the claim to its quota, and the next training pod
// fails with an error in its log that says the checkpoint could not be saved and the
// previous one is kept; a last pod reads the kept checkpoint of epoch 1, whole.
func fullCheckpointVolume(t *testing.T, ctx context.Context, admin kubernetes.Interface) {
	const claim = "ckpt-full"
	if _, err := admin.CoreV1().PersistentVolumeClaims(localNS).Create(ctx, localClaim(claim, "gpurack-local", "16Mi"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer admin.CoreV1().PersistentVolumeClaims(localNS).Delete(context.WithoutCancel(ctx), claim, metav1.DeleteOptions{})
	if p, err := runVolumePod(t, ctx, admin, volumePod("ckpt-epoch1", claim, "train", "/data", "1")); err != nil {
		t.Fatalf("training epoch 1 on the claim: %v\n%s", err, terminationMessage(p))
	}
	p, err := runVolumePod(t, ctx, admin, volumePod("ckpt-fill", claim, "write", "/data/filler", "32"))
	if err == nil || !strings.Contains(terminationMessage(p), "no space left on device") {
		t.Fatalf("filling the 16Mi claim with 32 MiB: %v; want ENOSPC\n%s", err, terminationMessage(p))
	}
	p, err = runVolumePod(t, ctx, admin, volumePod("ckpt-epoch3", claim, "train", "/data", "3"))
	msg := terminationMessage(p)
	if err == nil || !strings.Contains(msg, "epoch 2 trained but its checkpoint was not saved") ||
		!strings.Contains(msg, "no space left on device") || !strings.Contains(msg, "the checkpoint of epoch 1 is kept") {
		t.Fatalf("training on the full claim: %v; want its log to say epoch 2's checkpoint failed for lack of space and epoch 1's is kept:\n%s", err, msg)
	}
	t.Logf("training on the full volume, its log: %s", lastLines(strings.TrimSpace(msg), 1))
	p, err = runVolumePod(t, ctx, admin, volumePod("ckpt-read", claim, "cat", "/data/checkpoint.json"))
	var ck struct {
		Epoch   int       `json:"epoch"`
		Weights []float64 `json:"weights"`
	}
	if err != nil || json.Unmarshal([]byte(terminationMessage(p)), &ck) != nil || ck.Epoch != 1 || len(ck.Weights) == 0 {
		t.Fatalf("the kept checkpoint: %v %q; want epoch 1's, whole", err, terminationMessage(p))
	}
	t.Logf("the kept checkpoint reads whole: epoch %d, %d weights", ck.Epoch, len(ck.Weights))
}
