// Package demo runs `make demo`'s script, hack/rack-demo.sh, as a test: a small rack of
// simulated GPU servers (real gpuagent processes on the GPU simulator) powered on
// against the real control plane and the real gpuboot, so the README's main command
// cannot rot.
package demo

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gpurack/gpurack/internal/testreq"
)

// TestRackDemo powers on 4 servers: slot 2 starts with an XID 79 on GPU 3 and must be
// quarantined with gpurack.io/unvalidated kept; slot 3 gets an uncorrectable ECC error
// once the rack is ready, which withdraws that one GPU (7 allocatable, no taint); the
// totals are 3 ready, 1 quarantined, 4×8−8−1 GPUs allocatable; an 8-GPU pod must be
// bound to neither. Then `clean` must stop every process it started.
func TestRackDemo(t *testing.T) {
	testreq.Short(t, "the rack demo (a control plane, gpuboot and 4 agents)")
	for _, tool := range []string{"kubectl", "grpcurl", "kube-apiserver", "etcd", "kueue", "ss", "go"} {
		testreq.Tool(t, tool, "run make deps and make k8s-bins (make test puts the pinned binaries on PATH)")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", bin+"/", "./imagebuilder/cmd/gpuimage", "./pxe/cmd/gpuboot",
		"./agent/cmd/gpuagent", "./controlplane-bootstrap/cmd/controlplane-bootstrap")
	build.Dir, build.Env = root, append(os.Environ(), "CGO_ENABLED=1")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	work := filepath.Join(t.TempDir(), "demo")
	shift := freeShift(t, 4)
	env := append(os.Environ(), "GPURACK_BIN="+bin, "PATH="+bin+":"+os.Getenv("PATH"), "NODES=4", "QUARANTINE_SLOT=2", "ECC_SLOT=3",
		"DEMO_DIR="+work, fmt.Sprintf("DEMO_PORT_SHIFT=%d", shift), "DEMO_TIMEOUT=300", "DEMO_WORKLOADS=1")
	run := func(args ...string) (string, error) {
		cmd := exec.Command(filepath.Join(root, "hack", "rack-demo.sh"), args...)
		cmd.Dir, cmd.Env = root, env
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		return out.String(), err
	}
	t.Cleanup(func() { run("clean") })
	out, err := run()
	if err != nil {
		t.Fatalf("rack-demo.sh: %v\n%s\ngpuboot log:\n%s", err, out, tail(filepath.Join(work, "gpuboot.log")))
	}
	t.Logf("rack-demo.sh output:\n%s", out)
	for _, want := range []string{
		"all 4 machines commissioned",
		"4 machines (quarantined 1, ready 3)",
		"JSON: " + filepath.Join(work, "rack-r1.json"),
		"enrollment.allowSimulated: true lets them be ready",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the demo's output lacks %q", want)
		}
	}
	if !regexp.MustCompile(`quarantined\s+r1\s+02\s+gpu-r1-02`).MatchString(out) {
		t.Error("slot 2 (XID 79 on GPU 3 at power-on) was not shown quarantined")
	}
	if !regexp.MustCompile(`gpu-r1-02\s+7\s+\S*gpurack.io/unvalidated`).MatchString(out) {
		t.Error("the quarantined node does not show 7 GPUs (GPU 3 withdrawn) and keep gpurack.io/unvalidated in kubectl get nodes")
	}
	m := regexp.MustCompile(`train-8gpu bound to (gpu-r1-\d+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatal("the 8-GPU pod was not reported bound")
	}
	if m[1] == "gpu-r1-02" || m[1] == "gpu-r1-03" {
		t.Errorf("the 8-GPU pod was bound to %s, a node with a bad GPU", m[1])
	}
	checkWorkloadsDemo(t, out, m[1])
	// Slot 3's uncorrectable ECC error withdraws GPU 5 alone: 7 allocatable, no taint,
	// and the checklist says which GPU and why (decision 0630).
	for _, want := range []string{
		"gpu-r1-03: allocatable nvidia.com/gpu 8 -> 7 after",
		"Nodes ready: 3. Nodes quarantined: 1. GPUs allocatable: 23.",
		// Every GPU of the demo is simulated, and the checklist says so beside the totals.
		"Simulated, not hardware (GPU simulator): ",
		"3 of the 3 ready nodes, 23 of the 23 allocatable GPUs. Real GPUs: 0, 0 allocatable.",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the demo's output lacks %q", want)
		}
	}
	if !regexp.MustCompile(`- ready 03 gpu-r1-03, 7 GPUs allocatable: GPU 5 withdrawn \(gpu\.ecc\.uncorrected: `).MatchString(out) {
		t.Error("the checklist does not show slot 3's GPU 5 withdrawn with its reason")
	}
	if line := regexp.MustCompile(`(?m)^gpu-r1-03\s.*$`).FindString(out); !regexp.MustCompile(`^gpu-r1-03\s+7\s`).MatchString(line) || strings.Contains(line, "gpu-unhealthy") {
		t.Errorf("kubectl get nodes shows slot 3 as %q; want 7 GPUs and no gpurack.io/gpu-unhealthy taint", line)
	}
	js, err := os.ReadFile(filepath.Join(work, "rack-r1.json"))
	if err != nil {
		t.Fatalf("no JSON report: %v", err)
	}
	var report struct {
		Totals map[string]int `json:"totals"`
	}
	if err := json.Unmarshal(js, &report); err != nil {
		t.Fatalf("JSON report: %v", err)
	}
	// 4 × 8 GPUs, less the quarantined node's 8, less the one withdrawn.
	if tot := report.Totals; tot["nodesReady"] != 3 || tot["nodesQuarantined"] != 1 || tot["gpusAllocatable"] != 4*8-8-1 {
		t.Errorf("JSON totals %v; want nodesReady 3, nodesQuarantined 1, gpusAllocatable %d", tot, 4*8-8-1)
	}

	if out, err := run("clean"); err != nil {
		t.Fatalf("rack-demo.sh clean: %v\n%s", err, out)
	}
	if _, err := os.Stat(work); !os.IsNotExist(err) {
		t.Errorf("clean left %s behind (%v)", work, err)
	}
	// Nothing listens on the demo's ports any more.
	for _, p := range []int{26443, 28443, 29101, 29301, 9443} {
		addr := fmt.Sprintf("127.0.0.1:%d", p+shift)
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			t.Errorf("after clean something still listens on %s", addr)
		}
	}
}

// checkWorkloadsDemo: step 8 (DEMO_WORKLOADS=1). Alpha's three 4-GPU Jobs and beta's
// 2-GPU Job are admitted and bound to ready nodes with room (never the quarantined
// slot 2, never eight's node, which train-8gpu fills); alpha's 9-GPU pod waits with
// Kueue's topology reason; alpha borrows 4 of beta's GPUs.
func checkWorkloadsDemo(t *testing.T, out, full string) {
	t.Helper()
	for _, job := range []string{"alpha/train-1 (4 GPUs)", "alpha/train-2 (4 GPUs)", "alpha/train-3 (4 GPUs)", "beta/train-b (2 GPUs)"} {
		m := regexp.MustCompile(regexp.QuoteMeta(job) + `: admitted, its pod placed by Kueue and bound to (gpu-r1-\d+)`).FindStringSubmatch(out)
		if m == nil {
			t.Errorf("the workloads demo does not show %s admitted and bound", job)
			continue
		}
		if m[1] == "gpu-r1-02" || m[1] == full {
			t.Errorf("%s was bound to %s, which is quarantined or full", job, m[1])
		}
	}
	if !regexp.MustCompile(`alpha/big waits in alpha's queue, suspended, not refused. Kueue's reason: .*topology "gpurack-nodes" doesn't allow to fit any of 1 pod\(s\).*resource "nvidia.com/gpu": 3`).MatchString(out) {
		t.Error("the 9-GPU Job is not shown waiting with Kueue's topology reason (3 ready nodes short of GPUs)")
	}
	if !regexp.MustCompile(`alpha\s.*admitted 3, pending 1, GPUs 12 \(borrowed 4\)`).MatchString(out) {
		t.Error("tenants status does not show alpha borrowing 4 GPUs with 3 Jobs admitted and 1 waiting")
	}
}

// freeShift picks a DEMO_PORT_SHIFT under which every port the demo uses for n nodes
// is free now, so the test does not collide with the demo or other tests' servers.
func freeShift(t *testing.T, n int) int {
	t.Helper()
	bases := []int{26443, 22379, 22380, 22381, 30257, 30259, 28080, 28443, 9443, 9444, 9445}
	for i := 1; i <= n; i++ {
		bases = append(bases, 29100+i, 29300+i)
	}
	for range 50 {
		// Below 32768, where Linux starts handing out ephemeral ports.
		shift := 100 + rand.IntN(2300)
		free := true
		for _, b := range bases {
			l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", b+shift))
			if err != nil {
				free = false
				break
			}
			l.Close()
		}
		if free {
			return shift
		}
	}
	t.Fatal("no free set of ports for the demo in 50 tries")
	return 0
}

func tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}
