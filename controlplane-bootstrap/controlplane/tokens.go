package controlplane

import (
	"context"
	"fmt"
	"slices"

	"github.com/gpurack/gpurack/controlplane-bootstrap/joinconfig"
)

// RevokeToken deletes the bootstrap token whose id is id and, when it existed, waits
// until the apiserver refuses it (joinconfig.WaitRevoked), so that a caller told it is
// revoked can rely on it.
func (cp *ControlPlane) RevokeToken(ctx context.Context, id string) error {
	client, err := cp.Clientset()
	if err != nil {
		return err
	}
	// Read the secret part first so the wait can prove the token is refused.
	toks, err := joinconfig.ListTokens(ctx, client)
	if err != nil {
		return err
	}
	if err := joinconfig.RevokeToken(ctx, client, id); err != nil {
		return err
	}
	i := slices.IndexFunc(toks, func(t joinconfig.Token) bool { return t.ID == id })
	if i < 0 {
		return nil
	}
	rc, err := cp.RESTConfig()
	if err != nil {
		return err
	}
	if err := joinconfig.WaitRevoked(ctx, rc, toks[i].String()); err != nil {
		return fmt.Errorf("token %s deleted, but the apiserver still accepted it after 60s: %w", id, err)
	}
	return nil
}
