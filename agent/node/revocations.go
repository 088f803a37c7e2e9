package node

import (
	"log/slog"
	"path/filepath"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/internal/pki"
)

// revocationsFile, in the key directory, keeps the revocation list the last heartbeat
// answer brought, so an agent that systemd restarts refuses revoked operators before
// its first heartbeat answer.
const revocationsFile = "revocations.json"

// loadRevocations reads the kept list; none, or one that does not read, is an empty
// list (the first heartbeat answer brings gpuboot's).
func loadRevocations(keyDir string, log *slog.Logger) *pki.RevocationList {
	if keyDir == "" {
		return pki.NewRevocationList()
	}
	l, err := pki.LoadRevocationList(filepath.Join(keyDir, revocationsFile))
	if err != nil {
		log.Warn("kept revocation list not read; starting empty until gpuboot's next heartbeat answer", "error", err)
		return pki.NewRevocationList()
	}
	return l
}

// useRevocations installs the revocation list a heartbeat answer brought and keeps it.
func (n *node) useRevocations(r *bootv1.Revocations) {
	if r == nil {
		return
	}
	if err := n.revoked.Replace(r.GetSerials()); err != nil {
		n.log.Error("revocation list from gpuboot not installed", "error", err)
		return
	}
	n.log.Info("revocation list from gpuboot installed", "serials", len(r.GetSerials()), "digest", n.revoked.Digest())
	if n.guard != nil {
		if ended := n.guard.Recheck(); ended > 0 {
			n.log.Warn("ended API streams whose operator certificate the new list revokes", "streams", ended)
		}
	}
	if n.cfg.KeyDir != "" {
		if err := n.revoked.Save(filepath.Join(n.cfg.KeyDir, revocationsFile)); err != nil {
			n.log.Warn("revocation list not kept; an agent restart starts empty until the next heartbeat answer", "error", err)
		}
	}
}
