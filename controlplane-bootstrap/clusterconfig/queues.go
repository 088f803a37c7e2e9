package clusterconfig

// Queues configures Kueue, the job queues with fair sharing that init starts beside the
// control-plane components when Enabled (docs/tenants.md "Queues";
// docs/decisions/0696-kueue-as-a-supervised-component.md). It reads the API with
// DIR/kueue.conf (user gpurack:kueue) and DIR/queues/kueue-config.yaml, which init
// writes; `tenants apply` then gives every tenant a ClusterQueue and a LocalQueue.
type Queues struct {
	// Enabled starts Kueue and installs its CRDs, its ClusterRole and its admission
	// webhooks. Off by default: it needs `make k8s-bins`' kueue binary and the manifests
	// beside it (bin/kueue-manifests).
	Enabled bool `yaml:"enabled"`
	// WebhookPort is where Kueue serves its admission webhooks, on 127.0.0.1 with a
	// certificate of the cluster CA (pki/kueue/tls.crt): the API server on this host
	// calls it. Default 9443.
	WebhookPort int `yaml:"webhookPort"`
	// HealthPort serves /healthz and /readyz on 127.0.0.1; default 9444.
	HealthPort int `yaml:"healthPort"`
	// MetricsPort serves Kueue's /metrics over TLS on 127.0.0.1, to clients the API
	// server authorizes (get /metrics); default 9445.
	MetricsPort int `yaml:"metricsPort"`
	// ExtraArgs are kueue flags, without leading dashes (zap-log-level: 2).
	ExtraArgs map[string]string `yaml:"extraArgs"`
}

func (q *Queues) applyDefaults() {
	for _, f := range []struct {
		p *int
		v int
	}{
		{&q.WebhookPort, 9443}, {&q.HealthPort, 9444}, {&q.MetricsPort, 9445},
	} {
		if *f.p == 0 {
			*f.p = f.v
		}
	}
}

func (q *Queues) validate(p *problems) {
	if !q.Enabled {
		return
	}
	for k := range q.ExtraArgs {
		if !flagName.MatchString(k) {
			p.add("queues.extraArgs["+k+"]", "%q is not a flag name: write it without leading dashes, for example zap-log-level", k)
		}
	}
}
