package kubestore_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"

	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster"
	"github.com/gpurack/gpurack/pxe/identity"
	"github.com/gpurack/gpurack/pxe/inventory"
	"github.com/gpurack/gpurack/pxe/inventory/kubestore"
)

func TestMain(m *testing.M) { os.Exit(testcluster.Main(m)) }

// enrollerStore is a store with the enroller's credentials, as gpuboot holds them.
func enrollerStore(t *testing.T) *kubestore.Store {
	t.Helper()
	c := testcluster.Shared(t)
	cfg := testcluster.RESTConfigFrom(t, c.EnrollerKubeconfig)
	s, err := kubestore.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Check(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s
}

// newMachine is a machine with a MAC under prefix (each test its own, as the cluster is
// shared) moved to st from nothing.
func newMachine(t *testing.T, prefix string, i int, st inventory.State) (*inventory.Machine, inventory.Transition) {
	t.Helper()
	mac := fmt.Sprintf("%s:%02x:%02x", prefix, i>>8&0xff, i&0xff)
	m := &inventory.Machine{ID: inventory.NewID(), Identity: identity.Identity{MAC: mac, Serial: "SN-" + mac}, CreatedAt: time.Now().UTC()}
	tr, err := inventory.Move(m, st, "gpuboot", "test", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return m, tr
}

func move(to inventory.State, change func(*inventory.Machine)) func(*inventory.Machine) ([]inventory.Transition, error) {
	return func(m *inventory.Machine) ([]inventory.Transition, error) {
		if change != nil {
			change(m)
		}
		tr, err := inventory.Move(m, to, "operator:test", "test", time.Now())
		if err != nil {
			return nil, err
		}
		return []inventory.Transition{tr}, nil
	}
}

// TestStoreContract runs the Store contract against a real apiserver with the
// enroller's credentials: create, the lookups, the indexes, history, an unchanged
// update not written, an illegal move refused with nothing written.
func TestStoreContract(t *testing.T) {
	s := enrollerStore(t)
	ctx := context.Background()
	m, tr := newMachine(t, "52:54:10:00", 1, inventory.Registered)
	if err := s.Create(ctx, m, tr); err != nil {
		t.Fatal(err)
	}
	twin, ttr := newMachine(t, "52:54:10:00", 1, inventory.Registered)
	if err := s.Create(ctx, twin, ttr); !errors.Is(err, inventory.ErrExists) {
		t.Fatalf("second Create of one identity: %v, want ErrExists", err)
	}
	got, err := s.Lookup(ctx, m.Identity.Key())
	if err != nil || got.ID != m.ID || got.State != inventory.Registered {
		t.Fatalf("Lookup: %+v %v", got, err)
	}
	if _, err := s.Get(ctx, "mnosuchmachine00000"); !errors.Is(err, inventory.ErrNotFound) {
		t.Fatalf("Get of an unknown id: %v", err)
	}
	if c, _ := s.Claimants(ctx, m.Identity.MAC, ""); len(c) != 0 {
		t.Fatalf("a registered machine is no claimant: %v", c)
	}
	if _, err := s.Update(ctx, m.ID, move(inventory.Approved, func(m *inventory.Machine) { m.NodeName = "gpu-kubestore-1" })); err != nil {
		t.Fatal(err)
	}
	if c, err := s.Claimants(ctx, m.Identity.MAC, ""); err != nil || len(c) != 1 || c[0].ID != m.ID {
		t.Fatalf("Claimants by MAC after approval: %v %v", c, err)
	}
	if c, err := s.Claimants(ctx, "", m.Identity.Serial); err != nil || len(c) != 1 {
		t.Fatalf("Claimants by serial after approval: %v %v", c, err)
	}
	if ms, err := s.ByNodeName(ctx, "gpu-kubestore-1"); err != nil || len(ms) != 1 || ms[0].ID != m.ID {
		t.Fatalf("ByNodeName: %v %v", ms, err)
	}
	writes := s.Writes()
	if _, err := s.Update(ctx, m.ID, func(*inventory.Machine) ([]inventory.Transition, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
	if s.Writes() != writes {
		t.Errorf("an update that changed nothing was written")
	}
	_, err = s.Update(ctx, m.ID, move(inventory.Discovered, func(m *inventory.Machine) { m.Rack = "r-illegal" }))
	if !errors.Is(err, inventory.ErrIllegalTransition) {
		t.Fatalf("approved → discovered: %v, want ErrIllegalTransition", err)
	}
	got, _ = s.Get(ctx, m.ID)
	if got.Rack != "" || got.State != inventory.Approved {
		t.Fatalf("a refused update wrote: %+v", got)
	}
	hist, err := s.History(ctx, m.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := inventory.CheckHistory(hist, inventory.Approved); err != nil || len(hist) != 2 || hist[1].Seq != 2 {
		t.Fatalf("history %+v: %v", hist, err)
	}
	all, err := s.History(ctx, "")
	if err != nil || !slices.ContainsFunc(all, func(x inventory.Transition) bool { return x.MachineID == m.ID && x.To == inventory.Approved }) {
		t.Fatalf("every machine's history lacks %s's approval: %v", m.ID, err)
	}
}

// TestConcurrentCreateOneWinner: two stores (two gpuboot replicas) create one identity
// with different ids from 16 goroutines at once: exactly one wins, the others get
// ErrExists, and the cluster holds one Machine.
func TestConcurrentCreateOneWinner(t *testing.T) {
	a, b := enrollerStore(t), enrollerStore(t)
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make([]error, 16)
	for i := range errs {
		wg.Go(func() {
			m, tr := newMachine(t, "52:54:10:01", 1, inventory.Discovered)
			s := a
			if i%2 == 1 {
				s = b
			}
			errs[i] = s.Create(ctx, m, tr)
		})
	}
	wg.Wait()
	won := 0
	for _, err := range errs {
		switch {
		case err == nil:
			won++
		case !errors.Is(err, inventory.ErrExists):
			t.Errorf("Create: %v, want nil or ErrExists", err)
		}
	}
	if won != 1 {
		t.Fatalf("%d Creates of one identity won, want 1", won)
	}
	key := identity.Identity{MAC: "52:54:10:01:00:01", Serial: "SN-52:54:10:01:00:01"}.Key()
	if _, err := b.Lookup(ctx, key); err != nil {
		t.Fatal(err)
	}
}

// TestConcurrentUpdatesNoneLost: 40 updates of one machine, half through each store,
// each adding its own certificate serial: all 40 are there, and every lost race was
// retried on fresh data.
func TestConcurrentUpdatesNoneLost(t *testing.T) {
	a, b := enrollerStore(t), enrollerStore(t)
	ctx := context.Background()
	m, tr := newMachine(t, "52:54:10:02", 1, inventory.Registered)
	if err := a.Create(ctx, m, tr); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Go(func() {
			s := a
			if i%2 == 1 {
				s = b
			}
			_, err := s.Update(ctx, m.ID, func(m *inventory.Machine) ([]inventory.Transition, error) {
				m.AgentCertSerials = append(m.AgentCertSerials, fmt.Sprintf("%02x", i))
				return nil, nil
			})
			if err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	got, err := b.Get(ctx, m.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.AgentCertSerials) != 40 {
		t.Fatalf("%d of 40 concurrent updates kept: %v", len(got.AgentCertSerials), got.AgentCertSerials)
	}
	t.Logf("40 concurrent updates through two stores: %d lost a race and were retried", a.Conflicts()+b.Conflicts())
}

// TestHalfCreatedObjectCompleted: a replica that stopped between making a Machine and
// writing its record leaves an object without one; the lookups do not see it, and the
// next Create of that identity completes it.
func TestHalfCreatedObjectCompleted(t *testing.T) {
	c := testcluster.Shared(t)
	s := enrollerStore(t)
	ctx := context.Background()
	m, tr := newMachine(t, "52:54:10:03", 1, inventory.Discovered)
	dyn, err := dynamic.NewForConfig(c.RESTConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	half := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "inventory.gpurack.io/v1alpha1", "kind": "Machine",
		"metadata": map[string]any{"name": kubestore.ObjectName(m.Identity.Key())},
		"spec":     map[string]any{"identity": map[string]any{"mac": m.Identity.MAC, "serial": m.Identity.Serial}},
	}}
	if _, err := dyn.Resource(kubestore.GVR).Create(ctx, half, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Lookup(ctx, m.Identity.Key()); !errors.Is(err, inventory.ErrNotFound) {
		t.Fatalf("Lookup of a half-made machine: %v, want ErrNotFound", err)
	}
	if err := s.Create(ctx, m, tr); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Lookup(ctx, m.Identity.Key()); err != nil || got.ID != m.ID {
		t.Fatalf("after Create: %+v %v", got, err)
	}
}

// TestEnrollerCannotDeleteOrRewriteIdentity: the enroller may not delete a Machine,
// and nobody may change a Machine's identity (the CRD's validation).
func TestEnrollerCannotDeleteOrRewriteIdentity(t *testing.T) {
	c := testcluster.Shared(t)
	s := enrollerStore(t)
	ctx := context.Background()
	m, tr := newMachine(t, "52:54:10:04", 1, inventory.Discovered)
	if err := s.Create(ctx, m, tr); err != nil {
		t.Fatal(err)
	}
	name := kubestore.ObjectName(m.Identity.Key())
	enroller, _ := dynamic.NewForConfig(testcluster.RESTConfigFrom(t, c.EnrollerKubeconfig))
	if err := enroller.Resource(kubestore.GVR).Delete(ctx, name, metav1.DeleteOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("enroller deleting a Machine: %v, want Forbidden", err)
	}
	admin, _ := dynamic.NewForConfig(c.RESTConfig(t))
	u, err := admin.Resource(kubestore.GVR).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	unstructured.SetNestedField(u.Object, "52:54:10:04:99:99", "spec", "identity", "mac")
	_, err = admin.Resource(kubestore.GVR).Update(ctx, u, metav1.UpdateOptions{})
	if err == nil || !strings.Contains(err.Error(), "identity never changes") {
		t.Fatalf("changing a Machine's identity: %v, want the CRD's refusal", err)
	}
}

// TestMigrate moves a bbolt inventory of 30 machines, with histories of several
// transitions, into the cluster: every record and history reads back identical; run
// again, nothing is written; a machine the cluster holds differently stops it.
func TestMigrate(t *testing.T) {
	s := enrollerStore(t)
	ctx := context.Background()
	src, err := inventory.OpenBolt(filepath.Join(t.TempDir(), "inventory.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	var ids []string
	for i := range 30 {
		m, tr := newMachine(t, "52:54:10:05", i, inventory.Registered)
		if err := src.Create(ctx, m, tr); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, m.ID)
		for _, st := range []inventory.State{inventory.Approved, inventory.Joining, inventory.Commissioning, inventory.Ready}[:i%5] {
			if _, err := src.Update(ctx, m.ID, move(st, func(m *inventory.Machine) { m.NodeName = fmt.Sprintf("gpu-mig-%02d", i) })); err != nil {
				t.Fatal(err)
			}
		}
	}
	rep, err := inventory.Migrate(ctx, src, s, nil)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Machines != 30 || rep.Copied != 30 || rep.Transitions != 30+6*(0+1+2+3+4) {
		t.Fatalf("report %+v", rep)
	}
	for _, id := range ids {
		a, _ := src.History(ctx, id)
		b, err := s.History(ctx, id)
		if err != nil || len(a) != len(b) {
			t.Fatalf("history of %s: %d transitions in the file, %d in the cluster (%v)", id, len(a), len(b), err)
		}
	}
	writes := s.Writes()
	if rep, err = inventory.Migrate(ctx, src, s, nil); err != nil || rep.AlreadyThere != 30 || s.Writes() != writes {
		t.Fatalf("migrating again: %+v %v, %d writes", rep, err, s.Writes()-writes)
	}
	if _, err := s.Update(ctx, ids[7], func(m *inventory.Machine) ([]inventory.Transition, error) { m.Rack = "changed"; return nil, nil }); err != nil {
		t.Fatal(err)
	}
	_, err = inventory.Migrate(ctx, src, s, nil)
	if err == nil || !strings.Contains(err.Error(), ids[7]) || !strings.Contains(err.Error(), "differs") {
		t.Fatalf("migrating onto a changed machine: %v, want a refusal naming %s", err, ids[7])
	}
	if got, _ := s.Get(ctx, ids[7]); got.Rack != "changed" {
		t.Fatalf("the refused migration overwrote %s", ids[7])
	}
}
