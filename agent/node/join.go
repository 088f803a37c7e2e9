package node

import (
	"context"
	"crypto/ed25519"
	"crypto/tls"
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
	agentv1 "github.com/gpurack/gpurack/api/agent/v1"
	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	machinev1 "github.com/gpurack/gpurack/api/machine/v1"
)

// enrollAndJoin runs the enrollment of CONTRACTS §2 against target: key, Register with
// the pre-approval checklist, wait for approval, GetJoinBundle, then withBundle (mTLS
// listener, gossip), heartbeats, the Kubernetes join and the commissioning report.
func (n *node) enrollAndJoin(ctx context.Context, target enroll.Target) {
	fail := func(msg string, err error) {
		n.log.Error(msg, "error", err)
		n.enrollment.set(agentv1.EnrollmentState_ENROLLMENT_STATE_FAILED, msg+": "+err.Error())
	}
	key, created, err := enroll.LoadOrCreateKey(n.cfg.KeyDir)
	if err != nil {
		fail("enrollment key", err)
		return
	}
	fp := bootv1.KeyFingerprint(key.Public().(ed25519.PublicKey))
	n.enrollment.update("", fp)
	n.log.Info("enrollment key", "fingerprint", fp, "created", created, "dir", n.cfg.KeyDir)
	id := n.identity
	hbStart := make(chan struct{})
	var hbOnce sync.Once
	// The checklist runs at once (CONTRACTS §2.3); its snapshot gives the GPU inventory.
	pre := n.mon.RunChecks(monitor.PhasePreApproval)
	c := &enroll.Client{Target: target, Key: key, Log: n.log, Facts: n.facts(id, pre),
		PreApproval: func() *machinev1.Checklist { return protoconv.Checklist(pre, id, n.imageID, "") },
		Progress: func(st agentv1.EnrollmentState, msg, ms string) {
			prev := n.enrollment.state()
			n.enrollment.set(st, msg)
			n.enrollment.update(ms, "")
			if st != prev {
				n.log.Info("enrollment", "state", st.String(), "message", msg, "machine_state", ms)
				daemon.SdNotify(false, "STATUS="+msg)
				consoleLine(n.cfg.Console, fmt.Sprintf("gpuagent: %s (gpuboot %s, key %s)", msg, target.Endpoint, fp))
			}
			if st == agentv1.EnrollmentState_ENROLLMENT_STATE_WAITING_FOR_APPROVAL || st == agentv1.EnrollmentState_ENROLLMENT_STATE_APPROVED {
				hbOnce.Do(func() { close(hbStart) })
			}
		}}
	// The machine's TPM proves its identity when gpuboot asks for it (decision 0650);
	// without one the agent enrolls by MAC, UUID and serial alone.
	if tpm, err := attest.Open(); err != nil {
		if errors.Is(err, attest.ErrNoTPM) {
			n.log.Info("no TPM 2.0: enrolling without TPM attestation", "looked", attest.DevicePaths)
		} else {
			n.log.Warn("TPM unusable: enrolling without TPM attestation", "error", err)
		}
	} else {
		defer tpm.Close()
		if a, err := attest.New(tpm); err != nil {
			n.log.Warn("TPM keys could not be created: enrolling without TPM attestation", "error", err)
		} else {
			defer a.Close()
			c.TPM = a
		}
	}
	if err := c.Dial(); err != nil {
		fail("enroll", err)
		return
	}
	defer c.Close()

	// Heartbeats from the first Register answer on (CONTRACTS §2.6); a health change
	// sends one at once.
	kick := make(chan struct{}, 1)
	go func() {
		select {
		case <-ctx.Done():
			return
		case <-hbStart:
		}
		go monitor.Follow(ctx, n.mon.Broker(), func(e monitor.Event) {
			if e.Health != nil {
				select {
				case kick <- struct{}{}:
				default:
				}
			}
		}, nil)
		c.Heartbeats(ctx, func() enroll.HeartbeatFields {
			hf := enroll.HeartbeatFields{Identity: protoconv.Identity(id), NodeName: n.nodeNameIfJoined(), Health: protoconv.Health(n.mon.Health()),
				ImageID: n.imageID, BootID: n.cfg.FactsRoot.BootID(), AgentStartedAt: n.started, GossipKeyring: n.rack.Load().keyringDigest(),
				RevocationsDigest: n.revoked.Digest()}
			if last := n.mon.Last(); last != nil {
				hf.DriverVersion = last.Snapshot.Driver.Version
			}
			hf.GPUAllocation = n.gpuAllocation(ctx)
			return hf
		}, kick, func(r *bootv1.HeartbeatResponse) {
			n.enrollment.update(enroll.MachineStateWord(r.GetMachineState()), "")
			n.rack.Load().useKeys(r.GetGossip(), n.log)
			n.useRevocations(r.GetRevocations())
		})
	}()

	// gpuboot releases the bundle once per key: after a restart by systemd the agent
	// uses the one it kept beside its key (both are gone after a reboot).
	bundle, creds, err := joinbundle.Kept(n.cfg.KeyDir)
	if err == nil {
		n.log.Info("JoinBundle kept from before a restart", "node", bundle.GetNodeName(), "api_server", bundle.GetApiServerEndpoint(), "file", filepath.Join(n.cfg.KeyDir, joinbundle.KeptFile))
		n.enrollment.set(agentv1.EnrollmentState_ENROLLMENT_STATE_APPROVED, "approved earlier; using the JoinBundle kept from before the agent restarted")
		hbOnce.Do(func() { close(hbStart) })
	} else {
		if !errors.Is(err, fs.ErrNotExist) {
			n.log.Warn("kept JoinBundle not used; enrolling", "error", err)
		}
		if bundle, err = c.Enroll(ctx); err != nil {
			if ctx.Err() == nil {
				n.log.Error("enrollment ended", "error", err)
			}
			return
		}
		n.log.Info("JoinBundle received", "node", bundle.GetNodeName(), "api_server", bundle.GetApiServerEndpoint())
		if creds, err = joinbundle.LoadCredentials(bundle, n.cfg.KeyDir); err != nil {
			fail("JoinBundle from gpuboot", err)
			return
		}
		if err := joinbundle.Keep(bundle, n.cfg.KeyDir); err != nil {
			n.log.Warn("JoinBundle not kept; a restart of the agent will need an operator to re-approve", "error", err)
		}
	}
	if err := c.UseCertificate(tls.Certificate{Certificate: [][]byte{creds.Cert.Raw}, PrivateKey: creds.Key, Leaf: creds.Cert}); err != nil {
		fail("mutual TLS to gpuboot", err)
		return
	}
	if err := n.withBundle(bundle, creds); err != nil {
		fail("starting with the JoinBundle", err)
		return
	}
	n.enrollment.set(agentv1.EnrollmentState_ENROLLMENT_STATE_JOINING, "JoinBundle received from gpuboot; joining Kubernetes as "+bundle.GetNodeName())
	n.join(ctx, bundle, func(ctx context.Context) { n.commission(ctx, c, id, bundle.GetNodeName()) })
}

