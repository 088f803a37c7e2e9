package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gpurack/gpurack/internal/manifest"
)

func newVerifyCommand() *cobra.Command {
	var pubkeys []string
	cmd := &cobra.Command{
		Use:   "verify DIR --pubkey FILE",
		Short: "Check an image directory's signature and every artifact's sha256",
		Long: `verify checks manifest.sig (ed25519 over the exact bytes of manifest.json) against the
given public keys (any one suffices), then the size and sha256 of every artifact the
manifest lists. It exits 1 naming each file that fails.`,
		Example: "  gpuimage verify images/3f2a… --pubkey signing-key.pub.pem",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(pubkeys) == 0 {
				return fmt.Errorf("--pubkey is required: the public key(s) the image must be signed with")
			}
			pubs, err := manifest.LoadPublicKeys(pubkeys...)
			if err != nil {
				return err
			}
			m, err := manifest.VerifyDir(args[0], pubs)
			if err != nil {
				var lines []string
				for _, e := range unwrapAll(err) {
					var ae *manifest.ArtifactError
					if errors.As(e, &ae) {
						lines = append(lines, "FAIL "+ae.Name+": "+ae.Error())
					}
				}
				if len(lines) == 0 {
					lines = append(lines, "FAIL "+err.Error())
				}
				return &exitError{code: 1, msg: fmt.Sprintf("%s does not verify:\n%s", args[0], strings.Join(lines, "\n"))}
			}
			fmt.Fprintf(cmd.OutOrStdout(), "ok  image %s (%s): signature and %d artifacts verified\n", m.ImageID, m.Profile, len(m.Artifacts))
			return nil
		},
	}
	cmd.Flags().StringSliceVar(&pubkeys, "pubkey", nil, "public key file (PKIX PEM); repeat for several")
	return cmd
}

// unwrapAll flattens errors.Join trees.
func unwrapAll(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, unwrapAll(e)...)
		}
		return out
	}
	if u := errors.Unwrap(err); u != nil {
		if _, ok := err.(*manifest.ArtifactError); !ok {
			if more := unwrapAll(u); len(more) > 1 {
				return more
			}
		}
	}
	return []error{err}
}
