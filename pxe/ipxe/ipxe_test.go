package ipxe

import (
	"errors"
	"strings"
	"testing"
)

const pin = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func bootScript() Script {
	base := "http://10.88.0.1:8080/images/0123456789abcdef0123456789abcdef01234567/"
	return Script{
		Action:      Boot,
		ScriptURL:   "http://10.88.0.1:8080/boot.ipxe",
		ImageID:     "0123456789abcdef0123456789abcdef01234567",
		KernelURL:   base + "vmlinuz",
		InitrdURL:   base + "initrd.img",
		RootfsURL:   base + "rootfs.squashfs",
		Cmdline:     "console=ttyS0,115200 quiet initrd=other.img gpurack.rootfs.sha256=abc\n",
		ExtraArgs:   []string{"gpurack.rack=r1"},
		EnrollAddr:  "10.88.0.1:8443",
		EnrollCAPin: pin,
	}
}

func TestRenderBoot(t *testing.T) {
	got, err := Render(bootScript())
	if err != nil {
		t.Fatal(err)
	}
	want := `#!ipxe
echo gpurack: booting image 0123456789abcdef0123456789abcdef01234567
kernel http://10.88.0.1:8080/images/0123456789abcdef0123456789abcdef01234567/vmlinuz console=ttyS0,115200 quiet gpurack.rootfs.sha256=abc gpurack.rack=r1 initrd=initrd.img gpurack.rootfs=http://10.88.0.1:8080/images/0123456789abcdef0123456789abcdef01234567/rootfs.squashfs BOOTIF=01-${net0/mac:hexhyp} gpurack.enroll=10.88.0.1:8443 gpurack.enroll.ca=` + pin + ` || goto failed
initrd http://10.88.0.1:8080/images/0123456789abcdef0123456789abcdef01234567/initrd.img || goto failed
boot || goto failed
:failed
echo gpurack: boot failed; retrying in 10 s
sleep 10
chain --replace --autofree http://10.88.0.1:8080/boot.ipxe?mac=${net0/mac}&uuid=${uuid}&serial=${serial:uristring}
`
	if string(got) != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
}

func TestRenderHoldAndIdentify(t *testing.T) {
	got, err := Render(Script{Action: Hold, ScriptURL: "http://gpuboot:8080/boot.ipxe"})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"#!ipxe\n", "waiting for approval", "sleep 30\n", "chain --replace --autofree http://gpuboot:8080/boot.ipxe?mac=${net0/mac}"} {
		if !strings.Contains(string(got), want) {
			t.Errorf("hold script lacks %q:\n%s", want, got)
		}
	}
	got, err = Render(Script{Action: Identify, ScriptURL: "http://gpuboot:8080/boot.ipxe"})
	if err != nil {
		t.Fatal(err)
	}
	if want := "#!ipxe\nchain --replace --autofree http://gpuboot:8080/boot.ipxe?" + IdentifyQuery + "\n"; string(got) != want {
		t.Errorf("identify script %q; want %q", got, want)
	}
}

func TestRenderRefuses(t *testing.T) {
	for name, mutate := range map[string]func(*Script){
		"dollar in cmdline":   func(s *Script) { s.Cmdline = "a=${ip}" },
		"quote in extra":      func(s *Script) { s.ExtraArgs = []string{`a="b`} },
		"space in extra":      func(s *Script) { s.ExtraArgs = []string{"a b"} },
		"newline in extra":    func(s *Script) { s.ExtraArgs = []string{"a\nshell"} },
		"bad pin":             func(s *Script) { s.EnrollCAPin = "sha256:ABC" },
		"initrd name":         func(s *Script) { s.InitrdURL = "http://h/images/x/initrd.gz" },
		"kernel not http":     func(s *Script) { s.KernelURL = "tftp://h/vmlinuz" },
		"kernel with space":   func(s *Script) { s.KernelURL = "http://h/a b" },
		"no script url":       func(s *Script) { s.ScriptURL = "" },
		"newline in image id": func(s *Script) { s.ImageID = "x\nshell" },
		"unknown action":      func(s *Script) { s.Action = 99 },
	} {
		s := bootScript()
		mutate(&s)
		if got, err := Render(s); err == nil {
			t.Errorf("%s: rendered\n%s", name, got)
		}
	}
	s := bootScript()
	s.Cmdline = "x=$y"
	if _, err := Render(s); !errors.Is(err, ErrUnsafe) {
		t.Errorf("want ErrUnsafe, got %v", err)
	}
}

func TestBootArgsAlwaysCarryContract(t *testing.T) {
	s := bootScript()
	s.Cmdline = ""
	s.ExtraArgs = nil
	s.EnrollAddr, s.EnrollCAPin = "", ""
	args, err := BootArgs(s)
	if err != nil {
		t.Fatal(err)
	}
	if args[0] != "initrd=initrd.img" || !strings.HasPrefix(args[1], "gpurack.rootfs=") || args[2] != "BOOTIF=01-${net0/mac:hexhyp}" {
		t.Errorf("args %q", args)
	}
}

// FuzzRender: whatever an image's cmdline or a selector's extra argument
// holds, Render either refuses it or writes a script whose lines are all
// gpuboot's own and whose kernel line carries the contract's arguments.
func FuzzRender(f *testing.F) {
	f.Add("console=ttyS0,115200 quiet", "gpurack.rack=r1")
	f.Add("a=${ip} b", "x\nshell")
	f.Add("initrd=evil.img", "BOOTIF=01-00")
	f.Fuzz(func(t *testing.T, cmdline, extra string) {
		s := bootScript()
		s.Cmdline = cmdline
		s.ExtraArgs = []string{extra}
		out, err := Render(s)
		if err != nil {
			return
		}
		var kernel string
		for _, line := range strings.Split(strings.TrimSuffix(string(out), "\n"), "\n") {
			switch strings.SplitN(line, " ", 2)[0] {
			case "kernel":
				kernel = line
			case "#!ipxe", "echo", "initrd", "boot", ":failed", "sleep", "chain":
			default:
				t.Fatalf("foreign line %q", line)
			}
		}
		initrds := 0
		for _, field := range strings.Fields(kernel) {
			if strings.HasPrefix(field, "initrd=") {
				initrds++
			}
		}
		if initrds != 1 || !strings.Contains(kernel, " initrd=initrd.img ") ||
			strings.Count(kernel, "${") != 1 || !strings.Contains(kernel, "gpurack.enroll.ca="+pin) {
			t.Fatalf("kernel line %q", kernel)
		}
	})
}
