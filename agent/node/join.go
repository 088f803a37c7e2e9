package node

import (
	"context"
	"crypto/ed25519"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"sync"
	"syscall"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/kubernetes"

	"github.com/gpurack/gpurack/agent/attest"
	"github.com/gpurack/gpurack/agent/enroll"
	"github.com/gpurack/gpurack/agent/facts"
	"github.com/gpurack/gpurack/agent/joinbundle"
	"github.com/gpurack/gpurack/agent/kubejoin"
	"github.com/gpurack/gpurack/agent/monitor"
	"github.com/gpurack/gpurack/agent/podres"
	"github.com/gpurack/gpurack/agent/protoconv"
	"github.com/gpurack/gpurack/agent/retry"
	agentv1 "github.com/gpurack/gpurack/api/agent/v1"
	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	machinev1 "github.com/gpurack/gpurack/api/machine/v1"
)

// enrollAndJoin runs the enrollment of CONTRACTS §2 against target: key, Register with
// the pre-approval checklist, wait for approval, GetJoinBundle, then withBundle (mTLS
// listener, gossip), heartbeats, the Kubernetes join and the commissioning report.
func (n *node) enrollAndJoin(ctx context.Context, target enroll.Target) {
	key, created, err := enroll.LoadOrCreateKey(n.cfg.KeyDir)
	if err != nil {
		n.stepFailed("enrollment key", err)
		return
	}
	fp := bootv1.KeyFingerprint(key.Public().(ed25519.PublicKey))
	n.enrollment.update("", fp)
	n.log.Info("enrollment key", "fingerprint", fp, "created", created, "dir", n.cfg.KeyDir)
	hbStart := make(chan struct{})
	var hbOnce sync.Once
	startHeartbeats := func() { hbOnce.Do(func() { close(hbStart) }) }
	c := n.enrollmentClient(target, key, fp, startHeartbeats)
	defer n.useTPM(c)()
	if err := c.Dial(); err != nil {
		n.stepFailed("enroll", err)
		return
	}
	defer c.Close()
	go func() {
		select {
		case <-ctx.Done():
		case <-hbStart:
			n.heartbeats(ctx, c)
		}
	}()
	bundle, creds, ok := n.joinBundle(ctx, c, startHeartbeats)
	if !ok {
		return
	}
	if err := c.UseCertificate(creds); err != nil {
		n.stepFailed("mutual TLS to gpuboot", err)
		return
	}
	if err := n.withBundle(bundle, creds); err != nil {
		n.stepFailed("starting with the JoinBundle", err)
		return
	}
	go n.renewCertificate(ctx, c, bundle, creds)
	n.advance(evBundleInUse, "JoinBundle received from gpuboot; joining Kubernetes as "+bundle.GetNodeName())
	n.join(ctx, bundle, func(ctx context.Context) { n.commission(ctx, c, bundle.GetNodeName()) })
	// The client stays open for the heartbeats and the certificate renewal, also when
	// the join returned early (a bundle without a cluster).
	<-ctx.Done()
}

// renewCertificate renews the agent certificate through gpuboot at two thirds of its
// lifetime (CONTRACTS §2.10) until ctx ends; the mutual-TLS API and the calls to
// gpuboot take each new one without a restart, and it is kept beside the JoinBundle
// for a restart of the agent.
func (n *node) renewCertificate(ctx context.Context, c *enroll.Client, bundle *bootv1.JoinBundle, creds *joinbundle.Credentials) {
	r := &enroll.Renewal{Client: c, Identity: protoconv.Identity(n.identity), Cert: creds, Log: n.log,
		Renewed: func(cert *x509.Certificate) {
			if err := joinbundle.KeepRenewed(bundle, cert, n.cfg.KeyDir); err != nil {
				n.log.Warn("renewed agent certificate not kept; a restart of the agent starts from the previous one and renews it again", "error", err)
			}
		}}
	r.Run(ctx)
}

// advance moves the node's state by ev (the lifecycle table) with msg as its message.
// An event the table does not allow from the current state is a bug: it is logged and
// changes nothing. It returns the states before and after.
func (n *node) advance(ev event, msg string) (from, to agentv1.EnrollmentState) {
	from, to, err := n.enrollment.move(ev, msg)
	if err != nil {
		n.log.Error("node state not changed", "error", err, "message", msg)
	}
	return from, to
}

