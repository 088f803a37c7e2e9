package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gpurack/gpurack/imagebuilder/build"
	"github.com/gpurack/gpurack/internal/atomicfile"
	"github.com/gpurack/gpurack/internal/profile"
)

func newLockCommand() *cobra.Command {
	var check bool
	var cacheDir, out string
	cmd := &cobra.Command{
		Use:   "lock PROFILE",
		Short: "Resolve a node or container profile against the Debian archive into NAME.lock.json",
		Long: `lock resolves the profile with apt itself, under a private configuration and state
directory (the host's apt state is never read or written; only its list of Debian sources,
unless the profile sets base.mirror). apt verifies every InRelease with the Debian archive
keyring. Every root-filesystem package and every build-only input is recorded with its
version, archive area, pool path, size and sha256 (CONTRACTS §8).

With --check, nothing is written: the exit status is 1 and each stale package is named
when the profile changed or a locked .deb is neither in the archive nor in the cache.

A container profile (kind: container, docs/workload-images.md) is locked the same way:
Debian's Essential set and its packages.`,
		Example: "  gpuimage lock profiles/tiny.yaml\n  gpuimage lock --check profiles/tiny.yaml",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			lockPath := out
			if lockPath == "" {
				lockPath = profile.LockPath(args[0])
			}
			if isContainer, err := profile.IsContainerFile(args[0]); err != nil {
				return err
			} else if isContainer {
				return lockContainer(cmd, args[0], lockPath, cacheDir, check)
			}
			p, err := profile.Load(args[0])
			if err != nil {
				return err
			}
			// The archives are not locked (their digests enter the image id at build
			// time), but a missing or corrupt one is better found now.
			if _, err := build.ImageArchives(args[0], p); err != nil {
				return err
			}
			ctx := cmd.Context()
			if check {
				l, err := profile.LoadLock(lockPath)
				if err != nil {
					return fmt.Errorf("%w (run gpuimage lock %s)", err, args[0])
				}
				stale, err := build.CheckLock(ctx, cacheDir, p, l)
				if err != nil {
					return err
				}
				if len(stale) > 0 {
					return &exitError{code: 1, msg: fmt.Sprintf("%s is stale (%d problem(s)); run gpuimage lock %s:\n  %s", lockPath, len(stale), args[0], strings.Join(stale, "\n  "))}
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s: fresh, %d packages, %d build inputs\n", lockPath, len(l.Packages), len(l.Build))
				return nil
			}
			l, err := build.Lock(ctx, cacheDir, p)
			if err != nil {
				return err
			}
			size, err := writeLock(lockPath, l)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s: %d packages (%.1f MiB of .debs), %d build inputs, from %d Release files\n",
				lockPath, len(l.Packages), float64(size)/(1<<20), len(l.Build), len(l.Release))
			return nil
		},
	}
	cmd.Flags().BoolVar(&check, "check", false, "only check the existing lock; exit 1 naming stale packages")
	cmd.Flags().StringVar(&cacheDir, "cache", build.DefaultCacheDir(), "cache directory (private apt state, .deb cache)")
	cmd.Flags().StringVar(&out, "out", "", "write the lock here instead of beside the profile")
	return cmd
}

// writeLock writes l to lockPath once it validates as gpuimage would read it back, and
// returns the size of its packages' .debs.
func writeLock(lockPath string, l *profile.Lock) (int64, error) {
	data, err := l.Marshal()
	if err != nil {
		return 0, err
	}
	if _, err := profile.ParseLock(lockPath, data); err != nil {
		return 0, fmt.Errorf("the lock gpuimage made does not validate (a bug): %w", err)
	}
	if err := atomicfile.Write(lockPath, data, 0o644); err != nil {
		return 0, err
	}
	var size int64
	for _, lp := range l.Packages {
		size += lp.Size
	}
	return size, nil
}
