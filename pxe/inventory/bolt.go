package inventory

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/gpurack/gpurack/pxe/identity"
	bolterrors "go.etcd.io/bbolt/errors"
)

// Bucket names of the bbolt layout (schema version 3):
//
//	machines:   id → Machine as JSON
//	identities: Identity.Key → id
//	nodes:      NodeName "\x00" id → id, for every machine with a node name
//	claims:     "m\x00" MAC "\x00" id and "s\x00" serial "\x00" id → Identity.Key,
//	            for every claimant (Machine.Claimant); no serial entry without a serial
//	history:    id → bucket of 8-byte big-endian Seq → Transition as JSON
//	meta:       "schema" → "3"
//
// Version 1 had no nodes bucket, version 2 no claims bucket; OpenBolt builds what is
// missing from the machines and moves the file to version 3, after which a gpuboot
// that reads an older version refuses the file rather than writing machines without
// updating the indexes.
var (
	bucketMachines   = []byte("machines")
	bucketIdentities = []byte("identities")
	bucketNodes      = []byte("nodes")
	bucketClaims     = []byte("claims")
	bucketHistory    = []byte("history")
	bucketMeta       = []byte("meta")
	keySchema        = []byte("schema")
	schemaVersion    = []byte("3")
	schemaVersion2   = []byte("2")
	schemaVersion1   = []byte("1")
)

// BoltStore is the Store kept in one bbolt file. bbolt commits each transaction with
// fsync, so a machine and its transitions survive a crash together or not at all.
type BoltStore struct {
	db *bolt.DB
	// writes counts committed write transactions of Create and Update (each one an
	// fsync).
	writes atomic.Uint64
}

// Writes returns how many write transactions Create and Update committed since the
// store was opened: each is an fsync of the file.
func (s *BoltStore) Writes() uint64 { return s.writes.Load() }

// OpenBolt opens (creating it if needed) the inventory at path. It fails after a second
// if another process holds the file, naming the file.
func OpenBolt(path string) (*BoltStore, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("open inventory %s: %w", path, err)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if errors.Is(err, bolterrors.ErrTimeout) {
		return nil, fmt.Errorf("open inventory %s: another process (a running gpuboot?) holds it open", path)
	}
	if err != nil {
		return nil, fmt.Errorf("open inventory %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketMachines, bucketIdentities, bucketNodes, bucketClaims, bucketHistory, bucketMeta} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		meta := tx.Bucket(bucketMeta)
		switch v := meta.Get(keySchema); {
		case v == nil:
			return meta.Put(keySchema, schemaVersion)
		case bytes.Equal(v, schemaVersion1), bytes.Equal(v, schemaVersion2):
			if bytes.Equal(v, schemaVersion1) {
				if err := buildNodeIndex(tx); err != nil {
					return fmt.Errorf("migrate schema 1 to 2 (node name index): %w", err)
				}
			}
			if err := buildClaimIndex(tx); err != nil {
				return fmt.Errorf("migrate schema %s to 3 (claims index): %w", v, err)
			}
			return meta.Put(keySchema, schemaVersion)
		case !bytes.Equal(v, schemaVersion):
			return fmt.Errorf("schema version %q, this gpuboot reads %q: use a matching gpuboot", v, schemaVersion)
		}
		return nil
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("open inventory %s: %w", path, err)
	}
	return &BoltStore{db: db}, nil
}

// Close closes the file.
func (s *BoltStore) Close() error { return s.db.Close() }

// Create implements Store.
func (s *BoltStore) Create(_ context.Context, m *Machine, ts ...Transition) error {
	if m.ID == "" || m.Identity.MAC == "" {
		return fmt.Errorf("create machine: id and identity MAC are required")
	}
	if err := CheckChain(m.ID, None, m.State, ts); err != nil {
		return fmt.Errorf("create machine %s: %w", m.ID, err)
	}
	err := s.db.Update(func(tx *bolt.Tx) error {
		ids := tx.Bucket(bucketIdentities)
		key := []byte(m.Identity.Key())
		if id := ids.Get(key); id != nil {
			return fmt.Errorf("create machine for identity %s: %w as %s", m.Identity.Key(), ErrExists, id)
		}
		machines := tx.Bucket(bucketMachines)
		if machines.Get([]byte(m.ID)) != nil {
			return fmt.Errorf("create machine %s: %w", m.ID, ErrExists)
		}
		if err := ids.Put(key, []byte(m.ID)); err != nil {
			return err
		}
		if err := indexNode(tx, "", m); err != nil {
			return err
		}
		if err := indexClaim(tx, nil, m); err != nil {
			return err
		}
		if err := putMachine(machines, m); err != nil {
			return err
		}
		return appendHistory(tx, m.ID, ts)
	})
	if err == nil {
		s.writes.Add(1)
	}
	return err
}

// Get implements Store.
func (s *BoltStore) Get(_ context.Context, id string) (*Machine, error) {
	var m *Machine
	err := s.db.View(func(tx *bolt.Tx) error {
		var err error
		m, err = getMachine(tx, id)
		return err
	})
	return m, err
}

// Lookup implements Store.
func (s *BoltStore) Lookup(_ context.Context, identityKey string) (*Machine, error) {
	var m *Machine
	err := s.db.View(func(tx *bolt.Tx) error {
		id := tx.Bucket(bucketIdentities).Get([]byte(identityKey))
		if id == nil {
			return fmt.Errorf("identity %s: %w", identityKey, ErrNotFound)
		}
		var err error
		m, err = getMachine(tx, string(id))
		return err
	})
	return m, err
}

// List implements Store.
func (s *BoltStore) List(_ context.Context) ([]*Machine, error) {
	var out []*Machine
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketMachines).ForEach(func(k, v []byte) error {
			m := new(Machine)
			if err := json.Unmarshal(v, m); err != nil {
				return fmt.Errorf("machine %s: stored record does not decode: %w", k, err)
			}
			out = append(out, m)
			return nil
		})
	})
	return out, err
}

