package server_test

import (
	"strings"
	"testing"
)

// TestServeRolloutAndNextImage runs the rollout commands and `machines show`'s next
// boot against the real binary. The machine has a canary selector (one machine term)
// and a rack selector with two terms: the canary wins, and show says why and names the
// loser. Without a cluster credential a rollout is refused, as is one that names no
// machines; there is no rollout to show or release yet. The rollouts themselves run in
// pxe/nodecontrol's TestRolloutSimulatedRack, against a real apiserver.
func TestServeRolloutAndNextImage(t *testing.T) {
	a := newTestAgent(61)
	in := newInstance(t, `selectors:
  - {name: r1-sn, match: {rack: r1, serial: `+a.facts.Identity.Serial+`}, image: cccccccccccccccccccccccccccccccccccccccc}
  - {name: canary, match: {machine: "`+a.facts.Identity.BootMac+`"}, image: bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb}
`)
	help := in.run("rollout", "--help")
	for _, want := range []string{"goes first and alone", "PodDisruptionBudgets", "start", "status", "pause", "resume", "rollback", "release"} {
		if !strings.Contains(help, want) {
			t.Errorf("rollout --help lacks %q:\n%s", want, help)
		}
	}
	in.start()
	joined, _ := in.joinedAgent(61)
	show := in.cli("machines", "show", joined.facts.Identity.BootMac)
	for _, want := range []string{
		`next boot:        image bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb, from selector canary: selector "canary" matches (machine=` + a.facts.Identity.BootMac + `)`,
		`selector "r1-sn" (rack=r1, serial=SN-0061) also matches and loses: "canary" names the machine`,
	} {
		if !strings.Contains(show, want) {
			t.Errorf("machines show lacks %q:\n%s", want, show)
		}
	}
	if out := in.cliFails("rollout", "start", "--image", strings.Repeat("d", 40)); !strings.Contains(out, "name the machines") {
		t.Errorf("rollout without machines: %s", out)
	}
	if out := in.cliFails("rollout", "start", "--image", strings.Repeat("d", 40), "--selector", "rack=r1"); !strings.Contains(out, "FailedPrecondition") || !strings.Contains(out, "no cluster credential") {
		t.Errorf("rollout without a cluster: %s", out)
	}
	if out := in.cliFails("rollout", "start", "--image", strings.Repeat("d", 40), "--selector", "rack"); !strings.Contains(out, "write KEY=VALUE") {
		t.Errorf("bad selector: %s", out)
	}
	if out := in.cliFails("rollout", "status"); !strings.Contains(out, "NotFound") || !strings.Contains(out, "no rollout has been started") {
		t.Errorf("rollout status with none: %s", out)
	}
	if out := in.cliFails("rollout", "release", "--force"); !strings.Contains(out, "NotFound") || !strings.Contains(out, "no rollout has been started") {
		t.Errorf("rollout release with none: %s", out)
	}
}
