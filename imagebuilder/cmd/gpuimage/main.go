// Command gpuimage builds immutable, reproducible, signed gpurack node images from a
// declarative profile, one per GPU driver version. See `gpuimage --help`.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/gpurack/gpurack/internal/buildinfo"
)

func main() {
	if err := newRootCommand().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "gpuimage:", err)
		os.Exit(exitCode(err))
	}
}

func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "gpuimage",
		Short: "Build reproducible, signed GPU node images from profiles",
		Long: `gpuimage turns a node profile (profiles/NAME.yaml: Debian suite, kernel, GPU driver
version and flavor, expected hardware, Kubernetes version) and its lock file into
netboot artifacts that gpuboot serves. gpuimage container builds workload images (OCI)
from container profiles, pinned by the same lock.`,
		Version:       buildinfo.String(),
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newLintCommand())
	root.AddCommand(newLockCommand())
	root.AddCommand(newBuildCommand())
	root.AddCommand(newVerifyCommand())
	root.AddCommand(newInspectCommand())
	root.AddCommand(newKeygenCommand())
	root.AddCommand(newCacheCommand())
	root.AddCommand(newContainerCommand())
	return root
}

// exitError carries a process exit status with an already-printed failure.
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

func exitCode(err error) int {
	if e, ok := err.(*exitError); ok {
		return e.code
	}
	return 1
}
