package node

import (
	"context"
	"fmt"
	"log/slog"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/gpurack/gpurack/agent/sharedpv"
	"github.com/gpurack/gpurack/internal/sharedvol"
)

// sharedVolumesService takes part, with kubelet's node credentials, in the election
// of the one agent that provisions gpurack-shared volumes on the cluster's NFS export
// (agent/sharedpv, decision 0677), and provisions them while this agent leads. It
// idles while the cluster has no gpurack-shared class.
type sharedVolumesService struct {
	statusCell
	kubeconfig, node string
	mounts           *sharedpv.Mounter
	log              *slog.Logger
}

func (n *node) sharedVolumes(kubeconfig, nodeName string) *sharedVolumesService {
	return &sharedVolumesService{kubeconfig: kubeconfig, node: nodeName, mounts: &sharedpv.Mounter{}, log: n.log.With("service", "shared-volumes")}
}

func (s *sharedVolumesService) Name() string { return "shared-volumes" }

// attempt runs until ctx ends, or returns an error (a lost lead, an apiserver that
// refuses) the supervisor retries.
func (s *sharedVolumesService) attempt(ctx context.Context, _ gated) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", s.kubeconfig)
	if err != nil {
		return fmt.Errorf("kubelet's kubeconfig: %w", err)
	}
	cfg.UserAgent = "gpuagent/shared-volumes"
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	s.set(Starting, "looking for a "+sharedvol.StorageClass+" StorageClass")
	return sharedpv.Run(ctx, client, sharedpv.Options{Node: s.node, Mounts: s.mounts, Log: s.log, Told: func(st sharedpv.Status) {
		switch {
		case st.Classes == 0:
			s.set(Running, "idle: the cluster has no StorageClass of "+sharedvol.Provisioner+" (no NFS export)")
		case st.Leading:
			s.set(Running, fmt.Sprintf("provisioning %s volumes (elected; %d classes)", sharedvol.StorageClass, st.Classes))
		default:
			s.set(Running, fmt.Sprintf("standing by: %s provisions %s volumes", st.Leader, sharedvol.StorageClass))
		}
	}})
}
