package main

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/gpurack/gpurack/controlplane-bootstrap/auditlog"
)

// checkAuditBreakGlass makes, as the cluster admin against the running apiserver of
// dir, the requests a break-glass session makes (a kubectl debug node pod created, an
// exec into it, the node proxy), then reads them back with `audit break-glass`: the
// real apiserver's audit log, through the real CLI. TestCLIEndToEnd calls it.
func checkAuditBreakGlass(t *testing.T, dir string) {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(dir, "admin.conf"))
	if err != nil {
		t.Fatal(err)
	}
	cs := kubernetes.NewForConfigOrDie(cfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "node-debugger-gpu-r1-07-abcde", Namespace: "default"},
		Spec: corev1.PodSpec{NodeName: "gpu-r1-07", HostPID: true, Containers: []corev1.Container{{Name: "debugger", Image: "gpurack.io/debug:v1"}}}}
	if _, err := cs.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The node does not exist: the exec and the proxy fail after the audit filter logged them.
	cs.CoreV1().RESTClient().Post().Namespace("default").Resource("pods").Name(pod.Name).SubResource("exec").
		Param("command", "journalctl").Param("command", "-b").Param("stdout", "true").Do(ctx)
	cs.CoreV1().RESTClient().Get().Resource("nodes").Name("gpu-r1-07").SubResource("proxy").Suffix("logs/").Do(ctx)

	out, err := cli(t, "", "audit", "break-glass", "--dir", dir, "--since", "1h", "--json")
	if err != nil {
		t.Fatalf("audit break-glass: %v\n%s", err, out)
	}
	var got []auditlog.Access
	if err := json.Unmarshal([]byte(out[strings.Index(out, "["):]), &got); err != nil {
		t.Fatalf("audit break-glass --json: %v\n%s", err, out)
	}
	want := map[string]string{"debug-node-pod": "default/" + pod.Name, "exec": "default/" + pod.Name, "node-proxy": "gpu-r1-07"}
	for _, a := range got {
		if want[a.Action] == a.Target && a.User == "kubernetes-admin" && !a.Time.Before(start.Add(-time.Second)) {
			delete(want, a.Action)
		}
		if a.Action == "exec" && a.Command != "journalctl -b" {
			t.Errorf("exec command %q, want journalctl -b", a.Command)
		}
	}
	if len(want) > 0 {
		t.Errorf("the audit log lacks %v (by kubernetes-admin, since the test began); it gave:\n%s", want, out)
	}
	if out, err := cli(t, "", "audit", "break-glass", "--dir", dir); err != nil || !strings.Contains(out, "TIME  ") || !strings.Contains(out, "debug-node-pod") {
		t.Errorf("audit break-glass table: %v\n%s", err, out)
	}
	cs.CoreV1().Pods("default").Delete(ctx, pod.Name, metav1.DeleteOptions{})
}
