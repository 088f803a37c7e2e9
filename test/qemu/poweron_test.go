//go:build linux

package qemu

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
)

// The power-on milestones of a machine that boots through its firmware (TestRack's
// machine A, make demo-qemu's slot 1): DHCP, iPXE, the image, systemd, the agent, the
// approval, the Node, commissioning and the first pod, each seen in gpuboot's log,
// the serial console, gpuboot's machine history or the Kubernetes API.

// runFirstPod schedules a pod of the image's preloaded pause image (no registry is
// reachable) and waits for it to run on the node.
func runFirstPod(t *testing.T, ctx context.Context, cs kubernetes.Interface, ms *powerOnMilestones, nodeName string) {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "first-pod", Namespace: "default"},
		Spec: corev1.PodSpec{
			NodeSelector: map[string]string{corev1.LabelHostname: nodeName},
			Containers: []corev1.Container{{Name: "pause", Image: "registry.k8s.io/pause:3.10.1",
				ImagePullPolicy: corev1.PullNever}},
		},
	}
	if _, err := cs.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var got *corev1.Pod
	waitFor(t, ctx, nodeToReady, "pod first-pod Running on "+nodeName, func() bool {
		p, err := cs.CoreV1().Pods("default").Get(ctx, pod.Name, metav1.GetOptions{})
		got = p
		return err == nil && p.Status.Phase == corev1.PodRunning
	}, func() string {
		if got == nil {
			return "no pod"
		}
		return fmt.Sprintf("pod on %q: phase %s, conditions %v", got.Spec.NodeName, got.Status.Phase, got.Status.Conditions)
	})
	at := time.Now()
	for _, c := range got.Status.ContainerStatuses {
		if c.State.Running != nil {
			at = c.State.Running.StartedAt.Time
		}
	}
	ms.record(msPod, at, "Kubernetes API: container running")
}

// The milestones of a power-on, in their usual order (the table sorts them by time).
const (
	msDHCP          = "DHCP offer to iPXE"
	msScript        = "iPXE script for the machine"
	msKernel        = "kernel fetched"
	msInitrd        = "initrd fetched"
	msLease         = "initramfs DHCP lease"
	msRootfs        = "rootfs fetched"
	msVerified      = "rootfs verified"
	msSwitchRoot    = "systemd started"
	msRegistered    = "agent registered"
	msWaiting       = "waiting for approval on the console"
	msSystemd       = "systemd up (boot report)"
	msApproveCmd    = "approve command run"
	msApproved      = "approved"
	msBundle        = "JoinBundle released"
	msNode          = "Node registered"
	msCommissioning = "commissioning started"
	msReported      = "commissioning reported"
	msNodeReady     = "Node Ready"
	msMachineReady  = "machine ready"
	msPod           = "first pod Running"
)

var msOrder = []string{msDHCP, msScript, msKernel, msInitrd, msLease, msRootfs, msVerified, msSwitchRoot,
	msRegistered, msWaiting, msSystemd, msApproveCmd, msApproved, msBundle, msNode, msCommissioning,
	msReported, msNodeReady, msMachineReady, msPod}

// powerOnMilestones records when each milestone was first seen, relative to power-on
// (QEMU's start), and logs them.
type powerOnMilestones struct {
	t       *testing.T
	start   time.Time
	con     *serialConsole
	g       *namespacedGpuboot
	logPats []milestonePattern // matched against gpuboot's log lines
	conPats []milestonePattern // matched against the serial console

	mu   sync.Mutex
	seen map[string]milestoneSeen

	scanMu  sync.Mutex // one scan at a time
	logOff  int        // bytes of gpuboot's log scanned
	conSeen int        // console lines scanned
	stop    chan struct{}
	done    chan struct{}
}

type milestonePattern struct {
	name string
	re   *regexp.Regexp
}

type milestoneSeen struct {
	at   time.Time
	from string
}

// slogTime is the time= field of gpuboot's log lines (slog's text handler).
var slogTime = regexp.MustCompile(`^time=(\S+) `)

