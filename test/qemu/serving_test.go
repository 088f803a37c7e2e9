package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"

	"github.com/gpurack/gpurack/controlplane-bootstrap/tenants"
	"github.com/gpurack/gpurack/internal/testreq"
)

// The user's day goes on (issue 30): ben serves the model his training Job left, as a
// Deployment of 2 replicas behind a Service, and asks it for predictions through
// `kubectl port-forward`; then alpha and beta each queue more GPU Jobs than their
// quota, and Kueue lends alpha beta's idle GPU and takes it back when beta's Job comes.

// serveManifest is ben's Deployment of probe predict over the checkpoints claim (read
// only) on node, and its Service.
func serveManifest(node string) string {
	return fmt.Sprintf(`apiVersion: apps/v1
kind: Deployment
metadata: {name: serve, namespace: alpha}
spec:
  replicas: 2
  selector: {matchLabels: {app: serve}}
  template:
    metadata: {labels: {app: serve}}
    spec:
      nodeSelector: {kubernetes.io/hostname: %s}
      terminationGracePeriodSeconds: 1
      containers:
      - name: predict
        image: %s
        imagePullPolicy: Never
        args: ["predict", "/model"]
        ports: [{containerPort: 8080}]
        readinessProbe: {httpGet: {path: /healthz, port: 8080}, periodSeconds: 2}
        volumeMounts: [{name: model, mountPath: /model, readOnly: true}]
      volumes: [{name: model, persistentVolumeClaim: {claimName: checkpoints, readOnly: true}}]
---
apiVersion: v1
kind: Service
metadata: {name: serve, namespace: alpha}
spec:
  selector: {app: serve}
  ports: [{port: 80, targetPort: 8080}]
`, node, probeImage)
}

// servedPrediction is what probe predict answers.
type servedPrediction struct {
	Class       int     `json:"class"`
	Probability float64 `json:"probability"`
	ModelEpoch  int     `json:"modelEpoch"`
	Replica     string  `json:"replica"`
	Compute     string  `json:"compute"`
}

// serveModel: ben's 2 replicas become ready behind the Service (both in its
// endpoints), and a request through `kubectl port-forward svc/serve` gets a prediction
// from the model of the last epoch, for each class's centre, computed on the CPU.
func serveModel(t *testing.T, r *Rack, kc func(string, ...string) (string, error), kubeconfig, node string) {
	if out, err := kc(serveManifest(node), "apply", "-f", "-"); err != nil {
		t.Fatalf("ben applies the serving Deployment and Service: %v\n%s", err, out)
	}
	defer kc("", "delete", "-n", "alpha", "deployment/serve", "service/serve", "--wait=false")
	start := time.Now()
	if out, err := kc("", "rollout", "status", "-n", "alpha", "deployment/serve", "--timeout=5m"); err != nil {
		t.Fatalf("kubectl rollout status deployment/serve: %v\n%s\nevents: %s", err, out, eventMessages(r.ctx, r.admin, "alpha", "Pod", "", ""))
	}
	var ready []string
	last := ""
	waitFor(t, r.ctx, time.Minute, "both replicas ready in the Service's EndpointSlices", func() bool {
		out, err := kc("", "get", "endpointslices", "-n", "alpha", "-l", "kubernetes.io/service-name=serve", "-o",
			`jsonpath={range .items[*].endpoints[*]}{.targetRef.name}={.conditions.ready}{"\n"}{end}`)
		last, ready = out, nil
		for _, line := range strings.Split(out, "\n") {
			if pod, ok := strings.CutSuffix(line, "=true"); ok && strings.HasPrefix(pod, "serve-") {
				ready = append(ready, pod)
			}
		}
		return err == nil && len(ready) == 2
	}, func() string { return "ben's kubectl get endpointslices: " + last })
	t.Logf("2 replicas of serve ready behind the Service in %s: %v", time.Since(start).Round(time.Second), ready)

	addr := portForward(t, r, kubeconfig, "alpha", "svc/serve", 80)
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DialContext: nsDial(r.ns)}}
	for want, v := range map[int]string{0: "-0.5", 1: "0.5"} {
		u := "http://" + addr + "/predict?x=" + strings.Repeat(v+",", 15) + v
		resp, err := client.Get(u)
		if err != nil {
			t.Fatalf("GET %s through kubectl port-forward: %v", u, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var p servedPrediction
		if err := json.Unmarshal(body, &p); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d %s (%v)", u, resp.StatusCode, body, err)
		}
		if p.Class != want || p.ModelEpoch != trainEpochs || p.Compute != "CPU (CUDA unavailable)" {
			t.Errorf("class %d's centre: %s; want class %d from the model of epoch %d, computed on the CPU", want, body, want, trainEpochs)
		}
		t.Logf("through kubectl port-forward svc/serve: x = (%s, …) -> %s", v, strings.TrimSpace(string(body)))
	}
}

