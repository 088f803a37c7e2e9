package inventory

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/gpurack/gpurack/pxe/identity"
)

// BenchmarkNodeLookup compares finding the machine that holds a node name through the
// node name index (ByNodeName, what NodeRegistered and StateByNode use on every
// reconcile) with the full scan they did before (List, then compare names). Conditions:
// a bbolt file in the test's temporary directory, small records (identity, state, node
// name; no facts, checklists or keys, which make a real record larger and the scan
// slower), warm page cache.
func BenchmarkNodeLookup(b *testing.B) {
	for _, n := range []int{100, 1000} {
		s, err := OpenBolt(filepath.Join(b.TempDir(), "inventory.db"))
		if err != nil {
			b.Fatal(err)
		}
		ctx := context.Background()
		for i := range n {
			m := &Machine{ID: fmt.Sprintf("m%06d", i), Identity: identity.Identity{MAC: fmt.Sprintf("52:54:00:%02x:%02x:%02x", i>>16&0xff, i>>8&0xff, i&0xff)},
				NodeName: fmt.Sprintf("gpu-r%d-u%02d", i/20, i%20)}
			tr, _ := Move(m, Discovered, "gpuboot", "bench", time.Now())
			if err := s.Create(ctx, m, tr); err != nil {
				b.Fatal(err)
			}
		}
		want := fmt.Sprintf("gpu-r%d-u%02d", (n/2)/20, (n/2)%20)
		b.Run(fmt.Sprintf("index/machines=%d", n), func(b *testing.B) {
			for b.Loop() {
				ms, err := s.ByNodeName(ctx, want)
				if err != nil || len(ms) != 1 {
					b.Fatal(len(ms), err)
				}
			}
		})
		b.Run(fmt.Sprintf("scan/machines=%d", n), func(b *testing.B) {
			for b.Loop() {
				all, err := s.List(ctx)
				if err != nil {
					b.Fatal(err)
				}
				found := 0
				for _, m := range all {
					if m.NodeName == want {
						found++
					}
				}
				if found != 1 {
					b.Fatal(found)
				}
			}
		})
		s.Close()
	}
}
