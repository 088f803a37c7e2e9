// Package registryhosts writes what makes a node's containerd trust the cluster's image
// registry: containerd's registry host configuration (hosts.toml, containerd's
// docs/hosts.md) for the registry the JoinBundle names, with the cluster CA beside it.
// The image's containerd reads this folder as the CRI plugin's registry config_path
// (imagebuilder/rootfs), on each pull, so a change needs no restart.
//
// The files, for registry HOST:PORT in folder DIR:
//
//	DIR/HOST:PORT/hosts.toml   server and host https://HOST:PORT, capabilities pull and
//	                           resolve, ca = DIR/HOST:PORT/ca.crt
//	DIR/HOST:PORT/ca.crt       the JoinBundle's cluster CA (PEM)
//
// It is not for credentials: kubelet pulls with the pod's image pull Secret
// (gpurack-registry in each tenant namespace, docs/registry.md).
package registryhosts

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/gpurack/gpurack/internal/atomicfile"
)

// DefaultDir is the folder on the node: the image's containerd config_path
// (imagebuilder/rootfs.RegistryHostsDir). Under /run: it is this boot's state, written
// from this boot's JoinBundle.
const DefaultDir = "/run/gpurack/containerd/certs.d"

// The files in a registry's folder.
const (
	HostsFile = "hosts.toml"
	CAFile    = "ca.crt"
)

// marker starts every hosts.toml this package writes: Apply removes only folders whose
// hosts.toml starts with it, never one an operator put there.
const marker = "# gpurack: written by gpuagent from the JoinBundle (registry)"

// HostsTOML is the hosts.toml for registry (HOST:PORT) whose CA file is caFile
// (absolute path).
func HostsTOML(registry, caFile string) []byte {
	url := strconv.Quote("https://" + registry)
	return []byte(marker + `; rewritten at each join.
# containerd pulls HOST:PORT/... images from here over TLS, trusting the cluster CA.
server = ` + url + `

[host.` + url + `]
  capabilities = ["pull", "resolve"]
  ca = ` + strconv.Quote(caFile) + `
`)
}

// ValidRegistry checks that registry is HOST:PORT with a port number, fit to name a
// folder: no slash, no leading dot.
func ValidRegistry(registry string) error {
	host, port, err := net.SplitHostPort(registry)
	if err != nil {
		return fmt.Errorf("registry %q: %w", registry, err)
	}
	p, err := strconv.Atoi(port)
	if host == "" || err != nil || p < 1 || p > 65535 || strings.ContainsAny(registry, `/\`) || strings.HasPrefix(registry, ".") {
		return fmt.Errorf("registry %q is not HOST:PORT (gpuboot's cluster.registry)", registry)
	}
	return nil
}

// Apply makes dir hold the files for registry and no other registry's this package
// wrote: it writes DIR/registry/ca.crt, then hosts.toml, each atomically, and removes
// the folders of registries it wrote before (another cluster.registry at an earlier
// join), which it returns. An empty registry only removes. caPEM must hold a
// certificate when registry is set.
func Apply(dir, registry string, caPEM []byte) (removed []string, err error) {
	if registry != "" {
		if err := ValidRegistry(registry); err != nil {
			return nil, err
		}
		if !bytes.Contains(caPEM, []byte("-----BEGIN CERTIFICATE-----")) {
			return nil, fmt.Errorf("registry %s: the JoinBundle carries no cluster CA to trust it with", registry)
		}
		host := filepath.Join(dir, registry)
		ca := filepath.Join(host, CAFile)
		if err := atomicfile.WriteMkdirAll(ca, caPEM, 0o644, 0o755); err != nil {
			return nil, err
		}
		if err := atomicfile.Write(filepath.Join(host, HostsFile), HostsTOML(registry, ca), 0o644); err != nil {
			return nil, err
		}
	}
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		if !e.IsDir() || e.Name() == registry {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name(), HostsFile))
		if err != nil || !bytes.HasPrefix(b, []byte(marker)) {
			continue // not ours
		}
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return removed, err
		}
		removed = append(removed, e.Name())
	}
	return removed, nil
}