// portForward starts `kubectl port-forward target :port` as the user of kubeconfig in
// the rig's namespace and returns the local address it listens on there; it stops
// when t ends.
func portForward(t *testing.T, r *Rack, kubeconfig, ns, target string, port int) string {
	t.Helper()
	kubectl := testreq.Tool(t, "kubectl", "make k8s-bins puts the pinned kubectl in the tools directory")
	ctx, cancel := context.WithCancel(r.ctx)
	cmd := r.env.Command(r.ns, kubectl, "--kubeconfig", kubeconfig, "port-forward", "-n", ns, "--address", "127.0.0.1", target, fmt.Sprintf(":%d", port))
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("kubectl port-forward: %v", err)
	}
	t.Cleanup(func() { cancel(); cmd.Process.Kill(); cmd.Wait() })
	go func() { <-ctx.Done(); cmd.Process.Kill() }()
	found := make(chan string, 1)
	go func() {
		re := regexp.MustCompile(`^Forwarding from (127\.0\.0\.1:\d+) ->`)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case found <- m[1]:
				default:
				}
			}
		}
	}()
	select {
	case addr := <-found:
		return addr
	case <-time.After(time.Minute):
		t.Fatalf("kubectl port-forward %s: no local port after a minute; it said: %s", target, stderr.String())
	}
	return ""
}

// holdJob is a Job in namespace ns's queue on node asking for gpus GPUs, whose pod
// holds them for ten minutes (probe devices) unless it is preempted.
func holdJob(ns, name, node string, gpus int) string {
	return fmt.Sprintf(`apiVersion: batch/v1
kind: Job
metadata:
  name: %s
  namespace: %s
  labels: {%s: %s}
spec:
  backoffLimit: 0
  template:
    spec:
      restartPolicy: Never
      terminationGracePeriodSeconds: 1
      nodeSelector: {kubernetes.io/hostname: %s}
      containers:
      - name: hold
        image: %s
        imagePullPolicy: Never
        args: ["devices", "10m"]
        resources: {limits: {nvidia.com/gpu: %d}}
`, name, ns, tenants.QueueNameLabel, tenants.LocalQueueName, node, probeImage, gpus)
}

