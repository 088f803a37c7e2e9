//go:build linux

package qemu

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpurack/gpurack/controlplane-bootstrap/tenants"
	"github.com/gpurack/gpurack/internal/netnstest"
	"github.com/gpurack/gpurack/internal/testreq"
)

// The user's day with the project's own sample images (issue 30, parts 2 and 4): the
// notebook, train and serve images of profiles/workloads (Jupyter and PyTorch 1.13 from
// Debian's packages, 420 to 650 MB each), which TestRack cannot carry: its emulated
// nodes have 2 GiB, and containerd's store on a diskless node is in memory.

// userDayMachine boots the simulated GPU image with room for the three images: 20 GiB,
// of which containerd's tmpfs may take half. The three take 6.5 GiB there (each
// compressed layer and its unpacked files, 1.6 to 2.6 GiB an image); with 16 GiB that
// crossed kubelet's eviction threshold and the notebook was evicted. A blank data disk
// holds the user's gpurack-local claims (the work directory, the checkpoints). Its CPU is QEMU's
// "max" model: Debian's PyTorch dies of SIGILL (exit 132) on QEMU's default qemu64,
// which has no SSE4 or AVX.
var userDayMachine = MachineSpec{Node: "gpu-r1-work", MAC: "52:54:00:e2:e0:31", IP: "10.0.2.31", Serial: "GPR-SIM-0031",
	UUID: "5e1f0c2a-8d4b-4f7e-9a61-0c3d2b1a0e31", Image: imageSimGPU, Memory: 20 << 10, CPU: "max"}

// userDayTenants: cleo's team, alpha, with the node's GPUs in its queue.
const userDayTenants = `apiVersion: gpurack.io/v1alpha1
kind: TenantList
tenants:
  - name: alpha
    quota: {gpus: 1}
`

// userDayEpochs is the training Job's length: enough epochs (under a second each on the
// emulated node, PyTorch on the CPU) that its pod is deleted mid-run, between two
// checkpoints (GPURACK_USERDAY_EPOCHS changes it).
const userDayEpochs = 40

// TestUserDayImages is a tenant user's day with the sample images on a QEMU node, as
// the user: cleo, of tenant alpha, holding only what `users add` gave her (a
// kubeconfig and registry credentials) and the real kubectl and skopeo:
//
//   - pushes the notebook, train and serve archives (`make workload-images`) under
//     alpha/ in the cluster registry with skopeo; the node pulls them with alpha's
//     pull Secret (each pull's time is logged);
//   - submits the PyTorch training Job through alpha's queue, asking for a GPU, with a
//     checkpoint per epoch on a gpurack-local claim; its pod is deleted mid-run and the
//     Job's next pod resumes from the last checkpoint (the epochs go on) and saves the
//     model; she reads the logs with kubectl logs;
//   - serves the model: a Deployment of 2 replicas of serve behind a Service, asked
//     through `kubectl port-forward svc/serve` for the first ten digits of the dataset
//     the train image ships;
//   - starts a notebook with her work directory (a gpurack-local claim) mounted and a
//     token from a Secret, reaches it through `kubectl port-forward`: 403 without the
//     token, a file saved through Jupyter's API with it and a python3 kernel started;
//     the notebook pod is deleted and a new one finds the file in the work directory.
//
// Each workload says CUDA is unavailable and it computed on the CPU (the GPUs are
// simulated; Debian's PyTorch has no CUDA), and the test checks that it says so.
// GPURACK_WORKLOAD_IMAGES names the archives' folder (default bin/workloads).
func TestUserDayImages(t *testing.T) {
	testreq.OptIn(t, "GPURACK_E2E_WORKLOADS", "the sample PyTorch and Jupyter images (420 to 650 MB each) on a 20 GiB QEMU node, about 21 minutes; make e2e-workloads builds them and runs it")
	archives := workloadArchives(t)
	digits := digitsSamples(t, archives["train"], 10)
	disk := filepath.Join(t.TempDir(), "data.qcow2")
	qemuImg := testreq.Tool(t, "qemu-img", "apt-get install qemu-utils (make deps installs it)")
	if out, err := exec.Command(qemuImg, "create", "-q", "-f", "qcow2", disk, "8G").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img create: %v\n%s", err, out)
	}
	spec := userDayMachine
	spec.Disks = []QEMUDisk{{File: disk, Format: "qcow2", Serial: "GPR-DATA-0031"}}
	r := startRack(t, RackOptions{Machines: []MachineSpec{spec}})
	node := r.Machines[0].Node
	cleo := newRackUser(t, r, "cleo", userDayTenants)
	for _, name := range []string{"notebook", "train", "serve"} {
		ref := rackRegistry + "/alpha/" + name + ":1.0"
		took := cleo.push(t, "oci-archive:"+archives[name], ref)
		if st, err := os.Stat(archives[name]); err == nil {
			t.Logf("cleo pushed %s (%d MB archive) with skopeo in %s", ref, st.Size()/1e6, took.Round(time.Second))
		}
	}
	kc := userKubectl(t, r, cleo.kubeconfig)
	if out, err := kc(userDayClaims, "apply", "-f", "-"); err != nil {
		t.Fatalf("cleo's claims: %v\n%s", err, out)
	}
	trained := t.Run("PyTorch training through the queue, resumed from its checkpoint", func(t *testing.T) {
		userTraining(t, r, kc, node)
	})
	t.Run("the model served by 2 replicas behind a Service", func(t *testing.T) {
		if !trained {
			t.Fatal("no model: the training subtest failed")
		}
		userServe(t, r, cleo, kc, node, digits)
	})
	t.Run("notebook with the work directory, through kubectl port-forward", func(t *testing.T) {
		userNotebook(t, r, cleo, kc, node)
	})
}

