package runbooks

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// docPath is the document, from the module root; the tests name lines in it.
const docPath = "docs/operations.md"

// defaultsRunbook is the name of the tagged block every step's shell runs first (the
// exports at the top of the document: "The examples assume the operator CLI's defaults
// are set").
const defaultsRunbook = "defaults"

// runbookTest is how one runbook of the document runs: the site it needs, the state it
// assumes, and the test's stand-ins for the steps the document gives in words (do=) or
// that cannot run here (instead=). docs/testing.md lists the stand-ins.
type runbookTest struct {
	name string // the subtest, TestRunbooks/NAME
	// runbooks are the document's runbooks the subtest runs, in order, on its one site
	// (default: name alone).
	runbooks []string
	gpuboot  *gpubootSite // nil: no gpuboot in the site
	// ownCluster gives the site a control plane of its own (a runbook that restarts
	// it); the others share the world's.
	ownCluster bool
	// parallel runs the subtest beside the others (which run one at a time): for a
	// runbook that waits long (the drain's 3 minutes of key liveness).
	parallel bool
	// setUp makes what the runbook assumes exists (a tenant, an operator) and sets
	// placeholders the document uses (s.values).
	setUp    func(s *site)
	standIns map[string]standIn
}

// standIn does what the document gives in words (do=: block is ""), or stands in for
// a block that cannot run here (instead=: block is its text, placeholders replaced).
type standIn func(s *site, block string)

// readDoc parses the document.
func readDoc(t *testing.T) map[string]Runbook {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", docPath))
	if err != nil {
		t.Fatal(err)
	}
	rbs, err := Parse(string(data))
	if err != nil {
		t.Fatalf("%s: %v", docPath, err)
	}
	byName := map[string]Runbook{}
	for _, rb := range rbs {
		byName[rb.Name] = rb
	}
	return byName
}

// TestMain lets every subtest of TestRunbooks run at once whatever -test.parallel
// says (it defaults to the number of CPUs): those that share a world wait on a mutex,
// and the drain and the rollout wait 3 minutes on a server's key; with fewer slots than
// subtests, the waiting ones would hold the slots the others need.
func TestMain(m *testing.M) {
	flag.Parse()
	if f := flag.Lookup("test.parallel"); f != nil {
		if n, err := strconv.Atoi(f.Value.String()); err == nil && n <= len(runbookTests) {
			f.Value.Set(strconv.Itoa(len(runbookTests) + 1))
		}
	}
	os.Exit(m.Run())
}

