package server_test

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/gpurack/gpurack/internal/netnstest"
	"github.com/gpurack/gpurack/internal/testreq"
	"github.com/gpurack/gpurack/pxe/dhcp"
	"github.com/gpurack/gpurack/pxe/tftp"
)

// The files pxe/systemd ships, relative to this package.
const (
	unitFile     = "../systemd/gpuboot.service"
	sysusersFile = "../systemd/sysusers.d/gpuboot.conf"
	sysctlFile   = "../systemd/sysctl.d/90-gpuboot.conf"
	unitBinary   = "/usr/local/bin/gpuboot"
)

// unitDirectives reads a unit file (or a sysctl.d file, the same NAME = VALUE lines)
// into its directives, each name with its values in the order given (a name may
// repeat, as SystemCallFilter= does).
func unitDirectives(t *testing.T, path string) map[string][]string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	d := map[string][]string{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, "[") {
			continue
		}
		name, value, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("%s: %q is not NAME=VALUE", path, line)
		}
		name, value = strings.TrimSpace(name), strings.TrimSpace(value)
		d[name] = append(d[name], value)
	}
	return d
}

// TestGpubootUnitVerifies checks pxe/systemd/gpuboot.service with systemd-analyze verify,
// its ExecStart pointed at a freshly built gpuboot (the unit names /usr/local/bin/gpuboot),
// and that it keeps the settings decision 0688 relies on. It does not run the unit: no
// test runs under a systemd PID 1.
func TestGpubootUnitVerifies(t *testing.T) {
	sa := testreq.Tool(t, "systemd-analyze", "apt-get install systemd (hack/deps.sh lists it); it verifies the unit")
	d := unitDirectives(t, unitFile)
	want := map[string]string{
		"ExecStart":               unitBinary + " serve --config /etc/gpuboot/gpuboot.yaml",
		"After":                   "network-online.target",
		"Wants":                   "network-online.target",
		"Restart":                 "on-failure",
		"User":                    "gpuboot",
		"StateDirectory":          "gpuboot",
		"CapabilityBoundingSet":   "CAP_NET_BIND_SERVICE",
		"AmbientCapabilities":     "CAP_NET_BIND_SERVICE",
		"NoNewPrivileges":         "yes",
		"ProtectSystem":           "strict",
		"ProtectHome":             "yes",
		"PrivateTmp":              "yes",
		"PrivateDevices":          "yes",
		"ProtectKernelModules":    "yes",
		"ProtectKernelTunables":   "yes",
		"ProtectControlGroups":    "yes",
		"RestrictAddressFamilies": "AF_INET AF_INET6 AF_NETLINK AF_UNIX",
		"StandardError":           "journal",
		"SystemCallErrorNumber":   "EPERM",
	}
	for name, value := range want {
		if got := d[name]; !slices.Equal(got, []string{value}) {
			t.Errorf("%s=%q, want %s=%s", name, got, name, value)
		}
	}
	if got, filter := d["SystemCallFilter"], []string{"@system-service", "~@privileged @resources"}; !slices.Equal(got, filter) {
		t.Errorf("SystemCallFilter=%q, want %q", got, filter)
	}
	for _, name := range []string{"DynamicUser", "PrivateUsers", "ReadWritePaths"} {
		if v, ok := d[name]; ok {
			t.Errorf("%s=%q: decision 0688 says why the unit has none", name, v)
		}
	}
	exe := gpubootBinary(t)
	data, err := os.ReadFile(unitFile)
	if err != nil {
		t.Fatal(err)
	}
	unit := filepath.Join(t.TempDir(), "gpuboot.service")
	if err := os.WriteFile(unit, bytes.Replace(data, []byte(unitBinary+" "), []byte(exe+" "), 1), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(sa, "verify", unit).CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		t.Fatalf("systemd-analyze verify %s: %v\n%s", unitFile, err, out)
	}
}

