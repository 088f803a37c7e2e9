package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// policyStandIn is an apiserver whose one NetworkPolicy (alpha/iso) decides what a
// dial meets: while it stands a try gets no answer (a drop), deleting it lets tries
// pass, creating it drops them again.
type policyStandIn struct {
	mu      sync.Mutex
	stands  bool
	refuse  bool // while it stands, refuse (a reset) instead of dropping
	created []map[string]any
	api     *httptest.Server
}

func newPolicyStandIn(t *testing.T) *policyStandIn {
	p := &policyStandIn{stands: true}
	p.api = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		defer p.mu.Unlock()
		if r.Header.Get("Authorization") != "Bearer tok" {
			http.Error(w, "no token", http.StatusUnauthorized)
			return
		}
		const path = "/apis/networking.k8s.io/v1/namespaces/alpha/networkpolicies"
		switch {
		case r.Method == http.MethodGet && r.URL.Path == path+"/iso":
			io.WriteString(w, `{"metadata":{"name":"iso","namespace":"alpha","resourceVersion":"7","uid":"u"},"spec":{"podSelector":{}}}`)
		case r.Method == http.MethodDelete && r.URL.Path == path+"/iso":
			p.stands = false
		case r.Method == http.MethodPost && r.URL.Path == path:
			var obj map[string]any
			json.NewDecoder(r.Body).Decode(&obj)
			p.created = append(p.created, obj)
			p.stands = true
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, "{}")
		default:
			http.Error(w, r.Method+" "+r.URL.Path, http.StatusNotFound)
		}
	}))
	t.Cleanup(p.api.Close)
	return p
}

func (p *policyStandIn) client() *apiClient {
	return &apiClient{base: p.api.URL, token: "tok", http: p.api.Client()}
}

// dial is the node's judgement of a SYN: passed, dropped (no answer until the try's
// cutoff) or refused.
func (p *policyStandIn) dial(ctx context.Context, addr string) error {
	p.mu.Lock()
	stands, refuse := p.stands, p.refuse
	p.mu.Unlock()
	switch {
	case !stands:
		return nil
	case refuse:
		return fmt.Errorf("dial tcp %s: %w", addr, syscall.ECONNREFUSED)
	}
	<-ctx.Done()
	return ctx.Err()
}

// TestFlip runs flip against the stand-in: every flip must be seen both ways, the
// recreated policy must be the one read (without its server-set fields), and the
// report must carry each figure and the method.
func TestFlip(t *testing.T) {
	p := newPolicyStandIn(t)
	out, err := flipWith(t.Context(), p.client(), "10.0.0.1:8080", "alpha", "iso", 2, p.dial)
	if err != nil {
		t.Fatalf("flip: %v\n%s", err, out)
	}
	for _, want := range []string{"flip 1:", "flip 2:", "deleted -> passing: median", "created -> dropped: median", "(n=2)", "a try every 50ms"} {
		if !strings.Contains(out, want) {
			t.Errorf("the report lacks %q:\n%s", want, out)
		}
	}
	if len(p.created) != 2 {
		t.Fatalf("%d creates, want 2", len(p.created))
	}
	meta := p.created[0]["metadata"].(map[string]any)
	if meta["name"] != "iso" || meta["resourceVersion"] != nil || meta["uid"] != nil {
		t.Errorf("recreated metadata %v: want the name, without server-set fields", meta)
	}
}

// TestFlipRefusalIsNotADrop: a NetworkPolicy drops; a reset means something else
// answered, and flip must say so rather than count it.
func TestFlipRefusalIsNotADrop(t *testing.T) {
	p := newPolicyStandIn(t)
	p.refuse = true
	_, err := flipWith(t.Context(), p.client(), "10.0.0.1:8080", "alpha", "iso", 1, p.dial)
	if err == nil || !strings.Contains(err.Error(), "does not refuse") {
		t.Errorf("flip against refusals: %v, want an error naming the refusal", err)
	}
}

// TestFlipPolicyNotHeld: connections that pass while the policy stands are an error,
// not a figure.
func TestFlipPolicyNotHeld(t *testing.T) {
	p := newPolicyStandIn(t)
	pass := func(context.Context, string) error { return nil }
	if _, err := flipWith(t.Context(), p.client(), "10.0.0.1:8080", "alpha", "iso", 1, pass); err == nil || !strings.Contains(err.Error(), "is it enforced") {
		t.Errorf("flip with connections passing from the start: %v, want an error", err)
	}
}

// TestDecide: a slow allowed try (timed out) among passing ones is not a drop; the
// drop starts at the first try of a whole window of timeouts; a pass is the first
// try that passed.
func TestDecide(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int, o tryOutcome) try {
		return try{start: t0.Add(time.Duration(ms) * time.Millisecond), outcome: o}
	}
	var tries []try
	// Passing, one slow try that timed out at 100 ms, passing again, then the policy
	// takes hold at 400 ms and every try times out for 2.5 s.
	tries = append(tries, at(0, tryPassed), at(50, tryPassed), at(100, tryTimedOut), at(150, tryPassed), at(200, tryPassed))
	for ms := 400; ms <= 2900; ms += 50 {
		tries = append(tries, at(ms, tryTimedOut))
	}
	d, err, done := decide(tries, tryTimedOut, t0)
	if err != nil || !done || d != 400*time.Millisecond {
		t.Errorf("drop: %v %v %v, want 400ms (the slow try at 100ms is not the drop)", d, err, done)
	}
	if _, _, done := decide(tries[:10], tryTimedOut, t0); done {
		t.Error("a run of timeouts shorter than the window was taken for a drop")
	}
	running := append([]try{at(0, tryTimedOut)}, try{start: t0.Add(50 * time.Millisecond), outcome: -1})
	if _, _, done := decide(running, tryTimedOut, t0); done {
		t.Error("decided a drop past a try still running")
	}
	opening := []try{at(0, tryTimedOut), at(50, -1), at(100, tryPassed)}
	if d, _, done := decide(opening, tryPassed, t0); !done || d != 100*time.Millisecond {
		t.Errorf("pass: %v %v, want 100ms", d, done)
	}
}
