// Package kubestore keeps gpuboot's inventory in the cluster, as Machine custom
// resources (machines.inventory.gpurack.io), so that several gpuboot replicas share one
// record of every machine (decision 0704). It implements inventory.Store; bbolt
// (inventory.BoltStore) stays the store of a single gpuboot.
//
// One object per hardware identity, named from the identity (ObjectName): two replicas
// that record one machine at once collide on the name, and one wins. The machine and
// all its transitions live in the object's status and are written together, in one
// status update guarded by the object's resourceVersion, so a write is atomic and a
// lost race is retried on fresh data (Update calls fn again). The status fields the
// store looks machines up by (id, node name, the MAC and serial of a claimant) are the
// CRD's selectable fields: the apiserver filters by them.
//
// It is not the lifecycle (inventory.Move) and not the enrollment logic (pxe/enroll).
package kubestore

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/gpurack/gpurack/pxe/identity"
	"github.com/gpurack/gpurack/pxe/inventory"
)

//go:embed machines-crd.yaml
var crdYAML []byte

// GVR is the Machine resource.
var GVR = schema.GroupVersionResource{Group: "inventory.gpurack.io", Version: "v1alpha1", Resource: "machines"}

// LeaseNamespace and LeaseName name the Lease that gpuboot replicas on this store
// elect the one running the node controller with.
const (
	LeaseNamespace = "kube-system"
	LeaseName      = "gpuboot-node-controller"
)

// CRDName is the CustomResourceDefinition's name.
const CRDName = "machines.inventory.gpurack.io"

// CRD returns the Machine CustomResourceDefinition, as controlplane-bootstrap applies it.
func CRD() (*unstructured.Unstructured, error) {
	j, err := yaml.YAMLToJSON(crdYAML)
	if err != nil {
		return nil, fmt.Errorf("machines CRD: %w", err)
	}
	u := new(unstructured.Unstructured)
	if err := u.UnmarshalJSON(j); err != nil {
		return nil, fmt.Errorf("machines CRD: %w", err)
	}
	return u, nil
}

// ObjectName is the name of the Machine object of the identity with key identityKey:
// "id-" and the first 32 hex digits of its SHA-256.
func ObjectName(identityKey string) string {
	sum := sha256.Sum256([]byte(identityKey))
	return "id-" + hex.EncodeToString(sum[:16])
}

// object is a Machine as the apiserver stores it.
type object struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metav1.ObjectMeta `json:"metadata"`
	Spec       spec              `json:"spec"`
	Status     status            `json:"status,omitzero"`
}

type spec struct {
	Identity identity.Identity `json:"identity"`
}

// status holds the record. The plain fields are copies of the record's, for the
// apiserver's field selectors and kubectl's columns; Record is what the store reads.
type status struct {
	ID          string                 `json:"id,omitempty"`
	State       inventory.State        `json:"state,omitempty"`
	NodeName    string                 `json:"nodeName,omitempty"`
	ClaimMAC    string                 `json:"claimMAC,omitempty"`
	ClaimSerial string                 `json:"claimSerial,omitempty"`
	Record      *inventory.Machine     `json:"record,omitempty"`
	Transitions []inventory.Transition `json:"transitions,omitempty"`
}

// Store is the inventory kept as Machine objects.
type Store struct {
	client dynamic.ResourceInterface
	// names maps machine ids to object names; an id never changes its identity, so
	// an entry never goes stale.
	names sync.Map
	// writes and conflicts count status updates committed and lost to another writer.
	writes, conflicts atomic.Uint64
}

// ClientQPS and ClientBurst bound the requests a store's client sends: a first Register
// is about four (a read by name, a list by id, the object, its status), and an
// enrollment storm of a rack of new machines is hundreds a second. client-go's default
// (5 a second) would queue a rack behind it; the apiserver's priority and fairness
// still protects it from one gpuboot.
const (
	ClientQPS   = 1000
	ClientBurst = 2000
)

// New returns the store reached with cfg (gpuboot's enroller kubeconfig), its client
// bounded to ClientQPS. It reads nothing; Check does.
func New(cfg *rest.Config) (*Store, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = ClientQPS, ClientBurst
	c, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("inventory in the cluster: %w", err)
	}
	return &Store{client: c.Resource(GVR)}, nil
}