// stepFailed says that a step that is not retried failed: in the log and the state.
func (n *node) stepFailed(msg string, err error) {
	n.log.Error(msg, "error", err)
	n.advance(evStepFailed, msg+": "+err.Error())
}

// enrollmentClient is the enrollment client for target with the machine's facts and
// pre-approval checklist (run at once, CONTRACTS §2.3; its snapshot gives the GPU
// inventory). Its progress moves the node's state; the first answer from gpuboot
// calls startHeartbeats.
func (n *node) enrollmentClient(target enroll.Target, key ed25519.PrivateKey, fp string, startHeartbeats func()) *enroll.Client {
	id := n.identity
	pre := n.mon.RunChecks(monitor.PhasePreApproval)
	// shown is the last message on the console: a change of state shows its message, and
	// so does a new reason for registering again (gpuboot unreachable, a TPM that cannot
	// answer), which does not change the state; the same reason again is not repeated.
	var shown string
	return &enroll.Client{Target: target, Key: key, Log: n.log, Facts: n.facts(id, pre),
		PreApproval: func() *machinev1.Checklist { return protoconv.Checklist(pre, id, n.imageID, "") },
		Progress: func(st agentv1.EnrollmentState, msg, ms string) {
			ev, ok := gpubootEvent(st)
			if !ok {
				n.log.Error("node state not changed: the enrollment client reported a state that is not gpuboot's answer", "state", st.String(), "message", msg)
				return
			}
			from, to := n.advance(ev, msg)
			n.enrollment.update(ms, "")
			if to != from || (st == agentv1.EnrollmentState_ENROLLMENT_STATE_REGISTERING && msg != shown) {
				n.log.Info("enrollment", "state", to.String(), "message", msg, "machine_state", ms)
				daemon.SdNotify(false, "STATUS="+msg)
				consoleLine(n.cfg.Console, fmt.Sprintf("gpuagent: %s (gpuboot %s, key %s)", msg, target.Endpoint, fp))
				shown = msg
			}
			if to == waiting || to == approved {
				startHeartbeats()
			}
		}}
}

// useTPM lets the machine's TPM prove its identity when gpuboot asks for it (decision
// 0650); without one the agent enrolls by MAC, UUID and serial alone. It returns what
// closes the TPM once enrollment is over.
func (n *node) useTPM(c *enroll.Client) (closeTPM func()) {
	tpm, err := attest.Open()
	if err != nil {
		if errors.Is(err, attest.ErrNoTPM) {
			n.log.Info("no TPM 2.0: enrolling without TPM attestation", "looked", attest.DevicePaths)
		} else {
			n.log.Warn("TPM unusable: enrolling without TPM attestation", "error", err)
		}
		return func() {}
	}
	a, err := attest.New(tpm)
	if err != nil {
		n.log.Warn("TPM keys could not be created: enrolling without TPM attestation", "error", err)
		return func() { tpm.Close() }
	}
	c.TPM = a
	return func() { a.Close(); tpm.Close() }
}

// heartbeats sends heartbeats from the first Register answer on (CONTRACTS §2.6)
// until ctx ends; a health change sends one at once.
func (n *node) heartbeats(ctx context.Context, c *enroll.Client) {
	kick := make(chan struct{}, 1)
	go monitor.Follow(ctx, n.mon.Broker(), func(e monitor.Event) {
		if e.Health != nil {
			select {
			case kick <- struct{}{}:
			default:
			}
		}
	}, nil)
	c.Heartbeats(ctx, func() enroll.HeartbeatFields {
		hf := enroll.HeartbeatFields{Identity: protoconv.Identity(n.identity), NodeName: n.nodeNameIfJoined(), Health: protoconv.Health(n.mon.Health()),
			ImageID: n.imageID, BootID: n.cfg.FactsRoot.BootID(), AgentStartedAt: n.started, GossipKeyring: n.rack.Load().keyringDigest(),
			RevocationsDigest: n.revoked.Digest()}
		if last := n.mon.Last(); last != nil {
			hf.DriverVersion = last.Snapshot.Driver.Version
		}
		hf.GPUAllocation = n.gpuAllocation(ctx)
		hf.DataDisks, hf.WipeResult = n.disks.snapshot(), n.disks.wipeResult()
		return hf
	}, kick, func(r *bootv1.HeartbeatResponse) {
		n.enrollment.update(enroll.MachineStateWord(r.GetMachineState()), "")
		n.rack.Load().useKeys(r.GetGossip(), n.log)
		n.useRevocations(r.GetRevocations())
		n.disks.answer(r.GetWipe())
	})
}

