// Package promtest is what the tests of the metrics server share (test/monitoring,
// test/graphs): a bounded wait, instant queries against a real Prometheus's HTTP API,
// and gpuagent built from the tree for the simulated nodes they scrape.
package promtest

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/gpurack/gpurack/test/rigimage"
)

// Client bounds every request the tests make to Prometheus and Alertmanager.
var Client = &http.Client{Timeout: 10 * time.Second}

// Eventually polls cond every 250 ms until it returns nil or d passes, and fails t with
// cond's last error.
func Eventually(t testing.TB, d time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s: %v", what, d, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// GetJSON GETs rawURL and decodes the body (at most 16 MiB) into v.
func GetJSON(rawURL string, v any) error {
	resp, err := Client.Get(rawURL)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: HTTP %d: %s", rawURL, resp.StatusCode, body)
	}
	return json.Unmarshal(body, v)
}

// Sample is one series of an instant query's answer.
type Sample struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

// Query runs the instant PromQL query q against Prometheus at base.
func Query(base, q string) ([]Sample, error) {
	var r struct {
		Data struct {
			Result []Sample `json:"result"`
		} `json:"data"`
	}
	if err := GetJSON(base+"/api/v1/query?query="+url.QueryEscape(q), &r); err != nil {
		return nil, err
	}
	return r.Data.Result, nil
}

// BuildAgent builds gpuagent from the tree into dir, as `make build` does (cgo on).
func BuildAgent(t testing.TB, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "gpuagent")
	cmd := exec.Command("go", "build", "-trimpath", "-o", bin, "./agent/cmd/gpuagent")
	cmd.Dir = rigimage.RepoRoot(t)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build gpuagent: %v\n%s", err, out)
	}
	return bin
}
