// Package kubejoin joins the node to Kubernetes and keeps what the agent owns on the
// Node object (CONTRACTS §5): the gpurack.io/* labels and the GPUHealthy condition.
//
// Two ways in:
//   - Real nodes (kubelet.go, attach.go, dbus.go): the agent writes kubelet's bootstrap
//     kubeconfig and config.yaml (registerWithTaints gpurack.io/unvalidated plus the
//     bundle's taints, cgroup driver detected), sets the transient hostname and starts
//     kubelet.service over D-Bus (behind the Host interface), then uses kubelet's node
//     kubeconfig for its labels and GPUHealthy. kubelet keeps the Lease.
//   - Simulation mode: with no kubelet on the machine (a simulated GPU node), the agent
//     itself does the kubelet's TLS bootstrap with the JoinBundle's bootstrap token (CSR
//     signed by kubernetes.io/kube-apiserver-client-kubelet, approved by the cluster),
//     registers the Node with the node's own credentials (nvidia.com/gpu capacity from
//     the simulator, registerWithTaints gpurack.io/unvalidated), and renews its Lease in
//     kube-node-lease. Everywhere it shows, the Node says it is simulated (label
//     gpurack.io/simulated=true).
package kubejoin

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509/pkix"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	certutil "k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/certificate/csr"
	"k8s.io/client-go/util/keyutil"

	"github.com/gpurack/gpurack/agent/health"
	"github.com/gpurack/gpurack/internal/atomicfile"
	"github.com/gpurack/gpurack/internal/nodecontract"
)

