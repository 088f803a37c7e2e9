package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// serviceAccountToken is where kubelet mounts the pod's service-account token.
const serviceAccountToken = "/var/run/secrets/kubernetes.io/serviceaccount/token"

// apiClient calls the apiserver as the pod's service account.
type apiClient struct {
	base  string // https://host:port
	token string
	http  *http.Client
}

// inClusterAPI is the apiserver through the kubernetes Service, as the pod's service
// account.
func inClusterAPI() (*apiClient, error) {
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	token, err := os.ReadFile(serviceAccountToken)
	if host == "" || port == "" || err != nil {
		return nil, fmt.Errorf("no in-cluster apiserver (KUBERNETES_SERVICE_HOST %q, token: %v): the pod needs its service account token", host, err)
	}
	return &apiClient{base: "https://" + net.JoinHostPort(host, port), token: strings.TrimSpace(string(token)), http: newClient(serviceAccountCA)}, nil
}

// do sends a request with body (JSON, or nil) and decodes a JSON answer into out
// (when not nil); an answer other than 2xx is an error with the apiserver's message.
func (c *apiClient) do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, strings.TrimSpace(string(b)))
	}
	if out != nil {
		return json.Unmarshal(b, out)
	}
	return nil
}

// flipCutoff bounds one try to connect. It is under a second, the first SYN
// retransmission (Linux's initial RTO), so a try that passes passed with the SYN it
// sent when it started, and a try that times out had its one SYN dropped, or answered
// later than the cutoff.
const flipCutoff = 900 * time.Millisecond

// flipEvery is how often a new try starts while flip waits for a change: the figures'
// resolution, since tries overlap.
const flipEvery = 50 * time.Millisecond

// flipDropWindow is how long every try must time out, from the first of them, before
// flip counts the connections as dropped: an allowed connection that answered later
// than the cutoff (under emulation they took up to 1.1 s) is a lost try, not a drop,
// and one allowed try in the window starts the window again.
const flipDropWindow = 2 * time.Second

// tryOutcome is what one connection try met.
type tryOutcome int

const (
	tryPassed   tryOutcome = iota
	tryTimedOut            // no answer within flipCutoff: a drop, or a slow answer
	tryRefused             // a reset: something answered, which a NetworkPolicy drop never does
	tryFailed              // any other error
)

// try is one connection try and its outcome.
type try struct {
	start   time.Time
	outcome tryOutcome
	err     error
}

// dialFunc connects to addr or fails; ctx carries the try's cutoff.
type dialFunc func(ctx context.Context, addr string) error

// dialTCP connects to addr over TCP and closes the connection.
func dialTCP(ctx context.Context, addr string) error {
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	return c.Close()
}

// classify tells a try's outcome from its error.
func classify(err error) tryOutcome {
	var ne net.Error
	switch {
	case err == nil:
		return tryPassed
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return tryTimedOut
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET):
		return tryRefused
	}
	return tryFailed
}

// flip measures, in the pod's one clock, how long a NetworkPolicy change takes to be
// enforced: n times, it deletes the policy ns/name and tries new TCP connections to
// addr until one passes, then creates the policy again and tries until they are
// dropped. A new try starts every flipEvery, each with its own cutoff (flipCutoff), so
// a slow try does not hold the next back. "Passing" is the start of the first try that
// passed: its one SYN was judged allowed, so the change was in force by then (an upper
// bound, within flipEvery and the SYN's way to the node). "Dropped" is the start of the
// first try of a run of tries that all timed out for flipDropWindow: a slow allowed
// try is not taken for a drop. A refusal (a reset) is an error: a NetworkPolicy drops,
// it does not refuse. The policy is left as it was.
func flip(ctx context.Context, api *apiClient, addr, ns, name string, n int) (string, error) {
	return flipWith(ctx, api, addr, ns, name, n, dialTCP)
}