// ByNodeName implements Store. It reads the nodes index and the machines it names.
func (s *BoltStore) ByNodeName(_ context.Context, nodeName string) ([]*Machine, error) {
	if nodeName == "" {
		return nil, nil
	}
	var out []*Machine
	err := s.db.View(func(tx *bolt.Tx) error {
		prefix := nodeKey(nodeName, "")
		c := tx.Bucket(bucketNodes).Cursor()
		for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
			m, err := getMachine(tx, string(k[len(prefix):]))
			if err != nil {
				return fmt.Errorf("node name index entry %q: %w", k, err)
			}
			out = append(out, m)
		}
		return nil
	})
	return out, err
}

// Claimants implements Store. It reads the claims index only: no machine is decoded.
func (s *BoltStore) Claimants(_ context.Context, mac, serial string) ([]Claim, error) {
	var prefix []byte
	switch {
	case mac != "":
		prefix = claimKey("m", mac, "")
	case serial != "":
		prefix = claimKey("s", serial, "")
	default:
		return nil, nil
	}
	var out []Claim
	err := s.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketClaims).Cursor()
		for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
			id, err := parseIdentityKey(string(v))
			if err != nil {
				return fmt.Errorf("claims index entry %q: %w", k, err)
			}
			out = append(out, Claim{ID: string(k[len(prefix):]), Identity: id})
		}
		return nil
	})
	return out, err
}