// borrowAndReclaim: alpha (1 GPU) queues two 1-GPU Jobs while beta (1 GPU) is idle:
// both run, the second on beta's GPU, borrowed. Then carol, a user of beta, queues
// one: Kueue preempts alpha's borrowing Job (Evicted, reclaimed within the cohort),
// alpha's other Job keeps running, and beta's runs on the GPU given back. Each user
// acts with only their own kubeconfig.
func borrowAndReclaim(t *testing.T, r *Rack, node *corev1.Node) {
	dyn := r.cp.dynamicClient(t, r.ns)
	users := map[string]func(string, ...string) (string, error){}
	for user, tenant := range map[string]string{"dana": "alpha", "carol": "beta"} {
		kubeconfig := filepath.Join(t.TempDir(), user+".kubeconfig")
		if out, err := r.env.Run(r.ns, r.bins.controlplane, "users", "add", "--dir", r.cp.dir, user, "--tenant", tenant, "--role", "user", "--out", kubeconfig); err != nil {
			t.Fatalf("users add %s: %v\n%s", user, err, out)
		}
		users[tenant] = userKubectl(t, r, kubeconfig)
	}
	use := func() string {
		qs, err := tenants.QueueStatus(r.ctx, dyn)
		if err != nil {
			return err.Error()
		}
		return fmt.Sprintf("alpha: %s; beta: %s", qs["alpha"], qs["beta"])
	}
	waitFor(t, r.ctx, 5*time.Minute, "no GPUs held in alpha's and beta's queues (the training Jobs done)", func() bool {
		return strings.Contains(use(), "alpha: admitted 0, pending 0, GPUs 0 (borrowed 0); beta: admitted 0")
	}, use)
	for i, name := range []string{"hold-1", "hold-2"} {
		if i > 0 {
			// Kueue preempts a borrower's most recently admitted Workload first, by its
			// condition's time in seconds: hold-2 is admitted a second later.
			time.Sleep(1100 * time.Millisecond)
		}
		submit(t, users["alpha"], holdJob("alpha", name, node.Name, 1))
		defer users["alpha"]("", "delete", "-n", "alpha", "job/"+name, "--wait=false")
		awaitPodRunning(t, r, "alpha", name)
	}
	waitFor(t, r.ctx, time.Minute, "alpha borrowing beta's idle GPU", func() bool {
		return strings.Contains(use(), "alpha: admitted 2, pending 0, GPUs 2 (borrowed 1)")
	}, use)
	t.Logf("alpha's hold-1 and hold-2 (1 GPU each) run, one on beta's idle GPU: %s", use())

	submitted := time.Now()
	submit(t, users["beta"], holdJob("beta", "hold-b", node.Name, 1))
	defer users["beta"]("", "delete", "-n", "beta", "job/hold-b", "--wait=false")
	awaitPodRunning(t, r, "beta", "hold-b")
	running := time.Since(submitted)
	out, err := users["alpha"]("", "get", "workloads", "-n", "alpha", "-o",
		`jsonpath={range .items[*]}{.metadata.ownerReferences[0].name}{"\t"}{.status.conditions[?(@.type=="Evicted")].reason}{"\t"}{.status.conditions[?(@.type=="Preempted")].reason}{"\t"}{.status.conditions[?(@.type=="Admitted")].status}{"\n"}{end}`)
	if err != nil {
		t.Fatalf("dana's kubectl get workloads: %v\n%s", err, out)
	}
	if !strings.Contains(out, "hold-2\tPreempted\tInCohortReclamation\tFalse") || !strings.Contains(out, "hold-1\t\t\tTrue") {
		t.Errorf("alpha's Workloads (Job, Evicted reason, Preempted reason, Admitted):\n%s\nwant hold-2 preempted by beta's reclamation and hold-1, in alpha's own quota, still admitted", out)
	}
	waitFor(t, r.ctx, time.Minute, "alpha back within its own quota", func() bool {
		return strings.Contains(use(), "alpha: admitted 1, pending 1, GPUs 1 (borrowed 0); beta: admitted 1, pending 0, GPUs 1 (borrowed 0)")
	}, use)
	t.Logf("carol's hold-b ran %s after she submitted it: alpha's borrowing hold-2 preempted and requeued, hold-1 kept (alpha's Workloads, Job Evicted Preempted Admitted: %s); %s",
		running.Round(100*time.Millisecond), strings.ReplaceAll(strings.TrimSpace(out), "\n", "; "), use())
}

// submit applies manifest with the user's kubectl.
func submit(t *testing.T, kc func(string, ...string) (string, error), manifest string) {
	t.Helper()
	if out, err := kc(manifest, "apply", "-f", "-"); err != nil {
		t.Fatalf("kubectl apply: %v\n%s\n%s", err, out, manifest)
	}
}

// awaitPodRunning waits for a pod of Job job in ns to be running.
func awaitPodRunning(t *testing.T, r *Rack, ns, job string) {
	t.Helper()
	var phases []string
	waitFor(t, r.ctx, 4*time.Minute, "a running pod of Job "+ns+"/"+job, func() bool {
		pods, err := r.admin.CoreV1().Pods(ns).List(r.ctx, metav1.ListOptions{LabelSelector: "job-name=" + job})
		phases = nil
		for _, p := range pods.Items {
			phases = append(phases, p.Name+" "+string(p.Status.Phase))
			if p.Status.Phase == corev1.PodRunning {
				return err == nil
			}
		}
		return false
	}, func() string {
		return fmt.Sprintf("pods: %v; events: %s", phases, eventMessages(r.ctx, r.admin, ns, "Pod", "", ""))
	})
}

// dynamicClient is an admin dynamic client whose connections are made inside ns.
func (c *namespacedControlPlane) dynamicClient(t *testing.T, ns string) dynamic.Interface {
	t.Helper()
	d, err := dynamic.NewForConfig(c.restConfig(t, ns))
	if err != nil {
		t.Fatal(err)
	}
	return d
}