// watchPowerOn follows gpuboot's log and the console until the test ends, then logs the
// milestones and keeps the logs (GPURACK_E2E_LOGS).
func watchPowerOn(t *testing.T, con *serialConsole, g *namespacedGpuboot, imageID, machineMAC, ip string) *powerOnMilestones {
	mac := regexp.QuoteMeta(machineMAC)
	img := `msg="images: sent" image=` + imageID + ` file=`
	ms := &powerOnMilestones{t: t, start: con.start, con: con, g: g, seen: map[string]milestoneSeen{},
		stop: make(chan struct{}), done: make(chan struct{}),
		logPats: []milestonePattern{
			{msDHCP, regexp.MustCompile(`msg="dhcp: reply" type=OFFER mac=` + mac + ` client=ipxe `)},
			{msScript, regexp.MustCompile(`msg="boot.ipxe: boot" identity="?` + mac + `\|`)},
			{msKernel, regexp.MustCompile(img + `vmlinuz to=` + regexp.QuoteMeta(ip) + ` `)},
			{msInitrd, regexp.MustCompile(img + `initrd.img to=` + regexp.QuoteMeta(ip) + ` `)},
			{msRootfs, regexp.MustCompile(img + `rootfs.squashfs to=` + regexp.QuoteMeta(ip) + ` `)},
		},
		conPats: []milestonePattern{
			{msLease, regexp.MustCompile(`DHCP lease ` + regexp.QuoteMeta(ip) + `/24`)},
			{msVerified, regexp.MustCompile(`rootfs sha256 [0-9a-f]{64} verified`)},
			{msSwitchRoot, regexp.MustCompile(`switch_root: exec `)},
			{msWaiting, regexp.MustCompile(`gpuagent: waiting for approval`)},
			{msSystemd, regexp.MustCompile(`gpurack: booted image ` + imageID + ` .*gpuagent\.service=active`)},
		}}
	go func() {
		defer close(ms.done)
		for {
			select {
			case <-ms.stop:
				return
			case <-time.After(100 * time.Millisecond):
				ms.scan()
			}
		}
	}()
	logs := os.Getenv("GPURACK_E2E_LOGS")
	t.Cleanup(func() { // before QEMU and gpuboot stop: their logs so far
		close(ms.stop)
		<-ms.done
		ms.scan()
		table := ms.table()
		t.Logf("power-on milestones (0 = QEMU started at %s):\n%s", ms.start.UTC().Format("15:04:05.000"), table)
		if logs == "" {
			return
		}
		dir := filepath.Join(logs, t.Name())
		serial, err := os.ReadFile(con.logPath)
		if err == nil {
			err = os.MkdirAll(dir, 0o755)
		}
		for name, data := range map[string][]byte{"serial.log": serial, "gpuboot.log": []byte(g.log.String()), "milestones.txt": []byte(table)} {
			if err == nil {
				err = os.WriteFile(filepath.Join(dir, name), data, 0o644)
			}
		}
		if err != nil {
			t.Errorf("keep the logs in GPURACK_E2E_LOGS: %v", err)
			return
		}
		t.Logf("serial console, gpuboot log and milestones kept in %s", dir)
	})
	return ms
}

// scan matches the log and console lines that arrived since the last scan.
func (ms *powerOnMilestones) scan() {
	ms.scanMu.Lock()
	defer ms.scanMu.Unlock()
	now := time.Now()
	ms.con.mu.Lock()
	lines := slices.Clone(ms.con.lines[ms.conSeen:])
	ms.con.mu.Unlock()
	ms.conSeen += len(lines)
	newLog := ms.g.log.String()[ms.logOff:]
	newLog = newLog[:strings.LastIndexByte(newLog, '\n')+1] // whole lines only
	ms.logOff += len(newLog)

	for line := range strings.SplitSeq(newLog, "\n") {
		for _, p := range ms.logPats {
			if p.re.MatchString(line) {
				at := now
				if m := slogTime.FindStringSubmatch(line); m != nil {
					if t, err := time.Parse(time.RFC3339Nano, m[1]); err == nil {
						at = t
					}
				}
				ms.record(p.name, at, "gpuboot log")
			}
		}
	}
	for _, line := range lines {
		for _, p := range ms.conPats {
			if p.re.MatchString(line) {
				ms.record(p.name, now, "serial console")
			}
		}
	}
}

// history records the lifecycle transitions from gpuboot's machine record.
func (ms *powerOnMilestones) history(m *bootv1.Machine) {
	names := map[bootv1.MachineState]string{
		bootv1.MachineState_MACHINE_STATE_REGISTERED:    msRegistered,
		bootv1.MachineState_MACHINE_STATE_APPROVED:      msApproved,
		bootv1.MachineState_MACHINE_STATE_JOINING:       msBundle,
		bootv1.MachineState_MACHINE_STATE_COMMISSIONING: msCommissioning,
		bootv1.MachineState_MACHINE_STATE_READY:         msReported,
	}
	for _, tr := range m.GetHistory() {
		if name, ok := names[tr.GetTo()]; ok {
			ms.record(name, tr.GetTime().AsTime(), "gpuboot history: "+strings.ToLower(strings.TrimPrefix(tr.GetTo().String(), "MACHINE_STATE_")))
		}
	}
}

// mark records name as happening now.
func (ms *powerOnMilestones) mark(name, from string) { ms.record(name, time.Now(), from) }

// record keeps the first time name was seen and logs it.
func (ms *powerOnMilestones) record(name string, at time.Time, from string) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if _, ok := ms.seen[name]; ok {
		return
	}
	ms.seen[name] = milestoneSeen{at: at, from: from}
	ms.t.Logf("milestone %7.1fs %s (%s)", at.Sub(ms.start).Seconds(), name, from)
}

func (ms *powerOnMilestones) at(name string) (time.Duration, bool) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	s, ok := ms.seen[name]
	return s.at.Sub(ms.start), ok
}

// table lists the milestones seen in the order they happened, with the time since
// power-on, the time since the one before and where each was seen, then those not
// reached.
func (ms *powerOnMilestones) table() string {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	names := slices.Clone(msOrder)
	slices.SortStableFunc(names, func(a, b string) int {
		sa, oka := ms.seen[a]
		sb, okb := ms.seen[b]
		switch {
		case oka && okb:
			return sa.at.Compare(sb.at)
		case oka:
			return -1
		case okb:
			return 1
		}
		return 0
	})
	var b strings.Builder
	prev := ms.start
	for _, name := range names {
		s, ok := ms.seen[name]
		if !ok {
			fmt.Fprintf(&b, "  %8s  %7s  %-36s not reached\n", "-", "", name)
			continue
		}
		fmt.Fprintf(&b, "  %7.1fs  %+6.1fs  %-36s %s  %s\n", s.at.Sub(ms.start).Seconds(), s.at.Sub(prev).Seconds(), name,
			s.at.UTC().Format("15:04:05.000"), s.from)
		prev = s.at
	}
	return b.String()
}
