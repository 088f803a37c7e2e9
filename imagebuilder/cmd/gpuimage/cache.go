package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/gpurack/gpurack/imagebuilder/build"
	"github.com/gpurack/gpurack/imagebuilder/debcache"
	"github.com/gpurack/gpurack/internal/profile"
)

func newCacheCommand() *cobra.Command {
	var cacheDir string
	root := &cobra.Command{
		Use:   "cache",
		Short: "Carry the sha256-keyed .deb cache that keeps old locks buildable",
		Long: `The Debian mirror drops superseded versions and no snapshot archive is reachable, so a
lock stays buildable only while its .debs are in the archive or in the cache. export writes
the cache entries of a lock (or the whole cache) as a tar stream; import reads one back,
checking every file against the sha256 in its name.`,
	}
	export := &cobra.Command{
		Use:     "export FILE [LOCK...]",
		Short:   "Write the cache entries of the given locks (default: all) to FILE (a tar)",
		Example: "  gpuimage cache export tiny-debs.tar profiles/tiny.lock.json",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var pkgs []profile.LockedPackage
			for _, lp := range args[1:] {
				l, err := profile.LoadLock(lp)
				if err != nil {
					return err
				}
				pkgs = append(append(pkgs, l.Packages...), l.Build...)
			}
			f, err := os.Create(args[0])
			if err != nil {
				return err
			}
			c := &debcache.Cache{Dir: filepath.Join(cacheDir, "debs")}
			n, err := c.Export(f, pkgs)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				os.Remove(args[0])
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s: %d .debs\n", args[0], n)
			return nil
		},
	}
	imp := &cobra.Command{
		Use:   "import FILE",
		Short: "Add the .debs of a cache export to the cache, verifying each",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := os.Open(args[0])
			if err != nil {
				return err
			}
			defer f.Close()
			c := &debcache.Cache{Dir: filepath.Join(cacheDir, "debs")}
			added, present, err := c.Import(f)
			if err != nil {
				return fmt.Errorf("%s: %w", args[0], err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "imported %s: %d .debs added, %d already present\n", args[0], added, present)
			return nil
		},
	}
	root.PersistentFlags().StringVar(&cacheDir, "cache", build.DefaultCacheDir(), "cache directory")
	root.AddCommand(export, imp)
	return root
}
