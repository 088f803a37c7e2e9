package main

import (
	"archive/tar"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpurack/gpurack/imagebuilder/build"
	"github.com/gpurack/gpurack/imagebuilder/ociarchive"
	"github.com/gpurack/gpurack/internal/manifest"
	"github.com/gpurack/gpurack/internal/profile"
)

func newContainerCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "container",
		Short: "Build reproducible, signed workload images (OCI) from container profiles",
		Long: `A container profile (kind: container; docs/workload-images.md) names Debian packages, files
from its folder and an image config with a non-root user. gpuimage lock pins its packages
as it does a node profile's; container build turns profile and lock into an OCI
image-layout tar archive (ctr images import, skopeo copy oci-archive:) and, with --push,
pushes it.`,
	}
	root.AddCommand(newContainerBuildCommand(), newContainerVerifyCommand())
	return root
}

func newContainerBuildCommand() *cobra.Command {
	var o build.ContainerOptions
	cmd := &cobra.Command{
		Use:   "build PROFILE --out ARCHIVE",
		Short: "Build a container profile into an OCI archive (and push it)",
		Long: `build installs exactly the locked .debs (Debian's Essential set and the profile's packages,
from the same sha256-keyed cache as node images) with mmdebstrap into a tree, adds the
profile's files, its user and work directory, and writes one layer and the image config
deterministically: sorted entries, numeric owners, mtimes clamped to SOURCE_DATE_EPOCH
(default: the newest Release date in the lock). The same profile and lock give the same
manifest digest. ARCHIVE.sig is the ed25519 signature of that digest ("sha256:HEX") with
the image signing key; gpuimage container verify checks it.

The build refuses a profile whose lock is missing or stale, and a root user. ARCHIVE is
replaced only once the new one is complete. Needs root and mmdebstrap, like a node build.`,
		Example: "  gpuimage lock profiles/workloads/train.yaml\n  gpuimage container build profiles/workloads/train.yaml --out build/workloads/train.oci.tar\n" +
			"  gpuimage container build profiles/workloads/train.yaml --out train.oci.tar --push registry.example/workloads/train:1.0 --ca ca.pem --authfile auth.json",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Profile = args[0]
			epoch, err := build.EpochFromEnv()
			if err != nil {
				return err
			}
			o.Epoch = epoch
			o.Reporter = build.NewReporter(cmd.ErrOrStderr())
			start := time.Now()
			res, err := build.BuildContainer(cmd.Context(), o)
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "built %s in %s\n  image    %s\n  manifest %s\n  archive  %d bytes (layer %d bytes compressed)\n  signature %s\n",
				res.Archive, time.Since(start).Round(time.Second), res.Ref, res.Digest, res.Size, res.Layer, res.Signature)
			if res.Pushed != "" {
				fmt.Fprintf(w, "pushed %s\n", res.Pushed)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Out, "out", "", "the OCI image-layout tar archive to write (required); its signature goes to ARCHIVE.sig")
	f.StringVar(&o.Cache, "cache", build.DefaultCacheDir(), "cache directory (.deb cache, private apt state, default signing key)")
	f.StringVar(&o.Key, "key", "", "ed25519 signing key, PKIX PEM (default: CACHE/signing-key.pem, generated once)")
	f.StringVar(&o.Lock, "lock", "", "lock file (default: NAME.lock.json beside the profile)")
	f.StringVar(&o.Push, "push", "", "also push the image to this reference (registry.example/team/image:tag)")
	f.StringVar(&o.CA, "ca", "", "with --push: PEM file of CA certificates to trust besides the system's")
	f.StringVar(&o.AuthFile, "authfile", "", "with --push: containers auth file with the registry's credentials (the format of skopeo --authfile)")
	return cmd
}

