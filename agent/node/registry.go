package node

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"

	"github.com/gpurack/gpurack/agent/registryhosts"
	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
)

// registryHostsService makes the node's containerd trust the cluster registry the
// JoinBundle names (registry; agent/registryhosts): it writes the registry's hosts.toml
// and the cluster CA once, removes the folders of registries it wrote before, and then
// holds its status until the agent stops. containerd reads the files on each pull.
type registryHostsService struct {
	statusCell
	dir      string
	registry string // empty: none (said once in the log)
	caPEM    []byte
	log      *slog.Logger
}

// registryHosts is the registry-hosts service for bundle.
func (n *node) registryHosts(bundle *bootv1.JoinBundle) *registryHostsService {
	return &registryHostsService{dir: orDefault(n.cfg.RegistryHostsDir, registryhosts.DefaultDir),
		registry: bundle.GetRegistry(), caPEM: []byte(bundle.GetClusterCaPem()), log: n.log.With("service", "registry-hosts")}
}

func (s *registryHostsService) Name() string { return "registry-hosts" }

func (s *registryHostsService) attempt(ctx context.Context, _ gated) error {
	removed, err := registryhosts.Apply(s.dir, s.registry, s.caPEM)
	for _, r := range removed {
		s.log.Info("removed the hosts.toml of a registry the JoinBundle no longer names", "registry", r)
	}
	if err != nil {
		return err
	}
	if s.registry == "" {
		s.log.Info("no registry in the JoinBundle (gpuboot's cluster.registry): containerd trusts no cluster registry, and pulls from one fail on its certificate")
		s.set(Running, "no registry in the JoinBundle")
	} else {
		hosts := filepath.Join(s.dir, s.registry, registryhosts.HostsFile)
		s.log.Info("containerd trusts the cluster registry with the cluster CA", "registry", s.registry, "hosts", hosts)
		s.set(Running, fmt.Sprintf("containerd trusts %s with the cluster CA (%s)", s.registry, hosts))
	}
	<-ctx.Done()
	return nil
}
