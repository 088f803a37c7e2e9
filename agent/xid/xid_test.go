package xid

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpurack/gpurack/agent/gpu/sim"
	"github.com/gpurack/gpurack/internal/testreq"
)

func TestClassification(t *testing.T) {
	want := map[uint32]Class{
		13: Application, 31: Application, 43: Application, 45: Application, 68: Application,
		48: ResetGPU, 74: ResetGPU, 95: ResetGPU, 119: ResetGPU, 120: ResetGPU, 140: ResetGPU,
		79: Reboot, 64: Fatal, 63: Recoverable, 92: Recoverable, 94: Recoverable, 109: Recoverable,
	}
	for code, c := range want {
		i, known := Classify(code)
		if !known || i.Class != c || i.Why == "" || i.Name == "" {
			t.Errorf("XID %d = %+v (known %v), want class %s with a source", code, i, known, c)
		}
	}
	if i, known := Classify(999); known || i.Class != Recoverable {
		t.Errorf("unknown XID 999 = %+v", i)
	}
	for _, i := range Table() {
		if fatal := i.Class.Counts(); fatal != (i.Class == ResetGPU || i.Class == Reboot || i.Class == Fatal) {
			t.Errorf("XID %d class %s counts %v", i.Code, i.Class, fatal)
		}
	}
	// Every XID DCGM always fails on counts as fatal here.
	for _, code := range []uint32{48, 74, 79, 95, 119, 120, 140} {
		if i, _ := Classify(code); !i.Class.Counts() {
			t.Errorf("XID %d (DCGM FAIL) does not count as fatal", code)
		}
	}
}

func TestParseKmsg(t *testing.T) {
	cases := []struct {
		line string
		ok   bool
		want Record
	}{
		{"3,1234,5678901,-;NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.", true,
			Record{PCIBusID: "00000000:3B:00.0", Code: 79, Message: "GPU has fallen off the bus.", Seq: 1234, SinceBoot: 5678901 * time.Microsecond}},
		{"4,99,100,-;NVRM: Xid (PCI:0000:18:00): 13, pid=12345, name=python, Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0)\n SUBSYSTEM=pci", true,
			Record{PCIBusID: "00000000:18:00.0", Code: 13, PID: 12345, Process: "python", Message: "Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0)", Seq: 99, SinceBoot: 100 * time.Microsecond}},
		{"NVRM: Xid (0000:01:00): 31, Ch 00000008, intr 10000000. MMU Fault", true,
			Record{PCIBusID: "00000000:01:00.0", Code: 31, Message: "Ch 00000008, intr 10000000. MMU Fault"}},
		{"[ 1234.5] NVRM: Xid (PCI:0001:db:00): 48, pid=9, name=x, An uncorrectable double bit error", true,
			Record{PCIBusID: "00000001:DB:00.0", Code: 48, PID: 9, Process: "x", Message: "An uncorrectable double bit error"}},
		{"6,1,1,-;usb 1-1: new high-speed USB device", false, Record{}},
		{"NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.261.03", false, Record{}},
	}
	for _, c := range cases {
		got, ok, err := ParseKmsg(c.line)
		if err != nil || ok != c.ok || got != c.want {
			t.Errorf("ParseKmsg(%q)\n = %+v, %v, %v\nwant %+v, %v", c.line, got, ok, err, c.want, c.ok)
		}
	}
	for _, bad := range []string{
		"NVRM: Xid (PCI:0000:3b:00) 79, no colon",
		"NVRM: Xid (PCI:zz:3b:00): 79, x",
		"NVRM: Xid (PCI:0000:3b:00): seventy-nine, x",
		"NVRM: Xid (PCI:0000:3b:00): 0, x",
	} {
		if _, ok, err := ParseKmsg(bad); !ok || err == nil || !strings.Contains(err.Error(), "kmsg Xid line") {
			t.Errorf("ParseKmsg(%q): ok %v err %v; want an error naming the line", bad, ok, err)
		}
	}
}

