// Package etcdbench measures etcd's write latency with three members against one (issue
// 31, part 5), for `make bench-etcd` (test/bench/etcd.sh writes docs/bench/etcd.md).
package etcdbench

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/gpurack/gpurack/controlplane-bootstrap/components"
	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster"
	"github.com/gpurack/gpurack/internal/testreq"
)

// TestEtcdWriteLatency runs, alternating, an etcd cluster of 1 member and one of 3 (the
// pinned etcd, every member on this machine's loopback, its data on this machine's disk
// with fsync on, as etcd's default), ETCD_RUNS times each (default 3), and in each run
// times ETCD_PUTS sequential 1 KiB Puts (default 500) from one client, after 50 not
// timed. It prints one ETCD line per run for test/bench/etcd.sh.
func TestEtcdWriteLatency(t *testing.T) {
	testreq.OptIn(t, "GPURACK_BENCH_ETCD", "a benchmark that writes to the disk for a minute; make bench-etcd runs it")
	bin, err := components.FindBinary(components.BinDir(""), "etcd")
	if err != nil {
		testreq.Missing(t, err.Error(), "run make k8s-bins")
	}
	runs, puts := envInt("ETCD_RUNS", 3), envInt("ETCD_PUTS", 500)
	for run := 1; run <= runs; run++ {
		for _, members := range []int{1, 3} {
			if run%2 == 0 {
				members = 4 - members // alternate which size goes first
			}
			lat := measure(t, bin, members, puts)
			slices.Sort(lat)
			total := time.Duration(0)
			for _, d := range lat {
				total += d
			}
			fmt.Printf("ETCD members=%d run=%d puts=%d p50_ms=%.3f p99_ms=%.3f puts_per_s=%.1f\n", members, run, len(lat),
				ms(lat[len(lat)/2]), ms(lat[len(lat)*99/100]), float64(len(lat))/total.Seconds())
		}
	}
}

// measure starts an etcd cluster of n members, times puts sequential Puts through a
// client of all of them, stops the cluster and returns the latencies.
func measure(t *testing.T, bin string, n, puts int) []time.Duration {
	t.Helper()
	ports, err := testcluster.FreePorts(2 * n)
	if err != nil {
		t.Fatal(err)
	}
	var initial, endpoints []string
	for i := range n {
		initial = append(initial, fmt.Sprintf("m%d=http://127.0.0.1:%d", i, ports[2*i+1]))
		endpoints = append(endpoints, "http://"+net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[2*i])))
	}
	dir := t.TempDir()
	var procs []*exec.Cmd
	for i := range n {
		cmd := exec.Command(bin, "--name", fmt.Sprintf("m%d", i), "--data-dir", filepath.Join(dir, fmt.Sprintf("m%d", i)),
			"--listen-client-urls", endpoints[i], "--advertise-client-urls", endpoints[i],
			"--listen-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", ports[2*i+1]),
			"--initial-advertise-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", ports[2*i+1]),
			"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-state", "new", "--log-level", "error")
		log, err := os.Create(filepath.Join(dir, fmt.Sprintf("m%d.log", i)))
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stdout, cmd.Stderr = log, log
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		procs = append(procs, cmd)
	}
	defer func() {
		for _, p := range procs {
			p.Process.Kill()
			p.Wait()
		}
	}()
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	value := strings.Repeat("x", 1024)
	var lat []time.Duration
	for i := -50; i < puts; i++ {
		start := time.Now()
		if _, err := cli.Put(ctx, fmt.Sprintf("/bench/%d", i%100), value); err != nil {
			if i < 0 && ctx.Err() == nil { // the cluster may still be electing its leader
				time.Sleep(100 * time.Millisecond)
				i--
				continue
			}
			t.Fatalf("put %d on %d members: %v", i, n, err)
		}
		if i >= 0 {
			lat = append(lat, time.Since(start))
		}
	}
	return lat
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}
