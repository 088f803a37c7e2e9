package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	"github.com/gpurack/gpurack/pxe/bmc"
)

func TestPrintPower(t *testing.T) {
	off := &bootv1.PowerMachineResponse{MachineId: "m1", Bmc: "https://10.0.0.5", System: "1", PowerStateBefore: "On", PowerState: "Off",
		Resets:  []*bootv1.PowerReset{{ResetType: "ForceOff", HttpStatus: 202, Task: "/redfish/v1/TaskService/Tasks/3", TaskState: "Completed", ExpectedPowerState: "Off", Reached: true}},
		Elapsed: durationpb.New(3210 * time.Millisecond)}
	already := &bootv1.PowerMachineResponse{MachineId: "m2", Bmc: "https://10.0.0.6", System: "1", PowerStateBefore: "Off", PowerState: "Off"}
	var out bytes.Buffer
	err := printPower(&out, bmc.ActionOff, []string{"m1", "m2", "m3"}, []powerOutcome{
		{resp: off}, {resp: already},
		{err: status.Error(codes.FailedPrecondition, "machine m3 has no BMC address")},
	})
	if err == nil || err.Error() != "power off failed on 1 of 3 machines" {
		t.Errorf("err = %v, want one failure counted", err)
	}
	for _, want := range []string{
		"m1       Off    was On; ForceOff (HTTP 202, task Completed); Off after 3.2s (BMC https://10.0.0.5 system 1)",
		"m2       Off    already Off: nothing sent (BMC https://10.0.0.6 system 1)",
		"m3       -      FailedPrecondition: machine m3 has no BMC address",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestPowerCommandArgs(t *testing.T) {
	cmd := newRootCommand()
	cmd.SetArgs([]string{"machines", "power", "reboot", "m1"})
	cmd.SetOut(new(bytes.Buffer))
	if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), "use one of on, off, cycle, status") {
		t.Errorf("power reboot: %v, want the actions listed", err)
	}
	cmd = newRootCommand()
	cmd.SetArgs([]string{"machines", "power", "on"})
	cmd.SetOut(new(bytes.Buffer))
	cmd.SetErr(new(bytes.Buffer))
	if err := cmd.Execute(); err == nil {
		t.Error("power on without a machine: no error")
	}
}
