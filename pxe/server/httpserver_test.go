package server

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// testLimits are defaultHTTPLimits scaled down so the test runs in seconds.
var testLimits = httpLimits{Header: 300 * time.Millisecond, Body: 300 * time.Millisecond, Idle: 300 * time.Millisecond, MaxHeaderBytes: 8 << 10}

// serveLimited runs newHTTPServer(h, testLimits) on loopback and returns its address.
func serveLimited(t *testing.T, h http.Handler) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := newHTTPServer(h, testLimits)
	go srv.Serve(lis)
	t.Cleanup(func() { srv.Close() })
	return lis.Addr().String()
}

// cutOff reports whether the server closed conn within limit, writing one byte of
// send every step meanwhile (a slow client). limit is generous: the test asserts
// that the connection ends, not how fast.
func cutOff(t *testing.T, conn net.Conn, send string, step, limit time.Duration) bool {
	t.Helper()
	closed := make(chan struct{})
	go func() {
		io.Copy(io.Discard, conn)
		close(closed)
	}()
	deadline := time.After(limit)
	for i := 0; ; i++ {
		select {
		case <-closed:
			return true
		case <-deadline:
			return false
		case <-time.After(step):
			if i < len(send) {
				if _, err := conn.Write([]byte{send[i]}); err != nil {
					<-closed
					return true
				}
			}
		}
	}
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// TestHTTPServerSlowClients: slowloris-style clients (headers or body trickled a byte
// at a time, a keep-alive connection left idle) are cut off, oversized headers are
// refused, and a download read slowly for far longer than every timeout completes.
func TestHTTPServerSlowClients(t *testing.T) {
	payload := bytes.Repeat([]byte("gpurack "), 512<<10) // 4 MiB
	addr := serveLimited(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			if _, err := io.ReadAll(r.Body); err != nil {
				return
			}
			io.WriteString(w, "ok")
			return
		}
		w.Write(payload)
	}))

	t.Run("slow headers", func(t *testing.T) {
		conn := dial(t, addr)
		conn.Write([]byte("GET /small HTTP/1.1\r\nHost: x\r\n"))
		if !cutOff(t, conn, "X-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", 100*time.Millisecond, 10*time.Second) {
			t.Fatal("a client sending its headers one byte per 100 ms was still connected after 10 s (header timeout 300 ms)")
		}
	})
	t.Run("slow body", func(t *testing.T) {
		conn := dial(t, addr)
		conn.Write([]byte("POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n"))
		if !cutOff(t, conn, strings.Repeat("b", 1000), 100*time.Millisecond, 10*time.Second) {
			t.Fatal("a client sending its body one byte per 100 ms was still connected after 10 s (body timeout 300 ms)")
		}
	})
	t.Run("idle keep-alive", func(t *testing.T) {
		conn := dial(t, addr)
		conn.Write([]byte("POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi"))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if !cutOff(t, conn, "", time.Second, 10*time.Second) {
			t.Fatal("an idle keep-alive connection was still open after 10 s (idle timeout 300 ms)")
		}
	})
	t.Run("large header", func(t *testing.T) {
		req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/small", nil)
		req.Header.Set("X-Big", strings.Repeat("a", 64<<10))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
			t.Fatalf("64 KiB header: %s, want 431 (MaxHeaderBytes 8 KiB)", resp.Status)
		}
	})
	t.Run("slow download completes", func(t *testing.T) {
		conn := dial(t, addr)
		// A small receive buffer makes the server wait on the client, as on a slow link.
		conn.(*net.TCPConn).SetReadBuffer(16 << 10)
		conn.Write([]byte("GET /big HTTP/1.1\r\nHost: x\r\n\r\n"))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var got int
		buf := make([]byte, 256<<10)
		start := time.Now()
		for {
			n, err := resp.Body.Read(buf)
			got += n
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("download cut after %d of %d bytes, %v into it: %v", got, len(payload), time.Since(start), err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		if got != len(payload) {
			t.Fatalf("downloaded %d bytes, want %d", got, len(payload))
		}
		t.Logf("a %d-byte download read slowly for %v (every timeout is 300 ms) completed", got, time.Since(start).Round(time.Millisecond))
	})
}
