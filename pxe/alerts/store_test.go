package alerts

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)

func firing(fp, name string, startsAt time.Time, kv ...string) Alert {
	a := Alert{Status: StatusFiring, Fingerprint: fp, StartsAt: startsAt, Labels: map[string]string{"alertname": name}}
	for i := 0; i+1 < len(kv); i += 2 {
		a.Labels[kv[i]] = kv[i+1]
	}
	return a
}

func note(as ...Alert) *Notification {
	return &Notification{Version: WebhookVersion, Status: StatusFiring, Receiver: "gpuboot", Alerts: as}
}

// TestApply: firing alerts are kept by fingerprint, resolved ones removed, ones whose
// endsAt passed removed or not taken, a repeat changes nothing.
func TestApply(t *testing.T) {
	active := map[string]Alert{}
	a, b := firing("a", "A", t0, "Hostname", "gpu-1"), firing("b", "B", t0.Add(time.Minute))
	c, changed := apply(active, note(a, b), t0, 10)
	if !changed || c.Firing != 2 || c.Active != 2 {
		t.Fatalf("two firing: %+v changed=%v", c, changed)
	}
	if _, changed := apply(active, note(a, b), t0, 10); changed {
		t.Error("the same notification again changed the alerts")
	}
	a2 := a
	a2.Annotations = map[string]string{"summary": "now worse"}
	if _, changed := apply(active, note(a2), t0, 10); !changed || active["a"].Annotations["summary"] != "now worse" {
		t.Error("a new summary for a kept alert did not replace it")
	}
	resolved := b
	resolved.Status, resolved.EndsAt = StatusResolved, t0
	if c, _ := apply(active, note(resolved), t0, 10); c.Resolved != 1 || active["b"].Fingerprint != "" {
		t.Errorf("resolved: %+v, kept %v", c, active)
	}
	old := firing("c", "C", t0.Add(-time.Hour))
	old.EndsAt = t0.Add(-time.Minute)
	if c, changed := apply(active, note(old), t0, 10); c.Expired != 1 || changed || len(active) != 1 {
		t.Errorf("an alert whose endsAt passed: %+v changed=%v, kept %v", c, changed, active)
	}
	a3 := a
	a3.EndsAt = t0
	if c, _ := apply(active, note(a3), t0, 10); c.Expired != 1 || len(active) != 0 {
		t.Errorf("a kept alert now ending: %+v, kept %v", c, active)
	}
}

// TestApplyLimit: past the limit the alerts that started first go, and are counted.
func TestApplyLimit(t *testing.T) {
	active := map[string]Alert{}
	var as []Alert
	for i := range 5 {
		as = append(as, firing(fmt.Sprint("f", i), "A", t0.Add(time.Duration(i)*time.Minute)))
	}
	c, _ := apply(active, note(as...), t0, 3)
	if c.Dropped != 2 || len(active) != 3 {
		t.Fatalf("5 alerts, limit 3: %+v", c)
	}
	for _, fp := range []string{"f2", "f3", "f4"} {
		if _, ok := active[fp]; !ok {
			t.Errorf("%s (among the newest) was dropped; kept %v", fp, active)
		}
	}
}

// TestTrim: a kept alert holds alertname, at most labelsMax labels, short values and
// only the annotations the report shows.
func TestTrim(t *testing.T) {
	a := firing("f", "A", t0)
	for i := range 100 {
		a.Labels[fmt.Sprintf("a%03d", i)] = strings.Repeat("v", 1000)
	}
	a.Labels[strings.Repeat("n", 100)] = "long name"
	a.Annotations = map[string]string{"summary": strings.Repeat("s", 5000), "description": "d", "other": "x"}
	got := trim(a)
	if got.Name() != "A" || len(got.Labels) != labelsMax || len(got.Labels["a000"]) > labelValueMax+len("…") {
		t.Errorf("labels: %d, alertname %q, a000 %d bytes", len(got.Labels), got.Name(), len(got.Labels["a000"]))
	}
	if _, ok := got.Annotations["other"]; ok || got.Annotations["description"] != "d" || len(got.Annotations["summary"]) > annotationMax+len("…") {
		t.Errorf("annotations: %v", got.Annotations)
	}
}

// TestStorePersists: the alerts survive a new Open of the same file, which is
// written whole (no temporary file left), mode 0600.
func TestStorePersists(t *testing.T) {
	path := filepath.Join(t.TempDir(), "alerts.json")
	s := Open(path, 0, nil)
	if _, err := s.Receive(note(firing("a", "A", t0, "Hostname", "gpu-1"), firing("b", "B", t0)), t0); err != nil {
		t.Fatal(err)
	}
	resolved := firing("b", "B", t0)
	resolved.Status = StatusResolved
	if _, err := s.Receive(note(resolved), t0); err != nil {
		t.Fatal(err)
	}
	again := Open(path, 0, nil)
	got := again.Active(t0)
	if len(got) != 1 || got[0].Fingerprint != "a" || got[0].Labels["Hostname"] != "gpu-1" || !got[0].StartsAt.Equal(t0) {
		t.Errorf("after a restart: %+v, want alert a only", got)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("state file: %v, %v", fi, err)
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Errorf("the state directory holds %d files, want alerts.json only", len(entries))
	}
}

