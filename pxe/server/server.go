// Package server wires `gpuboot serve`: it turns a pxe/config.Config into running
// parts (CONTRACTS §3): DHCP (67, 4011) and TFTP (69) on the configured interfaces,
// plain HTTP (:8080: /boot.ipxe, /images, /metrics) and TLS (:8443: EnrollmentService,
// AdminService with server reflection, the REST API and the rack view), the inventory,
// the enrollment service and, with an enroller kubeconfig, the node controller. Each
// is a named service (services.go) started in order by one supervisor (supervisor.go).
// It also holds `gpuboot init` and operator certificate issuance.
//
// It holds no protocol or lifecycle logic; the packages it wires do.
package server

import (
	"context"
	"log/slog"

	"github.com/gpurack/gpurack/pxe/admin"
	"github.com/gpurack/gpurack/pxe/config"
	"github.com/gpurack/gpurack/pxe/nodecontrol"
	"github.com/gpurack/gpurack/pxe/report"
	"github.com/gpurack/gpurack/pxe/tftp"
)

// Run serves until ctx is done or a service fails: gpuboot's services (services.go),
// started in order under one supervisor.
func Run(ctx context.Context, cfg *config.Config, log *slog.Logger) error {
	g := &gpuboot{cfg: cfg, log: log}
	return supervise(ctx, log, g.services(), g.announce)
}

func tftpDir(cfg *config.Config) string {
	if cfg.TFTP.Dir != "" {
		return cfg.TFTP.Dir
	}
	return tftp.DefaultDir
}

func mustTokens(cfg *config.Config, log *slog.Logger) *admin.Tokens {
	t, err := admin.LoadTokens(cfg.Admin.TokensFile)
	if err != nil {
		log.Error("operator tokens not loaded; only operator certificates are accepted", "err", err)
		return nil
	}
	if old := t.Legacy(); len(old) > 0 {
		log.Warn("operator tokens without an expiry (written by an older gpuboot): issue new ones with `gpuboot certs operator NAME --token` and remove these lines", "operators", old, "file", cfg.Admin.TokensFile)
	}
	return t
}

// tenantQuotas reads the tenants' GPU quotas for the rack report with the enroller
// credential; nil without a cluster.
func tenantQuotas(c *nodecontrol.Cluster) func(context.Context) (map[string]report.Quota, error) {
	if c == nil {
		return nil
	}
	return func(ctx context.Context) (map[string]report.Quota, error) {
		qs, err := c.TenantGPUQuotas(ctx)
		if err != nil {
			return nil, err
		}
		out := make(map[string]report.Quota, len(qs))
		for t, q := range qs {
			out[t] = report.Quota{Hard: q.Hard, Used: q.Used}
		}
		return out, nil
	}
}