// TestGpubootUnitMatchesExample: the state directory the unit makes writable is the
// stateDir of docs/examples/gpuboot.yaml, and the operator-token file gpuboot rewrites
// lies inside it (ProtectSystem=strict makes everything else read-only).
func TestGpubootUnitMatchesExample(t *testing.T) {
	d := unitDirectives(t, unitFile)
	data, err := os.ReadFile("../../docs/examples/gpuboot.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var example struct {
		StateDir string `yaml:"stateDir"`
		Admin    struct {
			TokensFile string `yaml:"tokensFile"`
		} `yaml:"admin"`
	}
	if err := yaml.Unmarshal(data, &example); err != nil {
		t.Fatal(err)
	}
	stateDir := "/var/lib/" + strings.Join(d["StateDirectory"], "")
	if example.StateDir != stateDir {
		t.Errorf("docs/examples/gpuboot.yaml stateDir %q, the unit's StateDirectory is %s", example.StateDir, stateDir)
	}
	if !strings.HasPrefix(example.Admin.TokensFile, stateDir+"/") {
		t.Errorf("docs/examples/gpuboot.yaml admin.tokensFile %q is outside %s, which is all the unit lets gpuboot write", example.Admin.TokensFile, stateDir)
	}
}

// TestGpubootSysusers makes the user the unit runs as with systemd-sysusers in a scratch
// root, and checks that the sysctl drop-in gives DHCP the receive buffer it asks for.
func TestGpubootSysusers(t *testing.T) {
	sysusers := testreq.Tool(t, "systemd-sysusers", "apt-get install systemd (hack/deps.sh lists it); it reads pxe/systemd/sysusers.d")
	d := unitDirectives(t, unitFile)
	// Installed where docs/pxe.md says, in a scratch root that systemd-sysusers fills.
	root := t.TempDir()
	conf, err := os.ReadFile(sysusersFile)
	if err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(root, "etc", "sysusers.d"), 0o755)
	if err := os.WriteFile(filepath.Join(root, "etc", "sysusers.d", "gpuboot.conf"), conf, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(sysusers, "--root="+root).CombinedOutput(); err != nil {
		t.Fatalf("systemd-sysusers: %v\n%s", err, out)
	}
	passwd, err := os.ReadFile(filepath.Join(root, "etc", "passwd"))
	if err != nil {
		t.Fatal(err)
	}
	wantUser := strings.Join(d["User"], "") + ":"
	wantHome := ":/var/lib/" + strings.Join(d["StateDirectory"], "") + ":"
	found := false
	for line := range strings.SplitSeq(string(passwd), "\n") {
		if strings.HasPrefix(line, wantUser) && strings.Contains(line, wantHome) {
			found = true
		}
	}
	if !found {
		t.Errorf("systemd-sysusers made no user %s with home %s:\n%s", wantUser, wantHome, passwd)
	}
	sysctl := unitDirectives(t, sysctlFile)
	rmem, err := strconv.Atoi(strings.Join(sysctl["net.core.rmem_max"], ""))
	if err != nil || rmem < dhcp.ReceiveBuffer {
		t.Errorf("%s: net.core.rmem_max = %d (%v), want at least dhcp.ReceiveBuffer = %d", sysctlFile, rmem, err, dhcp.ReceiveBuffer)
	}
}

// unitCredentials is the setpriv command line that runs name as a user other than root
// with only the capabilities the unit grants (none when capabilities is false), as
// systemd would start it. Any unprivileged uid does: gpuboot needs no particular one.
func unitCredentials(d map[string][]string, capabilities bool, name string, args ...string) []string {
	caps := ""
	if capabilities {
		for c := range strings.FieldsSeq(strings.Join(d["AmbientCapabilities"], " ")) {
			caps += ",+" + strings.ToLower(strings.TrimPrefix(c, "CAP_"))
		}
	}
	bounding := ""
	for c := range strings.FieldsSeq(strings.Join(d["CapabilityBoundingSet"], " ")) {
		bounding += ",+" + strings.ToLower(strings.TrimPrefix(c, "CAP_"))
	}
	cmd := []string{"--reuid=65534", "--regid=65534", "--clear-groups", "--no-new-privs",
		"--bounding-set=-all" + bounding, "--inh-caps=-all" + caps}
	if caps != "" {
		cmd = append(cmd, "--ambient-caps="+strings.TrimPrefix(caps, ","))
	}
	return append(append(cmd, name), args...)
}

