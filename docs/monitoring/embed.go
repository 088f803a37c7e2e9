// Package monitoring carries the shipped monitoring files of this folder into the
// binaries: controlplane-bootstrap writes the alert and recording rules where the
// metrics server it starts reads them (docs/monitoring.md). The YAML files stay the
// one source; this file only embeds them.
package monitoring

import "embed"

// Rules are the rule files Prometheus loads, by file name: the alerts, the tenants'
// recording rules and the log store's alerts (not their promtool tests).
//
//go:embed gpurack-alerts.yaml gpurack-tenants.yaml gpurack-logs.yaml
var Rules embed.FS

// RuleFiles names the files in Rules.
var RuleFiles = []string{"gpurack-alerts.yaml", "gpurack-tenants.yaml", "gpurack-logs.yaml"}