// TestRunbooks runs every runbook of docs/operations.md that the test covers
// (runbookTests), as written, each in a site of its own; the control plane is shared.
func TestRunbooks(t *testing.T) {
	doc := readDoc(t)
	b := buildBinaries(t)
	// The runbooks that run one at a time share a world; one that runs beside them has
	// its own.
	shared := newWorld(t, b)
	var oneAtATime sync.Mutex
	for _, rt := range runbookTests {
		t.Run(rt.name, func(t *testing.T) {
			t.Parallel()
			w := shared
			if rt.parallel {
				w = newWorld(t, b)
			} else {
				// Unlocked after the site's own cleanup, which runs after this function:
				// the next site must not meet this one's gpuboot or servers.
				oneAtATime.Lock()
				t.Cleanup(oneAtATime.Unlock)
			}
			s := w.prepare(t, rt)
			for _, name := range rt.names() {
				rb, ok := doc[name]
				if !ok {
					t.Fatalf("%s tags no block for runbook %q", docPath, name)
				}
				if err := s.runRunbook(rb, doc[defaultsRunbook], rt.standIns); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
	t.Run("a broken runbook fails", func(t *testing.T) {
		t.Parallel()
		oneAtATime.Lock()
		t.Cleanup(oneAtATime.Unlock)
		shared.brokenRunbooksFail(t, doc)
	})
}

// names are the document's runbooks rt runs.
func (rt runbookTest) names() []string {
	if len(rt.runbooks) == 0 {
		return []string{rt.name}
	}
	return rt.runbooks
}

// prepare makes the site rt needs.
func (w *world) prepare(t *testing.T, rt runbookTest) *site {
	s := w.newSite(t, rt.name, rt.ownCluster)
	if rt.ownCluster {
		s.startControlPlane(1000)
	}
	if rt.gpuboot != nil {
		s.setUpGpuboot(*rt.gpuboot)
	}
	if rt.setUp != nil {
		rt.setUp(s)
	}
	return s
}

// runRunbook runs rb's steps in order and returns the first step's problems, naming
// its lines in the document. defaults' blocks run at the start of each step's shell.
func (s *site) runRunbook(rb Runbook, defaults Runbook, standIns map[string]standIn) error {
	var prelude strings.Builder
	for _, st := range defaults.Steps {
		prelude.WriteString(st.Text)
	}
	for _, st := range rb.Steps {
		where := fmt.Sprintf("%s:%d (%s)", docPath, st.Line, st.Section)
		switch {
		case st.Do != "" || st.Instead != "":
			name := st.Do + st.Instead
			fn, ok := standIns[name]
			if !ok {
				return fmt.Errorf("%s: the test has no stand-in %q (runbookTests)", where, name)
			}
			s.t.Logf("%s: stand-in %q", where, name)
			block := ""
			if st.Instead != "" {
				block = Substitute(st.Text, s.values, func(v string) string { return v })
			}
			fn(s, block)
		case st.Append != "":
			text := Substitute(st.Text, s.values, func(v string) string { return v })
			s.t.Logf("%s: appended to %s:\n%s", where, st.Append, text)
			if err := appendFile(s.hostPath(st.Append), text); err != nil {
				return fmt.Errorf("%s: %v", where, err)
			}
		default:
			if err := s.runStep(rb.Name, st, prelude.String()); err != nil {
				return err
			}
		}
	}
	return nil
}

func appendFile(path, text string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(text); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// stepTimeout bounds one run of a block.
const stepTimeout = 3 * time.Minute

// runStep runs one block, again until its expectations hold when it has retry=.
func (s *site) runStep(runbook string, st Step, prelude string) error {
	text := Substitute(st.Text, s.values, func(v string) string { return v })
	script := Script(docPath, st, prelude, text)
	deadline := time.Now().Add(st.Retry)
	for attempt := 1; ; attempt++ {
		start := time.Now()
		out, err := s.sh(script, stepTimeout)
		exit := 0
		if err != nil {
			exit = -1
			if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
				exit = ee.ExitCode()
			}
		}
		problems, captured := Judge(docPath, st, out, exit, s.values)
		if len(problems) == 0 {
			s.t.Logf("%s:%d (%s), passed in %.1f s:\n%s\n%s", docPath, st.Line, st.Section, time.Since(start).Seconds(), indent("$ ", text), indent("  ", out))
			for k, v := range captured {
				s.values[k] = v
			}
			return nil
		}
		if time.Now().Before(deadline) {
			time.Sleep(2 * time.Second)
			continue
		}
		return fmt.Errorf("runbook %q, section %q, run %d time(s):\n%s\n\n%s\noutput:\n%s", runbook, st.Section, attempt,
			strings.Join(problems, "\n"), indent("$ ", text), indent("  ", out))
	}
}

// indent prefixes every line of s.
func indent(prefix, s string) string {
	s = strings.TrimRight(s, "\n")
	return prefix + strings.ReplaceAll(s, "\n", "\n"+prefix)
}

// runbookTests are the runbooks the test runs, in order; docs/testing.md lists those
// it does not run and why.
var runbookTests = []runbookTest{
	{name: "tenants", setUp: func(s *site) {
		// docs/examples/tenants.yaml as the cluster's tenants, and ann, a user of vision,
		// whose credential the third runbook renews.
		s.must("install -m 0644 " + filepath.Join(s.w.root, "docs", "examples", "tenants.yaml") + ` /etc/gpurack/tenants.yaml
controlplane-bootstrap tenants apply --dir /var/lib/gpurack/cluster /etc/gpurack/tenants.yaml
controlplane-bootstrap users add --dir /var/lib/gpurack/cluster ann --tenant vision --role user --out ~/ann.kubeconfig`)
	}, standIns: map[string]standIn{
		// "Changing a quota", step 1: the edit the document gives as its example.
		"speech-quota-16-gpus": func(s *site, _ string) {
			s.must(`sed -i 's/^    quota: {gpus: 8, cpu: "64", memory: 512Gi}$/    quota: {gpus: 16, cpu: "64", memory: 512Gi}/' /etc/gpurack/tenants.yaml
grep -q '^    quota: {gpus: 16, cpu: "64", memory: 512Gi}$' /etc/gpurack/tenants.yaml`)
		},
	}},
	{name: "rack", runbooks: []string{"drain", "gpuboot-config", "power"}, parallel: true, gpuboot: &gpubootSite{cluster: true, machines: []int{7, 8}},
		standIns: map[string]standIn{
			// "Changing gpuboot's configuration", step 1: the edit.
			"edit-reenroll-auto": func(s *site, _ string) {
				s.must(`sed -i 's/^  reenroll: manual$/  reenroll: auto/' /etc/gpuboot/gpuboot.yaml.new
grep -q '^  reenroll: auto$' /etc/gpuboot/gpuboot.yaml.new`)
			},
		}},
	{name: "certificates", ownCluster: true, gpuboot: &gpubootSite{cluster: true, machines: []int{7}}, setUp: func(s *site) {
		s.must("runuser -u gpuboot -- gpuboot certs operator alice --level operator")
		// Step 4's node: the machine's address, where its agent serves /metrics.
		s.values["NODE"] = s.rack.machines[0].addr
	}, standIns: map[string]standIn{
		// Step 3's branch: the directory alice holds, as it was before the revoke.
		"keep-alices-directory": func(s *site, _ string) { s.must("cp -a /var/lib/gpuboot/operators/alice ~/alice-before") },
	}},
	{name: "etcd-backup", ownCluster: true, setUp: func(s *site) {
		s.must("kubectl create configmap gpurack-before-the-snapshot -n default --from-literal=written=before")
	}, standIns: map[string]standIn{
		// Between the backup and the restore: something written after the snapshot,
		// which the restore must take away.
		"write-after-the-snapshot": func(s *site, _ string) {
			s.must("kubectl create configmap gpurack-after-the-snapshot -n default --from-literal=written=after")
		},
		// `init` of a host with systemd units starts them; the sites have no systemd, so
		// the control plane starts again in the foreground, from the same directory.
		"start-the-control-plane": func(s *site, _ string) { s.runControlPlane() },
	}},
	{name: "prune-images", gpuboot: &gpubootSite{cluster: true, machines: []int{7}}, setUp: func(s *site) {
		// Step 1's ID: any image of the store; the unused one.
		s.values["ID"] = s.values["OLD-ID"]
	}},
	{name: "rotate-signing-key", gpuboot: &gpubootSite{cluster: true, machines: []int{7}}, setUp: func(s *site) {
		// Step 2's ID: the image the rack boots, rebuilt with the new key.
		s.values["ID"] = s.values["IMAGE-ID"]
	}, standIns: map[string]standIn{
		// Step 2's build: the image's files as the store has them, signed with the new
		// key, as a reproducible build of the same profile and lock gives them.
		"build-with-the-new-key": func(s *site, _ string) {
			id := s.standInImage("/srv/gpurack/resigned", "/etc/gpurack/keys/signing-2.pem", "in-use")
			if id != s.values["IMAGE-ID"] {
				s.t.Fatalf("the rebuilt image has id %s, not the rack's %s", id, s.values["IMAGE-ID"])
			}
		},
		// Step 2's copy to gpuboot's host, which is the same host here.
		"copy-to-gpuboots-host": func(s *site, _ string) {
			s.must("mkdir -p /var/lib/gpurack/images-resigned && cp -a /srv/gpurack/resigned/. /var/lib/gpurack/images-resigned/ && cp /etc/gpurack/keys/signing-2.pub.pem .")
		},
		// Step 3's edit of gpuboot.yaml.new.
		"trust-only-the-new-key": func(s *site, _ string) {
			s.must(`sed -i 's,^  trustedKeys: \[/etc/gpurack/image-signing.pub\]$,  trustedKeys: [/etc/gpurack/image-signing-2.pub],' /etc/gpuboot/gpuboot.yaml.new
grep -q '^  trustedKeys: \[/etc/gpurack/image-signing-2.pub\]$' /etc/gpuboot/gpuboot.yaml.new`)
		},
	}},
	{name: "rollout", parallel: true, gpuboot: &gpubootSite{cluster: true, machines: []int{3, 4}, reenroll: "auto"},
		standIns: map[string]standIn{
			// Step 1: the build host's checkout (the profiles and the agent's unit).
			"checkout-on-the-build-host": checkoutOnTheBuildHost,
			// Step 1's lock and build: a signed image in the store, on which the
			// canary's checklist fails (the branch step 4 covers).
			"lock-and-build": func(s *site, _ string) {
				s.values["NEW-ID"] = s.standInImage("/var/lib/gpurack/images", "/etc/gpurack/keys/signing.pem", "driver-550")
				s.rack.failOn(s.values["NEW-ID"])
			},
		}},
	{name: "rollout-success", parallel: true, gpuboot: &gpubootSite{cluster: true, machines: []int{3, 4}, reenroll: "auto"},
		standIns: map[string]standIn{
			"checkout-on-the-build-host": checkoutOnTheBuildHost,
			// Step 1's lock and build: a signed image in the store, on which the
			// servers' checklist passes.
			"lock-and-build": func(s *site, _ string) {
				s.values["NEW-ID"] = s.standInImage("/var/lib/gpurack/images", "/etc/gpurack/keys/signing.pem", "driver-550")
			},
			// Step 6's edit: the rack's defaultImage in gpuboot.yaml becomes NEW-ID.
			"point-the-rack-at-new-id": func(s *site, _ string) {
				s.must(fmt.Sprintf(`sed -i 's,^    defaultImage: %s$,    defaultImage: %s,' /etc/gpuboot/gpuboot.yaml
grep -q '^    defaultImage: %[2]s$' /etc/gpuboot/gpuboot.yaml`, s.values["IMAGE-ID"], s.values["NEW-ID"]))
			},
		}},
	{name: "gpuboot-host", gpuboot: &gpubootSite{cluster: true, machines: []int{7}}, standIns: map[string]standIn{
		// Step 2: the host is lost and a new one installed at its address: gpuboot
		// stopped, its state and configuration gone; its user, the image store and the
		// control plane stay, as the installation and the store's restore give them.
		"lose-gpuboots-host": func(s *site, _ string) {
			s.must(`systemctl stop gpuboot
find /var/lib/gpuboot /etc/gpuboot -mindepth 1 -delete
test -z "$(find /var/lib/gpuboot /etc/gpuboot -mindepth 1)"`)
		},
	}},
	{name: "decommission", gpuboot: &gpubootSite{cluster: true, machines: []int{7}}, standIns: map[string]standIn{
		// The server powered on again: off and on at its BMC, it network-boots.
		"power-the-server-on-again": func(s *site, _ string) {
			s.rack.machines[0].powerOff()
			s.rack.machines[0].powerOn()
		},
	}},
	{name: "adding-a-rack", gpuboot: &gpubootSite{cluster: true, machines: []int{7}}, standIns: map[string]standIn{
		// Step 2: the fragment merged into gpuboot.yaml, its keys replacing the file's.
		"merge-into-gpuboot-yaml": func(s *site, block string) { s.mergeYAML("/etc/gpuboot/gpuboot.yaml", block) },
		// Step 4: rack r2's server (the manifest's row) powered on; it has no BMC.
		"power-on-rack-r2": func(s *site, _ string) { s.rack.add("r2", 1, "SN-R2-01", "3c:ec:ef:10:02:01").powerOn() },
	}},
	{name: "operator-credentials", gpuboot: &gpubootSite{}},
	{name: "operators", gpuboot: &gpubootSite{}, standIns: map[string]standIn{
		// Step 2's hand-over: alice's machine is the site too; her directory goes where
		// step 3 reads it.
		"hand-over-alice": func(s *site, _ string) {
			s.must("mkdir -p ~/.config/gpuboot && cp -a /var/lib/gpuboot/operators/alice ~/.config/gpuboot/alice")
		},
	}},
}

// checkoutOnTheBuildHost stands in for the rollout's step 1 checkout on the build host:
// the profiles and the agent's unit of this tree.
func checkoutOnTheBuildHost(s *site, _ string) {
	s.must("mkdir -p agent && cp -a " + filepath.Join(s.w.root, "profiles") + " . && cp -a " + filepath.Join(s.w.root, "agent", "systemd") + " agent/")
}
