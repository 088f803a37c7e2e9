package nodecontrol_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	machinev1 "github.com/gpurack/gpurack/api/machine/v1"
	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster"
	"github.com/gpurack/gpurack/internal/nodecontract"
	"github.com/gpurack/gpurack/internal/pki"
	"github.com/gpurack/gpurack/internal/testreq"
	"github.com/gpurack/gpurack/pxe/bmc"
	"github.com/gpurack/gpurack/pxe/bmc/redfishtest"
	"github.com/gpurack/gpurack/pxe/enroll"
	"github.com/gpurack/gpurack/pxe/httpboot"
	"github.com/gpurack/gpurack/pxe/httpboot/imagetest"
	"github.com/gpurack/gpurack/pxe/identity"
	"github.com/gpurack/gpurack/pxe/inventory"
	"github.com/gpurack/gpurack/pxe/nodecontrol"
	"github.com/gpurack/gpurack/pxe/policy"
	"github.com/gpurack/gpurack/pxe/rollout"
)

// rolloutRack is a simulated rack for rollouts (docs/testing.md names it): the real
// enrollment service, node controller and rollout controller against the real
// apiserver with the enroller credential, a real signed image store, and per machine
// a Redfish test BMC whose power cycle "reboots" the machine: a new agent key and boot
// id register, redeem a JoinBundle, the Node reports the new boot id (as kubelet
// does), and the machine reports its commissioning checklist, failing when it booted
// the image the test marks bad. The enrollment clock jumps past KeyLiveness at each
// reboot, as the minutes a real server takes to boot do, so the new key re-enrolls.
type rolloutRack struct {
	t        testing.TB
	admin    kubernetes.Interface
	svc      *enroll.Service
	ctl      *rollout.Controller
	machines []*simMachine
	offset   atomic.Int64 // enrollment clock offset, ns
	bootMu   sync.Mutex   // one simulated reboot's clock jump and token redemption at a time
	imgA     string       // the rack's default image
	imgB     string
	imgBad   string // machines that boot it fail commissioning
	store    string
	images   *httpboot.Handler
	inv      *inventory.BoltStore
}

// simMachine is one simulated server of the rack.
type simMachine struct {
	r     *rolloutRack
	id    *machinev1.MachineIdentity
	node  string
	bmc   *redfishtest.Server
	mu    sync.Mutex
	key   ed25519.PrivateKey
	boots int
}

func (r *rolloutRack) now() time.Time { return time.Now().Add(time.Duration(r.offset.Load())) }

