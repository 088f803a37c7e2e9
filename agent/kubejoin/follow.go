package kubejoin

import (
	"context"
	"log/slog"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpurack/gpurack/agent/health"
	"github.com/gpurack/gpurack/agent/monitor"
)

// HealthSource is the node's published health and the broker that announces its
// changes (agent/monitor.Monitor).
type HealthSource interface {
	Health() health.Summary
	Broker() *monitor.Broker
}

// conditionOf maps a health summary to the GPUHealthy condition.
func conditionOf(s health.Summary) (corev1.ConditionStatus, string, string) {
	switch {
	case s.State == health.Unknown:
		return corev1.ConditionUnknown, s.Reason, s.Message
	case s.GPUHealthy:
		return corev1.ConditionTrue, s.Reason, s.Message
	}
	return corev1.ConditionFalse, s.Reason, s.Message
}

// Follow keeps the Node's GPUHealthy condition equal to src's health (written as soon
// as health changes; the hysteresis is src's) and renews the node Lease every
// leaseEvery (kubelet: 10 s; zero: kubelet runs and keeps the Lease itself), until ctx
// ends. On a simulated Node (registered with GPUs) it keeps the allocatable
// nvidia.com/gpu too, which kubelet computes from the device plugin on a real one: a
// withdrawn GPU costs one, or its replicas under time-slicing (AllocatableGPUs).
func Follow(ctx context.Context, n *Node, src HealthSource, leaseEvery time.Duration, log *slog.Logger) {
	write := func(s health.Summary) {
		// Allocatable first: a GPU is out of the scheduler's count before anything
		// else says so.
		if n.simGPUs > 0 {
			want := AllocatableGPUs(n.simGPUs, n.replicas, s)
			n.mu.Lock()
			have := n.allocatable
			n.mu.Unlock()
			if want != have {
				if err := n.SetAllocatableGPUs(ctx, want); err != nil {
					if ctx.Err() == nil {
						log.Warn("allocatable GPUs not written", "error", err)
					}
				} else {
					log.Info("allocatable GPUs written", "node", n.Name, "allocatable", want, "capacity", n.simGPUs*n.replicas, "withdrawn", s.WithdrawnGPUs())
				}
			}
		}
		st, reason, msg := conditionOf(s)
		if err := n.SetGPUHealthy(ctx, st, reason, msg); err != nil {
			if ctx.Err() == nil {
				log.Warn("GPUHealthy not written", "error", err)
			}
			return
		}
		log.Info("GPUHealthy written", "node", n.Name, "status", st, "reason", reason)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	// The Lease first: once GPUHealthy is written the node is fully there.
	if leaseEvery > 0 {
		if err := n.RenewLease(ctx, 40*time.Second); err != nil {
			log.Warn("node lease", "error", err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.NewTicker(leaseEvery)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
					if err := n.RenewLease(ctx, 40*time.Second); err != nil && ctx.Err() == nil {
						log.Warn("node lease", "error", err)
					}
				}
			}
		}()
	}
	// The current health at once, and again whenever events may have been missed.
	monitor.Follow(ctx, src.Broker(), func(e monitor.Event) {
		if e.Health != nil {
			write(e.Health.Current)
		}
	}, func() { write(src.Health()) })
}
