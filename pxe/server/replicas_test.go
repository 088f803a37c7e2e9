package server_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster"
	"github.com/gpurack/gpurack/pxe/inventory/kubestore"
)

// replicaConfig is what both replicas of the storm test add to gpuboot.yaml: the
// cluster store, automatic approval, and limits no storm of 50 reaches.
func replicaConfig(kubeconfig string) string {
	return "cluster: {kubeconfig: " + kubeconfig + "}\ninventory: {store: cluster}\npolicy: {approval: auto}\n" +
		"enrollment: {createRate: 10000, createBurst: 10000, sourceRate: 10000, sourceBurst: 10000}\n"
}

// newReplica is a second gpuboot of in's: the same state directory (CA, server
// certificate, gossip keys, operator credentials), copied as docs/operations.md says,
// and its own listeners.
func newReplica(t *testing.T, in *instance, extra string) *instance {
	t.Helper()
	r := newInstance(t, extra)
	state := filepath.Join(r.dir, "state")
	if err := os.RemoveAll(state); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cp", "-a", filepath.Join(in.dir, "state"), state).CombinedOutput(); err != nil {
		t.Fatalf("copy the state directory: %v\n%s", err, out)
	}
	r.pin = in.pin
	return r
}

// leaseHolder reads the node controller's Lease.
func leaseHolder(t *testing.T, admin kubernetes.Interface) string {
	t.Helper()
	l, err := admin.CoordinationV1().Leases(kubestore.LeaseNamespace).Get(context.Background(), kubestore.LeaseName, metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// errBundleLost: the bundle was released to the agent's key but the answer never
// reached it (the replica died after the release was recorded). As enroll.proto says,
// the agent is stuck until an operator re-approves it or it reboots with a new key.
var errBundleLost = errors.New("the JoinBundle was released to this key, and its answer lost")

// stormAgent enrolls one simulated machine against whichever replica answers: Register
// until approved, then GetJoinBundle. It counts the bundles it was given.
type stormAgent struct {
	a       *testAgent
	bundles atomic.Int32
	err     error
}

// reapproveLost takes the documented way out for the agents whose bundle answer died
// with the killed replica: an operator re-approves them at the survivor, and they fetch
// a new bundle with a new token. Any other enrollment error fails the test. It returns
// the MACs re-approved.
func reapproveLost(t *testing.T, ctx context.Context, survivor *instance, agents []*stormAgent) map[string]bool {
	t.Helper()
	lost := map[string]bool{}
	c := []bootv1.EnrollmentServiceClient{survivor.enrollClient()}
	for i, s := range agents {
		switch {
		case errors.Is(s.err, errBundleLost):
			mac := s.a.facts.Identity.BootMac
			lost[mac] = true
			survivor.cli("machines", "approve", mac, "--reason", "its JoinBundle answer was lost with a killed gpuboot replica")
			if err := s.enroll(ctx, c, 0); err != nil {
				t.Errorf("machine %d after re-approval: %v", i, err)
			}
		case s.err != nil:
			t.Errorf("machine %d: %v", i, s.err)
		}
	}
	t.Logf("figure: %d of %d machines had their JoinBundle released by the killed replica with the answer lost; re-approved by the operator, each got one bundle", len(lost), len(agents))
	return lost
}

func (s *stormAgent) enroll(ctx context.Context, clients []bootv1.EnrollmentServiceClient, first int) error {
	var last error
	for try := 0; try < 60; try++ {
		c := clients[(first+try)%len(clients)]
		r, err := s.a.register(ctx, c)
		if r.GetStatus() == bootv1.RegisterStatus_REGISTER_STATUS_BUNDLE_RELEASED && s.bundles.Load() == 0 {
			return errBundleLost
		}
		if err != nil || r.Status != bootv1.RegisterStatus_REGISTER_STATUS_APPROVED {
			last = fmt.Errorf("register: %v %v", r.GetStatus(), err)
			time.Sleep(200 * time.Millisecond)
			continue
		}
		req := &bootv1.GetJoinBundleRequest{Token: r.Token, Signature: bootv1.SignJoinBundle(s.a.key, r.Challenge, r.Token)}
		bootv1.SignRequest(s.a.key, bootv1.EnrollmentService_GetJoinBundle_FullMethodName, req, time.Now())
		if _, err := c.GetJoinBundle(ctx, req); err != nil {
			last = fmt.Errorf("join bundle: %v", err)
			if status.Code(err) == codes.FailedPrecondition {
				return last // released already: the agent would never get a second
			}
			time.Sleep(200 * time.Millisecond)
			continue
		}
		s.bundles.Add(1)
		// A second redemption of the same token, at the other replica, is refused.
		again := &bootv1.GetJoinBundleRequest{Token: r.Token, Signature: req.Signature}
		bootv1.SignRequest(s.a.key, bootv1.EnrollmentService_GetJoinBundle_FullMethodName, again, time.Now())
		if _, err := clients[(first+try+1)%len(clients)].GetJoinBundle(ctx, again); err == nil {
			s.bundles.Add(1)
		}
		return nil
	}
	return last
}

// stormRuns counts the storm's runs in this process (go test -count=N).
var stormRuns atomic.Int32

// TestReplicasEnrollmentStorm runs two gpuboot replicas on the cluster store against a
// real apiserver; 50 simulated machines enroll through both at once, and the replica
// holding the node controller's Lease is killed with SIGKILL during the storm. Every
// machine enrolls, each identity is one Machine, no JoinBundle is released twice, and
// the Lease moves to the surviving replica within its duration (15 s) and a retry.
func TestReplicasEnrollmentStorm(t *testing.T) {
	c := testcluster.Shared(t)
	admin := c.Clientset(t)
	a := newInstance(t, replicaConfig(c.EnrollerKubeconfig))
	b := newReplica(t, a, replicaConfig(c.EnrollerKubeconfig))
	a.start()
	b.start()
	// A replica of an earlier run in this cluster may still hold the Lease until it
	// expires: wait for one of these two.
	first := waitHolder(t, admin, 40*time.Second, a, b)
	holder, survivor := a, b
	if isHolder(first, b) {
		holder, survivor = b, a
	}
	clients := []bootv1.EnrollmentServiceClient{a.enrollClient(), b.enrollClient()}
	base := 0x0a00 + 64*int(stormRuns.Add(1)) // machines of their own in the shared cluster
	agents := make([]*stormAgent, 50)
	var wg sync.WaitGroup
	var done atomic.Int32
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for i := range agents {
		agents[i] = &stormAgent{a: newTestAgent(base + i)}
		wg.Go(func() {
			agents[i].err = agents[i].enroll(ctx, clients, i)
			done.Add(1)
		})
	}
	for done.Load() < 10 && ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond)
	}
	killed := time.Now()
	holder.kill9()
	t.Logf("killed the Lease holder (%s) with %d of 50 machines enrolled", first, done.Load())
	wg.Wait()
	lost := reapproveLost(t, ctx, survivor, agents)
	next := waitHolder(t, admin, 40*time.Second, survivor)
	moved := time.Since(killed)
	t.Logf("figure: the node controller's Lease moved from %s to %s %.1f s after its holder was killed (lease 15 s, retry 2 s)", first, next, moved.Seconds())
	if moved > 15*time.Second+6*2*time.Second {
		t.Errorf("the Lease moved %s after the kill: more than its duration (15 s) and six retries (2 s)", moved)
	}
	checkStormInventory(t, survivor, agents, lost)
	// The killed replica comes back: both read the same rack report.
	holder.start()
	generated := regexp.MustCompile(`Generated [^ ]+`)
	ra := generated.ReplaceAllString(a.cli("rack", "report", "r1"), "")
	rb := generated.ReplaceAllString(b.cli("rack", "report", "r1"), "")
	if ra != rb || !strings.Contains(ra, "machines") {
		t.Errorf("the two replicas' rack reports differ, or miss the 50 machines:\n%s\n---\n%s", ra, rb)
	}
}