// Check lists one Machine: it fails, saying what to do, when the CRD is not installed
// or the credentials may not read machines.
func (s *Store) Check(ctx context.Context) error {
	_, err := s.client.List(ctx, metav1.ListOptions{Limit: 1})
	switch {
	case apierrors.IsNotFound(err):
		return fmt.Errorf("inventory in the cluster: the API has no %s (run `controlplane-bootstrap init` of this release, which installs the CRD): %w", CRDName, err)
	case apierrors.IsForbidden(err):
		return fmt.Errorf("inventory in the cluster: the kubeconfig's user may not list machines (run `controlplane-bootstrap init` of this release, which grants the enroller): %w", err)
	case err != nil:
		return fmt.Errorf("inventory in the cluster: %w", err)
	}
	return nil
}

// Writes returns how many status updates the store committed; Conflicts, how many it
// lost to another writer and retried.
func (s *Store) Writes() uint64    { return s.writes.Load() }
func (s *Store) Conflicts() uint64 { return s.conflicts.Load() }

// Close implements inventory.Store; it holds nothing.
func (s *Store) Close() error { return nil }

func decode(u *unstructured.Unstructured) (*object, error) {
	j, err := u.MarshalJSON()
	if err != nil {
		return nil, err
	}
	o := new(object)
	if err := json.Unmarshal(j, o); err != nil {
		return nil, fmt.Errorf("machine object %s does not decode: %w", u.GetName(), err)
	}
	return o, nil
}

func encode(o *object) (*unstructured.Unstructured, error) {
	o.APIVersion, o.Kind = GVR.GroupVersion().String(), "Machine"
	j, err := json.Marshal(o)
	if err != nil {
		return nil, err
	}
	u := new(unstructured.Unstructured)
	return u, u.UnmarshalJSON(j)
}

// setRecord puts m and its transitions in o's status with the fields selected by.
func (o *object) setRecord(m *inventory.Machine, ts []inventory.Transition) {
	o.Status = status{ID: m.ID, State: m.State, NodeName: m.NodeName, Record: m, Transitions: ts}
	if m.Claimant() {
		o.Status.ClaimMAC = m.Identity.MAC
		o.Status.ClaimSerial = m.Identity.Serial
	}
}

// withSeq returns history followed by ts, numbered on from history's last Seq.
func withSeq(history, ts []inventory.Transition) []inventory.Transition {
	var seq uint64
	if n := len(history); n > 0 {
		seq = history[n-1].Seq
	}
	out := slices.Clone(history)
	for _, t := range ts {
		seq++
		t.Seq = seq
		out = append(out, t)
	}
	return out
}

// Create implements inventory.Store. It makes the object (spec only) and then writes
// its status; an object another writer made for the same identity and left without a
// record (it stopped between the two) is completed by whoever writes its status first.
func (s *Store) Create(ctx context.Context, m *inventory.Machine, ts ...inventory.Transition) error {
	if m.ID == "" || m.Identity.MAC == "" {
		return fmt.Errorf("create machine: id and identity MAC are required")
	}
	if err := inventory.CheckChain(m.ID, inventory.None, m.State, ts); err != nil {
		return fmt.Errorf("create machine %s: %w", m.ID, err)
	}
	if other, err := s.nameOf(ctx, m.ID); err == nil {
		return fmt.Errorf("create machine %s: %w (object %s)", m.ID, inventory.ErrExists, other)
	} else if !errors.Is(err, inventory.ErrNotFound) {
		return fmt.Errorf("create machine %s: %w", m.ID, err)
	}
	key := m.Identity.Key()
	name := ObjectName(key)
	o := &object{Metadata: metav1.ObjectMeta{Name: name}, Spec: spec{Identity: m.Identity}}
	u, err := encode(o)
	if err != nil {
		return err
	}
	got, err := s.client.Create(ctx, u, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		got, err = s.client.Get(ctx, name, metav1.GetOptions{})
	}
	if err != nil {
		return fmt.Errorf("create machine %s: %w", m.ID, err)
	}
	cur, err := decode(got)
	if err != nil {
		return err
	}
	if cur.Spec.Identity != m.Identity {
		return fmt.Errorf("create machine %s: object %s holds identity %s: two identities share a name hash", m.ID, name, cur.Spec.Identity.Key())
	}
	if cur.Status.Record != nil {
		return fmt.Errorf("create machine for identity %s: %w as %s", key, inventory.ErrExists, cur.Status.ID)
	}
	cur.setRecord(m.Clone(), withSeq(nil, ts))
	if _, err := s.writeStatus(ctx, cur); apierrors.IsConflict(err) {
		s.conflicts.Add(1)
		return fmt.Errorf("create machine for identity %s: %w (another gpuboot recorded it first)", key, inventory.ErrExists)
	} else if err != nil {
		return fmt.Errorf("create machine %s: %w", m.ID, err)
	}
	s.names.Store(m.ID, name)
	return nil
}

