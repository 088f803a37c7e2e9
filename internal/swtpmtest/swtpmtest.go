// Package swtpmtest starts a real software TPM 2.0 (swtpm, the Debian package) for
// tests and connects go-tpm to it over loopback TCP. Each TPM has its own state
// folder, so two of them have different Endorsement Keys, and restarting one on the
// same folder is the same TPM after a reboot.
package swtpmtest

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpurack/gpurack/internal/testreq"
)

// TPM is one running swtpm.
type TPM struct {
	// Dir is its state folder.
	Dir  string
	Addr string
	stop func()
}

// Stop ends swtpm (as a power-off does); StartIn on Dir brings the same TPM back.
func (p *TPM) Stop() { p.stop() }

// Start starts swtpm with a fresh state folder. It stops when t ends.
func Start(t testing.TB) *TPM {
	t.Helper()
	return StartIn(t, t.TempDir())
}

// StartIn starts swtpm on the state folder dir (a TPM started on the same folder
// before is the same TPM). It stops when t ends.
func StartIn(t testing.TB, dir string) *TPM {
	t.Helper()
	bin := testreq.Tool(t, "swtpm", "apt-get install swtpm swtpm-tools; hack/deps.sh installs it")
	var lastErr error
	for range 5 {
		port, err := freePort()
		if err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		cmd := exec.Command(bin, "socket", "--tpm2",
			"--server", "type=tcp,port="+strconv.Itoa(port)+",bindaddr=127.0.0.1",
			"--flags", "not-need-init,startup-clear",
			"--tpmstate", "dir="+dir)
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatalf("start swtpm: %v", err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		for {
			select {
			case err := <-exited:
				lastErr = fmt.Errorf("swtpm exited (%v): %s", err, out.String())
			case <-time.After(20 * time.Millisecond):
				c, err := net.Dial("tcp", addr)
				if err != nil {
					continue
				}
				c.Close()
				stop := sync.OnceFunc(func() {
					_ = cmd.Process.Kill()
					<-exited
				})
				t.Cleanup(stop)
				return &TPM{Dir: dir, Addr: addr, stop: stop}
			}
			break
		}
	}
	t.Fatalf("swtpm did not start: %v", lastErr)
	return nil
}

// Dial connects to the TPM's command stream, a go-tpm transport; the connection closes
// when t ends.
func (p *TPM) Dial(t testing.TB) *Stream {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr)
	if err != nil {
		t.Fatalf("dial swtpm %s: %v", p.Addr, err)
	}
	s := NewStream(c)
	t.Cleanup(func() { s.Close() })
	return s
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Vendor is a TPM maker's certificate authority for tests: swtpm_localca's root and
// the intermediate that signs EK certificates, as a real vendor publishes them.
type Vendor struct {
	// Root and Intermediate are PEM files.
	Root, Intermediate string
	dir, localca       string
}

// NewVendor makes a certificate authority in a fresh folder (its root and intermediate
// are created by the first StartCertified).
func NewVendor(t testing.TB) *Vendor {
	t.Helper()
	testreq.Tool(t, "swtpm_setup", "apt-get install swtpm-tools; hack/deps.sh installs it")
	localca := testreq.Tool(t, "swtpm_localca", "apt-get install swtpm-tools; hack/deps.sh installs it")
	dir := t.TempDir()
	return &Vendor{dir: dir, localca: localca, Root: filepath.Join(dir, "ca", "swtpm-localca-rootca-cert.pem"), Intermediate: filepath.Join(dir, "ca", "issuercert.pem")}
}

// StartCertified manufactures a TPM as its maker does (swtpm_setup: the EK, and its
// certificate signed by v's intermediate in NV index 0x01c00002) and starts it.
func (v *Vendor) StartCertified(t testing.TB) *TPM {
	t.Helper()
	ca := filepath.Join(v.dir, "ca")
	state := t.TempDir()
	files := map[string]string{
		"localca.conf":    fmt.Sprintf("statedir = %[1]s\nsigningkey = %[1]s/signkey.pem\nissuercert = %[1]s/issuercert.pem\ncertserial = %[1]s/certserial\n", ca),
		"localca.options": "--platform-manufacturer gpurack-test\n--platform-version 2.1\n--platform-model swtpm\n",
		"setup.conf":      fmt.Sprintf("create_certs_tool = %[2]s\ncreate_certs_tool_config = %[1]s/localca.conf\ncreate_certs_tool_options = %[1]s/localca.options\nactive_pcr_banks = sha256\n", v.dir, v.localca),
	}
	if err := os.MkdirAll(ca, 0o700); err != nil {
		t.Fatal(err)
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(v.dir, name), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command("swtpm_setup", "--tpm2", "--tpmstate", state, "--create-ek-cert", "--config", filepath.Join(v.dir, "setup.conf"), "--overwrite")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("swtpm_setup --create-ek-cert: %v\n%s", err, out)
	}
	return StartIn(t, state)
}

// QEMUTPM is swtpm serving QEMU's TPM emulator backend over a control socket.
type QEMUTPM struct {
	// Socket is the control socket: QEMU's -chardev socket,path=Socket with
	// -tpmdev emulator.
	Socket string
	stop   func()
}

// Stop ends swtpm (as a power-off does); StartForQEMU on the same folder brings the
// same TPM back.
func (p *QEMUTPM) Stop() { p.stop() }

// StartForQEMU starts swtpm on the state folder dir for one QEMU machine: it waits
// for QEMU on its control socket (dir/ctrl.sock) and ends when QEMU closes it
// (--terminate), or when t ends.
func StartForQEMU(t testing.TB, dir string) *QEMUTPM {
	t.Helper()
	bin := testreq.Tool(t, "swtpm", "apt-get install swtpm swtpm-tools; hack/deps.sh installs it")
	sock := filepath.Join(dir, "ctrl.sock")
	os.Remove(sock) // a previous power-on's
	// swtpm's output goes to a file beside its state, read only when it fails to start.
	logPath := filepath.Join(dir, "swtpm.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close() // swtpm holds its own descriptor
	out := func() string { b, _ := os.ReadFile(logPath); return string(b) }
	cmd := exec.Command(bin, "socket", "--tpm2", "--tpmstate", "dir="+dir, "--ctrl", "type=unixio,path="+sock, "--terminate")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatalf("start swtpm: %v", err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	stop := sync.OnceFunc(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	t.Cleanup(stop)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(sock); err == nil {
			return &QEMUTPM{Socket: sock, stop: stop}
		}
		select {
		case <-exited:
			t.Fatalf("swtpm exited before it made its control socket: %s", out())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("swtpm made no control socket %s in 10 s: %s", sock, out())
		}
	}
}
