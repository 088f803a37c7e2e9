package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/gpurack/gpurack/agent/datadisk"
	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	machinev1 "github.com/gpurack/gpurack/api/machine/v1"
	"github.com/gpurack/gpurack/internal/pki"
)

// The data-disk service (docs/storage.md) looks at the machine's whole disks once the
// machine is approved and kubelet has joined: the disks the profile's storage.dataDisks
// rules select are prepared (agent/datadisk: a GPT partition of gpurack's type carrying
// the cluster's fingerprint, XFS with project quotas, mounted) or refused when they hold
// anything gpurack did not make. What it found goes into every heartbeat (gpuboot keeps
// it for GetMachine and the rack report), the agent's Status, the log, the console and
// Events on the Node. It carries out the data-disk wipes an operator asked gpuboot for,
// which arrive in heartbeat answers, and looks again after each, and every few minutes
// for a disk that appeared.

// diskLookEvery is how often the service looks at the disks again on its own (a disk
// hot-plugged, or one that failed to mount); diskRetryEvery when a disk failed.
const (
	diskLookEvery  = 5 * time.Minute
	diskRetryEvery = time.Minute
)

// diskReport is what the data-disk service shares with the heartbeats: the latest look,
// and the wipe requests and results that travel between gpuboot's answers and the
// service. It exists from the agent's start (heartbeats begin before the join); the
// service fills it.
type diskReport struct {
	mu     sync.Mutex
	latest *machinev1.DataDisks
	// result is the outcome of the latest wipe; it goes in every heartbeat until an
	// answer no longer carries that request (gpuboot recorded it).
	result *machinev1.DataDiskWipeResult
	// taken is the id of the latest request handed to the service, so that a request
	// repeated in later answers is carried out once.
	taken string
	wipes chan *machinev1.DataDiskWipe
}

func newDiskReport() *diskReport {
	return &diskReport{wipes: make(chan *machinev1.DataDiskWipe, 1)}
}

// snapshot is the latest look, for a heartbeat or Status; nil before the first.
func (r *diskReport) snapshot() *machinev1.DataDisks {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.latest == nil {
		return nil
	}
	return proto.CloneOf(r.latest)
}

// wipeResult is the result the next heartbeat carries; nil when none is owed.
func (r *diskReport) wipeResult() *machinev1.DataDiskWipeResult {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.result == nil {
		return nil
	}
	return proto.CloneOf(r.result)
}

// answer takes a heartbeat answer's wipe request (nil when none): a new request goes to
// the service once; a result is no longer owed once the answer drops its request.
func (r *diskReport) answer(w *machinev1.DataDiskWipe) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.result != nil && (w == nil || w.GetId() != r.result.GetId()) {
		r.result = nil
	}
	if w == nil || w.GetId() == "" || w.GetId() == r.taken {
		return
	}
	select {
	case r.wipes <- proto.CloneOf(w):
		r.taken = w.GetId()
	default: // the service has one to do already; the next answer brings this again
	}
}

func (r *diskReport) set(d *machinev1.DataDisks) {
	r.mu.Lock()
	r.latest = d
	r.mu.Unlock()
}

func (r *diskReport) setResult(res *machinev1.DataDiskWipeResult) {
	r.mu.Lock()
	r.result = res
	r.mu.Unlock()
}

// dataDiskService is the post-join service over a diskReport.
type dataDiskService struct {
	statusCell
	report   *diskReport
	sel      datadisk.Selector
	prep     datadisk.Preparer
	discover datadisk.DiscoverOptions
	log      *slog.Logger
	console  string
	// event records an Event on the Node (reason, message, warning or not); nil: none.
	event func(ctx context.Context, reason, msg string, warning bool)
	// seen is each disk's last state and detail, so that a change is said once.
	seen map[string]string
}

func (s *dataDiskService) Name() string { return "data-disks" }

