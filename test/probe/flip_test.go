package main

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// TestFlip runs flip against a stand-in apiserver whose policy is a listening port:
// deleting the policy opens it, creating it closes it. Every flip must be seen both
// ways, the recreated policy must be the one read (without its server-set fields),
// and the report must carry each figure.
func TestFlip(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // the policy stands: nothing listens

	var mu sync.Mutex
	var open net.Listener
	var created []map[string]any
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if r.Header.Get("Authorization") != "Bearer tok" {
			http.Error(w, "no token", http.StatusUnauthorized)
			return
		}
		const path = "/apis/networking.k8s.io/v1/namespaces/alpha/networkpolicies"
		switch {
		case r.Method == http.MethodGet && r.URL.Path == path+"/iso":
			io.WriteString(w, `{"metadata":{"name":"iso","namespace":"alpha","resourceVersion":"7","uid":"u"},"spec":{"podSelector":{}}}`)
		case r.Method == http.MethodDelete && r.URL.Path == path+"/iso":
			if open, err = net.Listen("tcp", addr); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			go acceptAndClose(open)
		case r.Method == http.MethodPost && r.URL.Path == path:
			var obj map[string]any
			json.NewDecoder(r.Body).Decode(&obj)
			created = append(created, obj)
			open.Close()
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, "{}")
		default:
			http.Error(w, r.Method+" "+r.URL.Path, http.StatusNotFound)
		}
	}))
	defer api.Close()

	out, err := flip(t.Context(), &apiClient{base: api.URL, token: "tok", http: api.Client()}, addr, "alpha", "iso", 3)
	if err != nil {
		t.Fatalf("flip: %v\n%s", err, out)
	}
	for _, want := range []string{"flip 1:", "flip 3:", "deleted -> passing: median", "created -> dropped: median", "(n=3)"} {
		if !strings.Contains(out, want) {
			t.Errorf("the report lacks %q:\n%s", want, out)
		}
	}
	if len(created) != 3 {
		t.Fatalf("%d creates, want 3", len(created))
	}
	meta := created[0]["metadata"].(map[string]any)
	if meta["name"] != "iso" || meta["resourceVersion"] != nil || meta["uid"] != nil {
		t.Errorf("recreated metadata %v: want the name, without server-set fields", meta)
	}

	// A policy that does not hold at the start is an error, not a figure.
	mu.Lock()
	open, _ = net.Listen("tcp", addr)
	mu.Unlock()
	defer open.Close()
	go acceptAndClose(open)
	if _, err := flip(t.Context(), &apiClient{base: api.URL, token: "tok", http: api.Client()}, addr, "alpha", "iso", 1); err == nil || !strings.Contains(err.Error(), "is it enforced") {
		t.Errorf("flip with the port open from the start: %v, want an error", err)
	}
}

// acceptAndClose accepts connections on l and closes each, until l is closed.
func acceptAndClose(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		c.Close()
	}
}
