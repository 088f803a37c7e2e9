package inventory

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

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