// attempt looks at the disks, then again after each wipe and every diskLookEvery
// (diskRetryEvery while a disk failed), until ctx ends. An error (sysfs unreadable) ends
// the attempt; the supervisor restarts it.
func (s *dataDiskService) attempt(ctx context.Context, _ gated) error {
	for {
		failed, err := s.look(ctx)
		if err != nil {
			return err
		}
		wait := diskLookEvery
		if failed {
			wait = diskRetryEvery
		}
		select {
		case <-ctx.Done():
			return nil
		case w := <-s.report.wipes:
			s.report.setResult(s.wipe(ctx, w))
		case <-time.After(wait):
		}
	}
}

// look discovers the disks, prepares the selected ones (datadisk.Preparer.Ensure writes
// only to an empty disk or this cluster's own) and publishes what it found. failed is
// true when a selected disk could not be prepared or mounted.
func (s *dataDiskService) look(ctx context.Context) (failed bool, err error) {
	disks, err := datadisk.Discover(s.discover) // sorted by name, so by path as DataDisks wants
	if err != nil {
		return false, fmt.Errorf("list the disks: %w", err)
	}
	out := &machinev1.DataDisks{CheckedAt: timestamppb.Now(), ClusterFingerprint: s.prep.Cluster.Fingerprint()}
	var ready, refused, failing int
	for _, d := range disks {
		dd := diskProto(d)
		if s.sel.Selects(d.Candidate()) {
			s.ensure(ctx, d, dd)
		} else {
			dd.State = machinev1.DataDiskState_DATA_DISK_STATE_NOT_SELECTED
		}
		switch dd.GetState() {
		case machinev1.DataDiskState_DATA_DISK_STATE_READY:
			ready++
		case machinev1.DataDiskState_DATA_DISK_STATE_REFUSED:
			refused++
		case machinev1.DataDiskState_DATA_DISK_STATE_FAILED:
			failing++
		}
		s.say(ctx, dd)
		out.Disks = append(out.Disks, dd)
	}
	s.report.set(out)
	msg := fmt.Sprintf("%d data disks ready, %d refused, %d failed, %d other disks", ready, refused, failing, len(disks)-ready-refused-failing)
	if failing > 0 {
		s.set(Failed, msg)
	} else {
		s.set(Running, msg)
	}
	return failing > 0, nil
}

// ensure prepares one selected disk and fills dd's state.
func (s *dataDiskService) ensure(ctx context.Context, d datadisk.Disk, dd *machinev1.DataDisk) {
	res, err := s.prep.Ensure(ctx, d)
	var refused *datadisk.RefusedError
	switch {
	case errors.As(err, &refused):
		dd.State, dd.Detail = machinev1.DataDiskState_DATA_DISK_STATE_REFUSED, refused.Verdict.Reason()
	case err != nil:
		dd.State, dd.Detail = machinev1.DataDiskState_DATA_DISK_STATE_FAILED, err.Error()
	default:
		dd.State = machinev1.DataDiskState_DATA_DISK_STATE_READY
		dd.MountPoint, dd.PartitionGuid = res.MountPoint, strings.ToLower(res.PartitionGUID)
		dd.PreparedNow = res.Partitioned || res.Formatted
	}
}

