package node

import (
	"bytes"
	"log/slog"
	"testing"

	"github.com/gpurack/gpurack/agent/gossip"
	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
)

// TestUseKeysFromHeartbeat: the key ring a heartbeat answer brings is installed and
// then reported (keyringDigest), one for another rack or with a bad key is not, and a
// node without gossip reports nothing.
func TestUseKeysFromHeartbeat(t *testing.T) {
	oldKey, newKey := bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 32)
	a, err := gossip.Start(gossip.Config{Name: "n1", Rack: "r1", Key: oldKey, BindAddr: "127.0.0.1:0", Local: true,
		Meta: func() gossip.Meta { return gossip.Meta{State: 1} }})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Leave()
	r := &rackGossip{agent: a, rack: "r1"}
	log := slog.New(slog.DiscardHandler)
	if got, want := r.keyringDigest(), bootv1.GossipKeyringDigest(oldKey, nil); got != want {
		t.Fatalf("digest at start %q, want %q", got, want)
	}
	r.useKeys(&bootv1.GossipConfig{Key: newKey, Rack: "r2"}, log)
	r.useKeys(&bootv1.GossipConfig{Key: []byte("short"), Rack: "r1"}, log)
	if got, want := r.keyringDigest(), bootv1.GossipKeyringDigest(oldKey, nil); got != want {
		t.Fatalf("a ring for another rack or with a bad key was installed: digest %q, want %q", got, want)
	}
	r.useKeys(&bootv1.GossipConfig{Key: oldKey, AcceptedKeys: [][]byte{newKey}, Rack: "r1"}, log)
	if got, want := r.keyringDigest(), bootv1.GossipKeyringDigest(oldKey, [][]byte{newKey}); got != want {
		t.Fatalf("installing ring: digest %q, want %q", got, want)
	}
	r.useKeys(&bootv1.GossipConfig{Key: newKey, Rack: "r1"}, log)
	if p, acc := a.Keys(); !bytes.Equal(p, newKey) || len(acc) != 0 {
		t.Fatalf("after the last step: primary %x, %d accepted", p, len(acc))
	}
	var none *rackGossip
	if d := none.keyringDigest(); d != "" {
		t.Fatalf("no gossip reports ring %q", d)
	}
}
