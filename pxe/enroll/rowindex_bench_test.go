package enroll

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/pxe/identity"
	"github.com/gpurack/gpurack/pxe/inventory"
	"github.com/gpurack/gpurack/pxe/policy"
)

// BenchmarkAllowlistRegisterHeldRow measures the Register of an unapproved identity
// whose allowlist row another machine holds (a stranger repeating a listed serial and
// MAC with its own UUID), over real TLS gRPC, with the inventory holding 100 and 5000
// approved machines, each on its own row. gpuboot looks up the row's holder on every
// such call, under the lock that serialises approvals through rows: the figure should
// not grow with the inventory.
func BenchmarkAllowlistRegisterHeldRow(b *testing.B) {
	for _, n := range []int{100, 5000} {
		b.Run(fmt.Sprintf("machines=%d", n), func(b *testing.B) {
			var csv strings.Builder
			csv.WriteString("serial,mac\n")
			for i := range n {
				fmt.Fprintf(&csv, "SN-B%d,%s\n", i, benchMAC(i))
			}
			list, err := policy.ParseListBytes("bench.csv", []byte(csv.String()))
			if err != nil {
				b.Fatal(err)
			}
			e := newEnv(b, func(c *Config) {
				c.Policy = policy.Policy{Mode: policy.Allowlist, List: list}
				c.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
			})
			ctx := context.Background()
			now := e.clk.Now()
			for i := range n {
				m := &inventory.Machine{ID: inventory.NewID(), Rack: "r1", CreatedAt: now,
					Identity: identity.Identity{MAC: benchMAC(i), UUID: "4c4c4544-0042-3510-8052-b4c04f4e5931", Serial: fmt.Sprint("SN-B", i)}}
				t1, _ := inventory.Move(m, inventory.Discovered, "gpuboot", "bench", now)
				t2, _ := inventory.Move(m, inventory.Approved, "policy:allowlist", "bench", now)
				m.BoundKey = "sha256:bench"
				if err := e.store.Create(ctx, m, t1, t2); err != nil {
					b.Fatal(err)
				}
			}
			stranger := e.agent(benchMAC(n/2), fmt.Sprint("SN-B", n/2))
			stranger.facts.Identity.SmbiosUuid = "00000000-0000-4000-8000-000000000001"
			stranger.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_PENDING)
			b.ResetTimer()
			for range b.N {
				// Each call is signed afresh at a later time, as a polling agent's is.
				e.clk.Add(time.Millisecond)
				r, err := stranger.register()
				if err != nil || r.Status != bootv1.RegisterStatus_REGISTER_STATUS_PENDING {
					b.Fatal(r, err)
				}
			}
		})
	}
}

func benchMAC(i int) string {
	return fmt.Sprintf("52:54:01:%02x:%02x:%02x", byte(i>>16), byte(i>>8), byte(i))
}