// joinBundle is the JoinBundle and its credentials: the one kept beside the key from
// before a restart by systemd (gpuboot releases the bundle once per key; both are
// gone after a reboot), else gpuboot's, once enrollment is approved. ok is false when
// there is none: ctx ended, gpuboot stopped enrollment, or the bundle is unusable (the
// log and the state say which).
func (n *node) joinBundle(ctx context.Context, c *enroll.Client, startHeartbeats func()) (*bootv1.JoinBundle, *joinbundle.Credentials, bool) {
	bundle, creds, err := joinbundle.Kept(n.cfg.KeyDir)
	if err == nil {
		n.log.Info("JoinBundle kept from before a restart", "node", bundle.GetNodeName(), "api_server", bundle.GetApiServerEndpoint(), "file", filepath.Join(n.cfg.KeyDir, joinbundle.KeptFile))
		n.advance(evBundleKept, "approved earlier; using the JoinBundle kept from before the agent restarted")
		startHeartbeats()
		return bundle, creds, true
	}
	if !errors.Is(err, fs.ErrNotExist) {
		n.log.Warn("kept JoinBundle not used; enrolling", "error", err)
	}
	if bundle, err = c.Enroll(ctx); err != nil {
		if ctx.Err() == nil {
			n.log.Error("enrollment ended", "error", err)
		}
		return nil, nil, false
	}
	n.log.Info("JoinBundle received", "node", bundle.GetNodeName(), "api_server", bundle.GetApiServerEndpoint())
	if creds, err = joinbundle.LoadCredentials(bundle, n.cfg.KeyDir); err != nil {
		n.stepFailed("JoinBundle from gpuboot", err)
		return nil, nil, false
	}
	if err := joinbundle.Keep(bundle, n.cfg.KeyDir); err != nil {
		n.log.Warn("JoinBundle not kept; a restart of the agent will need an operator to re-approve", "error", err)
	}
	return bundle, creds, true
}

// nodeNameIfJoined is the node name once the agent has a bundle, else "".
func (n *node) nodeNameIfJoined() string {
	switch n.enrollment.state() {
	case joining, commissioning, joined:
		return n.name.get()
	}
	return ""
}

// commission runs the commissioning checklist once the Node exists and reports it
// (CONTRACTS §2.7); gpuboot moves the machine to ready or quarantined. It retries until
// the report is delivered.
func (n *node) commission(ctx context.Context, c *enroll.Client, nodeName string) {
	n.advance(evNodeRegistered, "Node "+nodeName+" registered; running and reporting the commissioning checklist")
	cl := protoconv.Checklist(n.mon.RunChecks(monitor.PhaseCommissioning), n.identity, n.imageID, nodeName)
	joinRetry.Do(ctx, func(ctx context.Context) error {
		r, err := c.Report(ctx, cl)
		if err != nil {
			return err
		}
		ms := enroll.MachineStateWord(r.GetMachineState())
		n.enrollment.update(ms, "")
		n.log.Info("commissioning report delivered", "overall", cl.GetOverall().String(), "machine_state", ms)
		n.advance(evReported, "joined as "+nodeName+"; commissioning "+cl.GetOverall().String()+"; gpuboot: "+ms+"; heartbeating and keeping GPUHealthy")
		return nil
	}, func(f retry.Failure) { n.log.Warn("commissioning report not delivered; retrying", "error", f.Err) })
}

