package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"

	"github.com/gpurack/gpurack/controlplane-bootstrap/components"
	"github.com/gpurack/gpurack/controlplane-bootstrap/controlplane"
	"github.com/gpurack/gpurack/controlplane-bootstrap/registryauth"
	"github.com/gpurack/gpurack/controlplane-bootstrap/tenantusers"
	"github.com/gpurack/gpurack/internal/atomicfile"
)

func newRegistryAuthCommand() *cobra.Command {
	return &cobra.Command{
		Use:   registryauth.Command + " --listen HOST:PORT --cert F --key F --signing-cert F --signing-key F --users-file F --robots-file F",
		Short: "Run the image registry's token issuer (init runs it as a component; not for use by hand)",
		// Its flags are the issuer's own (registryauth.Main), so that a test binary can
		// run it without this command tree.
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			return registryauth.Main(cmd.Context(), args, cmd.ErrOrStderr())
		},
	}
}

// registryFlag adds --registry, the registry's address that auth files and pull
// Secrets name.
func registryFlag(cmd *cobra.Command, registry *string) {
	cmd.Flags().StringVar(registry, "registry", "", "the image registry's HOST:PORT, as clients and kubelets reach it (default: cluster.yaml's, "+
		"apiServer.advertiseAddress:registry.port, when registry.enabled; otherwise no registry credentials)")
}

// registryAddress is the registry's host:port for the control plane in cp: the
// --registry value when given (checked), else the advertise address and registry.port
// when the registry is enabled, else "" (no registry credentials).
func registryAddress(flag string, cp *controlplane.ControlPlane) (string, error) {
	if flag == "" {
		if cp.Config.Registry.Enabled {
			return strings.TrimPrefix(components.RegistryURL(cp.Config), "https://"), nil
		}
		return "", nil
	}
	host, port, err := net.SplitHostPort(flag)
	if err != nil || host == "" || port == "" || strings.ContainsAny(flag, "/ ") {
		return "", fmt.Errorf("--registry %q: give HOST:PORT, such as 192.0.2.10:5000", flag)
	}
	return flag, nil
}

// robotsPath is where the control plane in cp keeps its tenants' pull credentials.
func robotsPath(cp *controlplane.ControlPlane) string {
	return filepath.Join(cp.Layout.Dir, registryauth.RobotsFile)
}

// applyPullSecrets gives every tenant in the cluster its pull credential for
// registry and reports what changed to out.
func applyPullSecrets(ctx context.Context, out io.Writer, cs kubernetes.Interface, cp *controlplane.ControlPlane, registry string) error {
	byTenant, err := registryauth.TenantNamespaces(ctx, cs)
	if err != nil {
		return err
	}
	robots, err := registryauth.LoadRobots(robotsPath(cp))
	if err != nil {
		return err
	}
	res, err := registryauth.ApplyPullSecrets(ctx, cs, robots, byTenant, registry, time.Now())
	if saveErr := robots.Save(robotsPath(cp)); saveErr != nil && err == nil {
		err = saveErr
	}
	for _, w := range res.Written {
		fmt.Fprintf(out, "registry  %s\n", w)
	}
	if len(res.Issued) > 0 {
		fmt.Fprintf(out, "registry  new pull credential for %s\n", strings.Join(res.Issued, ", "))
	}
	if len(res.Removed) > 0 {
		fmt.Fprintf(out, "registry  pull credential of %s removed (no longer tenants)\n", strings.Join(res.Removed, ", "))
	}
	return err
}

// writeRegistryAuth issues the credential credID in store a registry password and
// writes the user's auth file for registry beside kubeconfig, NAME.registry-auth.json.
// It returns the file's path.
func writeRegistryAuth(store *tenantusers.Store, credID, user, kubeconfig, registry string) (string, error) {
	password, err := registryauth.IssueUserPassword(store, credID)
	if err != nil {
		return "", err
	}
	data, err := registryauth.AuthFile(registry, user, password)
	if err != nil {
		return "", err
	}
	path := filepath.Join(filepath.Dir(kubeconfig), user+".registry-auth.json")
	if err := atomicfile.WriteMkdirAll(path, append(data, '\n'), 0o600, 0o700); err != nil {
		return "", err
	}
	return path, nil
}