// Bootstrap does kubelet TLS bootstrap: it authenticates with the bootstrap token,
// submits a CSR for system:node:NAME, waits for the cluster to approve and sign it, and
// returns a client configuration with the node's own credentials.
func Bootstrap(ctx context.Context, server string, caPEM []byte, token, nodeName string) (*rest.Config, error) {
	boot := &rest.Config{Host: server, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{CAData: caPEM}, Timeout: 30 * time.Second}
	client, err := kubernetes.NewForConfig(boot)
	if err != nil {
		return nil, fmt.Errorf("kubelet bootstrap: %w", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	csrPEM, err := certutil.MakeCSR(key, &pkix.Name{CommonName: "system:node:" + nodeName, Organization: []string{"system:nodes"}}, nil, nil)
	if err != nil {
		return nil, fmt.Errorf("kubelet bootstrap: CSR: %w", err)
	}
	usages := []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth}
	name, uid, err := csr.RequestCertificateWithContext(ctx, client, csrPEM, "", certificatesv1.KubeAPIServerClientKubeletSignerName, nil, usages, key)
	if err != nil {
		return nil, fmt.Errorf("kubelet bootstrap: submit CSR with the bootstrap token: %w", err)
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	certPEM, err := csr.WaitForCertificate(wctx, client, name, uid)
	if err != nil {
		return nil, fmt.Errorf("kubelet bootstrap: CSR %s not approved and signed: %w (is CSR auto-approval for bootstrappers set up?)", name, err)
	}
	keyPEM, err := keyutil.MarshalPrivateKeyToPEM(key)
	if err != nil {
		return nil, err
	}
	return &rest.Config{Host: server, TLSClientConfig: rest.TLSClientConfig{CAData: caPEM, CertData: certPEM, KeyData: keyPEM}, Timeout: 30 * time.Second}, nil
}

// labelValueRE is what a label value may contain.
var labelValueRE = regexp.MustCompile(`[^A-Za-z0-9._-]`)

// SanitizeLabel makes a label value the way GPU feature discovery does: spaces become
// '-', other characters outside [A-Za-z0-9._-] are dropped, the result is cut to 63
// characters and trimmed to start and end alphanumerically.
func SanitizeLabel(v string) string {
	v = labelValueRE.ReplaceAllString(strings.ReplaceAll(v, " ", "-"), "")
	if len(v) > 63 {
		v = v[:63]
	}
	return strings.Trim(v, "._-")
}

// NodeSpec is what the agent registers.
type NodeSpec struct {
	Name string
	// Labels are the profile's node labels plus the agent's gpurack.io/* labels.
	Labels map[string]string
	// Taints are the profile's; nodecontract.TaintUnvalidated is added.
	Taints []corev1.Taint
	// GPUs is the number of GPUs to advertise as nvidia.com/gpu (simulation mode).
	GPUs int
	// Replicas is how many devices each GPU is (time-slicing, the profile's
	// gpu.sharing.timeSlicing.replicas); 0 or 1: one. The capacity is GPUs × Replicas.
	Replicas int
	// BootID is the machine's boot id (/proc/sys/kernel/random/boot_id), reported as
	// status.nodeInfo.bootID as kubelet does: gpuboot holds a rejoining machine's
	// bootstrap token until its Node reports this boot (CONTRACTS §2.7).
	BootID string
}

// AgentLabels are the labels the agent owns (CONTRACTS §5). A node with GPUs also gets
// GPU feature discovery's sharing labels: nvidia.com/gpu.replicas (the devices per GPU,
// replicas; 1 when 0 or 1) and nvidia.com/gpu.sharing-strategy (time-slicing with
// more than one, else none), as NVIDIA's plugin and GFD label a node.
func AgentLabels(imageID, driver, product string, count, replicas int, simulated bool) map[string]string {
	l := map[string]string{
		nodecontract.LabelDriverVersion: SanitizeLabel(driver),
		nodecontract.LabelGPUProduct:    SanitizeLabel(product),
		nodecontract.LabelGPUCount:      fmt.Sprint(count),
		nodecontract.LabelAgent:         "true",
	}
	if imageID != "" {
		l[nodecontract.LabelImage] = SanitizeLabel(imageID)
	}
	if count > 0 {
		l[nodecontract.LabelGPUReplicas] = fmt.Sprint(max(replicas, 1))
		l[nodecontract.LabelGPUSharingStrategy] = nodecontract.SharingNone
		if replicas > 1 {
			l[nodecontract.LabelGPUSharingStrategy] = nodecontract.SharingTimeSlicing
		}
	}
	if simulated {
		l[nodecontract.LabelSimulated] = "true"
	}
	return l
}

// Node is a registered Node the agent keeps up to date with the node's credentials.
type Node struct {
	Client kubernetes.Interface
	Name   string

	mu sync.Mutex
	// gpuHealthy is the GPUHealthy status this Node last wrote; "" until it wrote
	// one (SetGPUHealthy then reads the Node's).
	gpuHealthy corev1.ConditionStatus
	// simGPUs is the number of GPUs the agent registered as nvidia.com/gpu in
	// simulation mode, each as replicas devices; the agent then keeps the allocatable
	// count too (Follow). 0: kubelet and the device plugin own both.
	simGPUs, replicas int
	// allocatable is the nvidia.com/gpu allocatable this Node last wrote; -1: none.
	allocatable int
}

// Register creates the Node (or adopts an existing one of the same name) the way a
// kubelet registers: with labels, taints, capacity and a Ready condition, so the
// scheduler and the node lifecycle controller treat it as a node. It then sets
// GPUHealthy Unknown until the first checklist.
func Register(ctx context.Context, client kubernetes.Interface, spec NodeSpec) (*Node, error) {
	taints := append([]corev1.Taint{{Key: nodecontract.TaintUnvalidated, Effect: corev1.TaintEffectNoSchedule}}, spec.Taints...)
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("8"),
		corev1.ResourceMemory: resource.MustParse("64Gi"),
		corev1.ResourcePods:   resource.MustParse("110"),
	}
	replicas := max(spec.Replicas, 1)
	if spec.GPUs > 0 {
		capacity[nodecontract.ResourceGPU] = *resource.NewQuantity(int64(spec.GPUs*replicas), resource.DecimalSI)
	}
	// kubelet's hostname label, which Kueue's topology (its node level) reads. Not its
	// kubernetes.io/os and /arch: Deployments that select those (CoreDNS) would then be
	// placed here, on a node without kubelet, where no pod runs or ends, and no drain
	// of it finishes.
	labels := map[string]string{corev1.LabelHostname: spec.Name}
	maps.Copy(labels, spec.Labels)
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: spec.Name, Labels: labels},
		Spec:       corev1.NodeSpec{Taints: taints},
	}
	created, err := client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		created, err = client.CoreV1().Nodes().Get(ctx, spec.Name, metav1.GetOptions{})
	}
	if err != nil {
		return nil, fmt.Errorf("register node %s: %w", spec.Name, err)
	}
	// A status patch, not an update: gpuboot's node controller may patch the Node's
	// taints between the create and this call, and an update would then conflict.
	now := metav1.Now()
	status := corev1.NodeStatus{Capacity: capacity, Allocatable: capacity,
		Conditions: []corev1.NodeCondition{
			{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "SimulatedKubeletReady", Message: "gpuagent simulates kubelet (no kubelet on this machine)", LastHeartbeatTime: now, LastTransitionTime: now},
			{Type: nodecontract.ConditionGPUHealthy, Status: corev1.ConditionUnknown, Reason: "ChecksNotRun", Message: "No checklist has completed yet.", LastHeartbeatTime: now, LastTransitionTime: now},
		},
		NodeInfo: corev1.NodeSystemInfo{KubeletVersion: "gpuagent-simulated", BootID: spec.BootID}}
	patch, err := json.Marshal(map[string]any{"status": status})
	if err != nil {
		return nil, err
	}
	if _, err := client.CoreV1().Nodes().Patch(ctx, created.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		return nil, fmt.Errorf("register node %s: status: %w", spec.Name, err)
	}
	return &Node{Client: client, Name: spec.Name, gpuHealthy: corev1.ConditionUnknown, simGPUs: spec.GPUs, replicas: replicas,
		allocatable: spec.GPUs * replicas}, nil
}