// facts are the machine facts sent with Register. The boot id is the kernel's, the one
// kubelet reports as the Node's status.nodeInfo.bootID: gpuboot holds a rejoining
// machine's bootstrap token until the Node reports it (CONTRACTS §2.7), so without it a
// power-cycled node's new kubelet found its token deleted by the old boot's Node.
func (n *node) facts(id facts.Identity, cl *monitor.Checklist) *machinev1.MachineFacts {
	mf := &machinev1.MachineFacts{Identity: protoconv.Identity(id), Hostname: facts.Hostname(), ImageId: n.imageID,
		CpuCount: uint32(runtime.NumCPU()), Ips: hostIPs(), BootId: n.cfg.FactsRoot.BootID()}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		mf.KernelVersion = unix.ByteSliceToString(u.Release[:])
	}
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) == nil {
		mf.MemoryBytes = uint64(si.Totalram) * uint64(si.Unit)
	}
	if cl != nil {
		mf.DriverVersion = cl.Snapshot.Driver.Version
		for i := range cl.Snapshot.GPUs {
			mf.Gpus = append(mf.Gpus, protoconv.GPU(&cl.Snapshot.GPUs[i]))
		}
	}
	return mf
}

// hostIPs are the machine's global unicast addresses (loopback and link-local left out).
func hostIPs() []string {
	addrs, _ := net.InterfaceAddrs()
	var out []string
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.IsGlobalUnicast() {
			out = append(out, n.IP.String())
		}
	}
	sort.Strings(out)
	return out
}

// ensureLabels brings the Node's labels up to date (kubejoin.Node.EnsureLabels), in a
// few tries.
func (n *node) ensureLabels(ctx context.Context, node *kubejoin.Node, labels map[string]string) {
	for try := 1; ctx.Err() == nil; try++ {
		changed, err := node.EnsureLabels(ctx, labels)
		if err == nil {
			if len(changed) > 0 {
				n.log.Info("node labels brought up to date (the Node was registered by an earlier boot)", "node", node.Name, "labels", changed)
			}
			return
		}
		if try == 3 {
			n.log.Error("node labels not brought up to date: the Node keeps an earlier boot's image and driver labels", "node", node.Name, "error", err)
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(2 * time.Second):
		}
	}
}

// joinRetry is the backoff of the join's steps (the simulated join, starting kubelet
// and kube-proxy) and of the commissioning report.
var joinRetry = retry.Backoff{First: time.Second, Max: 30 * time.Second}

// join joins the cluster named by the JoinBundle; afterNode runs once the Node exists
// (the commissioning report), before the agent starts following health.
//   - Simulator: there is no kubelet, so the agent does kubelet's TLS bootstrap,
//     registers the Node and keeps its Lease itself (kubejoin).
//   - Real GPUs: the agent writes kubelet's bootstrap kubeconfig and config.yaml, sets
//     the hostname and starts kubelet.service over D-Bus, then waits for kubelet's
//     node kubeconfig and uses it for labels and GPUHealthy; the post-join services
//     (postJoinServices) start then.
func (n *node) join(ctx context.Context, bundle *bootv1.JoinBundle, afterNode func(context.Context)) {
	if bundle == nil || bundle.GetApiServerEndpoint() == "" || bundle.GetBootstrapToken() == "" {
		return
	}
	labels := n.nodeLabels(bundle)
	var node *kubejoin.Node
	var lease time.Duration
	if n.cfg.Backend.Simulated() && n.cfg.Sim != nil && !n.cfg.DevicePlugin && !n.cfg.Profile.Simulated() {
		// The simulator without a kubelet: the agent registers the Node and its GPUs.
		// With DevicePlugin, or in a simulated GPU image (profile gpu.simulator: it has
		// a kubelet and the GPU container runtime), the simulated GPUs go through the
		// real kubelet below.
		node, lease = n.joinSimulated(ctx, bundle, labels), 10*time.Second
	} else if node = n.joinKubelet(ctx, bundle, labels); node != nil {
		n.supervise(n.postJoinServices(bundle), kubeletJoined)
	}
	if node == nil {
		return
	}
	// A Node from an earlier boot (a reboot, a re-image) keeps that boot's labels. A
	// refusal does not hold the join: the node works, with labels out of date.
	n.ensureLabels(ctx, node, labels)
	if afterNode != nil {
		afterNode(ctx)
	} else {
		n.advance(evNodeUp, "joined as "+bundle.GetNodeName()+"; keeping GPUHealthy")
	}
	kubejoin.Follow(ctx, node, n.mon, lease, n.log)
}

