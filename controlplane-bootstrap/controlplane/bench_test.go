package controlplane_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpurack/gpurack/controlplane-bootstrap/components"
	"github.com/gpurack/gpurack/controlplane-bootstrap/controlplane"
	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster"
)

// BenchmarkInitToReady measures a cold init (new PKI, empty etcd) until every
// component is healthy and the join material is applied, and the resident
// memory of each component right after. Run it with
//
//	go test -run '^$' -bench InitToReady -benchtime 3x ./controlplane-bootstrap/controlplane/
//
// The control plane runs with the test harness's settings: etcd with
// --unsafe-no-fsync (testcluster.Config), so no write waits for the disk. A
// production control plane fsyncs, and on a slow disk its start is slower
// than this figure.
func BenchmarkInitToReady(b *testing.B) {
	testcluster.Require(b)
	rss := map[string]float64{}
	var ready, total time.Duration
	for range b.N {
		cfg, err := testcluster.Config()
		if err != nil {
			b.Fatal(err)
		}
		dir := filepath.Join(b.TempDir(), "cluster")
		start := time.Now()
		cp, err := controlplane.Init(context.Background(), controlplane.Options{Dir: dir, Config: cfg})
		if err != nil {
			b.Fatal(err)
		}
		total += time.Since(start)
		ready += cp.ReadyAfter
		for _, name := range components.Names {
			rss[name] += rssMiB(cp.Supervisor.PID(name))
		}
		cp.Stop()
	}
	n := float64(b.N)
	b.ReportMetric(ready.Seconds()/n, "s-to-ready")
	b.ReportMetric(total.Seconds()/n, "s-init-total")
	sum := 0.0
	for _, name := range components.Names {
		b.ReportMetric(rss[name]/n, "MiB-"+name)
		sum += rss[name] / n
	}
	b.ReportMetric(sum, "MiB-total")
	b.Logf("init to ready %.2fs, init with join material %.2fs; RSS %s", ready.Seconds()/n, total.Seconds()/n, formatRSS(rss, n))
}

func formatRSS(rss map[string]float64, n float64) string {
	var parts []string
	for _, name := range components.Names {
		parts = append(parts, fmt.Sprintf("%s %.0f MiB", name, rss[name]/n))
	}
	return strings.Join(parts, ", ")
}

// rssMiB reads VmRSS of pid from /proc.
func rssMiB(pid int) float64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			return float64(kb) / 1024
		}
	}
	return 0
}