// say logs, prints on the console and records an Event for a disk whose state or
// detail changed since the last look.
func (s *dataDiskService) say(ctx context.Context, dd *machinev1.DataDisk) {
	key := dd.GetState().String() + "\x00" + dd.GetDetail() + "\x00" + dd.GetMountPoint()
	if s.seen[dd.GetPath()] == key {
		return
	}
	s.seen[dd.GetPath()] = key
	disk := dd.GetPath()
	if dd.GetSerial() != "" {
		disk += " (serial " + dd.GetSerial() + ")"
	}
	var reason, msg string
	warning := true
	switch dd.GetState() {
	case machinev1.DataDiskState_DATA_DISK_STATE_READY:
		reason, msg, warning = "DataDiskReady", fmt.Sprintf("data disk %s mounted at %s", disk, dd.GetMountPoint()), false
		if dd.GetPreparedNow() {
			msg = fmt.Sprintf("data disk %s prepared (GPT, XFS with project quotas) and mounted at %s", disk, dd.GetMountPoint())
		}
		s.log.Info(msg)
	case machinev1.DataDiskState_DATA_DISK_STATE_REFUSED:
		reason = "DataDiskRefused"
		msg = fmt.Sprintf("data disk %s refused: it holds %s; nothing was written (an operator can wipe it: gpuboot machines wipe-disk)", disk, dd.GetDetail())
		s.log.Warn(msg)
	case machinev1.DataDiskState_DATA_DISK_STATE_FAILED:
		reason, msg = "DataDiskFailed", fmt.Sprintf("data disk %s: %s", disk, dd.GetDetail())
		s.log.Warn(msg)
	default:
		s.log.Info("disk not selected as a data disk by the profile's storage.dataDisks rules", "disk", disk, "model", dd.GetModel(), "transport", dd.GetTransport(), "size", dd.GetSizeBytes())
		return
	}
	consoleLine(s.console, "gpuagent: "+msg)
	if s.event != nil {
		s.event(ctx, reason, msg, warning)
	}
}

// wipe carries out an operator's wipe request: only on a disk the profile's rules
// select, only when the serial matches (datadisk.Wipe checks it against sysfs again).
// It returns the result gpuboot records.
func (s *dataDiskService) wipe(ctx context.Context, w *machinev1.DataDiskWipe) *machinev1.DataDiskWipeResult {
	res := &machinev1.DataDiskWipeResult{Id: w.GetId()}
	err := s.wipeDisk(ctx, w)
	if err != nil {
		res.Error = err.Error()
		s.log.Warn("data-disk wipe refused", "disk", w.GetPath(), "request", w.GetId(), "error", err)
		consoleLine(s.console, "gpuagent: data-disk wipe of "+w.GetPath()+" refused: "+err.Error())
		if s.event != nil {
			s.event(ctx, "DataDiskWipeRefused", fmt.Sprintf("wipe of %s (request %s) refused: %v", w.GetPath(), w.GetId(), err), true)
		}
		return res
	}
	res.Wiped = true
	msg := fmt.Sprintf("data disk %s (serial %s) wiped on an operator's request %s: its first and last 2 MiB zeroed", w.GetPath(), w.GetSerial(), w.GetId())
	s.log.Warn(msg)
	consoleLine(s.console, "gpuagent: "+msg)
	if s.event != nil {
		s.event(ctx, "DataDiskWiped", msg, true)
	}
	return res
}

func (s *dataDiskService) wipeDisk(ctx context.Context, w *machinev1.DataDiskWipe) error {
	disks, err := datadisk.Discover(s.discover)
	if err != nil {
		return fmt.Errorf("list the disks: %w", err)
	}
	for _, d := range disks {
		if d.Path != w.GetPath() {
			continue
		}
		if !s.sel.Selects(d.Candidate()) {
			return fmt.Errorf("%s is not a data disk by the profile's storage.dataDisks rules; gpurack wipes only disks it would use", d)
		}
		ev, err := datadisk.Inspect(ctx, d)
		if err != nil {
			return err
		}
		if v := datadisk.Decide(ev, s.prep.Cluster); !v.Refused() {
			return fmt.Errorf("%s is not refused (it reads as %v); gpurack wipes only a disk it refused", d, v)
		}
		return datadisk.Wipe(d, w.GetSerial())
	}
	return fmt.Errorf("no disk %s on this machine", w.GetPath())
}

// diskProto is d's description, without a state.
func diskProto(d datadisk.Disk) *machinev1.DataDisk {
	return &machinev1.DataDisk{Path: d.Path, Serial: d.Serial, Model: d.Model, Transport: string(d.Transport),
		SizeBytes: uint64(max(d.Size, 0)), LogicalBlockSize: uint32(max(d.LogicalBlockSize, 0))}
}