// nodeLabels are the Node's labels: the bundle's, then the agent's (image, driver,
// GPU product and count, time-slicing, simulated).
func (n *node) nodeLabels(bundle *bootv1.JoinBundle) map[string]string {
	labels := map[string]string{}
	for k, v := range bundle.GetNodeLabels() {
		labels[k] = v
	}
	driver, product := "", ""
	if p := n.cfg.Profile; p.GPU != nil {
		driver, product = p.GPU.Driver.Version, p.GPU.Expect.Product
	}
	gpus := 0
	if last := n.mon.Last(); last != nil {
		gpus = len(last.Snapshot.GPUs)
		if v := last.Snapshot.Driver.Version; v != "" {
			driver = v
		}
	}
	if n.cfg.Sim != nil {
		gpus = n.cfg.Sim.GPUCount()
	}
	for k, v := range kubejoin.AgentLabels(n.imageID, driver, product, gpus, n.cfg.Profile.GPU.TimeSlicingReplicas(), n.cfg.Backend.Simulated()) {
		labels[k] = v
	}
	return labels
}

// joinSimulated is the simulation mode: client-go TLS bootstrap and Node registration,
// tried until it succeeds or ctx ends (nil then).
func (n *node) joinSimulated(ctx context.Context, bundle *bootv1.JoinBundle, labels map[string]string) *kubejoin.Node {
	name := bundle.GetNodeName()
	var node *kubejoin.Node
	joinRetry.Do(ctx, func(ctx context.Context) error {
		t0 := time.Now()
		var err error
		node, err = n.registerSimulated(ctx, bundle, labels)
		if err == nil {
			n.log.Info("joined Kubernetes as a simulated node", "node", name, "took", time.Since(t0).Round(time.Millisecond))
		}
		return err
	}, func(f retry.Failure) {
		n.log.Warn("Kubernetes join failed; retrying", "attempt", f.Attempt, "error", f.Err)
		n.advance(evJoinRetry, "join failed, retrying: "+f.Err.Error())
	})
	return node
}