// AllocatableGPUs is the nvidia.com/gpu allocatable of a simulated node with gpus GPUs
// of replicas devices each (time-slicing; 0 or 1: one) under health s: what kubelet
// would count from the device plugin's ListAndWatch (agent/deviceplugin.Decide),
// replicas less for every GPU among s.UnhealthyGPUs, withdrawn alone or not (decision
// 0630), none while the backend cannot be read. Before the first checklist it is the
// capacity, gpus × replicas (the node is still tainted unvalidated).
func AllocatableGPUs(gpus, replicas int, s health.Summary) int {
	replicas = max(replicas, 1)
	if s.State == health.Unknown && s.GPUCount == 0 {
		return gpus * replicas
	}
	n := min(gpus, s.GPUCount)
	for _, g := range s.UnhealthyGPUs {
		if g >= 0 && g < n {
			n--
		}
	}
	return max(n, 0) * replicas
}

// EnsureLabels sets every label of want whose value on the Node differs, with the
// node's own credentials (NodeRestriction lets a node label itself outside the
// restricted prefixes, which want never holds). A Node registered by an earlier boot
// keeps the labels of that boot: kubelet applies --node-labels only when it creates
// the Node, so after a re-image the agent brings the image and driver labels up to
// date here. It returns the keys it changed.
func (n *Node) EnsureLabels(ctx context.Context, want map[string]string) ([]string, error) {
	cur, err := n.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("read the labels of %s: %w", n.Name, err)
	}
	changed := map[string]string{}
	for k, v := range want {
		if have, ok := cur.Labels[k]; !ok || have != v {
			changed[k] = v
		}
	}
	if len(changed) == 0 {
		return nil, nil
	}
	data, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": changed}})
	if err != nil {
		return nil, err
	}
	if _, err := n.Client.CoreV1().Nodes().Patch(ctx, n.Name, types.StrategicMergePatchType, data, metav1.PatchOptions{}); err != nil {
		return nil, fmt.Errorf("label %s: %w", n.Name, err)
	}
	return slices.Sorted(maps.Keys(changed)), nil
}

// SetAllocatableGPUs patches the Node's allocatable nvidia.com/gpu (simulation mode:
// no kubelet computes it). The capacity stays as registered, as kubelet keeps it.
func (n *Node) SetAllocatableGPUs(ctx context.Context, count int) error {
	data, err := json.Marshal(map[string]any{"status": map[string]any{"allocatable": map[string]any{
		nodecontract.ResourceGPU: resource.NewQuantity(int64(count), resource.DecimalSI).String()}}})
	if err != nil {
		return err
	}
	if _, err := n.Client.CoreV1().Nodes().Patch(ctx, n.Name, types.StrategicMergePatchType, data, metav1.PatchOptions{}, "status"); err != nil {
		return fmt.Errorf("set allocatable %s on %s: %w", nodecontract.ResourceGPU, n.Name, err)
	}
	n.mu.Lock()
	n.allocatable = count
	n.mu.Unlock()
	return nil
}

