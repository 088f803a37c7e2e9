package runbooks

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// site is one host of the document, as a runbook sees it: a mount namespace in the
// world's network namespace in which the document's absolute paths are directories of
// the test's own (siteMounts), so the commands run with the paths as written and
// nothing outside the test's directories is touched. /etc/hosts names gpuboot.example.
type site struct {
	w    *world
	t    *testing.T
	name string
	root string // the site's directories, on the host
	// cluster is the host directory that is the site's /var/lib/gpurack/cluster: the
	// world's, or the site's own.
	cluster string
	work    string // the operator's working directory (and HOME's parent)
	run     string // the stand-ins' pid file and gpuboot's log
	pid     int    // the holder: the site's namespaces are its
	env     []string
	rack    *rack // the simulated servers, once gpuboot is set up
	// values are the placeholders known so far: set by the test's setup, then by
	// the steps' captures.
	values map[string]string
}

// siteMounts are the document's directories each site has of its own, parents first.
// /var/lib/gpurack/cluster is the world's, the same in every site, unless the site has
// a control plane of its own.
var siteMounts = []string{"/etc/gpurack", "/etc/gpuboot", "/var/lib/gpurack", "/var/lib/gpuboot", "/srv/gpurack"}

// siteSetup runs as the holder, in a new mount namespace whose mounts propagate
// nowhere: a tmpfs on the scratch directory; an overlay on /etc, /var/lib and /srv
// whose upper layer is on that tmpfs, so that their new subdirectories are mount points
// without touching the host's directories (the mounts below each are bound again on
// top); /etc/hosts with gpuboot.example; then each site directory bound on its path.
const siteSetup = `set -euo pipefail
scratch=$1; shift
mount -t tmpfs runbook-site "$scratch"
for parent in /etc /var/lib /srv; do
  subs=$(awk -v p="$parent/" 'index($5, p) == 1 { print $5 }' /proc/self/mountinfo)
  mkdir -p "$scratch/orig$parent" "$scratch/upper$parent" "$scratch/work$parent"
  mount --rbind "$parent" "$scratch/orig$parent"
  mount -t overlay overlay -o "lowerdir=$scratch/orig$parent,upperdir=$scratch/upper$parent,workdir=$scratch/work$parent" "$parent"
  for m in $subs; do mount --rbind "$scratch/orig$m" "$m"; done
done
{ cat /etc/hosts; echo "` + gpubootAddr + ` ` + gpubootName + `"; } >"$scratch/hosts"
mount --bind "$scratch/hosts" /etc/hosts
while [ $# -gt 0 ]; do mkdir -p "$2"; mount --bind "$1" "$2"; shift 2; done
echo ready
exec sleep infinity
`

// newSite starts a site in w; ownCluster gives it a /var/lib/gpurack/cluster of its
// own. It ends with t.
func (w *world) newSite(t *testing.T, name string, ownCluster bool) *site {
	t.Helper()
	s := &site{w: w, t: t, name: name, root: t.TempDir(), cluster: w.clusterDir, values: map[string]string{}}
	if ownCluster {
		s.cluster = filepath.Join(s.root, "var-lib-gpurack-cluster")
	}
	s.work, s.run = filepath.Join(s.root, "work"), filepath.Join(s.root, "run")
	scratch := filepath.Join(s.root, "scratch")
	args := []string{"--mount", "--propagation", "private", "bash", "-c", siteSetup, "site-setup", scratch}
	dirs := []string{scratch, s.work, s.run, filepath.Join(s.root, "home"), filepath.Join(s.root, "tmp")}
	for _, p := range append(slices.Clone(siteMounts), "/var/lib/gpurack/cluster") {
		args = append(args, s.hostPath(p), p)
		dirs = append(dirs, s.hostPath(p))
	}
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// Not netnstest's Command: that one is killed when the test's context ends, before
	// the cleanups that stop gpuboot and the servers in the site.
	holder := exec.Command("ip", append([]string{"netns", "exec", w.ns, "unshare"}, args...)...)
	holder.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	out, err := holder.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var setupErr strings.Builder
	holder.Stderr = &setupErr
	if err := holder.Start(); err != nil {
		t.Fatalf("site %s: %v", name, err)
	}
	t.Cleanup(func() { holder.Process.Kill(); holder.Wait() })
	if line, _ := bufio.NewReader(out).ReadString('\n'); line != "ready\n" {
		holder.Wait()
		t.Fatalf("site %s: the mount namespace was not set up: %s", name, setupErr.String())
	}
	s.pid = holder.Process.Pid
	k8sBin := filepath.Join(w.k8sDir, "bin")
	s.env = []string{
		"PATH=" + w.bin + ":" + k8sBin + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=" + filepath.Join(s.root, "home"), "TMPDIR=" + filepath.Join(s.root, "tmp"), "LANG=C.UTF-8",
		"GPURACK_K8S_DIR=" + w.k8sDir, "RUNBOOK_SITE=" + s.run,
		// The runbooks' kubectl runs as the cluster's admin unless they name a kubeconfig.
		"KUBECONFIG=/var/lib/gpurack/cluster/admin.conf",
	}
	return s
}

// hostPath is where the site's path p is on the host.
func (s *site) hostPath(p string) string {
	if rest, ok := strings.CutPrefix(p, "/var/lib/gpurack/cluster"); ok && (rest == "" || rest[0] == '/') {
		return s.cluster + rest
	}
	for _, m := range siteMounts {
		if rest, ok := strings.CutPrefix(p, m); ok && (rest == "" || rest[0] == '/') {
			return filepath.Join(s.root, strings.ReplaceAll(strings.TrimPrefix(m, "/"), "/", "-")) + rest
		}
	}
	return p
}

