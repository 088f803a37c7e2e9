// Package components describes the four control-plane components (etcd,
// kube-apiserver, kube-controller-manager, kube-scheduler): where their
// pinned binaries are, the flags and files they get, their systemd units,
// their health checks, and a supervisor that runs them as child processes,
// restarts a crashed one with backoff and one asked to restart at once.
//
// Flag and unit rendering are pure functions of the cluster configuration and
// the directory layout; only Supervisor, the health probes, the port check and
// the systemd D-Bus calls do I/O. It knows nothing about join material
// (package joinconfig) or the order of init (package controlplane).
package components

import "path/filepath"

// Layout names every file of one control plane under its directory.
type Layout struct {
	Dir string
}

// The directory's parts.
func (l Layout) PKIDir() string                { return filepath.Join(l.Dir, "pki") }
func (l Layout) PKI(rel string) string         { return filepath.Join(l.Dir, "pki", rel) }
func (l Layout) Kubeconfig(name string) string { return filepath.Join(l.Dir, name) }
func (l Layout) EtcdDataDir() string           { return filepath.Join(l.Dir, "etcd") }
func (l Layout) ConfigFile() string            { return filepath.Join(l.Dir, "cluster.yaml") }
func (l Layout) AuditPolicy() string           { return filepath.Join(l.Dir, "config", "audit-policy.yaml") }
func (l Layout) EncryptionConfig() string {
	return filepath.Join(l.Dir, "config", "encryption-config.yaml")
}
func (l Layout) LogDir() string { return filepath.Join(l.Dir, "logs") }
func (l Layout) LogFile(component string) string {
	return filepath.Join(l.Dir, "logs", component+".log")
}
func (l Layout) AuditLog() string { return filepath.Join(l.Dir, "logs", "audit.log") }
func (l Layout) RunDir() string   { return filepath.Join(l.Dir, "run") }
func (l Layout) PIDFile(component string) string {
	return filepath.Join(l.Dir, "run", component+".pid")
}
func (l Layout) SupervisorPIDFile() string { return filepath.Join(l.Dir, "run", "supervisor.pid") }
func (l Layout) SystemdMarker() string     { return filepath.Join(l.Dir, "run", "systemd-units") }
func (l Layout) UnitDir() string           { return filepath.Join(l.Dir, "units") }

// SupervisorSocket is where a foreground supervisor takes restart requests
// (`certs renew`).
func (l Layout) SupervisorSocket() string { return filepath.Join(l.Dir, "run", "supervisor.sock") }
