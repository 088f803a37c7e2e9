package pki

import (
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestRevocationList(t *testing.T) {
	l := NewRevocationList(big.NewInt(0x10), big.NewInt(0xa))
	if !l.Contains(big.NewInt(10)) || !l.Contains(big.NewInt(16)) || l.Contains(big.NewInt(11)) || l.Contains(nil) {
		t.Errorf("Contains is wrong")
	}
	if !l.Revoke(big.NewInt(0xff)) || l.Revoke(big.NewInt(0xff)) || l.Revoke(nil) {
		t.Errorf("Revoke should report only new serials")
	}
	if got, want := l.Serials(), []string{"a", "10", "ff"}; !slices.Equal(got, want) {
		t.Errorf("Serials = %v, want %v (numeric order)", got, want)
	}
	var zero RevocationList
	if zero.Contains(big.NewInt(1)) || !zero.Revoke(big.NewInt(1)) || !zero.Contains(big.NewInt(1)) {
		t.Errorf("the zero RevocationList should be usable")
	}
}

func TestRevocationListSaveLoad(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "revoked.json")

	l, err := LoadRevocationList(path)
	if err != nil || l.Len() != 0 {
		t.Fatalf("missing file: %v, %d entries; want an empty list", err, l.Len())
	}
	serial, _ := new(big.Int).SetString("d3adbeef00112233445566778899aabb", 16)
	l.Revoke(serial)
	l.Revoke(big.NewInt(1))
	if err := l.Save(path); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if want := "[\n  \"1\",\n  \"d3adbeef00112233445566778899aabb\"\n]\n"; string(data) != want {
		t.Errorf("saved %q, want %q", data, want)
	}
	got, err := LoadRevocationList(path)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.Serials(), l.Serials()) {
		t.Errorf("round trip: %v, want %v", got.Serials(), l.Serials())
	}
	// Saving again replaces the file and leaves no temporary files.
	got.Revoke(big.NewInt(2))
	if err := got.Save(path); err != nil {
		t.Fatal(err)
	}
	assertOnlyFiles(t, dir, "revoked.json")

	// Other spellings of serials: upper case, leading zeros, openssl colons.
	if err := os.WriteFile(path, []byte(`["0A", "d3:AD:be:ef:00:11:22:33:44:55:66:77:88:99:aa:bb"]`), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err = LoadRevocationList(path)
	if err != nil {
		t.Fatal(err)
	}
	if !got.Contains(big.NewInt(10)) || !got.Contains(serial) || got.Len() != 2 {
		t.Errorf("loaded %v", got.Serials())
	}

	for _, bad := range []string{``, `{}`, `["xyz"]`, `[""]`, `["-1"]`, `["0"]`, `[1]`, `["1"] trailing`} {
		if err := os.WriteFile(path, []byte(bad), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := LoadRevocationList(path)
		if err == nil {
			t.Errorf("loaded %q", bad)
		} else if !strings.Contains(err.Error(), path) {
			t.Errorf("error for %q does not name the file: %v", bad, err)
		}
	}
}

// TestRevocationSavesDoNotLoseEntries: a Save that snapshotted the list before a
// second revoke must not overwrite the file the second Save wrote.
func TestRevocationSavesDoNotLoseEntries(t *testing.T) {
	path := filepath.Join(t.TempDir(), "revoked.json")
	l := NewRevocationList()
	firstSnapshotted := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	saveHook = func() {
		once.Do(func() {
			close(firstSnapshotted)
			<-release
		})
	}
	defer func() { saveHook = nil }()
	aDone := make(chan error, 1)
	l.Revoke(big.NewInt(1))
	go func() { aDone <- l.Save(path) }()
	<-firstSnapshotted
	bDone := make(chan error, 1)
	l.Revoke(big.NewInt(2))
	go func() { bDone <- l.Save(path) }()
	// Without serialization B writes {1,2} and then A's stale {1} replaces it.
	// With it, B waits for A. Give B the chance to finish before releasing A.
	select {
	case err := <-bDone:
		bDone <- err
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	if err := <-aDone; err != nil {
		t.Fatal(err)
	}
	if err := <-bDone; err != nil {
		t.Fatal(err)
	}
	got, err := LoadRevocationList(path)
	if err != nil {
		t.Fatal(err)
	}
	if !got.Contains(big.NewInt(1)) || !got.Contains(big.NewInt(2)) {
		t.Fatalf("saved list %v, want both serials 1 and 2", got.Serials())
	}
}

func TestConcurrentRevokesAllSaved(t *testing.T) {
	path := filepath.Join(t.TempDir(), "revoked.json")
	l := NewRevocationList()
	var wg sync.WaitGroup
	for i := 1; i <= 64; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l.Revoke(big.NewInt(int64(i)))
			if err := l.Save(path); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	got, err := LoadRevocationList(path)
	if err != nil {
		t.Fatal(err)
	}
	if got.Len() != 64 {
		t.Fatalf("saved %d serials after 64 concurrent revokes, want 64", got.Len())
	}
}