// writeStatus writes o's status under o's resourceVersion.
func (s *Store) writeStatus(ctx context.Context, o *object) (*object, error) {
	o.Metadata.ManagedFields = nil // the apiserver keeps its own
	u, err := encode(o)
	if err != nil {
		return nil, err
	}
	got, err := s.client.UpdateStatus(ctx, u, metav1.UpdateOptions{})
	if err != nil {
		return nil, err
	}
	s.writes.Add(1)
	return decode(got)
}

// nameOf returns the object name of machine id: from memory, or found by the
// selectable field status.id.
func (s *Store) nameOf(ctx context.Context, id string) (string, error) {
	if v, ok := s.names.Load(id); ok {
		return v.(string), nil
	}
	if id == "" {
		return "", fmt.Errorf("machine with no id: %w", inventory.ErrNotFound)
	}
	objs, err := s.list(ctx, fields.OneTermEqualSelector("status.id", id))
	if err != nil {
		return "", err
	}
	if len(objs) == 0 {
		return "", fmt.Errorf("machine %s: %w", id, inventory.ErrNotFound)
	}
	s.names.Store(id, objs[0].Metadata.Name)
	return objs[0].Metadata.Name, nil
}

// get reads object name afresh; ErrNotFound when it is missing or holds no record yet.
func (s *Store) get(ctx context.Context, name, what string) (*object, error) {
	u, err := s.client.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("%s: %w", what, inventory.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	o, err := decode(u)
	if err != nil {
		return nil, err
	}
	if o.Status.Record == nil {
		return nil, fmt.Errorf("%s: %w (its record is being written)", what, inventory.ErrNotFound)
	}
	return o, nil
}

// list returns the objects with a record that sel selects (nil: all), by name.
func (s *Store) list(ctx context.Context, sel fields.Selector) ([]*object, error) {
	opts := metav1.ListOptions{Limit: 500}
	if sel != nil {
		opts.FieldSelector = sel.String()
	}
	var out []*object
	for {
		l, err := s.client.List(ctx, opts)
		if err != nil {
			return nil, fmt.Errorf("list machines: %w", err)
		}
		for i := range l.Items {
			o, err := decode(&l.Items[i])
			if err != nil {
				return nil, err
			}
			if o.Status.Record != nil {
				out = append(out, o)
			}
		}
		if opts.Continue = l.GetContinue(); opts.Continue == "" {
			return out, nil
		}
	}
}

// byID reads the object of machine id afresh.
func (s *Store) byID(ctx context.Context, id string) (*object, error) {
	name, err := s.nameOf(ctx, id)
	if err != nil {
		return nil, err
	}
	return s.get(ctx, name, "machine "+id)
}

// Get implements inventory.Store.
func (s *Store) Get(ctx context.Context, id string) (*inventory.Machine, error) {
	o, err := s.byID(ctx, id)
	if err != nil {
		return nil, err
	}
	return o.Status.Record, nil
}

// Lookup implements inventory.Store.
func (s *Store) Lookup(ctx context.Context, identityKey string) (*inventory.Machine, error) {
	o, err := s.get(ctx, ObjectName(identityKey), "identity "+identityKey)
	if err != nil {
		return nil, err
	}
	if o.Status.Record.Identity.Key() != identityKey {
		return nil, fmt.Errorf("identity %s: %w (object %s holds %s)", identityKey, inventory.ErrNotFound, o.Metadata.Name, o.Status.Record.Identity.Key())
	}
	return o.Status.Record, nil
}

func records(objs []*object) []*inventory.Machine {
	out := make([]*inventory.Machine, 0, len(objs))
	for _, o := range objs {
		out = append(out, o.Status.Record)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// List implements inventory.Store.
func (s *Store) List(ctx context.Context) ([]*inventory.Machine, error) {
	objs, err := s.list(ctx, nil)
	if err != nil {
		return nil, err
	}
	return records(objs), nil
}

// ByNodeName implements inventory.Store.
func (s *Store) ByNodeName(ctx context.Context, nodeName string) ([]*inventory.Machine, error) {
	if nodeName == "" {
		return nil, nil
	}
	objs, err := s.list(ctx, fields.OneTermEqualSelector("status.nodeName", nodeName))
	if err != nil {
		return nil, err
	}
	return records(objs), nil
}

// Claimants implements inventory.Store.
func (s *Store) Claimants(ctx context.Context, mac, serial string) ([]inventory.Claim, error) {
	var sel fields.Selector
	switch {
	case mac != "":
		sel = fields.OneTermEqualSelector("status.claimMAC", mac)
	case serial != "":
		sel = fields.OneTermEqualSelector("status.claimSerial", serial)
	default:
		return nil, nil
	}
	objs, err := s.list(ctx, sel)
	if err != nil {
		return nil, err
	}
	var out []inventory.Claim
	for _, m := range records(objs) {
		out = append(out, inventory.Claim{ID: m.ID, Identity: m.Identity})
	}
	return out, nil
}

// Update implements inventory.Store. It reads the object, calls fn with a copy of the
// record and writes the status under the resourceVersion it read; when another writer
// got there first it reads again and calls fn again, up to maxAttempts times. An
// update that changes nothing is not written.
func (s *Store) Update(ctx context.Context, id string, fn func(*inventory.Machine) ([]inventory.Transition, error)) (*inventory.Machine, error) {
	name, err := s.nameOf(ctx, id)
	if err != nil {
		return nil, err
	}
	for attempt := 1; ; attempt++ {
		o, err := s.get(ctx, name, "machine "+id)
		if err != nil {
			return nil, err
		}
		old := o.Status.Record
		m := old.Clone()
		ts, err := fn(m)
		if err != nil {
			return nil, err
		}
		if m.ID != old.ID || m.Identity != old.Identity {
			return nil, fmt.Errorf("update machine %s: the id and identity of a machine never change", id)
		}
		if err := inventory.CheckChain(id, old.State, m.State, ts); err != nil {
			return nil, fmt.Errorf("update machine %s: %w", id, err)
		}
		if len(ts) == 0 && sameRecord(old, m) {
			return m, nil
		}
		o.setRecord(m, withSeq(o.Status.Transitions, ts))
		_, err = s.writeStatus(ctx, o)
		if err == nil {
			return m, nil
		}
		if !apierrors.IsConflict(err) {
			return nil, fmt.Errorf("update machine %s: %w", id, err)
		}
		s.conflicts.Add(1)
		if attempt == maxAttempts {
			return nil, fmt.Errorf("update machine %s: %d writers raced and this one lost every time: %w", id, maxAttempts, err)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Duration(attempt)*5*time.Millisecond + rand.N(10*time.Millisecond)):
		}
	}
}

// maxAttempts bounds Update's retries after a lost race: the waits between them add
// up to about 4 s.
const maxAttempts = 40

func sameRecord(a, b *inventory.Machine) bool {
	ja, err1 := json.Marshal(a)
	jb, err2 := json.Marshal(b)
	return err1 == nil && err2 == nil && string(ja) == string(jb)
}

// History implements inventory.Store.
func (s *Store) History(ctx context.Context, id string) ([]inventory.Transition, error) {
	if id != "" {
		o, err := s.byID(ctx, id)
		if err != nil {
			return nil, err
		}
		return o.Status.Transitions, nil
	}
	objs, err := s.list(ctx, nil)
	if err != nil {
		return nil, err
	}
	var out []inventory.Transition
	for _, o := range objs {
		out = append(out, o.Status.Transitions...)
	}
	inventory.SortHistory(out)
	return out, nil
}