// TestGpubootUnitCapabilities runs the real `gpuboot serve`, DHCP and TFTP on a veth in a
// network namespace, as an unprivileged user holding only the capabilities the unit
// grants (setpriv, as systemd's User= and AmbientCapabilities= would): it must open
// DHCP's ports 67 and 4011, TFTP's 69, HTTP and TLS, send a file over TFTP and write its
// inventory. Without those capabilities it must fail at port 67, saying so. The rest of
// the unit's sandbox is systemd's and is not applied here.
func TestGpubootUnitCapabilities(t *testing.T) {
	netnstest.Require(t)
	setpriv := testreq.Tool(t, "setpriv", "apt-get install util-linux; it drops root's privileges as the unit does")
	testreq.File(t, filepath.Join(tftp.DefaultDir, "ipxe.efi"), "apt-get install ipxe (make deps installs it)")
	d := unitDirectives(t, unitFile)
	env, srvNS, cliNS, in := proxyInstanceInNamespaces(t)
	// The unprivileged user owns the state as the unit's user would, and can reach it
	// and the binary through the test's private temporary directories.
	for _, dir := range []string{filepath.Dir(in.dir), filepath.Dir(in.bin)} {
		if err := os.Chmod(dir, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := exec.Command("chown", "-R", "65534:65534", in.dir).CombinedOutput(); err != nil {
		t.Fatalf("chown: %v\n%s", err, out)
	}

	out, err := env.Run(srvNS, setpriv, unitCredentials(d, false, in.bin, "serve", "--config", in.cfg)...)
	if err == nil || !strings.Contains(out, "port 67") || !strings.Contains(out, "permission denied") {
		t.Fatalf("gpuboot serve without capabilities: %v, want a failure binding port 67 with permission denied:\n%s", err, out)
	}

	cmd := env.Command(srvNS, setpriv, unitCredentials(d, true, in.bin, "serve", "--config", in.cfg)...)
	var log strings.Builder
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// A gpuboot that exits ends the wait at once; its log is read only once it has.
	exited := make(chan struct{})
	go func() { cmd.Wait(); cancel(); close(exited) }()
	fail := func(format string, args ...any) {
		t.Helper()
		cmd.Process.Kill()
		<-exited
		t.Fatalf(format+"\ngpuboot serve's log:\n%s", append(args, log.String())...)
	}
	for _, p := range []struct{ network, addr string }{
		{"tcp", "192.0.2.1:8443"}, {"tcp", "192.0.2.1:8080"}, {"udp", "0.0.0.0:67"}, {"udp", "0.0.0.0:4011"}, {"udp", "0.0.0.0:69"},
	} {
		if err := netnstest.WaitPortIn(ctx, srvNS, p.network, p.addr); err != nil {
			fail("gpuboot serve with the unit's capabilities not listening on %s %s: %v", p.network, p.addr, err)
		}
	}
	fetched := filepath.Join(t.TempDir(), "ipxe.efi")
	if o, err := env.Run(cliNS, "curl", "-sS", "-o", fetched, "tftp://192.0.2.1/ipxe.efi"); err != nil {
		fail("curl tftp: %v\n%s", err, o)
	}
	if o, err := env.Run(cliNS, "curl", "-sS", "http://192.0.2.1:8080/boot.ipxe?mac=52:54:00:dd:00:02&serial=CAP-1"); err != nil {
		fail("curl boot.ipxe: %v\n%s", err, o)
	}
	list, err := env.Run(srvNS, in.bin, "machines", "list", "--server", "192.0.2.1:8443", "--credentials", in.creds)
	if err != nil || !strings.Contains(list, "52:54:00:dd:00:02") {
		fail("machines list: the unprivileged gpuboot did not record the machine: %v\n%s", err, list)
	}
	cmd.Process.Kill()
	<-exited
}
