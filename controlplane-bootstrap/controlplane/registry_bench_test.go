package controlplane

import (
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gpurack/gpurack/internal/testreq"
)

// TestRegistryThroughputFigures (opt-in, GPURACK_BENCH_REGISTRY=1) measures, for
// docs/bench/registry.md, the push and pull throughput of the cluster registry
// (distribution v3.1.2 under the supervisor, TLS from the cluster CA, token auth, on
// loopback) with Debian's skopeo, against the peer in the same run: skopeo copying the
// same image between two directories (oci: to dir:), which is skopeo's own cost with
// no registry. Each run makes a new image (one layer of random bytes, so the registry
// has none of it and gzip cannot shrink it), then, alternating: the peer, the push, the
// pull into a new directory. Three runs.
func TestRegistryThroughputFigures(t *testing.T) {
	testreq.OptIn(t, "GPURACK_BENCH_REGISTRY", "a measurement of about a minute for docs/bench/registry.md")
	const layerMiB = 128
	r := newRegistryRig(t)
	for run := 1; run <= 3; run++ {
		content := make([]byte, layerMiB<<20)
		if _, err := rand.Read(content); err != nil {
			t.Fatal(err)
		}
		dir := filepath.Join(r.dir, fmt.Sprintf("bench-%d", run))
		img := writeOCIImageLabelled(t, dir, "bench", string(content), fmt.Sprintf("bench run %d", run))
		st, err := os.Stat(filepath.Join(dir, "blobs", "sha256", img.layer[len("sha256:"):]))
		if err != nil {
			t.Fatal(err)
		}
		mb := float64(st.Size()) / 1e6
		timed := func(what string, args ...string) float64 {
			t0 := time.Now()
			if out, err := r.skopeoRun(args...); err != nil {
				t.Fatalf("run %d, %s: %v\n%s", run, what, err, out)
			}
			return time.Since(t0).Seconds()
		}
		peer := timed("skopeo copy between directories", "copy", "oci:"+img.dir+":"+img.tag, "dir:"+filepath.Join(r.dir, fmt.Sprintf("peer-%d", run)))
		repoTag := fmt.Sprintf("bench/run%d:v1", run)
		push := timed("push", "copy", "--dest-creds", rigUser+":"+rigPassword, "--dest-cert-dir", r.certDir, "oci:"+img.dir+":"+img.tag, r.ref(repoTag))
		pull := timed("pull", "copy", "--src-creds", rigUser+":"+rigPassword, "--src-cert-dir", r.certDir, r.ref(repoTag),
			"oci:"+filepath.Join(r.dir, fmt.Sprintf("pulled-bench-%d", run))+":pulled")
		t.Logf("run %d: layer %.1f MB; peer (dir to dir) %.0f MB/s (%.2f s); push %.0f MB/s (%.2f s, ratio %.2f); pull %.0f MB/s (%.2f s, ratio %.2f)",
			run, mb, mb/peer, peer, mb/push, push, peer/push, mb/pull, pull, peer/pull)
	}
}
