package kubejoin

import (
	"context"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpurack/gpurack/agent/health"
	"github.com/gpurack/gpurack/agent/monitor"
)

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

// Follow keeps the Node's GPUHealthy condition equal to the monitor's health (written
// as soon as health changes) and renews the node Lease every leaseEvery (kubelet: 10
// s; zero: kubelet runs and keeps the Lease itself), until ctx ends.
func Follow(ctx context.Context, n *Node, mon *monitor.Monitor, leaseEvery time.Duration, log *slog.Logger) {
	sub := mon.Broker().Subscribe()
	defer func() { sub.Close() }()
	write := func(s health.Summary) {
		st, reason, msg := conditionOf(s)
		if err := n.SetGPUHealthy(ctx, st, reason, msg); err != nil && ctx.Err() == nil {
			log.Warn("GPUHealthy not written", "error", err)
			return
		}
		log.Info("GPUHealthy written", "node", n.Name, "status", st, "reason", reason)
	}
	// The Lease first: once GPUHealthy is written the node is fully there.
	var leaseC <-chan time.Time
	if leaseEvery > 0 {
		if err := n.RenewLease(ctx, 40*time.Second); err != nil {
			log.Warn("node lease", "error", err)
		}
		lease := time.NewTicker(leaseEvery)
		defer lease.Stop()
		leaseC = lease.C
	}
	write(mon.Health())
	for {
		select {
		case <-ctx.Done():
			return
		case <-leaseC:
			if err := n.RenewLease(ctx, 40*time.Second); err != nil && ctx.Err() == nil {
				log.Warn("node lease", "error", err)
			}
		case e, ok := <-sub.C:
			if !ok { // fell behind: resubscribe and write the current state
				sub = mon.Broker().Subscribe()
				write(mon.Health())
				continue
			}
			if e.Health != nil {
				write(e.Health.Current)
			}
		}
	}
}
