package components

import (
	"net"
	"path/filepath"

	"github.com/gpurack/gpurack/controlplane-bootstrap/registryauth"
	"github.com/gpurack/gpurack/controlplane-bootstrap/tenantusers"
)

// The image registry's token issuer (docs/contracts.md, "Image registry tokens";
// decision 0698): controlplane-bootstrap itself, run as RegistryAuthCommand, beside the
// registry.
const (
	RegistryAuth = "registry-auth"
	// RegistryAuthCommand is the subcommand the issuer runs as.
	RegistryAuthCommand = registryauth.Command
	// registryServingCert and registryServingKey are the registry's serving pair under
	// DIR/pki (cluster CA; SANs the advertise addresses and gpurack-registry), which
	// the issuer serves with too: clients reach both at the same address.
	registryServingCert = "registry.crt"
	registryServingKey  = "registry.key"
)

// RegistryAuthSpec is the token issuer, listening with TLS on listenHost:port (the
// registry's realm, https://ADVERTISE:PORT/token; registryauth.Port by default),
// signing with DIR/pki/registry-token.key and reading the users' and the tenants'
// registry credentials on each request.
func RegistryAuthSpec(l Layout, listenHost string, port int) Component {
	flags := map[string]string{
		"listen":       hostPort(listenHost, port),
		"cert":         l.PKI(registryServingCert),
		"key":          l.PKI(registryServingKey),
		"signing-cert": l.PKI(registryauth.SigningCertFile),
		"signing-key":  l.PKI(registryauth.SigningKeyFile),
		"users-file":   filepath.Join(l.Dir, tenantusers.StoreFile),
		"robots-file":  filepath.Join(l.Dir, registryauth.RobotsFile),
	}
	probe := listenHost
	if ip := net.ParseIP(probe); ip == nil || ip.IsUnspecified() {
		probe = "127.0.0.1"
	}
	return Component{
		Name:      RegistryAuth,
		Self:      true,
		Args:      append([]string{RegistryAuthCommand}, render(flags, nil)...),
		Ports:     []Port{{listenHost, port, "registry.authPort"}},
		HealthURL: "https://" + hostPort(probe, port) + "/healthz",
	}
}
