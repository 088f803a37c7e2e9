package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gpurack/gpurack/imagebuilder/build"
)

func newBuildCommand() *cobra.Command {
	var o build.Options
	cmd := &cobra.Command{
		Use:   "build PROFILE",
		Short: "Build the netboot artifacts of a locked profile into OUT/<image-id>/",
		Long: `build turns a profile and its lock into vmlinuz, initrd.img, rootfs.squashfs, cmdline,
manifest.json, manifest.sig and sbom.spdx.json under OUT/<image-id>/.

Every locked .deb comes from the sha256-keyed cache (fetched from the archive when missing,
refetched when corrupted); mmdebstrap installs exactly those .debs with SOURCE_DATE_EPOCH
set (default: the newest Release date in the lock), so the same profile and lock give the
same bytes. The image installs and enables the gpuagent unit given with --agent-unit
(agent/systemd/gpuagent.service in the gpurack repository). Needs root (mmdebstrap runs maintainer scripts in a chroot), mmdebstrap,
squashfs-tools, the Go toolchain and the pinned Kubernetes binaries (make k8s-bins).`,
		Example: "  gpuimage build profiles/tiny.yaml --agent-unit agent/systemd/gpuagent.service --out /srv/gpurack/images",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Profile = args[0]
			epoch, err := build.EpochFromEnv()
			if err != nil {
				return err
			}
			o.Epoch = epoch
			o.Reporter = build.NewReporter(cmd.ErrOrStderr())
			if o.Src == "" {
				o.Src = findRepoRoot()
			}
			res, err := build.Build(cmd.Context(), o)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "built %s\n", res.Dir)
			for _, a := range res.Manifest.Artifacts {
				fmt.Fprintf(cmd.OutOrStdout(), "  %-16s %10d  sha256:%s\n", a.Name, a.Size, a.SHA256)
			}
			return nil
		},
	}
	k8s := os.Getenv("GPURACK_K8S_DIR")
	if k8s == "" {
		if d, err := os.UserCacheDir(); err == nil {
			k8s = filepath.Join(d, "gpurack", "k8s", "v1.34.2")
		}
	}
	f := cmd.Flags()
	f.StringVar(&o.Out, "out", "images", "image store directory")
	f.StringVar(&o.Cache, "cache", build.DefaultCacheDir(), "cache directory (.deb cache, private apt state, default signing key)")
	f.StringVar(&o.Key, "key", "", "ed25519 signing key, PKIX PEM (default: CACHE/signing-key.pem, generated once)")
	f.StringVar(&o.Lock, "lock", "", "lock file (default: NAME.lock.json beside the profile)")
	f.StringVar(&o.Src, "src", "", "gpurack source tree for gpuagent and gpurack-init (default: the enclosing repository)")
	f.StringVar(&o.AgentBin, "agent-bin", "", "use this gpuagent binary instead of building it")
	f.StringVar(&o.AgentUnit, "agent-unit", "", "the gpuagent systemd unit the image installs and enables (required; agent/systemd/gpuagent.service in the repository)")
	f.StringVar(&o.InitBin, "init-bin", "", "use this gpurack-init binary instead of building it")
	f.StringVar(&o.CDIHookBin, "cdi-hook-bin", "", "use this nvidia-cdi-hook binary (GPU profiles) instead of building it from the pinned nvidia-container-toolkit")
	f.StringVar(&o.NvidiaRuntimeBin, "nvidia-runtime-bin", "", "use this nvidia-container-runtime binary (GPU profiles on containerd 1.6) instead of building it from the pinned nvidia-container-toolkit")
	f.StringVar(&o.K8sDir, "k8s-dir", k8s, "output of make k8s-bins (bin/kubelet, bin/kube-proxy, bin/node_exporter, images/pause.tar)")
	return cmd
}

// findRepoRoot walks up from the working directory to the gpurack module root.
func findRepoRoot() string {
	dir, err := os.Getwd()
	if err != nil {
		return ""
	}
	for {
		if data, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && strings.HasPrefix(string(data), "module github.com/gpurack/gpurack\n") {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return ""
		}
		dir = parent
	}
}