func newRolloutRack(t *testing.T, n int) *rolloutRack {
	c := testcluster.Shared(t)
	cluster, err := nodecontrol.Load(c.EnrollerKubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	admin, err := kubernetes.NewForConfig(c.RESTConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	r := &rolloutRack{t: t, admin: admin}
	r.writeImages(t)
	suffix := time.Now().UnixNano() % 1e6
	manifest := "serial,mac,bmc\n"
	var caPEM []byte
	for i := 1; i <= n; i++ {
		m := &simMachine{r: r, id: &machinev1.MachineIdentity{BootMac: fmt.Sprintf("52:54:00:dd:%02x:%02x", suffix%250, i), Serial: fmt.Sprintf("RO-%d-%d", suffix, i)},
			node: fmt.Sprintf("ro-%d-%d", suffix, i)}
		m.bmc = redfishtest.New(t, redfishtest.Config{PowerDelay: 20 * time.Millisecond, OnReset: func(string) { go m.reboot() }})
		manifest += fmt.Sprintf("%s,%s,%s\n", m.id.Serial, m.id.BootMac, m.bmc.URL)
		caPEM = append(caPEM, m.bmc.CAPEM()...)
		r.machines = append(r.machines, m)
	}
	list, err := policy.ParseList("rack-ro.csv", strings.NewReader(manifest))
	if err != nil {
		t.Fatal(err)
	}
	creds, err := bmc.ParseCredentials("bmc-credentials.yaml", fmt.Appendf(nil, "default:\n  username: admin\n  password: redfishtest\n  ca: |\n    %s\n",
		strings.ReplaceAll(strings.TrimSpace(string(caPEM)), "\n", "\n    ")))
	if err != nil {
		t.Fatal(err)
	}
	r.startServices(t, cluster, list, creds)
	for _, m := range r.machines {
		m.enroll()
	}
	return r
}

// writeImages makes the signed image store: A, B and Bad signed by the trusted key.
func (r *rolloutRack) writeImages(t *testing.T) {
	r.store = t.TempDir()
	pub, priv, _ := ed25519.GenerateKey(rand.Reader)
	var err error
	for i, p := range []*string{&r.imgA, &r.imgB, &r.imgBad} {
		if *p, err = imagetest.Write(r.store, priv, map[string][]byte{"cmdline": fmt.Appendf(nil, "console=ttyS0 image=%d\n", i)}); err != nil {
			t.Fatal(err)
		}
	}
	r.images, err = httpboot.NewHandler(httpboot.Config{ImageStore: r.store, TrustedKeys: []ed25519.PublicKey{pub}, BaseURL: "http://127.0.0.1:1",
		VerifiedCopies: t.TempDir()}, httpboot.BooterFunc(func(context.Context, identity.Identity, netip.Addr) (httpboot.Target, error) {
		return httpboot.Target{}, errors.New("the rollout rack does not network-boot")
	}))
	if err != nil {
		t.Fatal(err)
	}
}

// startServices starts the enrollment service, the node controller and the rollout
// controller.
func (r *rolloutRack) startServices(t *testing.T, cluster *nodecontrol.Cluster, list *policy.List, creds *bmc.Credentials) {
	ca, _ := pki.NewCA(pki.CARequest{CommonName: "gpurack test CA"})
	store, err := inventory.OpenBolt(filepath.Join(t.TempDir(), "inventory.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	r.inv = store
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	nodes := nodecontrol.NewQueue()
	r.svc, err = enroll.New(context.Background(), enroll.Config{
		Store: store, CA: ca, Cluster: cluster, Policy: policy.Policy{Mode: policy.Manual, List: list},
		Racks: map[string]enroll.Rack{"r1": {Name: "r1", GossipKey: make([]byte, 32), DefaultImage: r.imgA}}, DefaultRack: "r1", Log: log,
		Now: r.now, BMC: enroll.BMCAccess{Credentials: creds},
		OnChange: func(m *inventory.Machine) { nodes.Enqueue(m.NodeName) },
	})
	if err != nil {
		t.Fatal(err)
	}
	ctl := nodecontrol.NewController(cluster, r.svc, nodecontrol.Options{Queue: nodes, Log: log})
	r.ctl, err = rollout.New(rollout.Config{Machines: r.svc, Nodes: cluster, Images: r.images, Dir: filepath.Join(t.TempDir(), "rollouts"),
		Interval: 50 * time.Millisecond, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, run := range []func(context.Context){func(ctx context.Context) { ctl.Run(ctx) }, func(ctx context.Context) { r.ctl.Run(ctx) }, r.kubelet} {
		wg.Add(1)
		go func() { defer wg.Done(); run(ctx) }()
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
}

// kubelet stands in for the machines' kubelets in one respect: a pod being deleted on
// one of the rack's Nodes goes once its grace period would start (its containers
// stopped), as kubelet confirms it with a delete of grace period 0.
func (r *rolloutRack) kubelet(ctx context.Context) {
	for ctx.Err() == nil {
		pods, err := r.admin.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "gpurack-test=rollout"})
		if err == nil {
			for _, p := range pods.Items {
				if p.DeletionTimestamp != nil {
					r.admin.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, *metav1.NewDeleteOptions(0))
				}
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// register registers key with bootID and returns gpuboot's answer.
func (m *simMachine) register(key ed25519.PrivateKey, bootID string) (*bootv1.RegisterResponse, error) {
	req := &bootv1.RegisterRequest{Facts: &machinev1.MachineFacts{Identity: m.id, Ips: []string{"192.0.2.60"}, BootId: bootID}, PublicKey: key.Public().(ed25519.PublicKey)}
	bootv1.SignRequest(key, bootv1.EnrollmentService_Register_FullMethodName, req, m.r.now())
	return m.r.svc.Register(context.Background(), req)
}

// join redeems the approved registration's JoinBundle, lets the Node report bootID
// (creating it on the first boot, as kubelet registers it), waits for commissioning and
// reports the checklist: failing on the image the rack marks bad.
func (m *simMachine) join(key ed25519.PrivateKey, bootID string, resp *bootv1.RegisterResponse) error {
	if err := m.redeem(key, bootID, resp); err != nil {
		return err
	}
	return m.commission(key, bootID)
}

// redeem redeems the approved registration's JoinBundle.
func (m *simMachine) redeem(key ed25519.PrivateKey, bootID string, resp *bootv1.RegisterResponse) error {
	if resp.Status != bootv1.RegisterStatus_REGISTER_STATUS_APPROVED {
		return fmt.Errorf("%s boot %s: register answered %s (%s), want APPROVED", m.node, bootID, resp.Status, resp.Message)
	}
	req := &bootv1.GetJoinBundleRequest{Token: resp.Token, Signature: bootv1.SignJoinBundle(key, resp.Challenge, resp.Token)}
	bootv1.SignRequest(key, bootv1.EnrollmentService_GetJoinBundle_FullMethodName, req, m.r.now())
	if _, err := m.r.svc.GetJoinBundle(context.Background(), req); err != nil {
		return fmt.Errorf("%s: join bundle: %w", m.node, err)
	}
	return nil
}

// commission lets the Node report bootID, waits for commissioning and reports the
// checklist.
func (m *simMachine) commission(key ed25519.PrivateKey, bootID string) error {
	ctx := context.Background()
	if err := m.r.nodeBooted(m.node, bootID); err != nil {
		return err
	}
	deadline := time.Now().Add(30 * time.Second)
	for st, _, _ := m.r.svc.StateByNode(ctx, m.node); st != inventory.Commissioning; st, _, _ = m.r.svc.StateByNode(ctx, m.node) {
		if time.Now().After(deadline) {
			return fmt.Errorf("%s boot %s: not commissioning after 30 s (state %s)", m.node, bootID, st)
		}
		time.Sleep(20 * time.Millisecond)
	}
	mach, err := m.r.svc.Resolve(ctx, m.node)
	if err != nil {
		return err
	}
	st := machinev1.CheckStatus_CHECK_STATUS_PASS
	if mach.ImageID == m.r.imgBad {
		st = machinev1.CheckStatus_CHECK_STATUS_FAIL
	}
	rep := &bootv1.ReportCommissioningRequest{Report: &machinev1.Checklist{Identity: m.id, Phase: machinev1.CheckPhase_CHECK_PHASE_COMMISSIONING, Overall: st,
		ImageId: mach.ImageID, Results: []*machinev1.CheckResult{{Id: "gpu.count", Status: st}}}}
	bootv1.SignRequest(key, bootv1.EnrollmentService_ReportCommissioning_FullMethodName, rep, m.r.now())
	_, err = m.r.svc.ReportCommissioning(ctx, rep)
	return err
}

// nodeBooted creates the Node on a machine's first boot and sets its boot id, as
// kubelet does at every boot.
func (r *rolloutRack) nodeBooted(name, bootID string) error {
	ctx := context.Background()
	n, err := r.admin.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		n, err = r.admin.CoreV1().Nodes().Create(ctx, &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"gpurack.io/gpu.count": "1"}},
			Spec:       corev1.NodeSpec{Taints: []corev1.Taint{{Key: nodecontract.TaintUnvalidated, Effect: corev1.TaintEffectNoSchedule}}},
		}, metav1.CreateOptions{})
		if err != nil {
			return err
		}
	}
	for {
		n.Status.NodeInfo.BootID = bootID
		_, err = r.admin.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		if !apierrors.IsConflict(err) {
			return err
		}
		if n, err = r.admin.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{}); err != nil {
			return err
		}
	}
}

// enroll is the machine's first boot: registered, approved by an operator, joined,
// commissioned.
func (m *simMachine) enroll() {
	t := m.r.t
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	bootID := m.node + "-boot-0"
	if _, err := m.register(key, bootID); err != nil {
		t.Fatal(err)
	}
	if _, err := m.r.svc.Approve(context.Background(), m.id.BootMac, enroll.ApproveOptions{Actor: "operator:test", Reason: "test", NodeName: m.node}); err != nil {
		t.Fatal(err)
	}
	resp, err := m.register(key, bootID)
	if err == nil {
		err = m.join(key, bootID, resp)
	}
	if err != nil {
		t.Fatal(err)
	}
	m.key = key
}

// reboot is a power cycle: the machine comes back with a new key and boot id, after
// what gpuboot sees as the minutes a boot takes.
func (m *simMachine) reboot() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.boots++
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	bootID := fmt.Sprintf("%s-boot-%d", m.node, m.boots)
	// One machine at a time jumps the clock and redeems its token: another's jump
	// between this Register and its GetJoinBundle would expire the token.
	m.r.bootMu.Lock()
	m.r.offset.Add(int64(inventory.KeyLiveness + time.Minute))
	resp, err := m.register(key, bootID)
	if err == nil {
		err = m.redeem(key, bootID, resp)
	}
	m.r.bootMu.Unlock()
	if err == nil {
		err = m.commission(key, bootID)
	}
	if err != nil {
		m.r.t.Errorf("reboot of %s: %v", m.node, err)
		return
	}
	m.key = key
}

// machine is the inventory record of m.
func (r *rolloutRack) machine(m *simMachine) *inventory.Machine {
	mach, err := r.svc.Resolve(context.Background(), m.node)
	if err != nil {
		r.t.Fatal(err)
	}
	return mach
}

// wait polls the newest rollout until it is in state, and returns it.
func (r *rolloutRack) wait(state string) *rollout.Rollout {
	r.t.Helper()
	deadline := time.Now().Add(120 * time.Second)
	for {
		ro, err := r.ctl.Get("")
		if err != nil {
			r.t.Fatal(err)
		}
		if ro.State == state {
			return ro
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("rollout %s is %s (%s), not %s, after 120 s; machines: %s", ro.ID, ro.State, ro.Reason, state, phases(ro))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func phases(ro *rollout.Rollout) string {
	var out []string
	for _, s := range ro.Machines {
		out = append(out, fmt.Sprintf("%s:%s(%s)", s.Node, s.Phase, s.Message))
	}
	return strings.Join(out, " ")
}

// workload puts a pod on each Node that a drain must evict.
func (r *rolloutRack) workload() {
	// On a control plane that has just started, the service-account controller may not
	// have made default/default yet, and admission refuses pods until it has.
	deadline := time.Now().Add(60 * time.Second)
	for _, m := range r.machines {
		for {
			_, err := r.admin.CoreV1().Pods("default").Create(context.Background(), &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: "job-" + m.node, Labels: map[string]string{"gpurack-test": "rollout"}},
				Spec:       corev1.PodSpec{NodeName: m.node, Containers: []corev1.Container{{Name: "c", Image: "train:1"}}},
			}, metav1.CreateOptions{})
			if err == nil {
				break
			}
			if !strings.Contains(err.Error(), `serviceaccount "default" not found`) || time.Now().After(deadline) {
				r.t.Fatal(err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
}

// TestRolloutSimulatedRack rolls a simulated rack of five from image A to B (canary,
// then batches of two), then to a bad image whose canary fails commissioning and stops
// the rollout, then rolls that back; and refuses images it cannot serve before it
// touches a machine.
func TestRolloutSimulatedRack(t *testing.T) {
	r := newRolloutRack(t, 5)
	ctx := context.Background()
	r.workload()

	// Refused before any machine is touched: not in the store, and signed by an
	// untrusted key.
	_, other, _ := ed25519.GenerateKey(rand.Reader)
	unsigned, err := imagetest.Write(r.store, other, map[string][]byte{"cmdline": []byte("untrusted\n")})
	if err != nil {
		t.Fatal(err)
	}
	for _, img := range []string{strings.Repeat("e", 40), unsigned} {
		_, err := r.ctl.Start(ctx, rollout.Spec{Image: img, Match: map[string]string{"rack": "r1"}, Actor: "operator:test"})
		if !errors.Is(err, rollout.ErrPrecondition) || !strings.Contains(err.Error(), "no machine is touched") {
			t.Fatalf("rollout to %s: %v, want refused before touching a machine", img, err)
		}
	}
	for _, m := range r.machines {
		if n := len(m.bmc.Resets()); n != 0 {
			t.Fatalf("%s got %d resets from refused rollouts", m.node, n)
		}
	}

	start := time.Now()
	ro, err := r.ctl.Start(ctx, rollout.Spec{Image: r.imgB, Match: map[string]string{"rack": "r1"}, Canary: 1, BatchSize: 2, MaxUnavailable: 2,
		NodeTimeout: time.Minute, Actor: "operator:test", Reason: "driver update"})
	if err != nil {
		t.Fatal(err)
	}
	if ro.State != rollout.Running || len(ro.Machines) != 5 || ro.Machines[0].Previous != r.imgA || ro.Machines[4].Batch != 2 {
		t.Fatalf("started rollout: %s %s", ro.State, phases(ro))
	}
	pauseAndResume(t, r, ro.ID)
	ro = r.wait(rollout.Done)
	firstID := ro.ID
	t.Logf("rollout of %d machines, canary 1 then batches of 2: %s (simulated reboots)", len(ro.Machines), time.Since(start).Round(time.Millisecond))
	checkBatches(t, ro)
	for _, m := range r.machines {
		mach := r.machine(m)
		c := r.svc.ImageChoice(mach)
		if mach.ImageID != r.imgB || mach.State != inventory.Ready || c.Source != enroll.SourceRollout || c.Name != ro.ID {
			t.Errorf("%s after the rollout: image %s, state %s, choice %+v", m.node, mach.ImageID, mach.State, c)
		}
		if n, _ := r.admin.CoreV1().Nodes().Get(ctx, m.node, metav1.GetOptions{}); hasTaint(n, nodecontract.TaintRollout) || hasTaint(n, nodecontract.TaintUnvalidated) {
			t.Errorf("%s still tainted after the rollout: %v", m.node, n.Spec.Taints)
		}
		if len(m.bmc.Resets()) == 0 {
			t.Errorf("%s was never power-cycled", m.node)
		}
	}
	if pods, _ := r.admin.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "gpurack-test=rollout"}); len(pods.Items) != 0 {
		t.Errorf("%d workload pods were not drained", len(pods.Items))
	}

	// A bad image: the canary is quarantined, the rollout stops, the rest are untouched.
	resets := make([]int, len(r.machines))
	for i, m := range r.machines {
		resets[i] = len(m.bmc.Resets())
	}
	if _, err := r.ctl.Start(ctx, rollout.Spec{Image: r.imgBad, Match: map[string]string{"rack": "r1"}, BatchSize: 4, NodeTimeout: time.Minute, Actor: "operator:test"}); err != nil {
		t.Fatal(err)
	}
	ro = r.wait(rollout.Stopped)
	canary := ro.Machines[0]
	if canary.Phase != rollout.Failed || !strings.Contains(ro.Reason, "quarantined after booting image "+r.imgBad) {
		t.Fatalf("stopped rollout: %s; %s", ro.Reason, phases(ro))
	}
	for i, s := range ro.Machines[1:] {
		if s.Phase != rollout.Pending || len(r.machines[i+1].bmc.Resets()) != resets[i+1] {
			t.Errorf("%s was touched after the canary failed: %s", s.Node, s.Phase)
		}
	}
	if _, err := r.ctl.Start(ctx, rollout.Spec{Image: r.imgA, Match: map[string]string{"rack": "r1"}, Actor: "operator:test"}); !errors.Is(err, rollout.ErrPrecondition) {
		t.Fatalf("a second rollout while one is stopped: %v", err)
	}

	// Roll back: the canary returns to B; nothing else moves.
	if _, err := r.ctl.Rollback("", "operator:test", "bad driver"); err != nil {
		t.Fatal(err)
	}
	ro = r.wait(rollout.RolledBack)
	cm := r.machine(r.machines[0])
	if ro.Machines[0].Phase != rollout.Ready || cm.ImageID != r.imgB || cm.State != inventory.Ready {
		t.Fatalf("after the rollback: %s; canary image %s state %s", phases(ro), cm.ImageID, cm.State)
	}
	for _, s := range ro.Machines[1:] {
		if s.Phase != rollout.Skipped {
			t.Errorf("rollback touched %s: %s", s.Node, s.Phase)
		}
	}
	h, _ := r.inv.History(ctx, cm.ID)
	if !historyHas(h, "image pinned", "power cycle") {
		t.Errorf("the canary's history lacks the pin and the power cycle: %v", h)
	}
	checkRelease(t, r, firstID, ro.ID)
}

// pauseAndResume pauses the rollout id as soon as its canary has started: the canary
// finishes its step and no other machine starts while it is paused, however long;
// resumed, it goes on.
func pauseAndResume(t *testing.T, r *rolloutRack, id string) {
	t.Helper()
	ro, err := r.ctl.Get(id)
	for deadline := time.Now().Add(60 * time.Second); err == nil && ro.Machines[0].Phase == rollout.Pending; ro, err = r.ctl.Get(id) {
		if time.Now().After(deadline) {
			t.Fatalf("the canary did not start: %s", phases(ro))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	ro, err = r.ctl.Pause(id, "operator:test", "maintenance window")
	if err != nil || ro.State != rollout.Paused {
		t.Fatalf("pause: %v, %+v", err, ro)
	}
	deadline := time.Now().Add(120 * time.Second)
	for ro.Machines[0].Phase != rollout.Ready {
		if time.Now().After(deadline) {
			t.Fatalf("the canary did not finish its step while paused: %s", phases(ro))
		}
		time.Sleep(50 * time.Millisecond)
		if ro, err = r.ctl.Get(id); err != nil {
			t.Fatal(err)
		}
	}
	// Passes go on while paused; none may start a machine.
	time.Sleep(2 * time.Second)
	if ro, err = r.ctl.Get(id); err != nil {
		t.Fatal(err)
	}
	for i, s := range ro.Machines[1:] {
		if s.Phase != rollout.Pending || !s.StartedAt.IsZero() || len(r.machines[i+1].bmc.Resets()) != 0 {
			t.Errorf("%s started while the rollout was paused: %s", s.Node, phases(ro))
		}
	}
	if ro.State != rollout.Paused {
		t.Errorf("state %s while paused", ro.State)
	}
	if _, err := r.ctl.Pause(id, "operator:test", "again"); err == nil {
		t.Error("pausing a paused rollout was accepted")
	}
	if ro, err = r.ctl.Resume(id, "operator:test", "window over"); err != nil || ro.State != rollout.Running {
		t.Fatalf("resume: %v, %+v", err, ro)
	}
}

// checkRelease releases the pins the rollouts left. The first (done, machines 2 to 5
// pinned to B while the rack's default image is A) keeps every pin without force,
// naming A. A third rollout moves machine 2 to A, and its release needs no force: the
// configuration agrees. Forced, the first's release frees machines 3 to 5 (not 2, now
// the third's, nor the canary, the second's), and the second's frees the canary. Then
// the default decides every machine's image again, and releasing rebooted nothing.
func checkRelease(t *testing.T, r *rolloutRack, first, second string) {
	t.Helper()
	ctx := context.Background()
	_, kept, err := r.ctl.Release(ctx, first, false, "operator:test", "tidy")
	if err != nil || len(kept) != 4 {
		t.Fatalf("release of %s: %v, %+v; want the four machines it pinned", first, err, kept)
	}
	for _, k := range kept {
		if k.Released || k.Next != r.imgB || !strings.Contains(k.Why, "the configuration chooses "+r.imgA) {
			t.Errorf("release without force: %+v; want kept on B, naming A", k)
		}
	}
	if _, err := r.ctl.Start(ctx, rollout.Spec{Image: r.imgA, Machines: []string{r.machines[1].node}, NodeTimeout: time.Minute, Actor: "operator:test"}); err != nil {
		t.Fatal(err)
	}
	third := r.wait(rollout.Done).ID
	resets := 0
	for _, m := range r.machines {
		resets += len(m.bmc.Resets())
	}
	for _, c := range []struct {
		id    string
		force bool
		n     int
	}{{third, false, 1}, {first, true, 3}, {second, true, 1}} {
		_, rel, err := r.ctl.Release(ctx, c.id, c.force, "operator:test", "tidy")
		if err != nil || len(rel) != c.n {
			t.Fatalf("release of %s (force %t): %v, %+v; want %d machines", c.id, c.force, err, rel, c.n)
		}
		for _, x := range rel {
			if !x.Released || x.Next != r.imgA {
				t.Errorf("release of %s (force %t): %+v; want released, next A", c.id, c.force, x)
			}
		}
	}
	for _, m := range r.machines {
		if c := r.svc.ImageChoice(r.machine(m)); c.Source == enroll.SourceRollout || c.Image != r.imgA {
			t.Errorf("%s after the releases: next image %+v, want the rack's default A", m.node, c)
		}
		resets -= len(m.bmc.Resets())
	}
	if resets != 0 {
		t.Errorf("releasing pins power-cycled machines (%d resets)", -resets)
	}
	if h, _ := r.inv.History(ctx, r.machine(r.machines[2]).ID); !historyHas(h, "image unpinned") {
		t.Errorf("machine 3's history lacks the release: %v", h)
	}
}

// checkBatches checks the order: the canary ready before any other machine started, a
// batch started only when the one before was ready, and never more than
// MaxUnavailable machines unavailable at once.
func checkBatches(t *testing.T, ro *rollout.Rollout) {
	t.Helper()
	lastReady := map[int]time.Time{}
	for _, s := range ro.Machines {
		if s.Phase != rollout.Ready || s.StartedAt.IsZero() || s.ReadyAt.Before(s.StartedAt) {
			t.Fatalf("machine %s: phase %s, started %s, ready %s", s.Node, s.Phase, s.StartedAt, s.ReadyAt)
		}
		if s.ReadyAt.After(lastReady[s.Batch]) {
			lastReady[s.Batch] = s.ReadyAt
		}
	}
	for _, s := range ro.Machines {
		if s.Batch > 0 && s.StartedAt.Before(lastReady[s.Batch-1]) {
			t.Errorf("%s (batch %d) started at %s, before batch %d was ready (%s)", s.Node, s.Batch, s.StartedAt, s.Batch-1, lastReady[s.Batch-1])
		}
		under := 0
		for _, o := range ro.Machines {
			if !o.StartedAt.After(s.StartedAt) && o.ReadyAt.After(s.StartedAt) {
				under++
			}
		}
		if under > ro.MaxUnavailable {
			t.Errorf("%d machines unavailable at once when %s started (max %d)", under, s.Node, ro.MaxUnavailable)
		}
	}
	for i, s := range ro.Machines {
		if want := batchOfTest(i, ro.Canary, ro.BatchSize); s.Batch != want {
			t.Errorf("machine %d (%s) is in batch %d, want %d", i, s.Node, s.Batch, want)
		}
	}
}

// batchOfTest is the batch of the ith machine: the canary's 0, then BatchSize a batch.
func batchOfTest(i, canary, size int) int {
	if i < canary {
		return 0
	}
	return 1 + (i-canary)/size
}

// historyHas reports whether h has a transition with each action.
func historyHas(h []inventory.Transition, actions ...string) bool {
	for _, a := range actions {
		found := false
		for _, tr := range h {
			found = found || tr.Action == a
		}
		if !found {
			return false
		}
	}
	return true
}

// TestRolloutFigures (opt-in: GPURACK_ROLLOUT_FIGURES=FILE appends its figures there,
// docs/bench/rollout.md) rolls a simulated rack of 20 in batches of 4 (canary 1, max
// unavailable 4) three times, A→B, B→A, A→B, and reports each rollout's total time and
// how long each node was unavailable (taint to ready). The machines reboot at once
// (simulated): the figures are gpuboot's own cost per node (drain through the eviction
// API, a Redfish session and PowerCycle, re-enrollment, commissioning, untaint, the
// 5 s pass interval cut to 50 ms here), not a server's boot time.
func TestRolloutFigures(t *testing.T) {
	testreq.OptIn(t, "GPURACK_ROLLOUT_FIGURES", "the 20-machine rollout figures (docs/bench/rollout.md)")
	file := os.Getenv("GPURACK_ROLLOUT_FIGURES")
	r := newRolloutRack(t, 20)
	ctx := context.Background()
	var totals, unavailable []time.Duration
	for i, img := range []string{r.imgB, r.imgA, r.imgB} {
		r.workload()
		start := time.Now()
		if _, err := r.ctl.Start(ctx, rollout.Spec{Image: img, Match: map[string]string{"rack": "r1"}, Canary: 1, BatchSize: 4, MaxUnavailable: 4,
			NodeTimeout: time.Minute, Actor: "operator:test"}); err != nil {
			t.Fatal(err)
		}
		ro := r.wait(rollout.Done)
		totals = append(totals, time.Since(start))
		checkBatches(t, ro)
		for _, s := range ro.Machines {
			unavailable = append(unavailable, s.ReadyAt.Sub(s.StartedAt))
		}
		t.Logf("rollout %d of 3 (to %s): %s", i+1, img[:8], totals[i].Round(time.Millisecond))
	}
	figures := fmt.Sprintf("| rollout of 20 simulated machines, canary 1 then batches of 4, max unavailable 4: total | %s, n=3 |\n"+
		"| a node unavailable (gpurack.io/rollout taint to ready) | %s, n=%d |\n", spread(totals), spread(unavailable), len(unavailable))
	t.Logf("\n%s", figures)
	f, err := os.OpenFile(file, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fmt.Fprint(f, figures)
}

// spread is "median (min–max)" of ds in seconds.
func spread(ds []time.Duration) string {
	s := slices.Clone(ds)
	slices.Sort(s)
	sec := func(d time.Duration) string { return strconv.FormatFloat(d.Seconds(), 'f', 2, 64) + " s" }
	return fmt.Sprintf("%s (%s–%s)", sec(s[len(s)/2]), sec(s[0]), sec(s[len(s)-1]))
}