// dataDisks is the data-disk service of a node that joined with bundle: its rules
// (dataDiskSelector; a rule the agent cannot parse makes a failed service that says so),
// the cluster carried on
// the disks (the gpurack CA's SPKI pin, the same as gpurack.enroll.ca, so re-imaging
// to any image of this gpuboot keeps the disks) and Events on the Node.
func (n *node) dataDisks(bundle *bootv1.JoinBundle, kubeconfig string) (attempter, error) {
	sel, err := dataDiskSelector(n.cfg.Profile.Storage.DataDisks, bundle.GetDataDisks())
	if err != nil {
		return nil, err
	}
	ca, err := pki.DecodeCertPEM([]byte(bundle.GetGpurackCaPem()))
	if err != nil {
		return nil, fmt.Errorf("the JoinBundle's gpurack CA, the cluster the data disks belong to: %w", err)
	}
	log := n.log.With("service", "data-disks")
	return &dataDiskService{report: n.disks, sel: sel, prep: datadisk.Preparer{Cluster: datadisk.ClusterID(pki.SPKIPin(ca)), Mount: datadisk.SystemdMount},
		log: log, console: n.cfg.Console, seen: map[string]string{},
		event: nodeEvents(kubeconfig, bundle.GetNodeName(), log)}, nil
}

// nodeEvents returns what records an Event on Node name with kubelet's node
// credentials (the Node authorizer lets a node create Events), as kubelet does: in the
// default namespace, the Node's name as its uid, so `kubectl describe node` shows it.
// The client is made on the first Event (kubelet writes its kubeconfig after the
// service is declared) and kept. A failure is logged, never fatal: the heartbeat and
// the log say the same.
func nodeEvents(kubeconfig, name string, log *slog.Logger) func(ctx context.Context, reason, msg string, warning bool) {
	var (
		mu     sync.Mutex
		client kubernetes.Interface
	)
	connect := func() (kubernetes.Interface, error) {
		mu.Lock()
		defer mu.Unlock()
		if client != nil {
			return client, nil
		}
		cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, err
		}
		if client, err = kubernetes.NewForConfig(cfg); err != nil {
			client = nil
		}
		return client, err
	}
	return func(ctx context.Context, reason, msg string, warning bool) {
		c, err := connect()
		if err != nil {
			log.Warn("no Event recorded", "reason", reason, "error", err)
			return
		}
		typ := corev1.EventTypeNormal
		if warning {
			typ = corev1.EventTypeWarning
		}
		now := metav1.Now()
		ev := &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{GenerateName: name + ".", Namespace: metav1.NamespaceDefault},
			InvolvedObject: corev1.ObjectReference{APIVersion: "v1", Kind: "Node", Name: name, UID: types.UID(name)},
			Reason:         reason, Message: msg, Type: typ, Count: 1, FirstTimestamp: now, LastTimestamp: now,
			Source: corev1.EventSource{Component: "gpuagent", Host: name},
		}
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if _, err := c.CoreV1().Events(metav1.NamespaceDefault).Create(cctx, ev, metav1.CreateOptions{}); err != nil {
			log.Warn("no Event recorded", "reason", reason, "error", err)
		}
	}
}

// dataDiskSelector is the rules the agent goes by: the JoinBundle's, from the gpuboot
// selector that matches the machine, when it carries any; else the profile's. Both were
// validated where they were written (gpuimage, gpuboot's configuration), with the same
// parser.
func dataDiskSelector(profile []datadisk.RuleSpec, fromGpuboot *bootv1.DataDiskRules) (datadisk.Selector, error) {
	specs, field, from := profile, "storage.dataDisks", "the profile's data-disk rules"
	if fromGpuboot != nil {
		specs, field, from = nil, "dataDisks", "the JoinBundle's data-disk rules (gpuboot's selector)"
		for _, r := range fromGpuboot.GetRules() {
			specs = append(specs, datadisk.RuleSpec{Path: r.GetPath(), Model: r.GetModel(), MinSize: r.GetMinSize(), MaxSize: r.GetMaxSize(), Transport: r.GetTransport()})
		}
	}
	sel, err := datadisk.ParseSelector(field, specs)
	if err != nil {
		return sel, fmt.Errorf("%s: %w", from, err)
	}
	return sel, nil
}
