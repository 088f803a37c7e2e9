package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// BenchmarkValidateProcess is `gpuagent validate` end to end on a simulated 8-GPU node:
// process start, profile, backend, checks, report.
func BenchmarkValidateProcess(b *testing.B) {
	for b.Loop() {
		cmd := agentCmd(context.Background(), "validate", "--gpu-backend", "sim:dgxh100", "--profile", h100Profile)
		var out bytes.Buffer
		cmd.Stdout = &out
		if err := cmd.Run(); err != nil {
			b.Fatalf("%v\n%s", err, out.String())
		}
	}
}

// BenchmarkRunCost runs `gpuagent run` on a simulated 8-GPU node, checking every
// second with metrics served, for GPUAGENT_BENCH_SECONDS (default 60) and reports its
// resident memory and CPU use. The figure is the simulator backend's: no NVML library
// is loaded and no GPU is read, so a node with the nvml backend uses more (not measured
// here, for want of a GPU). dcgm-exporter's 135–155 MiB is its published figure on real
// GPUs, not one measured beside this, so the two are not like for like.
func BenchmarkRunCost(b *testing.B) {
	secs := 60
	if v, err := strconv.Atoi(os.Getenv("GPUAGENT_BENCH_SECONDS")); err == nil && v > 0 {
		secs = v
	}
	for b.Loop() {
		dir := b.TempDir()
		cmd := agentCmd(context.Background(), "run", "--gpu-backend", "sim:dgxh100", "--profile", h100Profile, "--interval", "1s",
			"--listen", "", "--metrics-listen", "127.0.0.1:0", "--metrics-plaintext", "--socket", filepath.Join(dir, "agent.sock"), "--log-level", "warn")
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		cpu0 := cpuTicks(cmd.Process.Pid)
		time.Sleep(time.Duration(secs) * time.Second)
		cpu := cpuTicks(cmd.Process.Pid) - cpu0
		rss := rssKiB(cmd.Process.Pid)
		elapsed := time.Since(start).Seconds()
		cmd.Process.Kill()
		cmd.Wait()
		b.ReportMetric(float64(rss)/1024, "MiB-RSS")
		b.ReportMetric(float64(cpu)/100/elapsed*100, "%CPU")
	}
}

// cpuTicks is utime+stime of pid in clock ticks (USER_HZ = 100 on Linux).
func cpuTicks(pid int) int64 {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(data[bytes.LastIndexByte(data, ')')+2:]))
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return u + s
}

func rssKiB(pid int) int64 {
	data, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	for _, l := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			n, _ := strconv.ParseInt(strings.Fields(v)[0], 10, 64)
			return n
		}
	}
	return 0
}