// TestStoreCorruptFile: a file that does not parse is reported and ignored; the store
// works and the next notification replaces the file.
func TestStoreCorruptFile(t *testing.T) {
	for name, content := range map[string]string{
		"not JSON":      "{{{",
		"other version": `{"version":2,"alerts":[]}`,
		"bad alert":     `{"version":1,"alerts":[{"status":"firing","labels":{}}]}`,
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "alerts.json")
			if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
			var logged bytes.Buffer
			s := Open(path, 0, slog.New(slog.NewTextHandler(&logged, nil)))
			if !strings.Contains(logged.String(), "ignoring the kept alerts") || !strings.Contains(logged.String(), path) {
				t.Errorf("the log does not report the ignored file: %q", logged.String())
			}
			if s.Len() != 0 {
				t.Errorf("kept %d alerts from a corrupt file", s.Len())
			}
			if _, err := s.Receive(note(firing("a", "A", t0)), t0); err != nil {
				t.Fatal(err)
			}
			if got := Open(path, 0, nil).Active(t0); len(got) != 1 {
				t.Errorf("after a notification the file holds %v", got)
			}
		})
	}
}

// TestStoreLimitCounted: Dropped counts the alerts the limit removed; Active leaves
// out those whose endsAt passed since they arrived.
func TestStoreLimitCounted(t *testing.T) {
	s := Open(filepath.Join(t.TempDir(), "alerts.json"), 2, nil)
	ending := firing("c", "C", t0.Add(2*time.Minute))
	ending.EndsAt = t0.Add(time.Hour)
	if _, err := s.Receive(note(firing("a", "A", t0), firing("b", "B", t0.Add(time.Minute)), ending), t0); err != nil {
		t.Fatal(err)
	}
	if s.Dropped() != 1 || s.Len() != 2 {
		t.Errorf("dropped %d, kept %d; want 1 and 2", s.Dropped(), s.Len())
	}
	if got := s.Active(t0.Add(2 * time.Hour)); len(got) != 1 || got[0].Fingerprint != "b" {
		t.Errorf("two hours on: %+v, want b only (c's endsAt passed)", got)
	}
}

// TestStoreWriteFailureRetried: when the file cannot be written, Receive says so and
// the same notification again writes it once it can.
func TestStoreWriteFailureRetried(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	s := Open(filepath.Join(dir, "alerts.json"), 0, nil)
	n := note(firing("a", "A", t0))
	if _, err := s.Receive(n, t0); err == nil {
		t.Fatal("Receive wrote into a missing directory")
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Receive(n, t0); err != nil {
		t.Fatal(err)
	}
	if got := Open(filepath.Join(dir, "alerts.json"), 0, nil).Active(t0); len(got) != 1 {
		t.Errorf("the repeated notification did not write the file: %v", got)
	}
}

// TestStoreForgetsStale: an alert Alertmanager has not sent again for StaleAfter (its
// resolution missed, or a silence now holding it back) leaves Active, and the next
// notification forgets it; one sent again stays. After a restart the kept alerts
// count as seen when the file was read.
func TestStoreForgetsStale(t *testing.T) {
	path := filepath.Join(t.TempDir(), "alerts.json")
	s := open(path, 0, nil, t0)
	if _, err := s.Receive(note(firing("a", "A", t0), firing("b", "B", t0)), t0); err != nil {
		t.Fatal(err)
	}
	later := t0.Add(StaleAfter - time.Hour)
	if _, err := s.Receive(note(firing("b", "B", t0)), later); err != nil {
		t.Fatal(err)
	}
	past := t0.Add(StaleAfter + time.Minute)
	if got := s.Active(past); len(got) != 1 || got[0].Fingerprint != "b" {
		t.Errorf("past StaleAfter: %+v, want b only (a not sent again)", got)
	}
	c, err := s.Receive(note(), past)
	if err != nil || c.Stale != 1 || c.Active != 1 {
		t.Errorf("the next notification: %+v %v, want a forgotten", c, err)
	}
	restarted := open(path, 0, nil, past.Add(10*time.Hour))
	if got := restarted.Active(past.Add(10 * time.Hour)); len(got) != 1 {
		t.Errorf("after a restart: %+v, want b, seen when the file was read", got)
	}
}