// workloadArchives are the sample images' OCI archives by name, from
// GPURACK_WORKLOAD_IMAGES or bin/workloads.
func workloadArchives(t *testing.T) map[string]string {
	dir := os.Getenv("GPURACK_WORKLOAD_IMAGES")
	if dir == "" {
		dir = filepath.Join(repoRoot(t), "bin", "workloads")
	}
	m := map[string]string{}
	for _, name := range []string{"notebook", "train", "serve"} {
		m[name] = filepath.Join(dir, name+".oci.tar")
		testreq.File(t, m[name], "make workload-images builds the sample images into bin/workloads")
	}
	return m
}

// rackUser is a tenant user as `users add` made them: a kubeconfig, registry
// credentials and the cluster CA for skopeo.
type rackUser struct {
	env                  *netnstest.Env
	ns                   string
	name                 string
	kubeconfig, authfile string
	certs                string
}

// newRackUser applies tenantsYAML and adds name as a user of its first tenant.
func newRackUser(t *testing.T, r *Rack, name, tenantsYAML string) *rackUser {
	t.Helper()
	file := filepath.Join(t.TempDir(), "tenants.yaml")
	if err := os.WriteFile(file, []byte(tenantsYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := r.env.Run(r.ns, r.bins.controlplane, "tenants", "apply", "--dir", r.cp.dir, file); err != nil {
		t.Fatalf("tenants apply: %v\n%s", err, out)
	}
	return addRackUser(t, r.env, r.ns, r.bins.controlplane, r.cp, name, "alpha")
}

// addRackUser runs `users add NAME --tenant TENANT` with controlplane-bootstrap bin in
// namespace ns and keeps what it gave, with the cluster CA for registry clients in
// certs/ (skopeo's --dest-cert-dir), as the user would.
func addRackUser(t *testing.T, env *netnstest.Env, ns, bin string, cp *namespacedControlPlane, name, tenant string) *rackUser {
	t.Helper()
	dir := t.TempDir()
	u := &rackUser{env: env, ns: ns, name: name, kubeconfig: filepath.Join(dir, name+".kubeconfig"),
		authfile: filepath.Join(dir, name+".registry-auth.json"), certs: filepath.Join(dir, "certs")}
	if out, err := env.Run(ns, bin, "users", "add", "--dir", cp.dir, name, "--tenant", tenant, "--role", "user",
		"--out", u.kubeconfig); err != nil || !strings.Contains(out, filepath.Base(u.authfile)) {
		t.Fatalf("users add %s: %v\n%s", name, err, out)
	}
	ca, err := os.ReadFile(filepath.Join(cp.dir, "pki", "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(u.certs, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(u.certs, "ca.crt"), ca, 0o644); err != nil {
		t.Fatal(err)
	}
	return u
}

// push copies the image at src (a skopeo source: oci-archive:FILE, docker-archive:FILE)
// to ref with skopeo, as the user, and returns how long it took.
func (u *rackUser) push(t *testing.T, src, ref string) time.Duration {
	t.Helper()
	skopeo := testreq.Tool(t, "skopeo", "apt-get install skopeo (hack/deps.sh installs it)")
	t0 := time.Now()
	if out, err := u.env.Run(u.ns, skopeo, "copy", "--authfile", u.authfile, "--dest-cert-dir", u.certs, src, "docker://"+ref); err != nil {
		t.Fatalf("%s pushes %s: %v\n%s", u.name, ref, err, out)
	}
	return time.Since(t0)
}

// userDayClaims are cleo's gpurack-local claims: her work directory and the
// checkpoints.
const userDayClaims = `apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: work, namespace: alpha}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: gpurack-local
  resources: {requests: {storage: 256Mi}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: checkpoints, namespace: alpha}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: gpurack-local
  resources: {requests: {storage: 64Mi}}
`

// notebookManifest is cleo's notebook pod: the notebook image, its token from the
// Secret notebook-token, her work directory at /work.
func notebookManifest(node string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: notebook, namespace: alpha, labels: {app: notebook}}
spec:
  nodeSelector: {kubernetes.io/hostname: %s}
  containers:
  - name: notebook
    image: %s/alpha/notebook:1.0
    env: [{name: JUPYTER_TOKEN, valueFrom: {secretKeyRef: {name: notebook-token, key: token}}}]
    ports: [{containerPort: 8888}]
    resources: {requests: {cpu: 100m, memory: 256Mi}}
    readinessProbe: {tcpSocket: {port: 8888}, periodSeconds: 3}
    volumeMounts: [{name: work, mountPath: /work}]
  volumes: [{name: work, persistentVolumeClaim: {claimName: work}}]
`, node, rackRegistry)
}

// notebookToken is the token cleo gives her notebook.
const notebookToken = "0b5e3f7a9c4d41e2a8f6c1d07e9b3a52"

// userNotebook: the notebook starts with the work directory and the token; through
// kubectl port-forward it refuses a request without the token, saves a file and starts
// a kernel with it; a new notebook pod on the same claim lists the file.
func userNotebook(t *testing.T, r *Rack, u *rackUser, kc func(string, ...string) (string, error), node string) {
	if out, err := kc("", "create", "secret", "generic", "-n", "alpha", "notebook-token", "--from-literal=token="+notebookToken); err != nil {
		t.Fatalf("the token's Secret: %v\n%s", err, out)
	}
	start := func(what string) string {
		t0 := time.Now()
		if out, err := kc(notebookManifest(node), "apply", "-f", "-"); err != nil {
			t.Fatalf("cleo's notebook: %v\n%s", err, out)
		}
		waitPodReady(t, r, kc, "notebook", 15*time.Minute)
		t.Logf("%s notebook pod ready in %s", what, time.Since(t0).Round(time.Second))
		return portForward(t, r, u.kubeconfig, "alpha", "pod/notebook", 8888)
	}
	addr := start("the first (the image's pull included):")
	if code, body := jupyter(t, r, "GET", "http://"+addr+"/api/contents", "", ""); code != http.StatusForbidden {
		t.Errorf("Jupyter without the token: %d %.200s; want 403", code, body)
	}
	note := `{"type": "file", "format": "text", "content": "cleo's notes, saved through Jupyter\n"}`
	if code, body := jupyter(t, r, "PUT", "http://"+addr+"/api/contents/notes.txt", notebookToken, note); code != http.StatusCreated && code != http.StatusOK {
		t.Fatalf("saving notes.txt through Jupyter with the token: %d %.300s", code, body)
	}
	code, body := jupyter(t, r, "POST", "http://"+addr+"/api/kernels", notebookToken, `{"name": "python3"}`)
	if code != http.StatusCreated || !strings.Contains(body, `"python3"`) {
		t.Errorf("starting a python3 kernel: %d %.300s", code, body)
	} else {
		t.Logf("Jupyter started a kernel: %.200s", body)
	}
	requireLog(t, kc, "pod/notebook", "CUDA is not available", "computing on the CPU")
	if out, err := kc("", "delete", "-n", "alpha", "pod/notebook", "--wait=true", "--timeout=5m"); err != nil {
		t.Fatalf("delete the notebook pod: %v\n%s", err, out)
	}
	addr = start("a new")
	code, body = jupyter(t, r, "GET", "http://"+addr+"/api/contents/notes.txt", notebookToken, "")
	if code != http.StatusOK || !strings.Contains(body, "cleo's notes, saved through Jupyter") {
		t.Fatalf("a new notebook pod reading notes.txt from the work directory: %d %.300s", code, body)
	}
	t.Log("a new notebook pod on the same work directory reads notes.txt back through Jupyter")
	kc("", "delete", "-n", "alpha", "pod/notebook", "--wait=false")
}

// jupyter makes one request of Jupyter's REST API with token (none when ""), from the
// rig's namespace, where kubectl port-forward listens.
func jupyter(t *testing.T, r *Rack, method, url, token, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "token "+token)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	client := &http.Client{Timeout: 3 * time.Minute, Transport: &http.Transport{DialContext: nsDial(r.ns)}}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s through kubectl port-forward: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// waitPodReady waits until pod name in alpha is Ready, as the user reads it.
func waitPodReady(t *testing.T, r *Rack, kc func(string, ...string) (string, error), name string, limit time.Duration) {
	t.Helper()
	var last string
	waitFor(t, r.ctx, limit, "pod "+name+" Ready", func() bool {
		out, err := kc("", "get", "pod", "-n", "alpha", name, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
		last = out
		return err == nil && out == "True"
	}, func() string {
		d, _ := kc("", "describe", "pod", "-n", "alpha", name)
		return "kubectl get: " + last + "\n" + d
	})
}

// requireLog: target's log (kubectl logs, as the user) says each of want.
func requireLog(t *testing.T, kc func(string, ...string) (string, error), target string, want ...string) {
	t.Helper()
	out, err := kc("", "logs", "-n", "alpha", target)
	if err != nil {
		t.Errorf("kubectl logs %s: %v\n%s", target, err, out)
		return
	}
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("%s's log does not say %q:\n%s", target, w, out)
		}
	}
}

// userTrainJob is cleo's training Job in alpha's queue: the train image, a GPU, the
// checkpoints claim at /ckpt, the model saved there for serve.
func userTrainJob(node string, epochs int) string {
	return fmt.Sprintf(`apiVersion: batch/v1
kind: Job
metadata:
  name: train
  namespace: alpha
  labels: {%s: %s}
spec:
  backoffLimit: 3
  template:
    spec:
      restartPolicy: Never
      nodeSelector: {kubernetes.io/hostname: %s}
      terminationGracePeriodSeconds: 5
      containers:
      - name: train
        image: %s/alpha/train:1.0
        env:
        - {name: CHECKPOINT_DIR, value: /ckpt}
        - {name: MODEL_PATH, value: /ckpt/model/digits.pt}
        - {name: EPOCHS, value: "%d"}
        - {name: OMP_NUM_THREADS, value: "1"}
        resources: {requests: {cpu: 100m, memory: 512Mi}, limits: {nvidia.com/gpu: 1}}
        volumeMounts: [{name: ckpt, mountPath: /ckpt}]
      volumes: [{name: ckpt, persistentVolumeClaim: {claimName: checkpoints}}]
`, tenants.QueueNameLabel, tenants.LocalQueueName, node, rackRegistry, epochs)
}

// userTraining: the Job runs through the queue; its first pod is deleted once it has
// saved its second checkpoint; the next pod resumes and saves the model.
func userTraining(t *testing.T, r *Rack, kc func(string, ...string) (string, error), node string) {
	epochs := userDayEpochs
	if v := os.Getenv("GPURACK_USERDAY_EPOCHS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 4 {
			t.Fatalf("GPURACK_USERDAY_EPOCHS=%q: want a count of 4 or more", v)
		}
		epochs = n
	}
	t0 := time.Now()
	if out, err := kc(userTrainJob(node, epochs), "apply", "-f", "-"); err != nil {
		t.Fatalf("cleo submits the training Job: %v\n%s", err, out)
	}
	var phases string
	waitFor(t, r.ctx, 20*time.Minute, "a running pod of the training Job (the image's pull first)", func() bool {
		out, err := kc("", "get", "pods", "-n", "alpha", "-l", "job-name=train", "-o", "jsonpath={.items[*].status.phase}")
		phases = out
		return err == nil && strings.Contains(out, "Running")
	}, func() string {
		d, _ := kc("", "describe", "pods", "-n", "alpha", "-l", "job-name=train")
		w, _ := kc("", "get", "workloads", "-n", "alpha", "-o", "wide")
		return "phases: " + phases + "\n" + d + "\n" + w
	})
	t.Logf("the training Job's pod is running %s after the Job was submitted (admission and the image's pull)", time.Since(t0).Round(time.Second))
	first := awaitTrainingLine(t, r, kc, "train", "", regexp.MustCompile(`(?m)^epoch [2-9]\d* loss `), 30*time.Minute)
	t.Logf("train's pod %s has saved a checkpoint after epoch 2 or later, %s after the Job was submitted (the pull included)", first, time.Since(t0).Round(time.Second))
	if ts, err := kc("", "logs", "--timestamps", "-n", "alpha", first); err == nil {
		t.Logf("pod %s's log so far, with kubelet's timestamps:\n%s", first, ts)
	}
	if out, err := kc("", "delete", "-n", "alpha", "pod/"+first, "--wait=false"); err != nil {
		t.Fatalf("delete %s: %v\n%s", first, err, out)
	}
	second := awaitTrainingLine(t, r, kc, "train", first, regexp.MustCompile(`(?m)^saved the final model to /ckpt/model/digits.pt$`), 30*time.Minute)
	out, err := kc("", "logs", "-n", "alpha", second)
	if err != nil {
		t.Fatalf("kubectl logs %s: %v\n%s", second, err, out)
	}
	m := regexp.MustCompile(`(?m)^resuming from epoch (\d+)$`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("pod %s did not resume from the checkpoint:\n%s", second, out)
	}
	from, _ := strconv.Atoi(m[1])
	var seen []int
	for _, e := range regexp.MustCompile(`(?m)^epoch (\d+) loss `).FindAllStringSubmatch(out, -1) {
		n, _ := strconv.Atoi(e[1])
		seen = append(seen, n)
	}
	for i, n := range seen {
		if n != from+1+i {
			t.Fatalf("pod %s's epochs %v after resuming from epoch %d; want %d to %d in order", second, seen, from, from+1, epochs)
		}
	}
	if from < 2 || len(seen) == 0 || seen[len(seen)-1] != epochs {
		t.Fatalf("pod %s resumed from epoch %d and ran %v; want from epoch 2 or later to %d", second, from, seen, epochs)
	}
	requireLog(t, kc, "pod/"+second, "CUDA is not available", "computing on the CPU")
	if ts, err := kc("", "logs", "--timestamps", "-n", "alpha", second); err == nil {
		t.Logf("pod %s's log, with kubelet's timestamps:\n%s", second, ts)
	}
	last := regexp.MustCompile(`(?m)^epoch \d+ loss .*$`).FindAllString(out, -1)
	t.Logf("after %s was deleted, %s resumed from epoch %d and trained epochs %d to %d (simulated GPU: PyTorch on the CPU, as it says); its last line of the epochs: %q",
		first, second, from, from+1, epochs, last[len(last)-1])
}

// serveDeployment is cleo's serve Deployment of 2 replicas, reading the model from the
// checkpoints claim (read-only), and its Service.
func serveDeployment(node string) string {
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
      terminationGracePeriodSeconds: 5
      containers:
      - name: serve
        image: %s/alpha/serve:1.0
        env: [{name: MODEL_PATH, value: /ckpt/model/digits.pt}, {name: OMP_NUM_THREADS, value: "1"}]
        ports: [{containerPort: 8080}]
        resources: {requests: {cpu: 100m, memory: 256Mi}}
        readinessProbe: {httpGet: {path: /healthz, port: 8080}, periodSeconds: 3}
        volumeMounts: [{name: ckpt, mountPath: /ckpt, readOnly: true}]
      volumes: [{name: ckpt, persistentVolumeClaim: {claimName: checkpoints, readOnly: true}}]
---
apiVersion: v1
kind: Service
metadata: {name: serve, namespace: alpha}
spec:
  selector: {app: serve}
  ports: [{port: 80, targetPort: 8080}]
`, node, rackRegistry)
}

// userServe: both replicas ready; the first ten digits of the dataset asked through
// kubectl port-forward svc/serve each get a prediction, most of them right.
func userServe(t *testing.T, r *Rack, u *rackUser, kc func(string, ...string) (string, error), node string, digits []digitSample) {
	t0 := time.Now()
	if out, err := kc(serveDeployment(node), "apply", "-f", "-"); err != nil {
		t.Fatalf("cleo's serve Deployment: %v\n%s", err, out)
	}
	var last string
	waitFor(t, r.ctx, 15*time.Minute, "serve's 2 replicas ready", func() bool {
		out, err := kc("", "get", "deployment", "-n", "alpha", "serve", "-o", "jsonpath={.status.readyReplicas}")
		last = out
		return err == nil && out == "2"
	}, func() string {
		d, _ := kc("", "describe", "pods", "-n", "alpha", "-l", "app=serve")
		return "ready replicas: " + last + "\n" + d
	})
	t.Logf("serve's 2 replicas ready in %s (the pull included)", time.Since(t0).Round(time.Second))
	requireLog(t, kc, "deployment/serve", "CUDA is not available", "computing on the CPU")
	addr := portForward(t, r, u.kubeconfig, "alpha", "svc/serve", 80)
	client := &http.Client{Timeout: time.Minute, Transport: &http.Transport{DialContext: nsDial(r.ns)}}
	right := 0
	var answers []string
	for _, d := range digits {
		body, _ := json.Marshal(map[string][]int{"pixels": d.pixels})
		resp, err := client.Post("http://"+addr+"/predict", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatalf("POST /predict through kubectl port-forward svc/serve: %v", err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var p struct {
			Digit         int       `json:"digit"`
			Probabilities []float64 `json:"probabilities"`
		}
		if err := json.Unmarshal(b, &p); err != nil || resp.StatusCode != http.StatusOK || len(p.Probabilities) != 10 {
			t.Fatalf("POST /predict: %d %s (%v)", resp.StatusCode, b, err)
		}
		if p.Digit == d.label {
			right++
		}
		answers = append(answers, fmt.Sprintf("%d->%d", d.label, p.Digit))
	}
	t.Logf("serve's predictions for the dataset's first %d digits (label->answer): %s; %d right", len(digits), strings.Join(answers, " "), right)
	if right < len(digits)*7/10 {
		t.Errorf("%d of %d digits right; a trained model gets most of them", right, len(digits))
	}
}

// digitSample is one row of scikit-learn's digits dataset: 64 pixels and the digit.
type digitSample struct {
	pixels []int
	label  int
}

// digitsPath is the dataset inside python3-sklearn, as the train image ships it.
const digitsPath = "usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz"

// digitsSamples reads the first n rows of the digits dataset from the train image's
// archive (its layers, gzip tars, are searched for digitsPath).
func digitsSamples(t *testing.T, archive string, n int) []digitSample {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	outer := tar.NewReader(f)
	for {
		h, err := outer.Next()
		if errors.Is(err, io.EOF) {
			t.Fatalf("%s: no layer holds %s", archive, digitsPath)
		}
		if err != nil {
			t.Fatalf("%s: %v", archive, err)
		}
		if !strings.HasPrefix(h.Name, "blobs/") || h.Size < 1<<20 {
			continue
		}
		if data, ok := fileInLayer(outer, digitsPath); ok {
			return parseDigits(t, data, n)
		}
	}
}

// fileInLayer reads path from a gzip tar layer; false when r is not one or lacks it.
func fileInLayer(r io.Reader, path string) ([]byte, bool) {
	z, err := gzip.NewReader(r)
	if err != nil {
		return nil, false
	}
	layer := tar.NewReader(z)
	for {
		h, err := layer.Next()
		if err != nil {
			return nil, false
		}
		if strings.TrimPrefix(h.Name, "./") == path {
			b, err := io.ReadAll(layer)
			return b, err == nil
		}
	}
}

// parseDigits parses the gzip CSV of the dataset: 64 pixels and the label a row.
func parseDigits(t *testing.T, data []byte, n int) []digitSample {
	t.Helper()
	z, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	rows := csv.NewReader(z)
	var out []digitSample
	for len(out) < n {
		rec, err := rows.Read()
		if err != nil {
			t.Fatalf("%s: row %d: %v", digitsPath, len(out)+1, err)
		}
		if len(rec) != 65 {
			t.Fatalf("%s: row %d has %d fields; want 65", digitsPath, len(out)+1, len(rec))
		}
		var s digitSample
		for i, v := range rec {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				t.Fatalf("%s: row %d: %v", digitsPath, len(out)+1, err)
			}
			if i == 64 {
				s.label = int(f)
			} else {
				s.pixels = append(s.pixels, int(f))
			}
		}
		out = append(out, s)
	}
	return out
}
