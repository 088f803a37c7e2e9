package auditlog

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Lines as kube-apiserver v1.34 writes them (--audit-log-format=json, Metadata level),
// trimmed of fields this package does not read.
const (
	debugPodCreate = `{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"a1","stage":"ResponseComplete","requestURI":"/api/v1/namespaces/default/pods?fieldManager=kubectl-debug","verb":"create","user":{"username":"kubernetes-admin","groups":["kubeadm:cluster-admins","system:authenticated"]},"sourceIPs":["10.0.0.5"],"userAgent":"kubectl/v1.34.2","objectRef":{"resource":"pods","namespace":"default","name":"node-debugger-gpu-r1-07-x2k9p","apiVersion":"v1"},"responseStatus":{"metadata":{},"code":201},"requestReceivedTimestamp":"2026-12-03T10:00:01.000000Z","stageTimestamp":"2026-12-03T10:00:01.010000Z"}`
	attachStarted  = `{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"a2","stage":"ResponseStarted","requestURI":"/api/v1/namespaces/default/pods/node-debugger-gpu-r1-07-x2k9p/attach?container=debugger\u0026stdin=true\u0026stdout=true\u0026tty=true","verb":"create","user":{"username":"kubernetes-admin"},"sourceIPs":["10.0.0.5"],"objectRef":{"resource":"pods","namespace":"default","name":"node-debugger-gpu-r1-07-x2k9p","apiVersion":"v1","subresource":"attach"},"responseStatus":{"metadata":{},"code":101},"requestReceivedTimestamp":"2026-12-03T10:00:03.000000Z"}`
	attachComplete = `{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"a2","stage":"ResponseComplete","requestURI":"/api/v1/namespaces/default/pods/node-debugger-gpu-r1-07-x2k9p/attach?container=debugger","verb":"create","user":{"username":"kubernetes-admin"},"objectRef":{"resource":"pods","namespace":"default","name":"node-debugger-gpu-r1-07-x2k9p","subresource":"attach"},"responseStatus":{"metadata":{},"code":101},"requestReceivedTimestamp":"2026-12-03T10:00:03.000000Z"}`
	execLine       = `{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"a3","stage":"ResponseComplete","requestURI":"/api/v1/namespaces/speech/pods/train-0/exec?command=nvidia-smi\u0026command=-L\u0026container=main\u0026stdout=true","verb":"get","user":{"username":"lena"},"impersonatedUser":{"username":"bob"},"objectRef":{"resource":"pods","namespace":"speech","name":"train-0","subresource":"exec"},"responseStatus":{"metadata":{},"code":403},"requestReceivedTimestamp":"2026-12-03T09:00:00.000000Z"}`
	nodeProxy      = `{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"a4","stage":"ResponseComplete","requestURI":"/api/v1/nodes/gpu-r1-07/proxy/logs/","verb":"get","user":{"username":"kubernetes-admin"},"objectRef":{"resource":"nodes","name":"gpu-r1-07","subresource":"proxy"},"responseStatus":{"metadata":{},"code":200},"requestReceivedTimestamp":"2026-12-03T11:00:00.000000Z"}`
	ordinaryGet    = `{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"a5","stage":"ResponseComplete","requestURI":"/api/v1/namespaces/default/pods/node-debugger-gpu-r1-07-x2k9p","verb":"get","user":{"username":"kubernetes-admin"},"objectRef":{"resource":"pods","namespace":"default","name":"node-debugger-gpu-r1-07-x2k9p"},"responseStatus":{"code":200},"requestReceivedTimestamp":"2026-12-03T10:00:02.000000Z"}`
)

func TestReadMergesStagesAndKeepsOnlyBreakGlass(t *testing.T) {
	dir := t.TempDir()
	logs := filepath.Join(dir, "logs")
	os.MkdirAll(logs, 0o755)
	// A rotated backup (older) and the live file, with garbage, a text-format line and a
	// truncated last line among them.
	write(t, filepath.Join(logs, "audit-2026-12-03T09-30-00.000.log"), execLine+"\nnot json\n")
	write(t, filepath.Join(logs, "audit.log"), strings.Join([]string{debugPodCreate, ordinaryGet, attachStarted, attachComplete, nodeProxy,
		`2026-12-03T10:00:00Z AUDIT: id="x" stage="ResponseComplete"`, `{"kind":"Event","apiVersion":"audit.k8s.io/v1","auditID":"a9","verb":"cre`}, "\n"))
	got, st, err := Read(dir, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Files) != 2 || !strings.HasSuffix(st.Files[1], "audit.log") {
		t.Errorf("files %v, want the backup then audit.log", st.Files)
	}
	if st.Events != 6 || st.Skipped != 3 {
		t.Errorf("events %d skipped %d, want 6 and 3", st.Events, st.Skipped)
	}
	want := []Access{
		{Action: "exec", User: "lena as bob", Target: "speech/train-0", Command: "nvidia-smi -L", Code: 403},
		{Action: "debug-node-pod", User: "kubernetes-admin", Target: "default/node-debugger-gpu-r1-07-x2k9p", Code: 201, SourceIP: "10.0.0.5"},
		{Action: "attach", User: "kubernetes-admin", Target: "default/node-debugger-gpu-r1-07-x2k9p", Code: 101, SourceIP: "10.0.0.5"},
		{Action: "node-proxy", User: "kubernetes-admin", Target: "gpu-r1-07", Code: 200},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d accesses, want %d: %+v", len(got), len(want), got)
	}
	for i, w := range want {
		g := got[i]
		if g.Action != w.Action || g.User != w.User || g.Target != w.Target || g.Command != w.Command || g.Code != w.Code || g.SourceIP != w.SourceIP {
			t.Errorf("access %d = %+v, want %+v", i, g, w)
		}
	}
	late, _, _ := Read(dir, time.Date(2026, 12, 3, 10, 30, 0, 0, time.UTC))
	if len(late) != 1 || late[0].Action != "node-proxy" {
		t.Errorf("since 10:30: %+v, want the node proxy alone", late)
	}
}

func TestFilesSaysWhatIsMissing(t *testing.T) {
	_, err := Files(t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "logs/audit.log") {
		t.Errorf("no audit log: %v, want the path named", err)
	}
}

// TestLongLineIsBoundedAndCounted: a line over MaxLine is skipped and counted, and the
// next line still reads.
func TestLongLineIsBoundedAndCounted(t *testing.T) {
	in := `{"kind":"Event","x":"` + strings.Repeat("y", MaxLine) + `"}` + "\n" + nodeProxy + "\n"
	c := newCollector()
	var st Stats
	if err := scan(strings.NewReader(in), c, &st); err != nil {
		t.Fatal(err)
	}
	if st.Skipped != 1 || st.Events != 1 || len(c.order) != 1 {
		t.Errorf("skipped %d events %d accesses %d, want 1, 1, 1", st.Skipped, st.Events, len(c.order))
	}
}

func FuzzParseAndScan(f *testing.F) {
	for _, s := range []string{debugPodCreate, attachStarted, execLine, nodeProxy, "", "{}", `{"kind":"Event"}`, "\n\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		e, ok := ParseLine(b)
		if ok && e.AuditID == "" {
			t.Fatal("an event without an id was accepted")
		}
		c := newCollector()
		var st Stats
		if err := scan(bytes.NewReader(b), c, &st); err != nil {
			t.Fatal(err)
		}
		for _, a := range c.since(time.Time{}) {
			if a.Action == "" || a.AuditID == "" {
				t.Fatalf("access without an action or id: %+v", a)
			}
		}
	})
}

func write(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}
