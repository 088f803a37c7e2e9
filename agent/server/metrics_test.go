package server

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/gpurack/gpurack/agent/gpu/sim"
	"github.com/gpurack/gpurack/agent/monitor"
	"github.com/gpurack/gpurack/agent/podres"
	"github.com/gpurack/gpurack/internal/profile"
)

// The GPUs' holders from kubelet's pod-resources API become gpurack_gpu_allocated,
// with the GPU's dcgm-exporter labels and the pod's; a GPU the agent does not see is
// left out; pod_resources_up says whether kubelet answered; with no kubelet neither
// is exported.
func TestAllocatedMetrics(t *testing.T) {
	p, err := profile.Load("../../profiles/debian12-nvidia535.yaml")
	if err != nil {
		t.Fatal(err)
	}
	s, err := sim.New("dgxh100", sim.Options{DriverVersion: p.GPU.Driver.Version, Seed: "metrics"})
	if err != nil {
		t.Fatal(err)
	}
	mon := monitor.New(monitor.Config{Backend: s, Profile: p})
	cl := mon.RunChecks(monitor.PhaseCommissioning)
	g3 := cl.Snapshot.ByIndex(3)
	var holders podres.Holders
	var listErr error
	c := &Collector{Monitor: mon, Hostname: "gpu-r1-u07", Holders: func(context.Context) (podres.Holders, error) { return holders, listErr }}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)

	holders = podres.Holders{g3.UUID: {{Namespace: "team-a", Pod: "train-0", Container: "main"}, {Namespace: "team-b", Pod: "infer-1", Container: "server"}},
		"GPU-not-on-this-node": {{Namespace: "x", Pod: "y", Container: "z"}}}
	want := `
# HELP gpurack_gpu_allocated 1 for each container kubelet allocated the GPU to (pod-resources API; several under time-slicing).
# TYPE gpurack_gpu_allocated gauge
gpurack_gpu_allocated{Hostname="gpu-r1-u07",UUID="` + g3.UUID + `",container="main",gpu="3",modelName="` + g3.Name.V + `",namespace="team-a",pci_bus_id="` + g3.PCIBusID + `",pod="train-0",simulated="true"} 1
gpurack_gpu_allocated{Hostname="gpu-r1-u07",UUID="` + g3.UUID + `",container="server",gpu="3",modelName="` + g3.Name.V + `",namespace="team-b",pci_bus_id="` + g3.PCIBusID + `",pod="infer-1",simulated="true"} 1
# HELP gpurack_pod_resources_up 1 when kubelet's pod-resources API answered (gpu_allocated is current), 0 when it failed.
# TYPE gpurack_pod_resources_up gauge
gpurack_pod_resources_up{Hostname="gpu-r1-u07"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "gpurack_gpu_allocated", "gpurack_pod_resources_up"); err != nil {
		t.Error(err)
	}

	holders, listErr = nil, errors.New("kubelet pod-resources List: connection refused")
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP gpurack_pod_resources_up 1 when kubelet's pod-resources API answered (gpu_allocated is current), 0 when it failed.
# TYPE gpurack_pod_resources_up gauge
gpurack_pod_resources_up{Hostname="gpu-r1-u07"} 0
`), "gpurack_gpu_allocated", "gpurack_pod_resources_up"); err != nil {
		t.Error(err)
	}

	listErr = podres.ErrNoKubelet
	if n, err := testutil.GatherAndCount(reg, "gpurack_gpu_allocated", "gpurack_pod_resources_up"); err != nil || n != 0 {
		t.Errorf("without kubelet: %d series (%v), want none", n, err)
	}
}

// TestHostnameFollowsTheMachine: with CurrentHostname, every scrape reads the hostname
// again, so the agent's series carry the node name once the join has set it (an agent's
// metrics listener starts before that; the alerts' Hostname must be the node's).
func TestHostnameFollowsTheMachine(t *testing.T) {
	p, err := profile.Load("../../profiles/debian12-nvidia535.yaml")
	if err != nil {
		t.Fatal(err)
	}
	s, err := sim.New("dgxh100", sim.Options{DriverVersion: p.GPU.Driver.Version, Seed: "hostname"})
	if err != nil {
		t.Fatal(err)
	}
	mon := monitor.New(monitor.Config{Backend: s, Profile: p})
	mon.RunChecks(monitor.PhaseCommissioning)
	name := "localhost"
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(&Collector{Monitor: mon, Hostname: "ignored", CurrentHostname: func() string { return name }})
	for _, want := range []string{"localhost", "gpu-r1-07"} {
		name = want
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		got := ""
		for _, mf := range mfs {
			if mf.GetName() != "gpurack_node_gpus" {
				continue
			}
			for _, l := range mf.GetMetric()[0].GetLabel() {
				if l.GetName() == "Hostname" {
					got = l.GetValue()
				}
			}
		}
		if got != want {
			t.Errorf("gpurack_node_gpus Hostname=%q, want %q", got, want)
		}
	}
}
