package node

import (
	"context"
	"fmt"
	"log/slog"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/gpurack/gpurack/agent/localpv"
	machinev1 "github.com/gpurack/gpurack/api/machine/v1"
)

// localVolumesService provisions this node's gpurack-local volumes on its ready data
// disks and publishes their free space (agent/localpv, decision 0676), with kubelet's
// node credentials. A node without data disks publishes zero, so the scheduler sends
// it no gpurack-local claim.
type localVolumesService struct {
	statusCell
	kubeconfig, node string
	report           *diskReport
	log              *slog.Logger
}

func (n *node) localVolumes(kubeconfig, nodeName string) *localVolumesService {
	return &localVolumesService{kubeconfig: kubeconfig, node: nodeName, report: n.disks, log: n.log.With("service", "local-volumes")}
}

func (s *localVolumesService) Name() string { return "local-volumes" }

// attempt runs the provisioner until ctx ends; an apiserver that refuses (the
// cluster's local-volume objects not applied yet) is an error the supervisor retries.
func (s *localVolumesService) attempt(ctx context.Context, _ gated) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", s.kubeconfig)
	if err != nil {
		return fmt.Errorf("kubelet's kubeconfig: %w", err)
	}
	cfg.UserAgent = "gpuagent/local-volumes"
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	store := &localpv.Store{Disks: s.readyDisks, Quotas: localpv.Quota{}}
	s.set(Starting, "waiting for the claims, volumes and capacity caches")
	return localpv.Run(ctx, client, s.node, store, s.log, func(spaces []localpv.DiskSpace, err error) {
		if err != nil {
			s.set(Failed, err.Error())
			return
		}
		var free int64
		for _, d := range spaces {
			free += d.Free
		}
		s.set(Running, fmt.Sprintf("%d data disks, %d MiB free for gpurack-local volumes", len(spaces), free>>20))
	})
}

// readyDisks are the mount points of the data disks the data-disk service found ready.
func (s *localVolumesService) readyDisks() []string {
	var out []string
	for _, d := range s.report.snapshot().GetDisks() {
		if d.GetState() == machinev1.DataDiskState_DATA_DISK_STATE_READY && d.GetMountPoint() != "" {
			out = append(out, d.GetMountPoint())
		}
	}
	return out
}
