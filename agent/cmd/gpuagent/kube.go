package main

import (
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
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
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpurack/gpurack/agent/enroll"
	"github.com/gpurack/gpurack/agent/facts"
	"github.com/gpurack/gpurack/agent/gpu/sim"
	"github.com/gpurack/gpurack/agent/joinbundle"
	"github.com/gpurack/gpurack/agent/kubejoin"
	"github.com/gpurack/gpurack/agent/monitor"
	"github.com/gpurack/gpurack/agent/protoconv"
	agentv1 "github.com/gpurack/gpurack/api/agent/v1"
	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	machinev1 "github.com/gpurack/gpurack/api/machine/v1"
	"github.com/gpurack/gpurack/internal/profile"
)

// enrollState is the agent's enrollment status, updated by enrollment and the join.
type enrollState struct {
	mu sync.Mutex
	st *agentv1.EnrollmentStatus
}

func (e *enrollState) get() *agentv1.EnrollmentStatus {
	e.mu.Lock()
	defer e.mu.Unlock()
	return proto.Clone(e.st).(*agentv1.EnrollmentStatus)
}

func (e *enrollState) set(state agentv1.EnrollmentState, msg string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.st.State != state {
		e.st.Since = timestamppb.Now()
	}
	e.st.State, e.st.Message = state, msg
}

// update sets the fields of gpuboot's answers; empty values leave a field as it is.
func (e *enrollState) update(machineState, fingerprint string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if machineState != "" {
		e.st.MachineState = machineState
	}
	if fingerprint != "" {
		e.st.KeyFingerprint = fingerprint
	}
}

func (e *enrollState) state() agentv1.EnrollmentState {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.st.State
}

// joiner enrolls with gpuboot and joins Kubernetes.
type joiner struct {
	f         *runFlags
	simulated bool
	sim       *sim.Sim
	profile   *profile.Profile
	imageID   string
	mon       *monitor.Monitor
	enroll    *enrollState
	log       *slog.Logger
	root      facts.Root
	started   time.Time
	node      *nodeNameVar
	// host is systemd over D-Bus on real nodes; tests replace it.
	host kubejoin.Host
}

