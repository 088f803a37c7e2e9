package rollout

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestBatches(t *testing.T) {
	var got []int
	for n := range 8 {
		got = append(got, batchOf(n, 2, 3))
	}
	if want := []int{0, 0, 1, 1, 1, 2, 2, 2}; !slices.Equal(got, want) {
		t.Errorf("batchOf = %v, want %v", got, want)
	}
}

// TestNext: the canary batch goes alone; a batch starts only when the one before has
// nothing pending or under way; never more than MaxUnavailable under way; a paused
// rollout starts nothing; a failure keeps it from being done.
func TestNext(t *testing.T) {
	r := &Rollout{State: Running, MaxUnavailable: 2, Machines: []*Step{
		{Batch: 0, Phase: Booting}, {Batch: 1, Phase: Pending}, {Batch: 1, Phase: Pending}, {Batch: 1, Phase: Pending}, {Batch: 2, Phase: Pending},
	}}
	if i, done := next(r); i != -1 || done {
		t.Fatalf("canary under way: next = %d, %v", i, done)
	}
	r.Machines[0].Phase = Ready
	if i, _ := next(r); i != 1 {
		t.Fatalf("after the canary: next = %d, want 1", i)
	}
	r.Machines[1].Phase, r.Machines[2].Phase = Draining, Cycling
	if i, _ := next(r); i != -1 {
		t.Fatalf("two under way with max 2: next = %d", i)
	}
	r.Machines[1].Phase = Ready
	if i, _ := next(r); i != 3 {
		t.Fatalf("one under way: next = %d, want 3 (batch 1 before batch 2)", i)
	}
	r.State = Paused
	if i, _ := next(r); i != -1 {
		t.Fatalf("paused: next = %d", i)
	}
	r.State = Running
	for _, s := range r.Machines {
		s.Phase = Ready
	}
	if i, done := next(r); i != -1 || !done {
		t.Fatalf("all ready: next = %d, done %v", i, done)
	}
	r.Machines[4].Phase = Failed
	if _, done := next(r); done {
		t.Fatal("a failed machine: done")
	}
}

// TestRollbackAskedDuringAPass: a rollback asked for while a pass advanced the failed
// canary (the steps not yet rewritten) starts the canary back, never a pending machine
// toward the image rolled back from. (TestRolloutSimulatedRack once saw machines 2 to 5
// touched by a rollback this way.)
func TestRollbackAskedDuringAPass(t *testing.T) {
	r := &Rollout{State: RollingBack, RollbackPending: true, MaxUnavailable: 4, Machines: []*Step{
		{Batch: 0, Phase: Failed, Previous: "a", Target: "bad"}, {Batch: 1, Phase: Pending, Previous: "a", Target: "bad"}, {Batch: 1, Phase: Pending, Previous: "a", Target: "bad"},
	}}
	i, done := nextStart(r)
	if i != 0 || done || r.Machines[0].Target != "a" || r.Machines[1].Phase != Skipped || r.Machines[2].Phase != Skipped {
		t.Fatalf("nextStart = %d, %v; steps %+v %+v %+v; want the canary back to a, the others skipped", i, done, *r.Machines[0], *r.Machines[1], *r.Machines[2])
	}
}

func TestNormalise(t *testing.T) {
	img := strings.Repeat("a", 40)
	s, err := normalise(Spec{Image: img, Match: map[string]string{"rack": "r1"}, BatchSize: 4, Actor: "operator:x"})
	if err != nil || s.Canary != 1 || s.MaxUnavailable != 4 || s.NodeTimeout != DefaultNodeTimeout || s.DrainTimeout != DefaultDrainTimeout {
		t.Fatalf("normalise = %+v, %v", s, err)
	}
	for _, c := range []struct {
		spec Spec
		want string
	}{
		{Spec{Image: "v2", Match: map[string]string{"rack": "r1"}, Actor: "a"}, "is not an image id"},
		{Spec{Image: img, Actor: "a"}, "name the machines"},
		{Spec{Image: img, Match: map[string]string{"rack": "r1"}, Machines: []string{"m"}, Actor: "a"}, "not both"},
		{Spec{Image: img, Machines: []string{"m"}, BatchSize: -1, Actor: "a"}, "cannot be negative"},
	} {
		if _, err := normalise(c.spec); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("normalise(%+v) = %v, want %q", c.spec, err, c.want)
		}
	}
}

// TestStoreRoundTrip: records are read back in start order (a same-second suffix after
// its base), files that are not records are ignored, and a damaged record is an error
// naming it rather than a rollout forgotten.
func TestStoreRoundTrip(t *testing.T) {
	st := store{dir: filepath.Join(t.TempDir(), "rollouts")}
	if rs, err := st.load(); err != nil || rs != nil {
		t.Fatalf("load of a missing directory = %v, %v", rs, err)
	}
	now := time.Date(2026, 12, 3, 14, 5, 1, 0, time.UTC)
	for _, id := range []string{"r20261203T140501Z-10", "r20261203T140501Z", "r20261203T140501Z-2", "r20261202T230000Z"} {
		if err := st.save(&Rollout{ID: id, State: Done, StartedAt: now, Machines: []*Step{{Machine: "m1", Phase: Ready}}}); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(filepath.Join(st.dir, "notes.txt"), []byte("x"), 0o600)
	rs, err := st.load()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, r := range rs {
		ids = append(ids, r.ID)
	}
	if got := strings.Join(ids, " "); got != "r20261202T230000Z r20261203T140501Z r20261203T140501Z-2 r20261203T140501Z-10" {
		t.Errorf("load order: %s", got)
	}
	if rs[1].Machines[0].Phase != Ready || !rs[1].StartedAt.Equal(now) {
		t.Errorf("record read back: %+v", rs[1])
	}
	bad := filepath.Join(st.dir, "r20261203T150000Z.json")
	os.WriteFile(bad, []byte("{not json"), 0o600)
	if _, err := st.load(); err == nil || !strings.Contains(err.Error(), bad) || !strings.Contains(err.Error(), "move it away") {
		t.Errorf("damaged record: %v", err)
	}
}
