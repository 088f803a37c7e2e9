package main

import (
	"errors"
	"fmt"
	"io/fs"

	"github.com/spf13/cobra"

	"github.com/gpurack/gpurack/imagebuilder/build"
	"github.com/gpurack/gpurack/internal/profile"
)

func newLintCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "lint PROFILE...",
		Short: "Validate node and container profiles and the lock files beside them",
		Long: `lint parses each profile strictly (an unknown field is an error) and checks every
value. If NAME.lock.json exists beside the profile it is validated too, and a lock whose
profile digest differs from the profile's is reported as stale.

Each problem is printed as FILE:LINE: FIELD: what is wrong and what to fix.
Exit status: 0 when every file is valid, 1 otherwise.`,
		Example: "  gpuimage lint profiles/*.yaml",
		Args:    cobra.MinimumNArgs(1),
		ValidArgsFunction: func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
			return []string{"yaml", "yml"}, cobra.ShellCompDirectiveFilterFileExt
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			failed := 0
			for _, path := range args {
				if !lintOne(cmd, path) {
					failed++
				}
			}
			if failed > 0 {
				return &exitError{code: 1, msg: fmt.Sprintf("%d of %d profiles have problems", failed, len(args))}
			}
			return nil
		},
	}
}

// lintOne reports on one profile and its lock; it returns false if either is invalid.
func lintOne(cmd *cobra.Command, path string) bool {
	out, errOut := cmd.OutOrStdout(), cmd.ErrOrStderr()
	if isContainer, err := profile.IsContainerFile(path); err == nil && isContainer {
		return lintContainer(cmd, path)
	}
	p, err := profile.Load(path)
	if err != nil {
		fmt.Fprintln(errOut, err)
		return false
	}
	archives, err := build.ImageArchives(path, p)
	if err != nil {
		fmt.Fprintln(errOut, err)
		return false
	}
	gpu := "no GPU"
	switch {
	case p.Simulated():
		gpu = fmt.Sprintf("%dx %s, SIMULATED (simulator %s, no driver)", p.GPU.Expect.Count, p.GPU.Expect.Product, p.GPU.Simulator)
	case p.HasGPU():
		gpu = fmt.Sprintf("%dx %s, driver %s (%s)", p.GPU.Expect.Count, p.GPU.Expect.Product, p.GPU.Driver.Version, p.GPU.Driver.Flavor)
	}
	lockPath := profile.LockPath(path)
	lockState := "no lock file yet"
	l, err := profile.LoadLock(lockPath)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		fmt.Fprintln(errOut, err)
		return false
	case l.ProfileDigest != p.Digest():
		fmt.Fprintf(errOut, "%s: profileDigest: stale: the profile changed since it was locked (lock has %s, profile is %s); run gpuimage lock %s\n",
			lockPath, l.ProfileDigest, p.Digest(), path)
		return false
	default:
		lockState = fmt.Sprintf("lock ok, %d packages", len(l.Packages))
	}
	if len(archives) > 0 {
		gpu += fmt.Sprintf(", %d image archive(s)", len(archives))
	}
	fmt.Fprintf(out, "ok  %s: %s, %s, kernel %s, Kubernetes %s, %s; %s\n",
		path, p.Name, p.Base.Suite, p.Kernel.Package, p.Kubernetes.Version, gpu, lockState)
	return true
}