// enrollAndJoin runs the enrollment of CONTRACTS §2 against target: key, Register with
// the pre-approval checklist, wait for approval, GetJoinBundle, then withBundle (mTLS
// listener, gossip), heartbeats, the Kubernetes join and the commissioning report.
func (j *joiner) enrollAndJoin(ctx context.Context, target enroll.Target, withBundle func(*bootv1.JoinBundle, *joinbundle.Credentials) error) {
	fail := func(msg string, err error) {
		j.log.Error(msg, "error", err)
		j.enroll.set(agentv1.EnrollmentState_ENROLLMENT_STATE_FAILED, msg+": "+err.Error())
	}
	key, created, err := enroll.LoadOrCreateKey(j.f.keyDir)
	if err != nil {
		fail("enrollment key", err)
		return
	}
	fp := bootv1.KeyFingerprint(key.Public().(ed25519.PublicKey))
	j.enroll.update("", fp)
	j.log.Info("enrollment key", "fingerprint", fp, "created", created, "dir", j.f.keyDir)
	id := j.root.ReadIdentity()
	hbStart := make(chan struct{})
	var hbOnce sync.Once
	// The checklist runs at once (CONTRACTS §2.3); its snapshot gives the GPU inventory.
	pre := j.mon.RunChecks(monitor.PhasePreApproval)
	c := &enroll.Client{Target: target, Key: key, Log: j.log, Facts: j.facts(id, pre),
		PreApproval: func() *machinev1.Checklist { return protoconv.Checklist(pre, id, j.imageID, "") },
		Progress: func(st agentv1.EnrollmentState, msg, ms string) {
			prev := j.enroll.state()
			j.enroll.set(st, msg)
			j.enroll.update(ms, "")
			if st != prev {
				j.log.Info("enrollment", "state", st.String(), "message", msg, "machine_state", ms)
				daemon.SdNotify(false, "STATUS="+msg)
				consoleLine(j.f.console, fmt.Sprintf("gpuagent: %s (gpuboot %s, key %s)", msg, target.Endpoint, fp))
			}
			if st == agentv1.EnrollmentState_ENROLLMENT_STATE_WAITING_FOR_APPROVAL || st == agentv1.EnrollmentState_ENROLLMENT_STATE_APPROVED {
				hbOnce.Do(func() { close(hbStart) })
			}
		}}
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
		sub := j.mon.Broker().Subscribe()
		go func() {
			for {
				select {
				case <-ctx.Done():
					sub.Close()
					return
				case e, ok := <-sub.C:
					if !ok {
						sub = j.mon.Broker().Subscribe()
						continue
					}
					if e.Health != nil {
						select {
						case kick <- struct{}{}:
						default:
						}
					}
				}
			}
		}()
		c.Heartbeats(ctx, func() enroll.HeartbeatFields {
			hf := enroll.HeartbeatFields{Identity: protoconv.Identity(id), NodeName: j.nodeNameIfJoined(), Health: protoconv.Health(j.mon.Health()),
				ImageID: j.imageID, BootID: j.root.BootID(), AgentStartedAt: j.started}
			if last := j.mon.Last(); last != nil {
				hf.DriverVersion = last.Snapshot.Driver.Version
			}
			return hf
		}, kick, func(r *bootv1.HeartbeatResponse) { j.enroll.update(enroll.MachineStateWord(r.GetMachineState()), "") })
	}()

	// gpuboot releases the bundle once per key: after a restart by systemd the agent
	// uses the one it kept beside its key (both are gone after a reboot).
	bundle, creds, err := joinbundle.Kept(j.f.keyDir)
	if err == nil {
		j.log.Info("JoinBundle kept from before a restart", "node", bundle.GetNodeName(), "api_server", bundle.GetApiServerEndpoint(), "file", filepath.Join(j.f.keyDir, joinbundle.KeptFile))
		j.enroll.set(agentv1.EnrollmentState_ENROLLMENT_STATE_APPROVED, "approved earlier; using the JoinBundle kept from before the agent restarted")
		hbOnce.Do(func() { close(hbStart) })
	} else {
		if !errors.Is(err, fs.ErrNotExist) {
			j.log.Warn("kept JoinBundle not used; enrolling", "error", err)
		}
		if bundle, err = c.Enroll(ctx); err != nil {
			if ctx.Err() == nil {
				j.log.Error("enrollment ended", "error", err)
			}
			return
		}
		j.log.Info("JoinBundle received", "node", bundle.GetNodeName(), "api_server", bundle.GetApiServerEndpoint())
		if creds, err = joinbundle.LoadCredentials(bundle, j.f.keyDir); err != nil {
			fail("JoinBundle from gpuboot", err)
			return
		}
		if err := joinbundle.Keep(bundle, j.f.keyDir); err != nil {
			j.log.Warn("JoinBundle not kept; a restart of the agent will need an operator to re-approve", "error", err)
		}
	}
	if err := c.UseCertificate(tls.Certificate{Certificate: [][]byte{creds.Cert.Raw}, PrivateKey: creds.Key, Leaf: creds.Cert}); err != nil {
		fail("mutual TLS to gpuboot", err)
		return
	}
	if err := withBundle(bundle, creds); err != nil {
		fail("starting with the JoinBundle", err)
		return
	}
	j.enroll.set(agentv1.EnrollmentState_ENROLLMENT_STATE_JOINING, "JoinBundle received from gpuboot; joining Kubernetes as "+bundle.GetNodeName())
	j.join(ctx, bundle, func(ctx context.Context) { j.commission(ctx, c, id, bundle.GetNodeName()) })
}

// nodeNameIfJoined is the node name once the agent has a bundle, else "".
func (j *joiner) nodeNameIfJoined() string {
	switch j.enroll.state() {
	case agentv1.EnrollmentState_ENROLLMENT_STATE_JOINING, agentv1.EnrollmentState_ENROLLMENT_STATE_COMMISSIONING, agentv1.EnrollmentState_ENROLLMENT_STATE_JOINED:
		return j.node.get()
	}
	return ""
}

