package enroll

import (
	"bytes"
	"context"
	"net/netip"
	"strings"
	"testing"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/pxe/identity"
	"github.com/gpurack/gpurack/pxe/inventory"
	"github.com/gpurack/gpurack/pxe/policy"
	"github.com/gpurack/gpurack/pxe/protoconv"
)

// TestDecommissionSpendsAllowlistRow performs issue 33's attack 3 under `approval:
// allowlist`: a listed machine enrolls and is decommissioned; an attacker then forges its
// /boot.ipxe and registers with its serial, MAC and UUID (and, separately, with another
// UUID). Neither is approved, gets a token, a node name or the rack's gossip key; the
// decommission started a rotation of that key. Once an operator approves the real
// machine again (re-arms it), it enrolls.
func TestDecommissionSpendsAllowlistRow(t *testing.T) {
	const mac, serial = "52:54:00:00:0d:01", "SN-DECOM-1"
	list, err := policy.ParseListBytes("manifest.csv", []byte("serial,mac,rack,slot\n"+serial+","+mac+",r1,U7\n"))
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, func(c *Config) {
		c.Policy = policy.Policy{Mode: policy.Allowlist, List: list}
		c.Racks["r1"] = Rack{Name: "r1", DefaultImage: c.Racks["r1"].DefaultImage, GossipKey: bytes.Repeat([]byte{7}, 32)}
	})
	ctx := context.Background()

	a := e.agent(mac, serial)
	r := a.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_APPROVED)
	b, err := a.bundle(r.Token, r.Challenge)
	if err != nil || b.GetNodeName() == "" || len(b.GetGossip().GetKey()) == 0 {
		t.Fatalf("the listed machine's bundle: %v, %v", b, err)
	}
	oldKey := b.GetGossip().GetKey()

	m, err := e.svc.Decommission(ctx, mac, "operator:test", "returned to the vendor")
	if err != nil {
		t.Fatalf("decommission: %v", err)
	}
	if !m.AllowlistSpent {
		t.Fatal("decommission did not spend the allowlist approval")
	}
	// (Read without GossipKeyStatus, which would move the rotation on: no agent of
	// the rack is live to hold it back.)
	if ring, _ := e.svc.rings.get("r1"); ring.Phase() != bootv1.GossipRotationPhase_GOSSIP_ROTATION_PHASE_INSTALLING || !bytes.Equal(ring.Primary, oldKey) {
		t.Fatalf("gossip key ring after the decommission: %s; want a rotation installing a new key", protoconv.PhaseWord(ring.Phase()))
	}

	// The forged boot request starts the record over, spent.
	id, _ := identity.New(mac, a.facts.Identity.SmbiosUuid, serial)
	if _, err := e.svc.DecideBoot(ctx, id, netip.MustParseAddr("192.0.2.66")); err != nil {
		t.Fatal(err)
	}
	if m := e.machine(mac); m.State != inventory.Discovered || !m.AllowlistSpent {
		t.Fatalf("after the forged boot: %s, spent %v; want discovered and still spent", m.State, m.AllowlistSpent)
	}

	// The stranger with the machine's identity and its own key.
	stranger := a.rebooted()
	r = stranger.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_PENDING)
	if r.Token != "" || !strings.Contains(r.Message, "operator must approve") {
		t.Fatalf("stranger's answer: token %q, %q", r.Token, r.Message)
	}
	if _, err := stranger.bundle("", nil); err == nil {
		t.Fatal("a bundle without a token")
	}
	if m := e.machine(mac); m.State != inventory.Registered || m.NodeName != "" || m.BoundKey != "" {
		t.Fatalf("after the stranger's Register: %s, node %q, bound %q", m.State, m.NodeName, m.BoundKey)
	}

	// A stranger with the listed serial and MAC and another UUID: the spent machine
	// still holds the row.
	other := e.agent(mac, serial)
	other.facts.Identity.SmbiosUuid = "00000000-0000-4000-8000-0000000000d1"
	r = other.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_PENDING)
	if r.Token != "" || !strings.Contains(r.Message, "allowlist row") {
		t.Fatalf("other UUID's answer: token %q, %q", r.Token, r.Message)
	}

	// The operator re-arms the real machine: the stranger's key has gone quiet, the
	// real machine rebooted and registered, and the operator approves that key.
	e.clk.Add(inventory.KeyLiveness)
	real := a.rebooted()
	real.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_PENDING)
	m, err = e.svc.Approve(ctx, m.ID, ApproveOptions{Actor: "operator:test", Reason: "back from the vendor"})
	if err != nil {
		t.Fatal(err)
	}
	if m.AllowlistSpent || m.BoundKey != real.fp() {
		t.Fatalf("after the operator's approval: spent %v, bound %s; want re-armed and bound to the real key", m.AllowlistSpent, short(m.BoundKey))
	}
	r = real.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_APPROVED)
	b, err = real.bundle(r.Token, r.Challenge)
	if err != nil || b.GetNodeName() == "" {
		t.Fatalf("the re-armed machine's bundle: %v, %v", b, err)
	}
	if accepted := b.GetGossip().GetAcceptedKeys(); len(accepted) != 1 || bytes.Equal(accepted[0], oldKey) {
		t.Fatalf("the re-armed machine's bundle accepts %d keys; want the new key being installed", len(accepted))
	}
	h, err := e.store.History(ctx, m.ID)
	if err != nil {
		t.Fatal(err)
	}
	if re := h[len(h)-2]; re.Actor != "operator:test" || re.To != inventory.Approved || !strings.Contains(re.Reason, "re-armed") {
		t.Fatalf("the re-arm in the history: %+v", re)
	}
	m, _ = e.svc.Resolve(ctx, m.ID)
	if err := inventory.CheckHistory(h, m.State); err != nil {
		t.Fatal(err)
	}
}

