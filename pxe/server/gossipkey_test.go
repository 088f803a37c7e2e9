package server

import (
	"bytes"
	"sync"
	"testing"
)

// TestEnsureGossipKeyConcurrent: starts racing to create a rack's key all get the
// same whole key, never a partial file or an error.
func TestEnsureGossipKeyConcurrent(t *testing.T) {
	dir := t.TempDir()
	keys := make([][]byte, 16)
	errs := make([]error, 16)
	var wg sync.WaitGroup
	for i := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, keys[i], errs[i] = EnsureGossipKey(dir, "r1")
		}()
	}
	wg.Wait()
	for i := range keys {
		if errs[i] != nil {
			t.Fatalf("start %d: %v", i, errs[i])
		}
		if len(keys[i]) != 32 || !bytes.Equal(keys[i], keys[0]) {
			t.Fatalf("start %d got key %x, start 0 got %x", i, keys[i], keys[0])
		}
	}
}