// registerSimulated is one attempt at the simulated join: node credentials from before
// a restart first (gpuboot deletes the bootstrap token once the machine is ready),
// else kubelet's TLS bootstrap with the bundle's token; then the Node. Kept credentials
// the API server refuses are forgotten and the token tried at once (retry.Now).
func (n *node) registerSimulated(ctx context.Context, bundle *bootv1.JoinBundle, labels map[string]string) (*kubejoin.Node, error) {
	name, server, ca := bundle.GetNodeName(), bundle.GetApiServerEndpoint(), []byte(bundle.GetClusterCaPem())
	cfg, err := kubejoin.KeptCredentials(n.cfg.KeyDir, server, ca, name)
	kept := err == nil
	if kept {
		n.log.Info("using the node credentials kept from before a restart", "node", name)
	} else if cfg, err = kubejoin.Bootstrap(ctx, server, ca, bundle.GetBootstrapToken(), name); err != nil {
		return nil, err
	} else if kerr := kubejoin.KeepCredentials(n.cfg.KeyDir, cfg); kerr != nil {
		n.log.Warn("node credentials not kept; a restarted agent will need the bootstrap token", "error", kerr)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	node, err := kubejoin.Register(ctx, client, kubejoin.NodeSpec{Name: name, Labels: labels, Taints: taints(bundle),
		GPUs: n.cfg.Sim.GPUCount(), Replicas: n.cfg.Profile.GPU.TimeSlicingReplicas(), BootID: n.cfg.FactsRoot.BootID()})
	if err != nil && kept && apierrors.IsUnauthorized(err) {
		// Kept from another cluster, or for a node since deleted: they will never
		// work; the bootstrap token may (at once, not after the backoff).
		n.log.Warn("the API server refused the kept node credentials; forgetting them and using the bootstrap token", "error", err)
		if ferr := kubejoin.ForgetCredentials(n.cfg.KeyDir); ferr != nil {
			n.log.Warn("forget the kept node credentials", "error", ferr)
			return nil, err
		}
		return nil, retry.Now()
	}
	return node, err
}

// joinKubelet is the real-node join (CONTRACTS §6): kubelet's files and unit (tried
// until it starts), then its node kubeconfig and the Node.
func (n *node) joinKubelet(ctx context.Context, bundle *bootv1.JoinBundle, labels map[string]string) *kubejoin.Node {
	name := bundle.GetNodeName()
	paths := kubeletPaths(n.cfg.KubeletDir)
	kj, err := kubeletJoin(bundle, n.cfg.CgroupRoot)
	if err != nil {
		n.advance(evStepFailed, err.Error())
		n.log.Error("kubelet join", "error", err)
		return nil
	}
	host := n.cfg.Host
	if host == nil {
		host = kubejoin.SystemdHost{}
	}
	if server, ok := n.startAPILB(ctx, host, bundle); ok {
		kj.Server = server
	}
	if joinRetry.Do(ctx, func(ctx context.Context) error { return kubejoin.StartKubelet(ctx, host, paths, name, kj) }, func(f retry.Failure) {
		n.log.Warn("starting kubelet failed; retrying", "error", f.Err)
		n.advance(evJoinRetry, "starting kubelet failed, retrying: "+f.Err.Error())
	}) != nil {
		return nil
	}
	n.log.Info("kubelet started", "node", name, "cgroup_driver", kj.CgroupDriver, "bootstrap_kubeconfig", paths.BootstrapKubeconfig, "config", paths.Config)
	n.advance(evKubeletStarted, "kubelet started; waiting for its TLS bootstrap ("+paths.Kubeconfig+") and Node registration")
	cfg, err := kubejoin.WaitNodeCredentials(ctx, paths.Kubeconfig)
	if err != nil {
		return nil
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		n.advance(evStepFailed, "node kubeconfig: "+err.Error())
		return nil
	}
	node, err := kubejoin.Attach(ctx, client, name, labels)
	if err != nil {
		if ctx.Err() == nil {
			n.advance(evStepFailed, err.Error())
			n.log.Error("kubelet join", "error", err)
		}
		return nil
	}
	return node
}

// kubeletJoin is what kubelet is started with: the bundle's API server, CA, token,
// DNS and taints, the machine's cgroup driver and resolv.conf.
func kubeletJoin(bundle *bootv1.JoinBundle, cgroupRoot string) (kubejoin.KubeletJoin, error) {
	driver, err := kubejoin.DetectCgroupDriver(cgroupRoot)
	if err != nil {
		return kubejoin.KubeletJoin{}, err
	}
	kj := kubejoin.KubeletJoin{Server: bundle.GetApiServerEndpoint(), ClusterCAPEM: []byte(bundle.GetClusterCaPem()),
		Token: bundle.GetBootstrapToken(), ClusterDNS: bundle.GetClusterDns(), ClusterDomain: bundle.GetClusterDomain(), CgroupDriver: driver,
		ResolvConf: kubejoin.DetectResolvConf("/")}
	for _, t := range bundle.GetNodeTaints() {
		kj.Taints = append(kj.Taints, kubejoin.TaintSpec{Key: t.GetKey(), Value: t.GetValue(), Effect: t.GetEffect()})
	}
	return kj, nil
}

func kubeletPaths(dir string) kubejoin.KubeletPaths {
	return kubejoin.KubeletPaths{
		BootstrapKubeconfig: filepath.Join(dir, "bootstrap-kubeconfig"),
		Config:              filepath.Join(dir, "config.yaml"),
		Kubeconfig:          filepath.Join(dir, "kubeconfig"),
		ClientCA:            filepath.Join(dir, "cluster-ca.crt"),
	}
}

// taints are the profile's node taints from the bundle (kubelet's registerWithTaints).
func taints(b *bootv1.JoinBundle) []corev1.Taint {
	var out []corev1.Taint
	for _, t := range b.GetNodeTaints() {
		out = append(out, corev1.Taint{Key: t.GetKey(), Value: t.GetValue(), Effect: corev1.TaintEffect(t.GetEffect())})
	}
	return out
}

// consoleLine writes line to the terminal at path (the machine's console), if any. It
// is best effort: the journal holds the same message.
func consoleLine(path, line string) {
	if path == "" {
		return
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|syscall.O_NOCTTY, 0)
	if err != nil {
		return
	}
	defer f.Close()
	fmt.Fprintf(f, "\r%s\r\n", line)
}

// gpuAllocation is which pods hold the GPUs, with their tenants, for the heartbeat; nil
// where no kubelet answers (simulation mode, before the join).
func (n *node) gpuAllocation(ctx context.Context) *machinev1.GPUAllocation {
	h, err := n.pods.Holders(ctx)
	if err != nil {
		return nil
	}
	return podres.Allocation(ctx, h, n.tenants.Of)
}