// TestDecommissionDuringRotation: a second decommission while a rotation installs its
// next key replaces that key (the machine may hold it); one while the rotation retires
// its old key cannot start another, and says what to run.
func TestDecommissionDuringRotation(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	enroll := func(mac string) {
		a := e.agent(mac, "SN-"+mac)
		a.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_PENDING)
		e.approve(mac)
		a.mustRegister(bootv1.RegisterStatus_REGISTER_STATUS_APPROVED)
	}
	for _, mac := range []string{"52:54:00:00:0d:11", "52:54:00:00:0d:12", "52:54:00:00:0d:13"} {
		enroll(mac)
	}
	if _, err := e.svc.Decommission(ctx, "52:54:00:00:0d:11", "operator:test", "gone"); err != nil {
		t.Fatal(err)
	}
	first, _ := e.svc.rings.get("r1")
	if _, err := e.svc.Decommission(ctx, "52:54:00:00:0d:12", "operator:test", "gone"); err != nil {
		t.Fatal(err)
	}
	second, _ := e.svc.rings.get("r1")
	if second.Phase() != bootv1.GossipRotationPhase_GOSSIP_ROTATION_PHASE_INSTALLING || first.Next == nil || bytes.Equal(second.Next, first.Next) || !bytes.Equal(second.Primary, first.Primary) {
		t.Fatalf("after a second decommission: %s; want another next key installing beside the same primary", protoconv.PhaseWord(second.Phase()))
	}
	// No live agent holds the rack back: asking moves it to retiring.
	st, _ := e.svc.GossipKeyStatus(ctx, "r1")
	if st.GetPhase() != bootv1.GossipRotationPhase_GOSSIP_ROTATION_PHASE_RETIRING {
		t.Fatalf("rotation %v; want retiring", st)
	}
	m, err := e.svc.Decommission(ctx, "52:54:00:00:0d:13", "operator:test", "gone")
	if err == nil || m == nil || m.State != inventory.Decommissioned || !strings.Contains(err.Error(), "gpuboot gossip rotate r1") {
		t.Fatalf("decommission while retiring: %v, %v; want it decommissioned with an error naming gpuboot gossip rotate r1", m, err)
	}
}
