// Command gpurack-debug is the entrypoint of the break-glass debug image,
// gpurack.io/debug:v1 (hack/debug-image.sh packs it, static, as root). A node image
// ships no sshd; an operator gets a shell on a node with
//
//	kubectl debug node/NAME -it --profile=sysadmin --image=gpurack.io/debug:v1
//
// which runs this in a privileged pod in the node's PID, network and IPC namespaces
// with the node's root filesystem at /host. gpurack-debug enters that root (chroot)
// and runs the node's own shell there, so every tool is the node's: journalctl,
// systemctl, nvidia-smi, ip, crictl. Before the shell starts it writes a line to the
// node's journal (identifier gpurack-break-glass), and an interactive shell logs every
// command line typed to the same place, through the node's logger(1). Who ran it is in
// the apiserver's audit log (controlplane-bootstrap audit break-glass).
//
//	gpurack-debug [--host DIR] [COMMAND [ARG...]]
//
// With no COMMAND: the node's /bin/bash as a login shell (/bin/sh when there is no
// bash). A COMMAND runs once, in the node's root, and its exit status is this one's.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/coreos/go-systemd/v22/journal"
)

// identifier is the journal's SYSLOG_IDENTIFIER for everything a session records:
// journalctl -t gpurack-break-glass on the node.
const identifier = "gpurack-break-glass"

func main() {
	fs := flag.NewFlagSet("gpurack-debug", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: gpurack-debug [--host DIR] [COMMAND [ARG...]]

Runs the node's own shell (or COMMAND) inside the node's root filesystem, which
kubectl debug node/NAME mounts at /host, and records the session in the node's
journal (journalctl -t gpurack-break-glass). Start it with:

  kubectl debug node/NAME -it --profile=sysadmin --image=gpurack.io/debug:v1

`)
		fs.PrintDefaults()
	}
	host := fs.String("host", "/host", "the node's root filesystem, as kubectl debug node mounts it")
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		os.Exit(2)
	}
	if err := run(*host, fs.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "gpurack-debug:", err)
		var ee *exec.ExitError
		if errors.As(err, &ee) && ee.ExitCode() > 0 {
			os.Exit(ee.ExitCode())
		}
		os.Exit(1)
	}
}

// run enters host and runs args there (the node's login shell when args is empty).
func run(host string, args []string) error {
	if err := checkHostRoot(host); err != nil {
		return err
	}
	if err := syscall.Chroot(host); err != nil {
		return fmt.Errorf("enter the node's root %s: %w (the pod must run as root and privileged: --profile=sysadmin)", host, err)
	}
	if err := os.Chdir("/"); err != nil {
		return err
	}
	interactive := len(args) == 0
	if interactive {
		args = []string{loginShell(), "-l"}
	}
	path, err := exec.LookPath(args[0])
	if err != nil {
		return fmt.Errorf("%s: not found on the node (the command runs in the node's own root)", args[0])
	}
	record(args, interactive)
	cmd := exec.Command(path, args[1:]...)
	cmd.Args[0] = args[0]
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = sessionEnv(os.Environ(), interactive)
	return cmd.Run()
}

// checkHostRoot says what to do when host is not a node's root filesystem: the image
// was started as an ordinary pod, or without kubectl debug node's host mount.
func checkHostRoot(host string) error {
	for _, p := range []string{"etc/os-release", "usr/bin"} {
		if _, err := os.Stat(filepath.Join(host, p)); err != nil {
			return fmt.Errorf("%s does not hold a node's root filesystem (no %s): start this image with kubectl debug node/NAME --profile=sysadmin --image=gpurack.io/debug:v1, which mounts the node's / at /host", host, p)
		}
	}
	return nil
}

// loginShell is the node's bash, or its sh.
func loginShell() string {
	if _, err := os.Stat("/bin/bash"); err == nil {
		return "/bin/bash"
	}
	return "/bin/sh"
}

// record writes the session's start to the node's journal (after the chroot, the
// node's socket at /run/systemd/journal/socket). It says on stderr when it cannot:
// the session is then recorded only by the apiserver's audit log.
func record(args []string, interactive bool) {
	what := "command"
	if interactive {
		what = "shell"
	}
	msg := fmt.Sprintf("break-glass %s started: %s", what, strings.Join(args, " "))
	vars := map[string]string{
		"SYSLOG_IDENTIFIER":          identifier,
		"GPURACK_BREAK_GLASS":        what,
		"GPURACK_BREAK_GLASS_ARGV":   strings.Join(args, " "),
		"GPURACK_BREAK_GLASS_CGROUP": ownCgroup(),
	}
	if !journal.Enabled() {
		fmt.Fprintln(os.Stderr, "gpurack-debug: the node's journal socket is not there: this session is recorded only in the apiserver's audit log")
		return
	}
	if err := journal.Send(msg, journal.PriNotice, vars); err != nil {
		fmt.Fprintf(os.Stderr, "gpurack-debug: record the session in the node's journal: %v\n", err)
	}
}

// ownCgroup is this process's cgroup path (the last line of /proc/self/cgroup,
// "ID:CONTROLLERS:PATH"): it names the pod's container, to match the journal line
// with the pod the apiserver's audit log names.
func ownCgroup() string {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if f := strings.SplitN(lines[len(lines)-1], ":", 3); len(f) == 3 {
		return f[2]
	}
	return ""
}

// sessionEnv is the shell's environment: the node's PATH, a prompt that says where it
// is, and for an interactive shell, every command line sent to the journal by the
// node's logger(1) before the next prompt.
func sessionEnv(env []string, interactive bool) []string {
	out := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root"}
	for _, kv := range env {
		if strings.HasPrefix(kv, "TERM=") || strings.HasPrefix(kv, "LANG=") {
			out = append(out, kv)
		}
	}
	if interactive {
		// Debian's bash.bashrc puts debian_chroot in front of its prompt:
		// (break-glass)root@NODE:~#
		out = append(out, "debian_chroot=break-glass",
			`PROMPT_COMMAND=history 1 | sed 's/^ *[0-9]* *//' | logger -t `+identifier+` -p auth.notice --id=$$`)
	}
	return out
}