// Update implements Store. An update that changes nothing (no transition, the same
// encoded machine) is not written.
func (s *BoltStore) Update(_ context.Context, id string, fn func(*Machine) ([]Transition, error)) (*Machine, error) {
	var out *Machine
	err := s.db.Update(func(tx *bolt.Tx) error {
		old, err := getMachine(tx, id)
		if err != nil {
			return err
		}
		m := old.Clone()
		ts, err := fn(m)
		if err != nil {
			return err
		}
		if m.ID != old.ID || m.Identity != old.Identity {
			return fmt.Errorf("update machine %s: the id and identity of a machine never change", id)
		}
		if err := CheckChain(id, old.State, m.State, ts); err != nil {
			return fmt.Errorf("update machine %s: %w", id, err)
		}
		if len(ts) == 0 {
			// Nothing changed: roll back rather than commit (and fsync) the same bytes.
			v, err := json.Marshal(m)
			if err != nil {
				return fmt.Errorf("encode machine %s: %w", m.ID, err)
			}
			if bytes.Equal(v, tx.Bucket(bucketMachines).Get([]byte(id))) {
				out = m
				return errUnchanged
			}
		}
		if err := indexNode(tx, old.NodeName, m); err != nil {
			return err
		}
		if err := indexClaim(tx, old, m); err != nil {
			return err
		}
		if err := putMachine(tx.Bucket(bucketMachines), m); err != nil {
			return err
		}
		if err := appendHistory(tx, id, ts); err != nil {
			return err
		}
		out = m
		return nil
	})
	if errors.Is(err, errUnchanged) {
		return out, nil
	}
	if err == nil {
		s.writes.Add(1)
	}
	return out, err
}

// errUnchanged rolls back an Update that changed nothing.
var errUnchanged = errors.New("machine unchanged")

// History implements Store.
func (s *BoltStore) History(_ context.Context, id string) ([]Transition, error) {
	var out []Transition
	err := s.db.View(func(tx *bolt.Tx) error {
		hist := tx.Bucket(bucketHistory)
		read := func(b *bolt.Bucket) error {
			return b.ForEach(func(_, v []byte) error {
				var t Transition
				if err := json.Unmarshal(v, &t); err != nil {
					return fmt.Errorf("history of %s: stored transition does not decode: %w", id, err)
				}
				out = append(out, t)
				return nil
			})
		}
		if id != "" {
			if tx.Bucket(bucketMachines).Get([]byte(id)) == nil {
				return fmt.Errorf("machine %s: %w", id, ErrNotFound)
			}
			if b := hist.Bucket([]byte(id)); b != nil {
				return read(b)
			}
			return nil
		}
		return hist.ForEachBucket(func(k []byte) error { return read(hist.Bucket(k)) })
	})
	if id == "" {
		SortHistory(out)
	}
	return out, err
}

// SortHistory orders several machines' transitions by time, then machine id, then
// sequence: the order History("") returns them in.
func SortHistory(ts []Transition) {
	sort.SliceStable(ts, func(i, j int) bool {
		if !ts[i].Time.Equal(ts[j].Time) {
			return ts[i].Time.Before(ts[j].Time)
		}
		if ts[i].MachineID != ts[j].MachineID {
			return ts[i].MachineID < ts[j].MachineID
		}
		return ts[i].Seq < ts[j].Seq
	})
}

// CheckChain verifies that ts moves machine id from → to through allowed transitions
// and action records (Transition.legal). Every Store checks a write with it.
func CheckChain(id string, from, to State, ts []Transition) error {
	cur := from
	for _, t := range ts {
		if t.MachineID != id {
			return fmt.Errorf("transition for machine %q stored with machine %q", t.MachineID, id)
		}
		if err := t.legal(cur); err != nil {
			return err
		}
		cur = t.To
	}
	if cur != to {
		return fmt.Errorf("state changed %s → %s without a transition: %w", stateName(from), stateName(to), ErrIllegalTransition)
	}
	return nil
}

// nodeKey is the nodes index key of machine id holding nodeName. Node names hold no
// NUL byte (Kubernetes names are DNS subdomains), so the prefix nodeName+NUL selects
// exactly the machines holding nodeName.
func nodeKey(nodeName, id string) []byte {
	return []byte(nodeName + "\x00" + id)
}

// indexNode moves m's entry in the nodes index from oldName to m.NodeName.
func indexNode(tx *bolt.Tx, oldName string, m *Machine) error {
	if oldName == m.NodeName {
		return nil
	}
	if strings.Contains(m.NodeName, "\x00") {
		return fmt.Errorf("machine %s: node name %q holds a NUL byte", m.ID, m.NodeName)
	}
	nodes := tx.Bucket(bucketNodes)
	if oldName != "" {
		if err := nodes.Delete(nodeKey(oldName, m.ID)); err != nil {
			return err
		}
	}
	if m.NodeName == "" {
		return nil
	}
	return nodes.Put(nodeKey(m.NodeName, m.ID), []byte(m.ID))
}