// nodeNameIfJoined is the node name once the agent has a bundle, else "".
func (n *node) nodeNameIfJoined() string {
	switch n.enrollment.state() {
	case agentv1.EnrollmentState_ENROLLMENT_STATE_JOINING, agentv1.EnrollmentState_ENROLLMENT_STATE_COMMISSIONING, agentv1.EnrollmentState_ENROLLMENT_STATE_JOINED:
		return n.name.get()
	}
	return ""
}

// commission runs the commissioning checklist once the Node exists and reports it
// (CONTRACTS §2.7); gpuboot moves the machine to ready or quarantined. It retries until
// the report is delivered.
func (n *node) commission(ctx context.Context, c *enroll.Client, id facts.Identity, nodeName string) {
	n.enrollment.set(agentv1.EnrollmentState_ENROLLMENT_STATE_COMMISSIONING, "Node "+nodeName+" registered; running and reporting the commissioning checklist")
	cl := protoconv.Checklist(n.mon.RunChecks(monitor.PhaseCommissioning), id, n.imageID, nodeName)
	for wait := time.Second; ctx.Err() == nil; wait = min(2*wait, 30*time.Second) {
		r, err := c.Report(ctx, cl)
		if err == nil {
			ms := enroll.MachineStateWord(r.GetMachineState())
			n.enrollment.update(ms, "")
			n.log.Info("commissioning report delivered", "overall", cl.GetOverall().String(), "machine_state", ms)
			n.enrollment.set(agentv1.EnrollmentState_ENROLLMENT_STATE_JOINED,
				"joined as "+nodeName+"; commissioning "+cl.GetOverall().String()+"; gpuboot: "+ms+"; heartbeating and keeping GPUHealthy")
			return
		}
		n.log.Warn("commissioning report not delivered; retrying", "error", err)
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
}

// facts are the machine facts sent with Register.
func (n *node) facts(id facts.Identity, cl *monitor.Checklist) *machinev1.MachineFacts {
	mf := &machinev1.MachineFacts{Identity: protoconv.Identity(id), Hostname: facts.Hostname(), ImageId: n.imageID,
		CpuCount: uint32(runtime.NumCPU()), Ips: hostIPs()}
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

// join joins the cluster named by the JoinBundle; afterNode runs once the Node exists
// (the commissioning report), before the agent starts following health.
//   - Simulator: there is no kubelet, so the agent does kubelet's TLS bootstrap,
//     registers the Node and keeps its Lease itself (kubejoin).
//   - Real GPUs: the agent writes kubelet's bootstrap kubeconfig and config.yaml, sets
//     the hostname and starts kubelet.service over D-Bus, then waits for kubelet's
//     node kubeconfig and uses it for labels and GPUHealthy.
func (n *node) join(ctx context.Context, bundle *bootv1.JoinBundle, afterNode func(context.Context)) {
	if bundle == nil || bundle.GetApiServerEndpoint() == "" || bundle.GetBootstrapToken() == "" {
		return
	}
	name := bundle.GetNodeName()
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
	simulated := n.cfg.Backend.Simulated()
	for k, v := range kubejoin.AgentLabels(n.imageID, driver, product, gpus, n.cfg.Profile.GPU.TimeSlicingReplicas(), simulated) {
		labels[k] = v
	}
	var node *kubejoin.Node
	var lease time.Duration
	if simulated && n.cfg.Sim != nil && !n.cfg.DevicePlugin && !n.cfg.Profile.Simulated() {
		// The simulator without a kubelet: the agent registers the Node and its GPUs.
		// With DevicePlugin, or in a simulated GPU image (profile gpu.simulator: it has
		// a kubelet and the GPU container runtime), the simulated GPUs go through the
		// real kubelet below.
		node, lease = n.joinSimulated(ctx, bundle, labels), 10*time.Second
	} else {
		if node = n.joinKubelet(ctx, bundle, labels); node != nil {
			kubeconfig := kubeletPaths(n.cfg.KubeletDir).Kubeconfig
			if pn, err := n.podNetworkSettings(bundle); err != nil {
				// No pod network: the Node stays NotReady, and says why.
				n.services.Start(&failedService{name: "pod-network", err: err})
				consoleLine(n.cfg.Console, "gpuagent: pod network: "+err.Error())
			} else {
				kp := n.kubeProxy(kubeconfig, name, pn.PodSubnet)
				n.services.Start(kp)
				n.services.Start(n.podNetwork(kubeconfig, name, pn, kp.WaitSynced))
			}
			n.services.Start(n.networkPolicy(kubeconfig, name))
			if !n.cfg.DevicePlugin { // else it runs since the start
				n.services.Start(n.devicePlugin())
			}
		}
	}
	if node == nil {
		return
	}
	if afterNode != nil {
		afterNode(ctx)
	} else {
		n.enrollment.set(agentv1.EnrollmentState_ENROLLMENT_STATE_JOINED, "joined as "+name+"; keeping GPUHealthy")
	}
	kubejoin.Follow(ctx, node, n.mon, lease, n.log)
}

// joinSimulated is the simulation mode: client-go TLS bootstrap and Node registration.
func (n *node) joinSimulated(ctx context.Context, bundle *bootv1.JoinBundle, labels map[string]string) *kubejoin.Node {
	name := bundle.GetNodeName()
	for attempt, wait := 1, time.Second; ctx.Err() == nil; attempt, wait = attempt+1, min(2*wait, 30*time.Second) {
		t0 := time.Now()
		// Node credentials from before a restart first: gpuboot deletes the bootstrap
		// token once the machine is ready.
		cfg, err := kubejoin.KeptCredentials(n.cfg.KeyDir, bundle.GetApiServerEndpoint(), []byte(bundle.GetClusterCaPem()), name)
		kept := err == nil
		if kept {
			n.log.Info("using the node credentials kept from before a restart", "node", name)
		} else {
			if cfg, err = kubejoin.Bootstrap(ctx, bundle.GetApiServerEndpoint(), []byte(bundle.GetClusterCaPem()), bundle.GetBootstrapToken(), name); err == nil {
				if kerr := kubejoin.KeepCredentials(n.cfg.KeyDir, cfg); kerr != nil {
					n.log.Warn("node credentials not kept; a restarted agent will need the bootstrap token", "error", kerr)
				}
			}
		}
		if err == nil {
			var client *kubernetes.Clientset
			if client, err = kubernetes.NewForConfig(cfg); err == nil {
				var node *kubejoin.Node
				node, err = kubejoin.Register(ctx, client, kubejoin.NodeSpec{Name: name, Labels: labels, Taints: taints(bundle),
					GPUs: n.cfg.Sim.GPUCount(), Replicas: n.cfg.Profile.GPU.TimeSlicingReplicas()})
				if err == nil {
					n.log.Info("joined Kubernetes as a simulated node", "node", name, "took", time.Since(t0).Round(time.Millisecond))
					n.enrollment.set(agentv1.EnrollmentState_ENROLLMENT_STATE_JOINED,
						"simulated kubelet: TLS bootstrap done, Node registered, GPUHealthy and the node Lease kept by the agent")
					return node
				}
			}
		}
		if kept && apierrors.IsUnauthorized(err) {
			// Kept from another cluster, or for a node since deleted: they will never
			// work; the bootstrap token may (at once, not after the backoff).
			n.log.Warn("the API server refused the kept node credentials; forgetting them and using the bootstrap token", "error", err)
			if ferr := kubejoin.ForgetCredentials(n.cfg.KeyDir); ferr != nil {
				n.log.Warn("forget the kept node credentials", "error", ferr)
			} else {
				continue
			}
		}
		n.log.Warn("Kubernetes join failed; retrying", "attempt", attempt, "error", err)
		n.enrollment.set(agentv1.EnrollmentState_ENROLLMENT_STATE_JOINING, "join failed, retrying: "+err.Error())
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
	return nil
}

// joinKubelet is the real-node join (CONTRACTS §6).
func (n *node) joinKubelet(ctx context.Context, bundle *bootv1.JoinBundle, labels map[string]string) *kubejoin.Node {
	name := bundle.GetNodeName()
	paths := kubeletPaths(n.cfg.KubeletDir)
	driver, err := kubejoin.DetectCgroupDriver(n.cfg.CgroupRoot)
	if err != nil {
		n.enrollment.set(agentv1.EnrollmentState_ENROLLMENT_STATE_FAILED, err.Error())
		n.log.Error("kubelet join", "error", err)
		return nil
	}
	kj := kubejoin.KubeletJoin{Server: bundle.GetApiServerEndpoint(), ClusterCAPEM: []byte(bundle.GetClusterCaPem()),
		Token: bundle.GetBootstrapToken(), ClusterDNS: bundle.GetClusterDns(), ClusterDomain: bundle.GetClusterDomain(), CgroupDriver: driver,
		ResolvConf: kubejoin.DetectResolvConf("/")}
	for _, t := range bundle.GetNodeTaints() {
		kj.Taints = append(kj.Taints, kubejoin.TaintSpec{Key: t.GetKey(), Value: t.GetValue(), Effect: t.GetEffect()})
	}
	host := n.cfg.Host
	if host == nil {
		host = kubejoin.SystemdHost{}
	}
	for wait := time.Second; ; wait = min(2*wait, 30*time.Second) {
		err = kubejoin.StartKubelet(ctx, host, paths, name, kj)
		if err == nil {
			break
		}
		n.log.Warn("starting kubelet failed; retrying", "error", err)
		n.enrollment.set(agentv1.EnrollmentState_ENROLLMENT_STATE_JOINING, "starting kubelet failed, retrying: "+err.Error())
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
	n.log.Info("kubelet started", "node", name, "cgroup_driver", driver, "bootstrap_kubeconfig", paths.BootstrapKubeconfig, "config", paths.Config)
	n.enrollment.set(agentv1.EnrollmentState_ENROLLMENT_STATE_JOINING, "kubelet started; waiting for its TLS bootstrap ("+paths.Kubeconfig+") and Node registration")
	cfg, err := kubejoin.WaitNodeCredentials(ctx, paths.Kubeconfig)
	if err != nil {
		return nil
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		n.enrollment.set(agentv1.EnrollmentState_ENROLLMENT_STATE_FAILED, "node kubeconfig: "+err.Error())
		return nil
	}
	node, err := kubejoin.Attach(ctx, client, name, labels)
	if err != nil {
		if ctx.Err() == nil {
			n.enrollment.set(agentv1.EnrollmentState_ENROLLMENT_STATE_FAILED, err.Error())
			n.log.Error("kubelet join", "error", err)
		}
		return nil
	}
	return node
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
