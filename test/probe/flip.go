package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
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

// flipTimeout bounds one try to connect: an allowed connection between pods of one
// node answers well within it, even under emulation, and a dropped SYN is not
// retransmitted within it.
const flipTimeout = 250 * time.Millisecond

// flip measures, in the pod's one clock, how long a NetworkPolicy change takes to be
// enforced: n times, it deletes the policy ns/name and tries new TCP connections to
// addr until one passes, then creates the policy again and tries until one is
// dropped. Each figure is from the apiserver's answer to the start of the first try
// that showed the change, so it is an upper bound, within one try's time (up to
// flipTimeout) of the truth. The policy is left as it was.
func flip(ctx context.Context, api *apiClient, addr, ns, name string, n int) (string, error) {
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
	connects := func() bool {
		c, err := net.DialTimeout("tcp", addr, flipTimeout)
		if err != nil {
			return false
		}
		c.Close()
		return true
	}
	await := func(want bool) (time.Duration, error) {
		t0 := time.Now()
		for {
			try := time.Now()
			if connects() == want {
				return try.Sub(t0), nil
			}
			if time.Since(t0) > 30*time.Second || ctx.Err() != nil {
				return 0, fmt.Errorf("connections to %s: still %s 30 s after the change", addr, map[bool]string{true: "dropped", false: "passing"}[want])
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	if connects() { // the policy must hold when the measurement starts
		return "", fmt.Errorf("a connection to %s passed while %s/%s stood: is it enforced?", addr, ns, name)
	}
	var out strings.Builder
	var opened, closed []time.Duration
	for i := range n {
		if err := api.do(ctx, http.MethodDelete, path+"/"+name, nil, nil); err != nil {
			return out.String(), err
		}
		d, err := await(true)
		if err != nil {
			api.do(ctx, http.MethodPost, path, policy, nil) // leave it as it was
			return out.String(), err
		}
		opened = append(opened, d)
		if err := api.do(ctx, http.MethodPost, path, policy, nil); err != nil {
			return out.String(), err
		}
		if d, err = await(false); err != nil {
			return out.String(), err
		}
		closed = append(closed, d)
		fmt.Fprintf(&out, "flip %d: deleted -> passing %s, created -> dropped %s\n", i+1, opened[i].Round(time.Millisecond), d.Round(time.Millisecond))
	}
	fmt.Fprintf(&out, "deleted -> passing: %s\ncreated -> dropped: %s\n", spread(opened), spread(closed))
	return out.String(), nil
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