// SetGPUHealthy patches the GPUHealthy condition (status "True", "False" or
// "Unknown"). Conditions merge by type, so others' conditions are untouched.
// lastTransitionTime changes only when the status does, as for every Node condition
// (the first write of a Node value reads the status on the Node to know).
func (n *Node) SetGPUHealthy(ctx context.Context, status corev1.ConditionStatus, reason, message string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	prev := n.gpuHealthy
	if prev == "" {
		prev = n.readGPUHealthy(ctx)
	}
	now := metav1.Now()
	cond := map[string]any{"type": nodecontract.ConditionGPUHealthy, "status": status, "reason": reason, "message": message,
		"lastHeartbeatTime": now}
	if status != prev {
		cond["lastTransitionTime"] = now
	}
	data, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []any{cond}}})
	if err != nil {
		return err
	}
	if _, err := n.Client.CoreV1().Nodes().Patch(ctx, n.Name, types.StrategicMergePatchType, data, metav1.PatchOptions{}, "status"); err != nil {
		return fmt.Errorf("set GPUHealthy on %s: %w", n.Name, err)
	}
	n.gpuHealthy = status
	return nil
}

// readGPUHealthy is the Node's GPUHealthy status, "" when it has none or cannot be
// read (the write then sets lastTransitionTime).
func (n *Node) readGPUHealthy(ctx context.Context) corev1.ConditionStatus {
	node, err := n.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
	if err != nil {
		return ""
	}
	for _, c := range node.Status.Conditions {
		if c.Type == nodecontract.ConditionGPUHealthy {
			return c.Status
		}
	}
	return ""
}

// RenewLease creates or renews the node's Lease in kube-node-lease, as kubelet does
// every 10 s; the node lifecycle controller marks a node without renewals unreachable.
func (n *Node) RenewLease(ctx context.Context, duration time.Duration) error {
	leases := n.Client.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	now := metav1.NewMicroTime(time.Now())
	secs := int32(duration.Seconds())
	l, err := leases.Get(ctx, n.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = leases.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: n.Name, Namespace: corev1.NamespaceNodeLease},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: &n.Name, LeaseDurationSeconds: &secs, RenewTime: &now},
		}, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	l.Spec.RenewTime, l.Spec.LeaseDurationSeconds, l.Spec.HolderIdentity = &now, &secs, &n.Name
	_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
	return err
}

// Node credential files that Keep writes: the simulated kubelet's counterpart of
// kubelet's /var/lib/kubelet/pki.
const (
	nodeCertFile = "sim-node.crt"
	nodeKeyFile  = "sim-node.key"
)

// KeepCredentials stores the node credentials of cfg (from Bootstrap) in dir, mode 0600,
// so that a restarted agent does not need the bootstrap token again: gpuboot deletes it
// once the machine is ready.
func KeepCredentials(dir string, cfg *rest.Config) error {
	if err := atomicfile.Write(filepath.Join(dir, nodeKeyFile), cfg.KeyData, 0o600); err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(dir, nodeCertFile), cfg.CertData, 0o600)
}

// ForgetCredentials removes the node credentials KeepCredentials kept in dir: the API
// server refused them (another cluster, or a revoked or deleted node), so the next join
// uses the bootstrap token.
func ForgetCredentials(dir string) error {
	return errors.Join(removeIfExists(filepath.Join(dir, nodeCertFile)), removeIfExists(filepath.Join(dir, nodeKeyFile)))
}

func removeIfExists(p string) error {
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// KeptCredentials returns a client configuration with the node credentials kept in dir,
// if they are there, name system:node:NAME and are valid for at least another minute.
func KeptCredentials(dir, server string, caPEM []byte, nodeName string) (*rest.Config, error) {
	certPEM, err := os.ReadFile(filepath.Join(dir, nodeCertFile))
	if err != nil {
		return nil, err
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, nodeKeyFile))
	if err != nil {
		return nil, err
	}
	certs, err := certutil.ParseCertsPEM(certPEM)
	if err != nil || len(certs) == 0 {
		return nil, fmt.Errorf("kept node certificate: %v", err)
	}
	switch c := certs[0]; {
	case c.Subject.CommonName != "system:node:"+nodeName:
		return nil, fmt.Errorf("kept node certificate is for %q, not system:node:%s", c.Subject.CommonName, nodeName)
	case time.Now().Add(time.Minute).After(c.NotAfter):
		return nil, fmt.Errorf("kept node certificate expired at %s", c.NotAfter.Format(time.RFC3339))
	}
	return &rest.Config{Host: server, TLSClientConfig: rest.TLSClientConfig{CAData: caPEM, CertData: certPEM, KeyData: keyPEM}, Timeout: 30 * time.Second}, nil
}