func newContainerVerifyCommand() *cobra.Command {
	var pubkeys []string
	cmd := &cobra.Command{
		Use:   "verify ARCHIVE --pubkey FILE",
		Short: "Check a workload image archive and its signature (ARCHIVE.sig)",
		Long: `verify checks the archive as gpuimage checks image archives a node ships (every blob's
digest, linux/amd64, complete), then ARCHIVE.sig: the ed25519 signature of the image
manifest's digest by any of the given public keys. It exits 1 when either fails.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(pubkeys) == 0 {
				return fmt.Errorf("--pubkey is required: the public key(s) the image must be signed with")
			}
			pubs, err := manifest.LoadPublicKeys(pubkeys...)
			if err != nil {
				return err
			}
			a, err := ociarchive.InspectFile(args[0])
			if err != nil {
				return &exitError{code: 1, msg: "FAIL " + err.Error()}
			}
			digest, err := archiveManifestDigest(args[0])
			if err != nil {
				return &exitError{code: 1, msg: "FAIL " + err.Error()}
			}
			sig, err := os.ReadFile(args[0] + ".sig")
			if err != nil {
				return &exitError{code: 1, msg: "FAIL " + err.Error()}
			}
			if err := manifest.Verify(pubs, []byte(digest), sig); err != nil {
				return &exitError{code: 1, msg: fmt.Sprintf("FAIL %s.sig: %v", args[0], err)}
			}
			fmt.Fprintf(cmd.OutOrStdout(), "ok  %s: %s, manifest %s signed\n", args[0], strings.Join(a.Names, " "), digest)
			return nil
		},
	}
	cmd.Flags().StringSliceVar(&pubkeys, "pubkey", nil, "public key file (PKIX PEM); repeat for several")
	return cmd
}

// archiveManifestDigest reads the digest of the one image manifest that an OCI
// archive's index.json lists.
func archiveManifestDigest(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return "", fmt.Errorf("%s has no index.json; not an OCI image layout", path)
		}
		if err != nil {
			return "", fmt.Errorf("%s: %w", path, err)
		}
		if strings.TrimPrefix(h.Name, "./") != "index.json" {
			continue
		}
		var idx struct {
			Manifests []struct {
				Digest string `json:"digest"`
			} `json:"manifests"`
		}
		if err := json.NewDecoder(io.LimitReader(tr, ociarchive.MaxJSON)).Decode(&idx); err != nil {
			return "", fmt.Errorf("%s: index.json: %w", path, err)
		}
		if len(idx.Manifests) != 1 {
			return "", fmt.Errorf("%s: index.json lists %d manifests, want 1", path, len(idx.Manifests))
		}
		return idx.Manifests[0].Digest, nil
	}
}

// lockContainer is gpuimage lock for a container profile: the same lock file, written
// and checked the same way as a node profile's.
func lockContainer(cmd *cobra.Command, path, lockPath, cacheDir string, check bool) error {
	c, err := profile.LoadContainer(path)
	if err != nil {
		return err
	}
	ctx := cmd.Context()
	if check {
		l, err := profile.LoadLock(lockPath)
		if err != nil {
			return fmt.Errorf("%w (run gpuimage lock %s)", err, path)
		}
		stale, err := build.CheckContainerLock(ctx, cacheDir, c, l)
		if err != nil {
			return err
		}
		if len(stale) > 0 {
			sort.Strings(stale)
			return &exitError{code: 1, msg: fmt.Sprintf("%s is stale (%d problem(s)); run gpuimage lock %s:\n  %s", lockPath, len(stale), path, strings.Join(stale, "\n  "))}
		}
		fmt.Fprintf(cmd.OutOrStdout(), "%s: fresh, %d packages\n", lockPath, len(l.Packages))
		return nil
	}
	l, err := build.LockContainer(ctx, cacheDir, c)
	if err != nil {
		return err
	}
	size, err := writeLock(lockPath, l)
	if err != nil {
		return err
	}
	fmt.Fprintf(cmd.OutOrStdout(), "wrote %s: %d packages (%.1f MiB of .debs), from %d Release files\n", lockPath, len(l.Packages), float64(size)/(1<<20), len(l.Release))
	return nil
}

// lintContainer is gpuimage lint for a container profile: the profile, its files and
// the lock beside it.
func lintContainer(cmd *cobra.Command, path string) bool {
	c, err := profile.LoadContainer(path)
	if err != nil {
		fmt.Fprintln(cmd.ErrOrStderr(), err)
		return false
	}
	lockPath := profile.LockPath(path)
	lockState := "no lock file yet"
	l, err := profile.LoadLock(lockPath)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		fmt.Fprintln(cmd.ErrOrStderr(), err)
		return false
	case l.ProfileDigest != c.Digest():
		fmt.Fprintf(cmd.ErrOrStderr(), "%s: profileDigest: stale: the profile changed since it was locked (lock has %s, profile is %s); run gpuimage lock %s\n",
			lockPath, l.ProfileDigest, c.Digest(), path)
		return false
	default:
		lockState = fmt.Sprintf("lock ok, %d packages", len(l.Packages))
	}
	fmt.Fprintf(cmd.OutOrStdout(), "ok  %s: container %s, %s, %d packages listed, %d files, user %s (%d:%d); %s\n",
		path, c.Ref(), c.Base.Suite, len(c.Packages), len(c.Files), c.Image.User.Name, c.Image.User.UID, c.Image.User.GID, lockState)
	return true
}
