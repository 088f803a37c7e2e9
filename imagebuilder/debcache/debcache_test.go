package debcache

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/gpurack/gpurack/internal/profile"
)

func locked(content string) profile.LockedPackage {
	sum := sha256.Sum256([]byte(content))
	return profile.LockedPackage{Name: "hello", Version: "1.0-1", Architecture: "amd64", Area: "main",
		Filename: "pool/main/h/hello/hello_1.0-1_amd64.deb", Size: int64(len(content)), SHA256: hex.EncodeToString(sum[:])}
}

func archive(t *testing.T, content string) (*httptest.Server, *atomic.Int32) {
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/debian/pool/main/h/hello/hello_1.0-1_amd64.deb" {
			http.NotFound(w, r)
			return
		}
		hits.Add(1)
		fmt.Fprint(w, content)
	}))
	t.Cleanup(srv.Close)
	return srv, &hits
}

func TestGetFetchesThenServesFromCache(t *testing.T) {
	srv, hits := archive(t, "deb bytes")
	c := &Cache{Dir: t.TempDir()}
	lp := locked("deb bytes")
	for i := 0; i < 2; i++ {
		path, err := c.Get(context.Background(), lp, []string{srv.URL + "/missing", srv.URL + "/debian"})
		if err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(path); string(b) != "deb bytes" {
			t.Fatalf("cached %q", b)
		}
	}
	if hits.Load() != 1 {
		t.Fatalf("archive fetched %d times, want 1 (the second Get must use the cache)", hits.Load())
	}
}

func TestCorruptedEntryIsRefetchedNeverUsed(t *testing.T) {
	srv, hits := archive(t, "deb bytes")
	var logged []string
	c := &Cache{Dir: t.TempDir(), Log: func(f string, a ...any) { logged = append(logged, fmt.Sprintf(f, a...)) }}
	lp := locked("deb bytes")
	os.MkdirAll(strings.TrimSuffix(c.Path(lp.SHA256), "/"+lp.SHA256+".deb"), 0o755)
	if err := os.WriteFile(c.Path(lp.SHA256), []byte("deb bytez"), 0o644); err != nil {
		t.Fatal(err)
	}
	path, err := c.Get(context.Background(), lp, []string{srv.URL + "/debian"})
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); string(b) != "deb bytes" || hits.Load() != 1 {
		t.Fatalf("got %q after %d fetches", b, hits.Load())
	}
	if len(logged) != 1 || !strings.Contains(logged[0], "not the locked") || !strings.Contains(logged[0], "fetching again") {
		t.Fatalf("log %q does not explain the refetch", logged)
	}
}

func TestWrongSHA256FromArchiveIsRefused(t *testing.T) {
	srv, _ := archive(t, "tampered")
	c := &Cache{Dir: t.TempDir()}
	lp := locked("deb bytes")
	lp.Size = int64(len("tampered"))
	_, err := c.Get(context.Background(), lp, []string{srv.URL + "/debian"})
	if err == nil || !strings.Contains(err.Error(), "the lock says") || !strings.Contains(err.Error(), "hello 1.0-1") {
		t.Fatalf("err = %v", err)
	}
	if c.Has(lp.SHA256) {
		t.Fatal("a file with the wrong digest was stored under the locked digest")
	}
}

func TestUnreachableArchive(t *testing.T) {
	c := &Cache{Dir: t.TempDir()}
	_, err := c.Get(context.Background(), locked("x"), []string{"http://127.0.0.1:1/debian"})
	if err == nil || !strings.Contains(err.Error(), "127.0.0.1:1") || !strings.Contains(err.Error(), "not in the cache and no archive has it") {
		t.Fatalf("err = %v", err)
	}
}
