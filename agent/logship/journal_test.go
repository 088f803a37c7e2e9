package logship

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpurack/gpurack/agent/retry"
	"github.com/gpurack/gpurack/internal/testreq"
)

// journalRemote is systemd-journal-remote, which writes journal files from systemd's
// export format: the only Debian tool that makes a journal file without a running
// journald.
const journalRemote = "/lib/systemd/systemd-journal-remote"

// journalFile is a real journal file the test appends entries to.
type journalFile struct {
	t    testing.TB
	path string
	boot string
	mono int
}

func newJournalFile(t testing.TB) *journalFile {
	testreq.File(t, journalRemote, "apt-get install systemd-journal-remote (hack/deps.sh installs it)")
	testreq.Tool(t, "journalctl", "apt-get install systemd")
	boot := strings.ReplaceAll(BootID(), "-", "")
	if boot == "" {
		testreq.NotApplicable(t, "no /proc/sys/kernel/random/boot_id: journalctl --boot needs this boot's id")
	}
	return &journalFile{t: t, path: filepath.Join(t.TempDir(), "test.journal"), boot: boot}
}

// add appends entries (field maps) through systemd-journal-remote, in export format
// (https://systemd.io/JOURNAL_EXPORT_FORMATS/): every value in the binary-safe form.
func (j *journalFile) add(entries ...map[string]string) {
	var in bytes.Buffer
	for _, e := range entries {
		j.mono += 1000
		fmt.Fprintf(&in, "__REALTIME_TIMESTAMP=%d\n__MONOTONIC_TIMESTAMP=%d\n_BOOT_ID=%s\n", time.Now().UnixMicro(), j.mono, j.boot)
		for k, v := range e {
			in.WriteString(k + "\n")
			binary.Write(&in, binary.LittleEndian, uint64(len(v)))
			in.WriteString(v + "\n")
		}
		in.WriteString("\n")
	}
	cmd := exec.Command(journalRemote, "--output="+j.path, "-")
	cmd.Stdin = &in
	if out, err := cmd.CombinedOutput(); err != nil {
		j.t.Fatalf("systemd-journal-remote: %v: %s", err, out)
	}
}

