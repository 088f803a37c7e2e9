package node

import (
	"context"
	"errors"

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
		Simulated: n.cfg.Backend.Simulated(), Log: n.log})}
}

func (s *devicePluginService) Name() string { return "device-plugin" }

func (s *devicePluginService) Run(ctx context.Context) error {
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