// writeFile writes the site's file p (its directory made as needed).
func (s *site) writeFile(p, content string, mode os.FileMode) {
	s.t.Helper()
	hp := s.hostPath(p)
	if err := os.MkdirAll(filepath.Dir(hp), 0o755); err != nil {
		s.t.Fatal(err)
	}
	if err := os.WriteFile(hp, []byte(content), mode); err != nil {
		s.t.Fatal(err)
	}
}

// command runs name in the site, from the operator's working directory, in a process
// group of its own that the kernel kills should the test binary die. It does not end
// with the test's context (which ends before the cleanups that still need the site):
// whoever starts it stops it, in a cleanup.
func (s *site) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command("nsenter", append([]string{"--target", strconv.Itoa(s.pid), "--mount", "--net", "--", name}, args...)...)
	cmd.Env, cmd.Dir = s.env, s.work
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	return cmd
}

// sh runs a bash script in the site and returns its output; d bounds it. A process the
// script leaves running (gpuboot, started by the systemctl stand-in) is the caller's to
// stop.
func (s *site) sh(script string, d time.Duration) (string, error) {
	cmd := s.command("bash", "-c", script)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return "", err
	}
	timer := time.AfterFunc(d, func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	err := cmd.Wait()
	if !timer.Stop() {
		out.WriteString("\nrunbook test: killed after " + d.String())
	}
	return out.String(), err
}

// must runs a script of the test's own setup in the site and fails t if it fails.
func (s *site) must(script string) string {
	s.t.Helper()
	out, err := s.sh("set -euo pipefail\n"+script, 3*time.Minute)
	if err != nil {
		s.t.Fatalf("site %s: %v\n$ %s\n%s", s.name, err, script, out)
	}
	return out
}

// systemctlStandIn is systemctl in the sites, which run no systemd: it starts, stops and
// restarts `gpuboot serve --config /etc/gpuboot/gpuboot.yaml` as pxe/systemd's
// gpuboot.service does (as the user gpuboot, umask 0077, the state directory chowned to
// it when the directory's own owner differs, as StateDirectory= does), logs where the
// journalctl stand-in reads, and, like systemctl, fails a start when gpuboot exits
// before it serves. The rest of the unit's sandbox is systemd's and not stood in for.
const systemctlStandIn = `#!/bin/bash
# systemctl stand-in of the runbook tests (test/runbooks): gpuboot.service only.
set -uo pipefail
run=${RUNBOOK_SITE:?RUNBOOK_SITE is not set}
pidfile=$run/gpuboot.pid log=$run/gpuboot.log
if [ $# -ne 2 ] || [ "${2%.service}" != gpuboot ]; then
  echo "systemctl (runbook test stand-in): only start, stop, restart or is-active gpuboot, not: $*" >&2; exit 1
fi
running() { [ -s "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }
stop() {
  running || { rm -f "$pidfile"; return 0; }
  pid=$(cat "$pidfile"); kill -TERM "$pid"
  for _ in $(seq 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null; rm -f "$pidfile"
}
start() {
  running && return 0
  from=$(cat "$log" 2>/dev/null | wc -l)
  id gpuboot >/dev/null 2>&1 || { echo "gpuboot.service: no user gpuboot (install pxe/systemd/sysusers.d/gpuboot.conf and run systemd-sysusers)" >&2; exit 1; }
  [ "$(stat -c %U /var/lib/gpuboot)" = gpuboot ] || chown -R gpuboot:gpuboot /var/lib/gpuboot
  (umask 0077; exec setpriv --reuid=gpuboot --regid=gpuboot --init-groups -- gpuboot serve --config /etc/gpuboot/gpuboot.yaml) </dev/null >>"$log" 2>&1 &
  echo $! >"$pidfile"
  for _ in $(seq 300); do
    tail -n +"$((from + 1))" "$log" | grep -q 'msg="gpuboot serving"' && return 0
    if ! running; then
      rm -f "$pidfile"
      echo "Job for gpuboot.service failed because the control process exited with error code." >&2
      echo "See \"journalctl -u gpuboot\" for details." >&2
      exit 1
    fi
    sleep 0.1
  done
  echo "gpuboot.service: no 'gpuboot serving' in its log after 30 s" >&2; exit 1
}
case $1 in
  start) start ;;
  stop) stop ;;
  restart) stop; start ;;
  is-active) if running; then echo active; else echo inactive; exit 3; fi ;;
  *) echo "systemctl (runbook test stand-in): unknown verb $1" >&2; exit 1 ;;
esac
`

// journalctlStandIn prints gpuboot's log, which the systemctl stand-in writes: the
// journal of gpuboot.service. It takes -u gpuboot and ignores --since and the like
// (the whole log is recent).
const journalctlStandIn = `#!/bin/bash
# journalctl stand-in of the runbook tests (test/runbooks): -u gpuboot only.
unit=
while [ $# -gt 0 ]; do
  case $1 in
    -u) unit=${2%.service}; shift 2 ;;
    --since|--until|-n) shift 2 ;;
    *) shift ;;
  esac
done
if [ "$unit" != gpuboot ]; then echo "journalctl (runbook test stand-in): only -u gpuboot" >&2; exit 1; fi
cat "${RUNBOOK_SITE:?}/gpuboot.log" 2>/dev/null
`