// isHolder reports whether the Lease holder identity holder (HOST_PID_RANDOM) is in's.
func isHolder(holder string, in *instance) bool {
	return strings.Contains(holder, fmt.Sprintf("_%d_", in.cmd.Process.Pid))
}

// waitHolder waits until one of ins holds the Lease, and returns its identity.
func waitHolder(t *testing.T, admin kubernetes.Interface, within time.Duration, ins ...*instance) string {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		h := leaseHolder(t, admin)
		for _, in := range ins {
			if isHolder(h, in) {
				return h
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("none of the replicas holds %s/%s after %s (holder %q)", kubestore.LeaseNamespace, kubestore.LeaseName, within, h)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// checkStormInventory checks, through the surviving replica's operator API, that each
// agent got exactly one JoinBundle and is one machine, joining, whose history records
// one release per token redeemed.
func checkStormInventory(t *testing.T, survivor *instance, agents []*stormAgent, lost map[string]bool) {
	t.Helper()
	byMAC := map[string][]*bootv1.Machine{}
	for _, m := range survivor.listMachines() {
		byMAC[m.GetIdentity().GetBootMac()] = append(byMAC[m.GetIdentity().GetBootMac()], m)
	}
	for i, s := range agents {
		mac := s.a.facts.Identity.BootMac
		if n := s.bundles.Load(); n != 1 {
			t.Errorf("machine %d (%s) was given %d JoinBundles, want 1", i, mac, n)
		}
		ms := byMAC[mac]
		if len(ms) != 1 {
			t.Errorf("machine %d (%s) is %d machines in the inventory, want 1", i, mac, len(ms))
			continue
		}
		if ms[0].State != bootv1.MachineState_MACHINE_STATE_JOINING {
			t.Errorf("machine %d (%s) is %s, want joining", i, mac, ms[0].State)
		}
		// One release per token: a second for the machines whose first answer was lost
		// and an operator re-approved.
		want := 1
		if lost[mac] {
			want = 2
		}
		out := survivor.cli("machines", "history", ms[0].Id)
		if n := strings.Count(out, "JoinBundle released"); n != want {
			t.Errorf("machine %d's history records %d releases, want %d:\n%s", i, n, want, out)
		}
	}
}