// TestShipsJournalToVictoriaLogs runs the real journalctl on a real journal file and
// ships it into a real victoria-logs: units, priorities, messages journalctl leaves out
// as too long (read again, whole or cut at 64 KiB), a binary one; then an agent restart resumes after the saved
// cursor, and entries added while it runs are followed.
func TestShipsJournalToVictoriaLogs(t *testing.T) {
	jf := newJournalFile(t)
	vl := startVictoriaLogs(t)
	jf.add(map[string]string{"MESSAGE": "Started kubelet", "_SYSTEMD_UNIT": "kubelet.service", "SYSLOG_IDENTIFIER": "kubelet", "PRIORITY": "6"},
		map[string]string{"MESSAGE": "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus", "SYSLOG_IDENTIFIER": "kernel", "PRIORITY": "3"},
		map[string]string{"MESSAGE": strings.Repeat("z", 10000), "_SYSTEMD_UNIT": "chatty.service", "PRIORITY": "6"},
		map[string]string{"MESSAGE": "long \"quoted\" \u00e9 " + strings.Repeat("w", 100<<10), "_SYSTEMD_UNIT": "huge.service", "PRIORITY": "4"},
		map[string]string{"MESSAGE": "bad \xff\xfe utf8\nsecond line", "SYSLOG_IDENTIFIER": "bin"},
		map[string]string{"MESSAGE": "trace:\n" + strings.Repeat("\tat frame\n", 500), "_SYSTEMD_UNIT": "trace.service", "PRIORITY": "3"})
	m := &Metrics{}
	state := filepath.Join(t.TempDir(), "logship.json")
	cfg := Config{URL: vl.URL, Node: "gpu-r1-07", BootID: BootID(), Journalctl: "journalctl", JournalArgs: []string{"--file=" + jf.path},
		StateFile: state, FlushEvery: 100 * time.Millisecond, Metrics: m, Backoff: retry.Backoff{First: 100 * time.Millisecond, Max: time.Second}}
	stop := runShipper(t, cfg)
	vl.waitCount(t, "source:journal", 6)
	rows, err := vl.rows(`source:journal AND unit:"kubelet.service"`, 1)
	if err != nil || len(rows) != 1 || rows[0]["_msg"] != "Started kubelet" || rows[0]["identifier"] != "kubelet" || rows[0]["priority"] != "6" || rows[0]["node"] != "gpu-r1-07" || rows[0]["boot_id"] != BootID() {
		t.Errorf("kubelet's line: %v, %v", rows, err)
	}
	vl.waitCount(t, `source:journal AND unit:kernel AND priority:3 AND "fallen off the bus"`, 1)
	// journalctl leaves messages of 4096 bytes or more out of its JSON; the agent reads
	// them again, bounded: whole up to 64 KiB, cut beyond.
	rows, err = vl.rows(`source:journal AND unit:"chatty.service"`, 1)
	if err != nil || len(rows) != 1 || rows[0]["truncated"] != "" || rows[0]["_msg"] != strings.Repeat("z", 10000) {
		t.Errorf("the 10000-byte message: %d rows, %v; want it whole, not truncated", len(rows), err)
	}
	rows, err = vl.rows(`source:journal AND unit:"huge.service"`, 1)
	if want := ("long \"quoted\" \u00e9 " + strings.Repeat("w", 100<<10))[:DefaultMaxLine]; err != nil || len(rows) != 1 || rows[0]["truncated"] != "true" || rows[0]["_msg"] != want {
		t.Errorf("the 100 KiB message: %d rows, %v; want its first 64 KiB, truncated", len(rows), err)
	}
	// Long and multi-line: journalctl's export format gives it in its binary form.
	rows, err = vl.rows(`source:journal AND unit:"trace.service"`, 1)
	if want := "trace:\n" + strings.Repeat("\tat frame\n", 500); err != nil || len(rows) != 1 || rows[0]["truncated"] != "" || rows[0]["_msg"] != want {
		t.Errorf("the long multi-line message: %d rows, %v; want it whole, not truncated", len(rows), err)
	}
	rows, err = vl.rows(`source:journal AND unit:bin`, 1)
	if want := "bad \ufffd utf8\nsecond line"; err != nil || len(rows) != 1 || rows[0]["_msg"] != want {
		t.Errorf("the binary message: %v, %v; want %q", rows, err, want)
	}
	if m.Truncated("journal") != 1 || m.Shipped("journal") != 6 {
		t.Errorf("journal: %d shipped, %d truncated; want 6 and 1", m.Shipped("journal"), m.Truncated("journal"))
	}

	// Followed while running.
	jf.add(map[string]string{"MESSAGE": "while running", "SYSLOG_IDENTIFIER": "later"})
	vl.waitCount(t, `source:journal AND "while running"`, 1)
	stop()

	// An agent restart: the next run goes on after the saved cursor (nothing shipped
	// twice), and ships what came meanwhile.
	jf.add(map[string]string{"MESSAGE": "while stopped", "SYSLOG_IDENTIFIER": "later"})
	m2 := &Metrics{}
	cfg.Metrics = m2
	runShipper(t, cfg)
	vl.waitCount(t, `source:journal AND "while stopped"`, 1)
	waitFor(t, "the second run to ship", func() bool { return m2.Shipped("journal") >= 1 })
	time.Sleep(500 * time.Millisecond) // a line shipped twice would show by now
	if n := m2.Shipped("journal"); n != 1 {
		t.Errorf("the restarted shipper shipped %d journal lines, want 1 (only what came after the saved cursor)", n)
	}
	vl.waitCount(t, "source:journal", 8)
	if data, err := os.ReadFile(state); err != nil || !strings.Contains(string(data), `"journal_cursor":"s=`) {
		t.Errorf("state file: %s, %v; want a journal cursor", data, err)
	}
}
