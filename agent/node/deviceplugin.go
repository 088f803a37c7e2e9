package node

import (
	"context"
	"errors"

	"github.com/gpurack/gpurack/agent/cdi"
	"github.com/gpurack/gpurack/agent/deviceplugin"
)

// devicePluginService runs the nvidia.com/gpu device plugin (agent/deviceplugin) for
// the kubelet the agent started. Simulation mode has no kubelet (the agent writes the
// Node's nvidia.com/gpu capacity itself, agent/kubejoin), so it does not run there.
type devicePluginService struct {
	statusCell
	p *deviceplugin.Plugin
}

func (n *node) devicePlugin() *devicePluginService {
	return &devicePluginService{p: deviceplugin.New(deviceplugin.Config{Monitor: n.mon, Dir: n.cfg.DevicePluginDir,
		Simulated: n.cfg.Backend.Simulated(), Replicas: n.cfg.Profile.GPU.TimeSlicingReplicas(), CDI: n.writeCDISpec, Log: n.log})}
}

// writeCDISpec writes the CDI spec that defines the devices Allocate names
// (agent/cdi.Write): nvidia.yaml from NVML on real GPUs, the simulation-labelled spec over
// null-device nodes on the simulator.
func (n *node) writeCDISpec(ctx context.Context, gpus []deviceplugin.GPU) error {
	path, simulated, err := cdi.Write(ctx, n.cfg.Backend, cdi.Options{Dir: n.cfg.CDIDir, DevDir: n.cfg.SimDevDir, Log: n.log,
		SimGPUs: func() []cdi.GPU { return deviceplugin.CDIGPUs(gpus) }})
	switch {
	case err != nil:
		return err
	case simulated:
		n.log.Warn("wrote the SIMULATED GPUs' CDI spec: containers get null-device nodes, not GPUs", "spec", path, "device_nodes", cdi.SimDevDir, "gpus", len(gpus))
	default:
		n.log.Info("wrote the GPUs' CDI spec", "spec", path, "gpus", len(gpus))
	}
	return nil
}

func (s *devicePluginService) Name() string { return "device-plugin" }

// Run runs the device plugin from the start (Config.DevicePlugin), outside the
// supervisor.
func (s *devicePluginService) Run(ctx context.Context) error { return s.attempt(ctx, gated{}) }

// attempt serves the device plugin until ctx ends, once the first checklist is in;
// with no GPU it stops. It is not restarted.
func (s *devicePluginService) attempt(ctx context.Context, _ gated) error {
	s.set(Starting, "waiting for the first checklist")
	if err := s.p.Run(ctx); errors.Is(err, deviceplugin.ErrNoGPU) {
		s.set(Stopped, "no GPU on this node: "+deviceplugin.ErrNoGPU.Error())
		return nil
	} else if err != nil {
		return err
	}
	return nil
}

func (s *devicePluginService) Status() ServiceStatus {
	st := s.statusCell.Status()
	if st.State == Stopped {
		return st
	}
	if ok, msg := s.p.State(); ok {
		st.State, st.Message = Running, msg
	} else {
		st.Message = msg
	}
	return st
}
