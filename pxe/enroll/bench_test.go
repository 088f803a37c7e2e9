package enroll

import (
	"fmt"
	"sync/atomic"
	"testing"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
)

// BenchmarkRegisterNew measures first registrations of distinct machines over real TLS
// gRPC on loopback into a bbolt inventory (two fsynced transactions each), with 16
// goroutines per CPU registering at once (a boot storm).
//
// It runs with the bounds on new records off: the harness sets CreateRate and
// CreateBurst to 1e6 and this benchmark MaxUnapproved to 1<<30, so it measures the
// Register path itself. With the defaults gpuboot admits new machines at
// DefaultCreateRate (5/s) after a burst of DefaultCreateBurst (50), and no more than
// DefaultMaxUnapproved (1000) waiting; a real boot storm of new machines is paced by
// that limiter, not by this figure.
func BenchmarkRegisterNew(b *testing.B) {
	e := newEnv(b, func(c *Config) { c.MaxUnapproved = 1 << 30 })
	var n atomic.Int64
	b.SetParallelism(16) // a rack's worth of agents at once
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := n.Add(1)
			a := e.agent(fmt.Sprintf("52:54:%02x:%02x:%02x:%02x", byte(i>>24), byte(i>>16), byte(i>>8), byte(i)), fmt.Sprint("B", i))
			if r, err := a.register(); err != nil || r.Status != bootv1.RegisterStatus_REGISTER_STATUS_PENDING {
				b.Fatal(r, err)
			}
		}
	})
}

// BenchmarkRegisterPoll measures the polling Register of an already registered machine
// (what every waiting agent does every 10 s).
func BenchmarkRegisterPoll(b *testing.B) {
	e := newEnv(b, nil)
	a := e.agent("52:54:00:00:10:01", "POLL")
	a.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_PENDING)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := a.register(); err != nil {
			b.Fatal(err)
		}
	}
}