// commission runs the commissioning checklist once the Node exists and reports it
// (CONTRACTS §2.7); gpuboot moves the machine to ready or quarantined. It retries until
// the report is delivered.
func (j *joiner) commission(ctx context.Context, c *enroll.Client, id facts.Identity, nodeName string) {
	j.enroll.set(agentv1.EnrollmentState_ENROLLMENT_STATE_COMMISSIONING, "Node "+nodeName+" registered; running and reporting the commissioning checklist")
	cl := protoconv.Checklist(j.mon.RunChecks(monitor.PhaseCommissioning), id, j.imageID, nodeName)
	for wait := time.Second; ctx.Err() == nil; wait = min(2*wait, 30*time.Second) {
		r, err := c.Report(ctx, cl)
		if err == nil {
			ms := enroll.MachineStateWord(r.GetMachineState())
			j.enroll.update(ms, "")
			j.log.Info("commissioning report delivered", "overall", cl.GetOverall().String(), "machine_state", ms)
			j.enroll.set(agentv1.EnrollmentState_ENROLLMENT_STATE_JOINED,
				"joined as "+nodeName+"; commissioning "+cl.GetOverall().String()+"; gpuboot: "+ms+"; heartbeating and keeping GPUHealthy")
			return
		}
		j.log.Warn("commissioning report not delivered; retrying", "error", err)
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
}

// facts are the machine facts sent with Register.
func (j *joiner) facts(id facts.Identity, cl *monitor.Checklist) *machinev1.MachineFacts {
	mf := &machinev1.MachineFacts{Identity: protoconv.Identity(id), Hostname: facts.Hostname(), ImageId: j.imageID,
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
func (j *joiner) join(ctx context.Context, bundle *bootv1.JoinBundle, afterNode func(context.Context)) {
	if bundle == nil || bundle.GetApiServerEndpoint() == "" || bundle.GetBootstrapToken() == "" {
		return
	}
	name := bundle.GetNodeName()
	labels := map[string]string{}
	for k, v := range bundle.GetNodeLabels() {
		labels[k] = v
	}
	driver, product := "", ""
	if p := j.profile; p.GPU != nil {
		driver, product = p.GPU.Driver.Version, p.GPU.Expect.Product
	}
	gpus := 0
	if last := j.mon.Last(); last != nil {
		gpus = len(last.Snapshot.GPUs)
		if v := last.Snapshot.Driver.Version; v != "" {
			driver = v
		}
	}
	if j.sim != nil {
		gpus = j.sim.GPUCount()
	}
	for k, v := range kubejoin.AgentLabels(j.imageID, driver, product, gpus, j.simulated) {
		labels[k] = v
	}
	var node *kubejoin.Node
	var lease time.Duration
	if j.simulated && j.sim != nil {
		node, lease = j.joinSimulated(ctx, bundle, labels), 10*time.Second
	} else {
		node = j.joinKubelet(ctx, bundle, labels)
	}
	if node == nil {
		return
	}
	if afterNode != nil {
		afterNode(ctx)
	} else {
		j.enroll.set(agentv1.EnrollmentState_ENROLLMENT_STATE_JOINED, "joined as "+name+"; keeping GPUHealthy")
	}
	kubejoin.Follow(ctx, node, j.mon, lease, j.log)
}

// joinSimulated is the simulation mode: client-go TLS bootstrap and Node registration.
func (j *joiner) joinSimulated(ctx context.Context, bundle *bootv1.JoinBundle, labels map[string]string) *kubejoin.Node {
	name := bundle.GetNodeName()
	for attempt, wait := 1, time.Second; ctx.Err() == nil; attempt, wait = attempt+1, min(2*wait, 30*time.Second) {
		t0 := time.Now()
		// Node credentials from before a restart first: gpuboot deletes the bootstrap
		// token once the machine is ready.
		cfg, err := kubejoin.KeptCredentials(j.f.keyDir, bundle.GetApiServerEndpoint(), []byte(bundle.GetClusterCaPem()), name)
		if err == nil {
			j.log.Info("using the node credentials kept from before a restart", "node", name)
		} else {
			if cfg, err = kubejoin.Bootstrap(ctx, bundle.GetApiServerEndpoint(), []byte(bundle.GetClusterCaPem()), bundle.GetBootstrapToken(), name); err == nil {
				if kerr := kubejoin.KeepCredentials(j.f.keyDir, cfg); kerr != nil {
					j.log.Warn("node credentials not kept; a restarted agent will need the bootstrap token", "error", kerr)
				}
			}
		}
		if err == nil {
			var client *kubernetes.Clientset
			if client, err = kubernetes.NewForConfig(cfg); err == nil {
				var node *kubejoin.Node
				node, err = kubejoin.Register(ctx, client, kubejoin.NodeSpec{Name: name, Labels: labels, Taints: taints(bundle), GPUs: j.sim.GPUCount()})
				if err == nil {
					j.log.Info("joined Kubernetes as a simulated node", "node", name, "took", time.Since(t0).Round(time.Millisecond))
					j.enroll.set(agentv1.EnrollmentState_ENROLLMENT_STATE_JOINED,
						"simulated kubelet: TLS bootstrap done, Node registered, GPUHealthy and the node Lease kept by the agent")
					return node
				}
			}
		}
		j.log.Warn("Kubernetes join failed; retrying", "attempt", attempt, "error", err)
		j.enroll.set(agentv1.EnrollmentState_ENROLLMENT_STATE_JOINING, "join failed, retrying: "+err.Error())
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
	return nil
}

// joinKubelet is the real-node join (CONTRACTS §6).
func (j *joiner) joinKubelet(ctx context.Context, bundle *bootv1.JoinBundle, labels map[string]string) *kubejoin.Node {
	name := bundle.GetNodeName()
	paths := kubeletPaths(j.f.kubeletDir)
	driver, err := kubejoin.DetectCgroupDriver(j.f.cgroupRoot)
	if err != nil {
		j.enroll.set(agentv1.EnrollmentState_ENROLLMENT_STATE_FAILED, err.Error())
		j.log.Error("kubelet join", "error", err)
		return nil
	}
	kj := kubejoin.KubeletJoin{Server: bundle.GetApiServerEndpoint(), ClusterCAPEM: []byte(bundle.GetClusterCaPem()),
		Token: bundle.GetBootstrapToken(), ClusterDNS: bundle.GetClusterDns(), ClusterDomain: bundle.GetClusterDomain(), CgroupDriver: driver}
	for _, t := range bundle.GetNodeTaints() {
		kj.Taints = append(kj.Taints, kubejoin.TaintSpec{Key: t.GetKey(), Value: t.GetValue(), Effect: t.GetEffect()})
	}
	host := j.host
	if host == nil {
		host = kubejoin.SystemdHost{}
	}
	for wait := time.Second; ; wait = min(2*wait, 30*time.Second) {
		err = kubejoin.StartKubelet(ctx, host, paths, name, kj)
		if err == nil {
			break
		}
		j.log.Warn("starting kubelet failed; retrying", "error", err)
		j.enroll.set(agentv1.EnrollmentState_ENROLLMENT_STATE_JOINING, "starting kubelet failed, retrying: "+err.Error())
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
	j.log.Info("kubelet started", "node", name, "cgroup_driver", driver, "bootstrap_kubeconfig", paths.BootstrapKubeconfig, "config", paths.Config)
	j.enroll.set(agentv1.EnrollmentState_ENROLLMENT_STATE_JOINING, "kubelet started; waiting for its TLS bootstrap ("+paths.Kubeconfig+") and Node registration")
	cfg, err := kubejoin.WaitNodeCredentials(ctx, paths.Kubeconfig)
	if err != nil {
		return nil
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		j.enroll.set(agentv1.EnrollmentState_ENROLLMENT_STATE_FAILED, "node kubeconfig: "+err.Error())
		return nil
	}
	node, err := kubejoin.Attach(ctx, client, name, labels)
	if err != nil {
		if ctx.Err() == nil {
			j.enroll.set(agentv1.EnrollmentState_ENROLLMENT_STATE_FAILED, err.Error())
			j.log.Error("kubelet join", "error", err)
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
