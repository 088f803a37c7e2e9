package qemu

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpurack/gpurack/controlplane-bootstrap/auditlog"
	"github.com/gpurack/gpurack/internal/testreq"
	"github.com/gpurack/gpurack/test/rigimage"
)

// checkLogsExecAndBreakGlass runs, with the real kubectl as the cluster admin, what an
// operator does on a node that has no sshd (docs/operations.md, "Getting onto a node"):
// kubectl exec into a pod and kubectl logs of it; a one-off command and an interactive
// shell (under a pseudo-terminal, script(1)) through kubectl debug node with the
// preloaded debug image; the node's journal holding the sessions and the command typed
// in the shell; and controlplane-bootstrap audit break-glass naming the admin for each.
func checkLogsExecAndBreakGlass(t *testing.T, r *Rack, node *corev1.Node) {
	kubectl := testreq.Tool(t, "kubectl", "make k8s-bins puts the pinned kubectl in the tools directory")
	script := testreq.Tool(t, "script", "apt-get install bsdutils")
	start := time.Now()
	kc := func(stdin string, args ...string) (string, error) {
		cmd := r.env.Command(r.ns, kubectl, append([]string{"--kubeconfig", r.cp.adminKubeconfig, "--request-timeout=3m"}, args...)...)
		cmd.Stdin = strings.NewReader(stdin)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}

	// kubectl exec and kubectl logs: the apiserver reaches kubelet's streaming API.
	server := probePod(node, "kubectl-exec", "serve")
	server.Spec.RestartPolicy = corev1.RestartPolicyAlways
	if _, err := r.admin.CoreV1().Pods("default").Create(r.ctx, server, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer r.admin.CoreV1().Pods("default").Delete(r.ctx, server.Name, metav1.DeleteOptions{})
	if out, err := kc("", "wait", "--for=condition=Ready", "pod/kubectl-exec", "--timeout=3m"); err != nil {
		t.Fatalf("the kubectl-exec pod is not Ready: %v\n%s", err, out)
	}
	if out, err := kc("", "exec", "kubectl-exec", "--", "/probe", "resolve", "kubernetes.default.svc.cluster.local"); err != nil || !strings.Contains(out, "10.96.0.1") {
		t.Errorf("kubectl exec: %v\n%s", err, out)
	}

	// A one-off command through kubectl debug node: the debug image enters the node's
	// root, so the tools are the node's.
	pod := debugNode(t, kc, node.Name, "--arguments-only", "--", "sh", "-c", "uname -n; systemctl is-active gpuagent kubelet")
	waitPodDone(t, r, pod)
	if out, err := kc("", "logs", pod); err != nil || !strings.Contains(out, node.Name) || strings.Count(out, "active") != 2 {
		t.Errorf("kubectl logs of the debug pod (want the node's name %s from uname -n and two active units): %v\n%s", node.Name, err, out)
	}
	// The same output, shipped by the node's agent, from the central log store.
	checkCentralPodLogs(t, r, node.Name, "default", pod, []string{node.Name, "active"})

	// An interactive shell: kubectl gets a terminal from script(1); the typed line runs
	// on the node as root, and the next prompt sends it to the node's journal. (What
	// bash printed before kubectl attached, its first prompt, is not in the output.)
	cmd := r.env.Command(r.ns, script, "-qec", strings.Join([]string{kubectl, "--kubeconfig", r.cp.adminKubeconfig, "debug", "node/" + node.Name,
		"-it", "--profile=sysadmin", "--image=" + rigimage.DebugImage}, " "), "/dev/null")
	cmd.Stdin = strings.NewReader("echo BG-$(id -u)-MARK\nexit\n")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "BG-0-MARK") || !strings.Contains(string(out), "logout") {
		t.Errorf("interactive kubectl debug node (want the marker run as root, then the login shell's logout): %v\n%s", err, out)
	}
	shellPod := regexp.MustCompile(`node-debugger-\S+`).FindString(string(out))

	journal := debugNode(t, kc, node.Name, "--arguments-only", "--", "journalctl", "-t", "gpurack-break-glass", "-o", "cat", "--no-pager")
	waitPodDone(t, r, journal)
	got, err := kc("", "logs", journal)
	for _, want := range []string{"break-glass command started: sh -c uname -n; systemctl is-active gpuagent kubelet", "break-glass shell started: /bin/bash -l", "echo BG-$(id -u)-MARK"} {
		if err != nil || !strings.Contains(got, want) {
			t.Errorf("the node's journal (journalctl -t gpurack-break-glass) lacks %q: %v\n%s", want, err, got)
		}
	}
	for _, p := range []string{pod, shellPod, journal} {
		if p != "" {
			r.admin.CoreV1().Pods("default").Delete(r.ctx, p, metav1.DeleteOptions{})
		}
	}
	checkBreakGlassAudit(t, r, start, []string{pod, shellPod, journal})
	// The node's journal lines too, by node and syslog identifier.
	waitCentralLogs(t, r, "the break-glass journal lines of "+node.Name, []string{"break-glass command started", "break-glass shell started"},
		"--node", node.Name, "--identifier", "gpurack-break-glass", "--since", "30m")
}

