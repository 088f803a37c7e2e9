package logship

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpurack/gpurack/internal/testreq"
)

// victoriaLogs is a real victoria-logs on loopback, for the tests.
type victoriaLogs struct {
	URL string
}

// startVictoriaLogs runs victoria-logs (from PATH) with its data in a temporary folder
// until the test ends.
func startVictoriaLogs(t testing.TB) *victoriaLogs {
	t.Helper()
	bin := testreq.Tool(t, "victoria-logs", "make k8s-bins builds it into $GPURACK_CACHE/k8s/v1.34.2/bin (hack/k8s-bins.sh); put that folder on PATH")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	dir := t.TempDir()
	logf, err := os.Create(filepath.Join(dir, "victoria-logs.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-storageDataPath="+filepath.Join(dir, "data"), "-httpListenAddr="+addr, "-loggerLevel=WARN")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		logf.Close()
		if t.Failed() {
			out, _ := os.ReadFile(logf.Name())
			t.Logf("victoria-logs output:\n%s", out)
		}
	})
	v := &victoriaLogs{URL: "http://" + addr}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(v.URL + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return v
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("victoria-logs did not answer /health on %s within 30 s: %v", addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// query runs a LogsQL query and returns the rows (each a field map).
func (v *victoriaLogs) query(q string) ([]map[string]string, error) {
	resp, err := http.PostForm(v.URL+"/select/logsql/query", url.Values{"query": {q}})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("query %q: %s", q, resp.Status)
	}
	var rows []map[string]string
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 4<<20)
	for sc.Scan() {
		if len(strings.TrimSpace(sc.Text())) == 0 {
			continue
		}
		var r map[string]string
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return nil, fmt.Errorf("query %q: row %q: %w", q, sc.Text(), err)
		}
		rows = append(rows, r)
	}
	return rows, sc.Err()
}

// rows waits until q returns want rows and returns them (or the last answer after 30 s,
// for the caller to report). A plain query leaves out rows whose stream the store has
// not yet indexed, though `stats count()` already counts them (VictoriaMetrics pull
// 6127), so a count reached is no promise that the rows are readable yet.
func (v *victoriaLogs) rows(q string, want int) ([]map[string]string, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		rows, err := v.query(q)
		if (err == nil && len(rows) == want) || time.Now().After(deadline) {
			return rows, err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// count is how many lines match the LogsQL filter q.
func (v *victoriaLogs) count(q string) (int, error) {
	rows, err := v.query(q + " | stats count() n")
	if err != nil {
		return 0, err
	}
	if len(rows) == 0 {
		return 0, nil
	}
	return strconv.Atoi(rows[0]["n"])
}

// waitCount waits until q matches want lines (the store makes lines searchable about a
// second after it takes them), failing after 30 s with the last count.
func (v *victoriaLogs) waitCount(t testing.TB, q string, want int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		n, err := v.count(q)
		if err == nil && n == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("victoria-logs: %q matches %d lines (error %v), want %d", q, n, err, want)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
