package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gpurack/gpurack/controlplane-bootstrap/controlplane"
)

// TestVIPHealthHandler: /healthz is "ok"; /leader is the holder's name, empty when
// none holds the address, and 503 with the reason when etcd cannot be read; other
// methods are refused.
func TestVIPHealthHandler(t *testing.T) {
	holder, holderErr := "cp-1", error(nil)
	h := vipHealthHandler(func(ctx context.Context) (string, error) {
		if _, ok := ctx.Deadline(); !ok {
			t.Error("/leader reads etcd without a time limit")
		}
		return holder, holderErr
	})
	get := func(method, path string) (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
		return rec.Code, rec.Body.String()
	}
	if code, body := get(http.MethodGet, "/healthz"); code != 200 || body != "ok" {
		t.Errorf("/healthz: %d %q", code, body)
	}
	if code, body := get(http.MethodGet, "/leader"); code != 200 || body != "cp-1\n" {
		t.Errorf("/leader: %d %q", code, body)
	}
	holder = ""
	if code, body := get(http.MethodGet, "/leader"); code != 200 || body != "" {
		t.Errorf("/leader with no holder: %d %q", code, body)
	}
	holderErr = errors.New("vip: read the holder of 10.0.0.10 from etcd: context deadline exceeded")
	if code, body := get(http.MethodGet, "/leader"); code != http.StatusServiceUnavailable || !strings.Contains(body, "context deadline exceeded") {
		t.Errorf("/leader with etcd down: %d %q", code, body)
	}
	if code, _ := get(http.MethodPost, "/healthz"); code != http.StatusMethodNotAllowed {
		t.Errorf("POST /healthz: %d", code)
	}
}

// TestVIPHealthWhileRunning: --health-listen answers while the holder runs and stops
// answering when it returns, with its error.
func TestVIPHealthWhileRunning(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	running := make(chan struct{})
	done := make(chan error, 1)
	leader := func(context.Context) (string, error) { return "cp-2", nil }
	go func() {
		done <- runWithHealth(ctx, ln, leader, slog.New(slog.DiscardHandler), func(ctx context.Context) error {
			close(running)
			<-ctx.Done()
			return errors.New("stopped")
		})
	}()
	<-running
	for path, want := range map[string]string{"/healthz": "ok", "/leader": "cp-2\n"} {
		if got := httpGet(t, url+path); got != want {
			t.Errorf("%s while running: %q, want %q", path, got, want)
		}
	}
	cancel()
	select {
	case err := <-done:
		if err == nil || err.Error() != "stopped" {
			t.Errorf("runWithHealth returned %v, want the run's error", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("runWithHealth did not return after its run did")
	}
	if _, err := http.Get(url + "/healthz"); err == nil {
		t.Error("/healthz still answers after the holder stopped")
	}
}

func httpGet(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Errorf("GET %s: HTTP %d", url, resp.StatusCode)
	}
	return string(body)
}

// TestVIPStatusLine: status names the floating address and its holder, none, or why
// the holder is unknown.
func TestVIPStatusLine(t *testing.T) {
	for _, tc := range []struct {
		v    controlplane.VIPStatus
		want string
	}{
		{controlplane.VIPStatus{Address: "10.0.0.10/24", Holder: "cp-1"}, "API address 10.0.0.10/24 (apiServer.vip): held by cp-1"},
		{controlplane.VIPStatus{Address: "10.0.0.10/24"}, "API address 10.0.0.10/24 (apiServer.vip): held by no host"},
		{controlplane.VIPStatus{Address: "10.0.0.10/24", Err: "http://127.0.0.1:9446/leader: connection refused: not listening (is it running?)"},
			"API address 10.0.0.10/24 (apiServer.vip): holder unknown: http://127.0.0.1:9446/leader: connection refused: not listening (is it running?)"},
	} {
		if got := vipLine(&tc.v); !strings.HasPrefix(got, tc.want) {
			t.Errorf("vipLine(%+v) = %q, want %q", tc.v, got, tc.want)
		}
	}
}

// TestVIPHealthListenFlag: the vip command has --health-listen, off by default.
func TestVIPHealthListenFlag(t *testing.T) {
	f := newVIPCommand().Flags().Lookup("health-listen")
	if f == nil || f.DefValue != "" {
		t.Fatalf("--health-listen: %+v", f)
	}
}
