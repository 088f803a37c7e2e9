package inventory

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/gpurack/gpurack/pxe/identity"
)

func openTest(t *testing.T) (*BoltStore, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "inventory.db")
	s, err := OpenBolt(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, path
}

func newMachine(t *testing.T, mac string, st State) (*Machine, Transition) {
	t.Helper()
	m := &Machine{ID: NewID(), Identity: identity.Identity{MAC: mac, Serial: "SN-" + mac}, CreatedAt: time.Now()}
	tr, err := Move(m, st, "gpuboot", "test", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return m, tr
}

func TestBoltCreateGetLookup(t *testing.T) {
	ctx := context.Background()
	s, path := openTest(t)
	m, tr := newMachine(t, "52:54:00:00:00:01", Discovered)
	if err := s.Create(ctx, m, tr); err != nil {
		t.Fatal(err)
	}
	// Same identity again: ErrExists, whatever the id.
	dup, tr2 := newMachine(t, "52:54:00:00:00:01", Registered)
	if err := s.Create(ctx, dup, tr2); !errors.Is(err, ErrExists) {
		t.Fatalf("duplicate identity: err = %v, want ErrExists", err)
	}
	// Same UUID, other MAC: a different machine (never key on UUID alone).
	m.Identity.UUID = "00000000-0000-0000-0000-000000000000"
	other, tr3 := newMachine(t, "52:54:00:00:00:02", Discovered)
	if err := s.Create(ctx, other, tr3); err != nil {
		t.Fatal(err)
	}
	got, err := s.Lookup(ctx, identity.Identity{MAC: "52:54:00:00:00:01", Serial: "SN-52:54:00:00:00:01"}.Key())
	if err != nil || got.ID != m.ID {
		t.Fatalf("Lookup = %v, %v", got, err)
	}
	if _, err := s.Get(ctx, "nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get(nope) err = %v", err)
	}
	// Survives close and reopen.
	s.Close()
	s2, err := OpenBolt(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	all, err := s2.List(ctx)
	if err != nil || len(all) != 2 {
		t.Fatalf("List after reopen = %d machines, %v", len(all), err)
	}
	h, err := s2.History(ctx, m.ID)
	if err != nil || len(h) != 1 || h[0].To != Discovered || h[0].Seq != 1 {
		t.Fatalf("History = %+v, %v", h, err)
	}
}

func TestBoltUpdateAtomic(t *testing.T) {
	ctx := context.Background()
	s, _ := openTest(t)
	m, tr := newMachine(t, "52:54:00:00:00:03", Discovered)
	if err := s.Create(ctx, m, tr); err != nil {
		t.Fatal(err)
	}
	// fn fails: nothing written.
	boom := errors.New("boom")
	_, err := s.Update(ctx, m.ID, func(m *Machine) ([]Transition, error) {
		m.NodeName = "changed"
		return nil, boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("err = %v", err)
	}
	// State changed without a transition: refused.
	_, err = s.Update(ctx, m.ID, func(m *Machine) ([]Transition, error) {
		m.State = Ready
		return nil, nil
	})
	if !errors.Is(err, ErrIllegalTransition) {
		t.Fatalf("silent state change: err = %v", err)
	}
	// Identity change refused.
	_, err = s.Update(ctx, m.ID, func(m *Machine) ([]Transition, error) {
		m.Identity.MAC = "52:54:00:00:00:99"
		return nil, nil
	})
	if err == nil {
		t.Fatal("identity change accepted")
	}
	got, _ := s.Get(ctx, m.ID)
	if got.NodeName != "" || got.State != Discovered {
		t.Fatalf("failed updates left traces: %+v", got)
	}
	// A real move.
	got, err = s.Update(ctx, m.ID, func(m *Machine) ([]Transition, error) {
		t1, err := Move(m, Registered, "agent:x", "registered", time.Now())
		if err != nil {
			return nil, err
		}
		t2, err := Move(m, Approved, "operator:alice", "ok", time.Now())
		return []Transition{t1, t2}, err
	})
	if err != nil || got.State != Approved {
		t.Fatalf("update: %v, %v", got, err)
	}
	h, _ := s.History(ctx, m.ID)
	if err := CheckHistory(h, Approved); err != nil {
		t.Fatal(err)
	}
	all, _ := s.History(ctx, "")
	if len(all) != 3 {
		t.Fatalf("global history has %d transitions, want 3", len(all))
	}
}

func TestBoltConcurrentCreateOneWinner(t *testing.T) {
	ctx := context.Background()
	s, _ := openTest(t)
	var wg sync.WaitGroup
	var mu sync.Mutex
	wins := 0
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m := &Machine{ID: NewID(), Identity: identity.Identity{MAC: "52:54:00:00:00:10"}}
			tr, _ := Move(m, Discovered, "gpuboot", fmt.Sprint("racer ", i), time.Now())
			if err := s.Create(ctx, m, tr); err == nil {
				mu.Lock()
				wins++
				mu.Unlock()
			} else if !errors.Is(err, ErrExists) {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if wins != 1 {
		t.Fatalf("%d creates won, want 1", wins)
	}
}

func TestBoltLockedFile(t *testing.T) {
	_, path := openTest(t)
	if _, err := OpenBolt(path); err == nil {
		t.Fatal("second open of a held inventory succeeded")
	}
}

// nodeNames returns the ids ByNodeName finds for name.
func nodeNames(t *testing.T, s *BoltStore, name string) []string {
	t.Helper()
	ms, err := s.ByNodeName(context.Background(), name)
	if err != nil {
		t.Fatalf("ByNodeName(%q): %v", name, err)
	}
	var ids []string
	for _, m := range ms {
		if m.NodeName != name {
			t.Errorf("ByNodeName(%q) returned machine %s named %q", name, m.ID, m.NodeName)
		}
		ids = append(ids, m.ID)
	}
	return ids
}

func TestBoltNodeNameIndex(t *testing.T) {
	ctx := context.Background()
	s, _ := openTest(t)
	create := func(id, mac, node string) {
		m := &Machine{ID: id, Identity: identity.Identity{MAC: mac}, NodeName: node}
		tr, _ := Move(m, Discovered, "gpuboot", "test", time.Now())
		if err := s.Create(ctx, m, tr); err != nil {
			t.Fatal(err)
		}
	}
	rename := func(id, node string) {
		if _, err := s.Update(ctx, id, func(m *Machine) ([]Transition, error) { m.NodeName = node; return nil, nil }); err != nil {
			t.Fatal(err)
		}
	}
	create("m1", "52:54:00:00:00:01", "gpu-r1-u01")
	create("m2", "52:54:00:00:00:02", "")
	create("m3", "52:54:00:00:00:03", "gpu-r1-u01-b") // a name that extends another
	if got := nodeNames(t, s, "gpu-r1-u01"); !slices.Equal(got, []string{"m1"}) {
		t.Errorf("gpu-r1-u01: %v; want [m1]", got)
	}
	if got := nodeNames(t, s, ""); got != nil {
		t.Errorf("empty name: %v; want none", got)
	}
	// A decommissioned machine keeps its name while a new one takes it: both are found,
	// ordered by id.
	rename("m2", "gpu-r1-u01")
	if got := nodeNames(t, s, "gpu-r1-u01"); !slices.Equal(got, []string{"m1", "m2"}) {
		t.Errorf("after m2 takes the name: %v; want [m1 m2]", got)
	}
	rename("m1", "gpu-r1-u02")
	rename("m3", "")
	for name, want := range map[string][]string{"gpu-r1-u01": {"m2"}, "gpu-r1-u02": {"m1"}, "gpu-r1-u01-b": nil} {
		if got := nodeNames(t, s, name); !slices.Equal(got, want) {
			t.Errorf("after renames, %s: %v; want %v", name, got, want)
		}
	}
	// A failed update leaves the index as it was.
	_, _ = s.Update(ctx, "m1", func(m *Machine) ([]Transition, error) { m.NodeName = "gpu-x"; return nil, errors.New("no") })
	if got := nodeNames(t, s, "gpu-x"); got != nil {
		t.Errorf("failed update indexed gpu-x: %v", got)
	}
}

// TestBoltMigratesSchema1 opens an inventory written before the node name index
// existed: OpenBolt builds the indexes and marks the file schema 3.
func TestBoltMigratesSchema1(t *testing.T) {
	path := filepath.Join(t.TempDir(), "inventory.db")
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range []string{"machines", "identities", "history", "meta"} {
			if _, err := tx.CreateBucket([]byte(b)); err != nil {
				return err
			}
		}
		for i, node := range []string{"gpu-r1-u01", "", "gpu-r1-u03"} {
			m := &Machine{ID: fmt.Sprintf("m%d", i+1), Identity: identity.Identity{MAC: fmt.Sprintf("52:54:00:00:00:0%d", i+1)}, State: Ready, NodeName: node}
			v, _ := json.Marshal(m)
			if err := tx.Bucket([]byte("machines")).Put([]byte(m.ID), v); err != nil {
				return err
			}
			if err := tx.Bucket([]byte("identities")).Put([]byte(m.Identity.Key()), []byte(m.ID)); err != nil {
				return err
			}
		}
		return tx.Bucket([]byte("meta")).Put([]byte("schema"), []byte("1"))
	})
	if err != nil {
		t.Fatal(err)
	}
	db.Close()

	s, err := OpenBolt(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := nodeNames(t, s, "gpu-r1-u01"); !slices.Equal(got, []string{"m1"}) {
		t.Errorf("gpu-r1-u01 after migration: %v; want [m1]", got)
	}
	if got := nodeNames(t, s, "gpu-r1-u03"); !slices.Equal(got, []string{"m3"}) {
		t.Errorf("gpu-r1-u03 after migration: %v; want [m3]", got)
	}
	var schema string
	_ = s.db.View(func(tx *bolt.Tx) error { schema = string(tx.Bucket(bucketMeta).Get(keySchema)); return nil })
	if schema != "3" {
		t.Errorf("schema after migration %q; want 3", schema)
	}
	if got, err := s.Claimants(context.Background(), "52:54:00:00:00:02", ""); err != nil || len(got) != 1 || got[0].ID != "m2" {
		t.Errorf("claimants of 52:54:00:00:00:02 after migration: %+v, %v; want m2", got, err)
	}
	s.Close()

	// A file from a newer gpuboot is refused with a message naming both versions.
	db, _ = bolt.Open(path, 0o600, nil)
	_ = db.Update(func(tx *bolt.Tx) error { return tx.Bucket([]byte("meta")).Put([]byte("schema"), []byte("4")) })
	db.Close()
	if _, err := OpenBolt(path); err == nil || !strings.Contains(err.Error(), `schema version "4"`) {
		t.Errorf("schema 4: %v; want a version error", err)
	}
}

// TestBoltUnchangedUpdateNotWritten: an Update that changes nothing commits no write
// transaction (no fsync); one that changes a field does, and is read back.
func TestBoltUnchangedUpdateNotWritten(t *testing.T) {
	s, _ := openTest(t)
	ctx := context.Background()
	m, tr := newMachine(t, "52:54:00:00:00:01", Discovered)
	if err := s.Create(ctx, m, tr); err != nil {
		t.Fatal(err)
	}
	before := s.Writes()
	got, err := s.Update(ctx, m.ID, func(*Machine) ([]Transition, error) { return nil, nil })
	if err != nil || got == nil || got.ID != m.ID {
		t.Fatalf("unchanged update: %+v, %v", got, err)
	}
	if n := s.Writes() - before; n != 0 {
		t.Fatalf("an unchanged update committed %d write transactions, want 0", n)
	}
	if _, err := s.Update(ctx, m.ID, func(m *Machine) ([]Transition, error) { m.Slot = "U7"; return nil, nil }); err != nil {
		t.Fatal(err)
	}
	if n := s.Writes() - before; n != 1 {
		t.Fatalf("a changed update committed %d write transactions, want 1", n)
	}
	if g, _ := s.Get(ctx, m.ID); g.Slot != "U7" {
		t.Fatalf("slot %q after the update, want U7", g.Slot)
	}
}

// TestBoltActionRecords: the store takes an action record (From == To with an Action)
// beside or instead of a move, and refuses a same-state transition without one, or an
// action that changes the state. The data disks and a pending wipe round-trip, and
// Clone copies the wipe.
func TestBoltActionRecords(t *testing.T) {
	ctx := context.Background()
	s, _ := openTest(t)
	m, tr := newMachine(t, "52:54:00:00:00:21", Registered)
	if err := s.Create(ctx, m, tr); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	wipe := &DataDiskWipe{ID: "w1", Path: "/dev/sdb", Serial: "S1", Actor: "operator:alice", Reason: "old disk", RequestedAt: now.UTC()}
	got, err := s.Update(ctx, m.ID, func(m *Machine) ([]Transition, error) {
		m.DataDisks, m.DataDisksAt, m.PendingWipe = []byte{0x0a, 0x00}, now.UTC(), wipe
		r, err := Record(m, "wipe-data-disk requested", "operator:alice", "/dev/sdb serial S1: old disk", now)
		return []Transition{r}, err
	})
	if err != nil || got.State != Registered || got.PendingWipe == nil || *got.PendingWipe != *wipe || len(got.DataDisks) != 2 {
		t.Fatalf("update with an action record: %+v, %v", got, err)
	}
	c := got.Clone()
	c.PendingWipe.Serial = "changed"
	if got.PendingWipe.Serial != "S1" {
		t.Fatal("Clone shares the pending wipe")
	}
	for name, fn := range map[string]func(m *Machine) ([]Transition, error){
		"same-state transition without an action": func(m *Machine) ([]Transition, error) {
			return []Transition{{MachineID: m.ID, From: m.State, To: m.State, Actor: "x", Reason: "y"}}, nil
		},
		"action that changes the state": func(m *Machine) ([]Transition, error) {
			r, _ := Record(m, "x", "a", "r", now)
			m.State, r.To = Approved, Approved
			return []Transition{r}, nil
		},
	} {
		if _, err := s.Update(ctx, m.ID, fn); !errors.Is(err, ErrIllegalTransition) {
			t.Errorf("%s: %v; want ErrIllegalTransition", name, err)
		}
	}
	got, err = s.Update(ctx, m.ID, func(m *Machine) ([]Transition, error) {
		t1, err := Move(m, Approved, "operator:alice", "ok", now)
		if err != nil {
			return nil, err
		}
		t2, err := Record(m, "wipe-data-disk done", "agent:sha256:aa", "/dev/sdb serial S1 wiped", now)
		m.PendingWipe = nil
		return []Transition{t1, t2}, err
	})
	if err != nil || got.State != Approved || got.PendingWipe != nil {
		t.Fatalf("move and record: %+v, %v", got, err)
	}
	h, _ := s.History(ctx, m.ID)
	if err := CheckHistory(h, Approved); err != nil || len(h) != 4 || h[1].Action != "wipe-data-disk requested" || h[3].Action != "wipe-data-disk done" {
		t.Fatalf("history %+v: %v", h, err)
	}
}