func TestNormalizeBusID(t *testing.T) {
	for in, want := range map[string]string{
		"0000:3b:00":       "00000000:3B:00.0",
		"00000000:3B:00.0": "00000000:3B:00.0",
		"3b:00.1":          "00000000:3B:00.1",
	} {
		if got, err := NormalizeBusID(in); err != nil || got != want {
			t.Errorf("NormalizeBusID(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "3b", "0000:3b:20", "0000:3b:00.8", "0000:100:00"} {
		if _, err := NormalizeBusID(bad); err == nil {
			t.Errorf("NormalizeBusID(%q) accepted", bad)
		}
	}
}

// FuzzParseKmsg: the kernel log is untrusted text. The parser must not panic, must
// refuse non-Xid lines silently, and must produce a well-formed record or an error.
func FuzzParseKmsg(f *testing.F) {
	f.Add("3,1234,5678901,-;NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.")
	f.Add("NVRM: Xid (0000:01:00): 31, Ch 00000008")
	f.Add("6,1,1,-;hello")
	f.Fuzz(func(t *testing.T, line string) {
		rec, ok, err := ParseKmsg(line)
		if !ok && (err != nil || rec != (Record{})) {
			t.Fatalf("not an Xid line but rec %+v err %v", rec, err)
		}
		if ok && err == nil {
			if rec.Code == 0 || len(rec.PCIBusID) != 16 {
				t.Fatalf("bad record %+v", rec)
			}
			if again, err := NormalizeBusID(rec.PCIBusID); err != nil || again != rec.PCIBusID {
				t.Fatalf("bus id %q not canonical", rec.PCIBusID)
			}
		}
	})
}

func TestTracker(t *testing.T) {
	tr := NewTracker()
	t0 := time.Unix(10000, 0)
	if !tr.Add(Event{GPU: 3, Code: 79, At: t0, Source: "nvml"}, 0) {
		t.Fatal("first event not added")
	}
	if tr.Add(Event{GPU: 3, Code: 79, At: t0.Add(time.Second), Source: "kmsg"}, 42) {
		t.Error("same XID from kmsg 1 s later counted twice")
	}
	if tr.Add(Event{GPU: 3, Code: 79, At: t0.Add(2 * time.Second), Source: "nvml-lost"}, 0) {
		t.Error("lost GPU counted as a second XID 79")
	}
	if !tr.Add(Event{GPU: 1, Code: 63, At: t0, Source: "kmsg"}, 43) || tr.Add(Event{GPU: 1, Code: 63, At: t0, Source: "kmsg"}, 43) {
		t.Error("kmsg sequence dedup")
	}
	tr.Add(Event{GPU: 2, Code: 13, At: t0, Source: "kmsg"}, 44)
	ev := tr.Events(t0.Add(time.Minute), time.Hour)
	if len(ev) != 3 || ev[0].Class != Reboot {
		t.Fatalf("events %+v", ev)
	}
	// Three hours later the recoverable and application XIDs left the window; the
	// fatal one stays until the GPU is reset.
	ev = tr.Events(t0.Add(3*time.Hour), 2*time.Hour)
	if len(ev) != 1 || ev[0].Code != 79 {
		t.Fatalf("after window: %+v", ev)
	}
	tr.Reset(3, t0.Add(3*time.Hour))
	if ev := tr.Events(t0.Add(3*time.Hour), 2*time.Hour); len(ev) != 0 {
		t.Fatalf("after reset: %+v", ev)
	}
	if !tr.Add(Event{GPU: 3, Code: 79, At: t0.Add(4 * time.Hour), Source: "nvml-lost"}, 0) {
		t.Error("GPU lost again after its reset not counted")
	}
	if c := tr.Counts(); c[CodeOnGPU{3, 79}] != 2 {
		t.Errorf("counts %v", c)
	}
}

func TestWatchKmsg(t *testing.T) {
	r, w := io.Pipe()
	var mu sync.Mutex
	var got []Record
	done := make(chan error, 1)
	go func() {
		done <- WatchKmsg(r, slog.New(slog.DiscardHandler), func(rec Record) {
			mu.Lock()
			got = append(got, rec)
			mu.Unlock()
		})
	}()
	// Records split across writes, a malformed Xid line and noise.
	io.WriteString(w, "6,1,10,-;eth0: link up\n3,2,20,-;NVRM: Xid (PCI:0000:3b")
	io.WriteString(w, ":00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n")
	io.WriteString(w, "3,3,30,-;NVRM: Xid (PCI:0000:3b:00): bogus\n3,4,40,-;NVRM: Xid (PCI:0000:18:00): 48, pid=1, name=a, DBE\n")
	w.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Code != 79 || got[0].Seq != 2 || got[1].Code != 48 {
		t.Fatalf("records %+v", got)
	}
}

// TestOpenKmsg reads the real kernel log for a moment, as the agent does, without
// writing to it.
func TestOpenKmsg(t *testing.T) {
	f, err := OpenKmsg(KmsgPath)
	if err != nil {
		testreq.Missing(t, fmt.Sprintf("cannot read %s here (%v)", KmsgPath, err), "run the tests as root, as the agent runs")
	}
	done := make(chan error, 1)
	go func() { done <- WatchKmsg(f, slog.New(slog.DiscardHandler), func(Record) {}) }()
	time.Sleep(100 * time.Millisecond)
	f.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not stop the kernel log reader")
	}
	if bt := BootTime(); bt.IsZero() || time.Since(bt) <= 0 {
		t.Errorf("boot time %v", bt)
	}
}

func TestWatchNVMLOnSimulator(t *testing.T) {
	s, err := sim.New("dgxh100", sim.Options{})
	if err != nil {
		t.Fatal(err)
	}
	lib, _ := s.Library()
	ctx, cancel := context.WithCancel(context.Background())
	events := make(chan NVMLEvent, 8)
	done := make(chan error, 1)
	go func() { done <- WatchNVML(ctx, lib, slog.New(slog.DiscardHandler), func(e NVMLEvent) { events <- e }) }()
	f, _ := sim.ParseFault("xid:79@gpu3")
	// The watcher registers asynchronously; inject until an event arrives.
	var ev NVMLEvent
	deadline := time.After(10 * time.Second)
wait:
	for {
		s.Inject(f, 0)
		select {
		case ev = <-events:
			break wait
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			t.Fatal("no event")
		}
	}
	if ev.GPU != 3 || ev.Type != nvml.EventTypeXidCriticalError || ev.Data != 79 || ev.PCIBusID == "" {
		t.Errorf("event %+v", ev)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("watch did not stop")
	}
}

func TestMain(m *testing.M) { os.Exit(m.Run()) }
