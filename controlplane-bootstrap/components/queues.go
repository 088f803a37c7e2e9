package components

import (
	"bytes"
	"fmt"
	"path/filepath"
	"strconv"
	"text/template"

	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterconfig"
	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterpki"
)

// Kueue is the job-queue component (cluster.yaml's queues.enabled), also its pinned
// binary's name (`make k8s-bins`); KueueManifestsDir is the folder beside it that holds
// its CRDs, its ClusterRole and its webhook configurations, as its module ships them.
const (
	Kueue             = "kueue"
	KueueManifestsDir = "kueue-manifests"
)

// The queue files, under DIR/queues.
func (l Layout) QueuesDir() string   { return filepath.Join(l.Dir, "queues") }
func (l Layout) KueueConfig() string { return filepath.Join(l.Dir, "queues", "kueue-config.yaml") }

func queueSpecs(cfg *clusterconfig.Config, l Layout) []Component {
	if !cfg.Queues.Enabled {
		return nil
	}
	q := cfg.Queues
	flags := map[string]string{
		"config": l.KueueConfig(),
		// Its flag names the kubeconfig and the certificate folder, so `certs renew
		// kueue.conf` and `certs renew kueue-webhook` restart it (Using).
		"kubeconfig":       l.Kubeconfig(clusterpki.KueueKubeconfig),
		"metrics-cert-dir": l.PKI(clusterpki.KueueServingDir),
		"zap-log-level":    "info",
	}
	return []Component{{
		Name: Kueue,
		Args: render(flags, q.ExtraArgs),
		Ports: []Port{
			{"127.0.0.1", q.WebhookPort, "queues.webhookPort"},
			{"127.0.0.1", q.HealthPort, "queues.healthPort"},
			{"127.0.0.1", q.MetricsPort, "queues.metricsPort"},
		},
		// Ready once its webhook server serves (cmd/kueue's readyz check).
		HealthURL: "http://" + hostPort("127.0.0.1", q.HealthPort) + "/readyz",
	}}
}

// KueueWebhookURL is the base of the URLs the webhook configurations call.
func KueueWebhookURL(cfg *clusterconfig.Config) string {
	return "https://" + hostPort("127.0.0.1", cfg.Queues.WebhookPort)
}

// kueueConfig is Kueue's Configuration (config.kueue.x-k8s.io/v1beta2). Only Jobs that
// name a LocalQueue (kueue.x-k8s.io/queue-name) are managed; waitForPodsReady is off
// (Kueue admits a Job when its pods fit a node, decision 0702); its own
// certificate management is off (the cluster CA signs pki/kueue/tls.crt); one Kueue per
// control plane, so no leader election (docs/decisions/0696); the on-demand visibility
// API server is off (it would listen on every address, and no APIService points at it);
// MultiKueue is off (it watches Secrets in Kueue's own namespace, for other clusters'
// kubeconfigs, and without that Role its caches never sync, holding every queue).
var kueueConfig = template.Must(template.New("kueue-config.yaml").Parse(`# Written by controlplane-bootstrap init from cluster.yaml; it is rewritten on the next init.
apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
health:
  healthProbeBindAddress: {{.Health}}
metrics:
  bindAddress: {{.Metrics}}
webhook:
  host: 127.0.0.1
  port: {{.WebhookPort}}
  certDir: {{.CertDir}}
leaderElection:
  leaderElect: false
internalCertManagement:
  enable: false
manageJobsWithoutQueueName: false
featureGates:
  VisibilityOnDemand: false
  MultiKueue: false
clientConnection:
  qps: 50
  burst: 100
integrations:
  frameworks:
    - batch/job
`))

// KueueConfig renders DIR/queues/kueue-config.yaml for cfg.
func KueueConfig(cfg *clusterconfig.Config, l Layout) ([]byte, error) {
	q := cfg.Queues
	var b bytes.Buffer
	err := kueueConfig.Execute(&b, map[string]any{
		"Health":      strconv.Quote(hostPort("127.0.0.1", q.HealthPort)),
		"Metrics":     strconv.Quote(hostPort("127.0.0.1", q.MetricsPort)),
		"WebhookPort": q.WebhookPort,
		"CertDir":     strconv.Quote(l.PKI(clusterpki.KueueServingDir)),
	})
	if err != nil {
		return nil, fmt.Errorf("render %s: %w", l.KueueConfig(), err)
	}
	return b.Bytes(), nil
}
