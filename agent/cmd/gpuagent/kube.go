package main

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpurack/gpurack/agent/gpu/sim"
	"github.com/gpurack/gpurack/agent/kubejoin"
	"github.com/gpurack/gpurack/agent/monitor"
	agentv1 "github.com/gpurack/gpurack/api/agent/v1"
	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/internal/profile"
)

// enrollState is the agent's enrollment status, updated by the join.
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
	e.st.State, e.st.Message, e.st.Since = state, msg, timestamppb.Now()
}

// joinKubernetes joins the cluster named by the JoinBundle. On the simulator there is
// no kubelet, so the agent does kubelet's TLS bootstrap, registers the Node and keeps
// its Lease itself (kubejoin); on real GPUs the kubelet join is not in this build.
func joinKubernetes(ctx context.Context, f *runFlags, bundle *bootv1.JoinBundle, simulated bool, s *sim.Sim, p *profile.Profile,
	imageID string, mon *monitor.Monitor, enroll *enrollState, log *slog.Logger) {
	if bundle == nil || bundle.GetApiServerEndpoint() == "" || bundle.GetBootstrapToken() == "" {
		return
	}
	if !simulated || s == nil {
		enroll.set(agentv1.EnrollmentState_ENROLLMENT_STATE_FAILED,
			"JoinBundle has a cluster, but starting kubelet (bootstrap kubeconfig, config.yaml, D-Bus) is not implemented in this agent build")
		log.Error("kubelet join not implemented for real GPUs in this build")
		return
	}
	name := bundle.GetNodeName()
	var cfgErr error
	for attempt, wait := 1, time.Second; ctx.Err() == nil; attempt, wait = attempt+1, min(2*wait, 30*time.Second) {
		t0 := time.Now()
		cfg, err := kubejoin.Bootstrap(ctx, bundle.GetApiServerEndpoint(), []byte(bundle.GetClusterCaPem()), bundle.GetBootstrapToken(), name)
		if err == nil {
			client, err := kubernetes.NewForConfig(cfg)
			if err == nil {
				labels := map[string]string{}
				for k, v := range bundle.GetNodeLabels() {
					labels[k] = v
				}
				driver := ""
				if p.GPU != nil {
					driver = p.GPU.Driver.Version
				}
				product := ""
				if p.GPU != nil {
					product = p.GPU.Expect.Product
				}
				for k, v := range kubejoin.AgentLabels(imageID, driver, product, s.GPUCount(), true) {
					labels[k] = v
				}
				var node *kubejoin.Node
				node, err = kubejoin.Register(ctx, client, kubejoin.NodeSpec{Name: name, Labels: labels, Taints: taints(bundle), GPUs: s.GPUCount()})
				if err == nil {
					log.Info("joined Kubernetes as a simulated node", "node", name, "took", time.Since(t0).Round(time.Millisecond))
					enroll.set(agentv1.EnrollmentState_ENROLLMENT_STATE_JOINED,
						"simulated kubelet: TLS bootstrap done, Node registered, GPUHealthy and the node Lease kept by the agent")
					kubejoin.Follow(ctx, node, mon, 10*time.Second, log)
					return
				}
			}
			cfgErr = err
		} else {
			cfgErr = err
		}
		log.Warn("Kubernetes join failed; retrying", "attempt", attempt, "error", cfgErr)
		enroll.set(agentv1.EnrollmentState_ENROLLMENT_STATE_JOINING, "join failed, retrying: "+cfgErr.Error())
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
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
