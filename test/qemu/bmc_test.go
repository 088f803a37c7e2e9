//go:build linux

package qemu

import (
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/internal/netnstest"
	"github.com/gpurack/gpurack/pxe/bmc/redfishtest"
)

// startBMCs gives each machine with MachineSpec.BMC a Redfish BMC listening in the
// rack's namespace on gpuboot's address, and tells gpuboot: the rack manifest names
// each BMC (bmc column; approval stays as set says), and bmc-credentials.yaml in its
// state directory holds the account. The BMCs' certificates are self-signed, as
// BMCs' are, so the account is insecure: true.
func (r *Rack) startBMCs(t *testing.T, set *gpubootSettings) {
	t.Helper()
	r.bmcs = map[string]*redfishtest.Server{}
	r.powered = make(chan *RackMachine, 4)
	manifest := "serial,mac,bmc\n"
	for _, spec := range r.opts.Machines {
		if !spec.BMC {
			continue
		}
		var l net.Listener
		if err := netnstest.InNamespace(r.ns, func() (err error) {
			l, err = net.Listen("tcp", joinHost+":0")
			return err
		}); err != nil {
			t.Fatalf("the BMC of %s: listen in the rack's namespace: %v", spec.Node, err)
		}
		bmc := redfishtest.New(t, redfishtest.Config{Listener: l, OnReset: func(resetType string) { go r.bmcReset(t, spec, resetType) }})
		r.bmcs[spec.Node] = bmc
		manifest += fmt.Sprintf("%s,%s,%s\n", spec.Serial, spec.MAC, bmc.URL)
		t.Logf("%s's BMC: %s (Redfish, pxe/bmc/redfishtest; its resets stop and start the machine's QEMU)", spec.Node, bmc.URL)
	}
	if len(r.bmcs) == 0 {
		return
	}
	set.manifest = manifest
	set.stateFiles = map[string]string{"bmc-credentials.yaml": "default:\n  username: admin\n  password: redfishtest\n  insecure: true\n"}
}

// bmcReset carries out a Reset the machine's BMC accepted: ForceOff (or a graceful
// shutdown) stops its QEMU as pulling the plug does, On starts a new one (the machine
// boots what gpuboot's boot script gives it now), and a cycle or restart does both.
// Each machine powered on replaces the old one in Machines and goes to r.powered.
func (r *Rack) bmcReset(t *testing.T, spec MachineSpec, resetType string) {
	off, on := false, false
	switch resetType {
	case "ForceOff", "GracefulShutdown":
		off = true
	case "On", "PushPowerButton":
		on = true
	case "PowerCycle", "ForceRestart", "GracefulRestart":
		off, on = true, true
	default:
		t.Logf("%s's BMC: reset %s does nothing to the machine here", spec.Node, resetType)
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	i := -1
	for j, m := range r.Machines {
		if m.Node == spec.Node {
			i = j
		}
	}
	if off && i >= 0 {
		r.Machines[i].powerOff()
	}
	if !on {
		return
	}
	// It boots what gpuboot gives it now: a rollout may have pinned another image.
	if next := r.g.machine(t, spec.Node).GetNextImage().GetImageId(); next != "" {
		for name, id := range r.images.ids {
			if id == next {
				spec.Image = name
			}
		}
	}
	m := r.powerOn(t, spec)
	t.Cleanup(m.powerOff)
	if i >= 0 {
		r.Machines[i] = m
	} else {
		r.Machines = append(r.Machines, m)
	}
	t.Logf("%s powered on by its BMC (%s)", spec.Node, resetType)
	r.powered <- m
}

// writeFile writes content to path with perm, or fails the test.
func writeFile(t *testing.T, path, content string, perm os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), perm); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, perm); err != nil {
		t.Fatal(err)
	}
}

// bmcLines is the BMC lines of gpuboot's log, for a failure message.
func (r *Rack) bmcLines() string {
	var out []string
	for _, l := range strings.Split(r.g.log.String(), "\n") {
		if strings.Contains(l, "rollout") || strings.Contains(l, "power") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// rollOut rolls machine b to imageSimGPUNext with `gpuboot rollout start` and waits
// until the rollout is done: gpuboot pins b to the image, taints and drains its Node,
// power-cycles it through its BMC (which stops its QEMU and starts a new one that boots
// the pinned image), and waits until it is ready on the image. It returns the machine
// now running and the image id, and logs the time b was unavailable.
func rollOut(t *testing.T, r *Rack, b *RackMachine) (*RackMachine, string) {
	t.Helper()
	next := r.images.ids[imageSimGPUNext]
	if r.bmcs[b.Node] == nil || next == "" {
		t.Fatalf("%s has no BMC or the rack no image %s: TestRack's setup gives both", b.Node, imageSimGPUNext)
	}
	t.Logf("%s", r.g.cli(t, "rollout", "start", "--image", next, b.Node, "--node-timeout", "15m", "--reason", "TestRack: roll B to another image"))
	var b2 *RackMachine
	select {
	case b2 = <-r.powered:
	case <-time.After(5 * time.Minute):
		t.Fatalf("the rollout did not power %s on through its BMC within 5 min:\n%s\n%s", b.Node, r.g.cli(t, "rollout", "status"), r.bmcLines())
	}
	if b2.imageID != next {
		t.Errorf("%s's BMC powered it on into image %s, want the rollout's %s", b.Node, b2.imageID, next)
	}
	var ro bootv1.Rollout
	waitFor(t, r.ctx, 20*time.Minute, "the rollout of "+b.Node+" to be done", func() bool {
		out := r.g.cli(t, "rollout", "status", "-o", "json")
		if err := protojson.Unmarshal([]byte(out), &ro); err != nil {
			t.Fatalf("rollout status -o json: %v\n%s", err, out)
		}
		if ro.State == "stopped" {
			t.Fatalf("the rollout stopped: %s\n%s", ro.Reason, r.g.cli(t, "rollout", "status"))
		}
		return ro.State == "done"
	}, func() string { return r.g.cli(t, "rollout", "status") }, b2.con.tail)
	s := ro.Machines[0]
	t.Logf("rollout of %s to image %s through its Redfish BMC: unavailable %s (taint to ready), power cycle to ready %s",
		b.Node, next, s.ReadyAt.AsTime().Sub(s.StartedAt.AsTime()).Round(time.Second), s.ReadyAt.AsTime().Sub(s.CycledAt.AsTime()).Round(time.Second))
	show := r.g.cli(t, "machines", "show", b.Node)
	if !strings.Contains(show, "from rollout "+ro.Id) || !strings.Contains(show, "power cycle") || !strings.Contains(show, "image pinned") {
		t.Errorf("machines show %s lacks the rollout's pin, its next boot from the rollout or the power cycle:\n%s", b.Node, show)
	}
	return b2, next
}
