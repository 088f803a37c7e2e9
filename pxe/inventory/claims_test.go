package inventory

import (
	"context"
	"encoding/json"
	"path/filepath"
	"slices"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/gpurack/gpurack/pxe/identity"
)

func claimIDs(t *testing.T, s *BoltStore, mac, serial string) []string {
	t.Helper()
	cs, err := s.Claimants(context.Background(), mac, serial)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, c := range cs {
		ids = append(ids, c.ID)
	}
	return ids
}

// TestBoltClaimants: the claims index holds exactly the claimants (bound, in conflict,
// or retired with the allowlist approval spent), found by MAC or serial, and follows
// every Update in and out.
func TestBoltClaimants(t *testing.T) {
	s, _ := openTest(t)
	ctx := context.Background()
	now := time.Now()
	mk := func(id, mac, uuid, serial string, path ...State) *Machine {
		m := &Machine{ID: id, Identity: identity.Identity{MAC: mac, UUID: uuid, Serial: serial}, CreatedAt: now}
		var ts []Transition
		for _, st := range path {
			tr, err := Move(m, st, "gpuboot", "test", now)
			if err != nil {
				t.Fatal(err)
			}
			ts = append(ts, tr)
		}
		if err := s.Create(ctx, m, ts...); err != nil {
			t.Fatal(err)
		}
		return m
	}
	const mac = "52:54:00:00:0c:01"
	mk("ma", mac, "", "SN-C|1", Discovered, Approved)
	mk("mb", mac, "4c4c4544-0042-3510-8052-b4c04f4e5931", "SN-C|1", Registered)
	mk("mc", "52:54:00:00:0c:02", "", "SN-C|1", Registered, Conflict)
	mk("md", "52:54:00:00:0c:03", "", "", Discovered, Approved)

	if got := claimIDs(t, s, mac, ""); !slices.Equal(got, []string{"ma"}) {
		t.Errorf("claimants by MAC: %v; want [ma] (mb is registered, not a claimant)", got)
	}
	if got := claimIDs(t, s, "", "SN-C|1"); !slices.Equal(got, []string{"ma", "mc"}) {
		t.Errorf("claimants by serial: %v; want [ma mc]", got)
	}
	cs, _ := s.Claimants(ctx, "", "SN-C|1")
	if cs[0].Identity != (identity.Identity{MAC: mac, Serial: "SN-C|1"}) {
		t.Errorf("claimant identity %+v", cs[0].Identity)
	}
	if got := claimIDs(t, s, "", ""); got != nil {
		t.Errorf("claimants of nothing: %v", got)
	}

	// Out: decommissioned without the allowlist spent; in again: spent.
	move := func(id string, to State, spent bool) {
		t.Helper()
		if _, err := s.Update(ctx, id, func(m *Machine) ([]Transition, error) {
			m.AllowlistSpent = spent
			tr, err := Move(m, to, "gpuboot", "test", now)
			return []Transition{tr}, err
		}); err != nil {
			t.Fatal(err)
		}
	}
	move("ma", Decommissioned, false)
	if got := claimIDs(t, s, mac, ""); got != nil {
		t.Errorf("claimants by MAC after a decommission without spending: %v; want none", got)
	}
	move("ma", Discovered, true)
	if got := claimIDs(t, s, mac, ""); !slices.Equal(got, []string{"ma"}) {
		t.Errorf("claimants by MAC with the allowlist spent: %v; want [ma]", got)
	}
	move("mb", Approved, false)
	if got := claimIDs(t, s, mac, ""); !slices.Equal(got, []string{"ma", "mb"}) {
		t.Errorf("claimants by MAC after approving mb: %v; want [ma mb]", got)
	}
	if got := claimIDs(t, s, "52:54:00:00:0c:03", ""); !slices.Equal(got, []string{"md"}) {
		t.Errorf("claimant without a serial: %v; want [md]", got)
	}
}

// TestBoltMigratesSchema2 opens an inventory written before the claims index: OpenBolt
// builds it from the machines.
func TestBoltMigratesSchema2(t *testing.T) {
	path := filepath.Join(t.TempDir(), "inventory.db")
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range []string{"machines", "identities", "nodes", "history", "meta"} {
			if _, err := tx.CreateBucket([]byte(b)); err != nil {
				return err
			}
		}
		for i, st := range []State{Ready, Registered} {
			m := &Machine{ID: "m" + string(rune('1'+i)), Identity: identity.Identity{MAC: "52:54:00:00:0c:10", Serial: "SN-" + string(rune('1'+i))}, State: st}
			v, _ := json.Marshal(m)
			if err := tx.Bucket([]byte("machines")).Put([]byte(m.ID), v); err != nil {
				return err
			}
			if err := tx.Bucket([]byte("identities")).Put([]byte(m.Identity.Key()), []byte(m.ID)); err != nil {
				return err
			}
		}
		return tx.Bucket([]byte("meta")).Put([]byte("schema"), []byte("2"))
	})
	if err != nil {
		t.Fatal(err)
	}
	db.Close()
	s, err := OpenBolt(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got := claimIDs(t, s, "52:54:00:00:0c:10", ""); !slices.Equal(got, []string{"m1"}) {
		t.Errorf("claimants after migrating schema 2: %v; want [m1]", got)
	}
}
