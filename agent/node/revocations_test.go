package node

import (
	"log/slog"
	"math/big"
	"testing"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
)

// TestRevocationsKeptAcrossRestart: the list a heartbeat answer brings is installed and
// kept in the key directory, so a restarted agent starts with it; an answer with a bad
// serial changes nothing.
func TestRevocationsKeptAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	log := slog.New(slog.DiscardHandler)
	n := &node{cfg: Config{KeyDir: dir}, log: log, revoked: loadRevocations(dir, log)}
	if n.revoked.Len() != 0 {
		t.Fatal("a new agent starts with revocations")
	}
	n.useRevocations(&bootv1.Revocations{Serials: []string{"abc123"}})
	n.useRevocations(&bootv1.Revocations{Serials: []string{"zz"}})
	if !n.revoked.Contains(big.NewInt(0xabc123)) || n.revoked.Len() != 1 {
		t.Fatalf("after the answers: %v", n.revoked.Serials())
	}
	again := loadRevocations(dir, log)
	if !again.Contains(big.NewInt(0xabc123)) {
		t.Fatal("a restarted agent lost the revocation list")
	}
}