// claimKey is a claims index key: kind "m" (MAC) or "s" (serial), the value, and the
// machine id. MACs, serials (printable ASCII, pxe/identity) and ids hold no NUL byte,
// so the key with an empty id is the prefix of exactly the claimants with that value.
func claimKey(kind, value, id string) []byte {
	return []byte(kind + "\x00" + value + "\x00" + id)
}

// claimKeys are m's claims index keys.
func claimKeys(m *Machine) [][]byte {
	keys := [][]byte{claimKey("m", m.Identity.MAC, m.ID)}
	if m.Identity.Serial != "" {
		keys = append(keys, claimKey("s", m.Identity.Serial, m.ID))
	}
	return keys
}

// indexClaim brings m's claims index entries from old's (nil: none) to m's.
func indexClaim(tx *bolt.Tx, old, m *Machine) error {
	was := old != nil && old.Claimant()
	if was == m.Claimant() {
		return nil
	}
	claims := tx.Bucket(bucketClaims)
	for _, k := range claimKeys(m) {
		var err error
		if was {
			err = claims.Delete(k)
		} else {
			err = claims.Put(k, []byte(m.Identity.Key()))
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// buildClaimIndex fills the claims index from the machines bucket (schema 2 → 3).
func buildClaimIndex(tx *bolt.Tx) error {
	return tx.Bucket(bucketMachines).ForEach(func(k, v []byte) error {
		m := new(Machine)
		if err := json.Unmarshal(v, m); err != nil {
			return fmt.Errorf("machine %s: stored record does not decode: %w", k, err)
		}
		return indexClaim(tx, nil, m)
	})
}

// parseIdentityKey reverses identity.Identity.Key ("mac|uuid|serial"; the serial may
// hold "|", the MAC and UUID never do).
func parseIdentityKey(k string) (identity.Identity, error) {
	parts := strings.SplitN(k, "|", 3)
	if len(parts) != 3 || parts[0] == "" {
		return identity.Identity{}, fmt.Errorf("identity key %q is not mac|uuid|serial", k)
	}
	return identity.Identity{MAC: parts[0], UUID: parts[1], Serial: parts[2]}, nil
}

// buildNodeIndex fills the nodes index from the machines bucket (schema 1 → 2).
func buildNodeIndex(tx *bolt.Tx) error {
	return tx.Bucket(bucketMachines).ForEach(func(k, v []byte) error {
		m := new(Machine)
		if err := json.Unmarshal(v, m); err != nil {
			return fmt.Errorf("machine %s: stored record does not decode: %w", k, err)
		}
		return indexNode(tx, "", m)
	})
}

func getMachine(tx *bolt.Tx, id string) (*Machine, error) {
	v := tx.Bucket(bucketMachines).Get([]byte(id))
	if v == nil {
		return nil, fmt.Errorf("machine %s: %w", id, ErrNotFound)
	}
	m := new(Machine)
	if err := json.Unmarshal(v, m); err != nil {
		return nil, fmt.Errorf("machine %s: stored record does not decode: %w", id, err)
	}
	return m, nil
}

func putMachine(b *bolt.Bucket, m *Machine) error {
	v, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("encode machine %s: %w", m.ID, err)
	}
	return b.Put([]byte(m.ID), v)
}

func appendHistory(tx *bolt.Tx, id string, ts []Transition) error {
	if len(ts) == 0 {
		return nil
	}
	b, err := tx.Bucket(bucketHistory).CreateBucketIfNotExists([]byte(id))
	if err != nil {
		return err
	}
	for _, t := range ts {
		seq, err := b.NextSequence()
		if err != nil {
			return err
		}
		t.Seq = seq
		v, err := json.Marshal(t)
		if err != nil {
			return err
		}
		if err := b.Put(binary.BigEndian.AppendUint64(nil, seq), v); err != nil {
			return err
		}
	}
	return nil
}