// debugNode starts kubectl debug node/NAME with the debug image and the sysadmin
// profile, without attaching, and returns the pod it made.
func debugNode(t *testing.T, kc func(string, ...string) (string, error), node string, args ...string) string {
	t.Helper()
	out, err := kc("", append([]string{"debug", "node/" + node, "--profile=sysadmin", "--image=" + rigimage.DebugImage}, args...)...)
	pod := regexp.MustCompile(`node-debugger-\S+`).FindString(out)
	if err != nil || pod == "" {
		t.Fatalf("kubectl debug node/%s: %v\n%s", node, err, out)
	}
	return pod
}

// waitPodDone waits until pod has ended; a failed pod fails t with its log.
func waitPodDone(t *testing.T, r *Rack, pod string) {
	t.Helper()
	var p *corev1.Pod
	waitFor(t, r.ctx, 6*time.Minute, "debug pod "+pod+" ended", func() bool {
		var err error
		p, err = r.admin.CoreV1().Pods("default").Get(r.ctx, pod, metav1.GetOptions{})
		return err == nil && podEnd(p) != ""
	})
	if podEnd(p) == corev1.PodFailed {
		t.Fatalf("debug pod %s failed: %s%s", pod, podStatus(p), podLogs(r.ctx, r.admin, p))
	}
}

// checkBreakGlassAudit reads the control plane's audit log with the real CLI: each debug
// pod was created by the cluster admin, and the interactive one attached to.
func checkBreakGlassAudit(t *testing.T, r *Rack, start time.Time, pods []string) {
	t.Helper()
	out, err := exec.Command(r.bins.controlplane, "audit", "break-glass", "--dir", r.cp.dir, "--json").Output()
	if err != nil {
		t.Fatalf("controlplane-bootstrap audit break-glass: %v\n%s", err, out)
	}
	var accesses []auditlog.Access
	if err := json.Unmarshal(out, &accesses); err != nil {
		t.Fatalf("audit break-glass --json: %v\n%s", err, out)
	}
	seen := map[string]bool{}
	for _, a := range accesses {
		if a.User == "kubernetes-admin" && !a.Time.Before(start.Add(-time.Second)) {
			seen[a.Action+" "+a.Target] = true
		}
	}
	want := []string{"exec default/kubectl-exec", "attach default/" + pods[1]}
	for _, p := range pods {
		want = append(want, "debug-node-pod default/"+p)
	}
	for _, w := range want {
		if !seen[w] {
			t.Errorf("audit break-glass lacks %q by kubernetes-admin:\n%s", w, out)
		}
	}
	t.Logf("audit break-glass: %d requests since the check began (%s)", len(seen), fmt.Sprint(want))
}