func flipWith(ctx context.Context, api *apiClient, addr, ns, name string, n int, dial dialFunc) (string, error) {
	path := "/apis/networking.k8s.io/v1/namespaces/" + ns + "/networkpolicies"
	var policy map[string]any
	if err := api.do(ctx, http.MethodGet, path+"/"+name, nil, &policy); err != nil {
		return "", err
	}
	if meta, ok := policy["metadata"].(map[string]any); ok {
		for _, k := range []string{"resourceVersion", "uid", "creationTimestamp", "managedFields", "generation"} {
			delete(meta, k)
		}
	}
	tryOnce := func() try {
		tctx, cancel := context.WithTimeout(ctx, flipCutoff)
		defer cancel()
		t := try{start: time.Now()}
		t.err = dial(tctx, addr)
		t.outcome = classify(t.err)
		return t
	}
	// await starts a try every flipEvery until the tries show want, and returns how
	// long after t0 the deciding try started. It waits for its tries to end before it
	// returns, so that the next phase's tries are its own.
	await := func(want tryOutcome) (time.Duration, error) {
		t0 := time.Now()
		var mu sync.Mutex
		var tries []try // in start order
		var wg sync.WaitGroup
		defer wg.Wait()
		for tick := time.NewTicker(flipEvery); ; <-tick.C {
			if time.Since(t0) > 30*time.Second || ctx.Err() != nil {
				tick.Stop()
				return 0, fmt.Errorf("connections to %s: still %s 30 s after the change", addr, map[bool]string{true: "dropped", false: "passing"}[want == tryPassed])
			}
			mu.Lock()
			i := len(tries)
			tries = append(tries, try{start: time.Now(), outcome: -1})
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := tryOnce()
				mu.Lock()
				tries[i] = r
				mu.Unlock()
			}()
			mu.Lock()
			d, err, done := decide(tries, want, t0)
			mu.Unlock()
			if done {
				tick.Stop()
				return d, err
			}
		}
	}
	// The policy must hold when the measurement starts: its connections are dropped.
	if first := tryOnce(); first.outcome == tryPassed {
		return "", fmt.Errorf("a connection to %s passed while %s/%s stood: is it enforced?", addr, ns, name)
	}
	if d, err := await(tryTimedOut); err != nil || d > flipDropWindow {
		return "", fmt.Errorf("connections to %s while %s/%s stood: not dropped (%v): is it enforced?", addr, ns, name, err)
	}
	var out strings.Builder
	var opened, closed []time.Duration
	for i := range n {
		if err := api.do(ctx, http.MethodDelete, path+"/"+name, nil, nil); err != nil {
			return out.String(), err
		}
		d, err := await(tryPassed)
		if err != nil {
			api.do(ctx, http.MethodPost, path, policy, nil) // leave it as it was
			return out.String(), err
		}
		opened = append(opened, d)
		if err := api.do(ctx, http.MethodPost, path, policy, nil); err != nil {
			return out.String(), err
		}
		if d, err = await(tryTimedOut); err != nil {
			return out.String(), err
		}
		closed = append(closed, d)
		fmt.Fprintf(&out, "flip %d: deleted -> passing %s, created -> dropped %s\n", i+1, opened[i].Round(time.Millisecond), d.Round(time.Millisecond))
	}
	fmt.Fprintf(&out, "deleted -> passing: %s\ncreated -> dropped: %s\n", spread(opened), spread(closed))
	fmt.Fprintf(&out, "method: a try every %s, each cut off at %s (under the first SYN retransmission); dropped = every try timed out for %s\n",
		flipEvery, flipCutoff, flipDropWindow)
	return out.String(), nil
}

// decide reads the tries so far (in start order; outcome -1 while one runs). For
// tryPassed it is done at the first try that passed; for tryTimedOut, at the first
// try of a run of ended tries that all timed out and that spans flipDropWindow of
// starts. A refused or failed try ends the wait with an error.
func decide(tries []try, want tryOutcome, t0 time.Time) (time.Duration, error, bool) {
	runStart := -1
	for i, t := range tries {
		switch t.outcome {
		case -1:
			if want == tryTimedOut {
				return 0, nil, false // the run cannot be judged past a try still going
			}
		case tryRefused, tryFailed:
			return 0, fmt.Errorf("a connection try was refused or failed (%v): a NetworkPolicy drops, it does not refuse", t.err), true
		case tryPassed:
			if want == tryPassed {
				return t.start.Sub(t0), nil, true
			}
			runStart = -1
		case tryTimedOut:
			if want != tryTimedOut {
				continue
			}
			if runStart < 0 {
				runStart = i
			}
			if t.start.Sub(tries[runStart].start) >= flipDropWindow {
				return tries[runStart].start.Sub(t0), nil, true
			}
		}
	}
	return 0, nil, false
}

// spread is "median M max X (n=N)".
func spread(ds []time.Duration) string {
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s) == 0 {
		return "no samples"
	}
	return fmt.Sprintf("median %s max %s (n=%d)", s[len(s)/2].Round(time.Millisecond), s[len(s)-1].Round(time.Millisecond), len(s))
}
