package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/gpurack/gpurack/internal/manifest"
)

func newKeygenCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "keygen PRIVATE.pem PUBLIC.pem",
		Short: "Generate an ed25519 image-signing key pair (PKIX PEM)",
		Long: `keygen writes a new ed25519 key pair for signing manifests: the private key (mode 0600)
for gpuimage build --key, the public key for gpuimage verify --pubkey and gpuboot's config.
openssl reads both (openssl pkeyutl -verify -rawin checks a manifest.sig).`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, p := range args {
				if _, err := os.Stat(p); err == nil {
					return fmt.Errorf("%s exists; refusing to overwrite a signing key (move it away first)", p)
				}
			}
			pub, priv, err := manifest.GenerateKey()
			if err != nil {
				return err
			}
			if err := manifest.WriteKeyPair(args[0], args[1], priv); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s and %s (key id %s)\n", args[0], args[1], manifest.KeyID(pub))
			return nil
		},
	}
	return cmd
}
