// Package ipxe renders the iPXE scripts gpuboot serves at /boot.ipxe: the
// script that asks iPXE for the machine's identity, the script that boots
// an image, and the "waiting for approval" script. Rendering is pure: no
// I/O, no clock; the caller (pxe/httpboot) decides which script a machine
// gets and supplies the URLs and the image's cmdline file.
//
// Every boot script carries the kernel arguments of docs/contracts.md §3, in
// this order after the image's own cmdline and the caller's extra
// arguments:
//
//	initrd=initrd.img  gpurack.rootfs=<url>  BOOTIF=01-${net0/mac:hexhyp}
//	gpurack.enroll=<host:port>  gpurack.enroll.ca=sha256:<hex>
//
// initrd= is always present: the Debian iPXE build for EFI hands the
// initrd to the kernel only when the command line names it (without it the
// kernel panics with "VFS: Unable to mount root fs"); on BIOS it is
// harmless.
//
// iPXE expands ${…} and splits on quotes and whitespace in every command
// it runs, so arguments from an image or the operator that contain "$",
// quotes, backslashes, whitespace or control characters are refused, not
// escaped: a script must never run something its author did not write.
//
// This package does not fetch images, decide policy or build URLs from a
// request; see pxe/httpboot.
package ipxe

import (
	"errors"
	"fmt"
	"net/url"
	"path"
	"regexp"
	"strings"
)

// Action is what a script makes the machine do.
type Action int

const (
	// Identify chains back to the script URL with the machine's MAC,
	// SMBIOS UUID and serial in the query.
	Identify Action = iota + 1
	// Boot loads an image's kernel and initrd and boots it.
	Boot
	// Hold prints a waiting message and chains the script URL again after
	// RetrySeconds.
	Hold
)

// InitrdName is the initrd's image name inside iPXE: the last path segment
// of the initrd URL, and the value of the initrd= kernel argument.
const InitrdName = "initrd.img"

// DefaultRetrySeconds is how long a held machine waits before asking again
// (docs/contracts.md §2 step 2).
const DefaultRetrySeconds = 30

// Script is the input of Render.
type Script struct {
	Action Action

	// ScriptURL is the absolute URL of /boot.ipxe, without a query; Identify
	// and Hold chain to it, and Boot falls back to it when loading fails.
	ScriptURL string

	// Boot only.
	ImageID   string
	KernelURL string // …/images/<id>/vmlinuz
	InitrdURL string // …/images/<id>/initrd.img; its last segment must be InitrdName
	RootfsURL string // …/images/<id>/rootfs.squashfs
	// Cmdline is the content of the image's cmdline file (the profile's
	// arguments and gpurack.rootfs.sha256=HEX), whitespace-separated.
	Cmdline string
	// ExtraArgs are appended after Cmdline (for example from a selector).
	ExtraArgs []string
	// EnrollAddr is host:port of gpuboot's TLS listener; EnrollCAPin is
	// "sha256:" + 64 lowercase hex digits (docs/contracts.md §3).
	EnrollAddr  string
	EnrollCAPin string

	// Hold only: a one-line message and the retry interval (0 means
	// DefaultRetrySeconds).
	HoldMessage  string
	RetrySeconds int
}

// ErrUnsafe marks an argument or URL that iPXE would reinterpret.
var ErrUnsafe = errors.New("unsafe in an iPXE script")

var (
	pinRE  = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)
	safeRE = regexp.MustCompile(`^[A-Za-z0-9._~:/?#\[\]@!&()*+,;=%-]+$`)
)

// IdentifyQuery is the query iPXE fills in when it chains back to the
// script URL: its MAC, SMBIOS UUID and serial (URI-escaped).
const IdentifyQuery = "mac=${net0/mac}&uuid=${uuid}&serial=${serial:uristring}"

// Render returns the script for s, or an error naming the bad field.
func Render(s Script) ([]byte, error) {
	if err := checkURL("script URL", s.ScriptURL); err != nil {
		return nil, err
	}
	var b strings.Builder
	b.WriteString("#!ipxe\n")
	switch s.Action {
	case Identify:
		fmt.Fprintf(&b, "chain --replace --autofree %s?%s\n", s.ScriptURL, IdentifyQuery)
	case Hold:
		secs := s.RetrySeconds
		if secs <= 0 {
			secs = DefaultRetrySeconds
		}
		msg := s.HoldMessage
		if msg == "" {
			msg = "waiting for approval"
		}
		if err := checkText("hold message", msg); err != nil {
			return nil, err
		}
		fmt.Fprintf(&b, "echo gpurack: ${net0/mac} %s; retrying in %d s\n", msg, secs)
		fmt.Fprintf(&b, "sleep %d\n", secs)
		fmt.Fprintf(&b, "chain --replace --autofree %s?%s\n", s.ScriptURL, IdentifyQuery)
	case Boot:
		args, err := BootArgs(s)
		if err != nil {
			return nil, err
		}
		for _, u := range []struct{ name, v string }{{"kernel URL", s.KernelURL}, {"initrd URL", s.InitrdURL}} {
			if err := checkURL(u.name, u.v); err != nil {
				return nil, err
			}
		}
		if path.Base(s.InitrdURL) != InitrdName {
			return nil, fmt.Errorf("initrd URL %q: the last path segment must be %q, the name initrd= refers to", s.InitrdURL, InitrdName)
		}
		if err := checkText("image id", s.ImageID); err != nil {
			return nil, err
		}
		fmt.Fprintf(&b, "echo gpurack: booting image %s\n", s.ImageID)
		fmt.Fprintf(&b, "kernel %s %s || goto failed\n", s.KernelURL, strings.Join(args, " "))
		fmt.Fprintf(&b, "initrd %s || goto failed\n", s.InitrdURL)
		b.WriteString("boot || goto failed\n")
		b.WriteString(":failed\n")
		b.WriteString("echo gpurack: boot failed; retrying in 10 s\n")
		b.WriteString("sleep 10\n")
		fmt.Fprintf(&b, "chain --replace --autofree %s?%s\n", s.ScriptURL, IdentifyQuery)
	default:
		return nil, fmt.Errorf("render iPXE script: unknown action %d", s.Action)
	}
	return []byte(b.String()), nil
}

// BootArgs returns the kernel arguments of a Boot script: the image's
// cmdline, ExtraArgs, then the docs/contracts.md §3 arguments. Arguments that
// the contract sets (initrd=, gpurack.rootfs=, BOOTIF=, gpurack.enroll=,
// gpurack.enroll.ca=) are dropped from the cmdline and ExtraArgs, so the
// contract's values win.
func BootArgs(s Script) ([]string, error) {
	if err := checkURL("rootfs URL", s.RootfsURL); err != nil {
		return nil, err
	}
	if s.EnrollAddr != "" {
		if err := checkText("enroll address", s.EnrollAddr); err != nil {
			return nil, err
		}
		if !pinRE.MatchString(s.EnrollCAPin) {
			return nil, fmt.Errorf("enroll CA pin %q: want sha256: and 64 lowercase hex digits (docs/contracts.md §3)", s.EnrollCAPin)
		}
	}
	var args []string
	add := func(from string, list []string) error {
		for _, a := range list {
			if err := checkArg(a); err != nil {
				return fmt.Errorf("%s: %w", from, err)
			}
			if reserved(a) {
				continue
			}
			args = append(args, a)
		}
		return nil
	}
	if err := add("image cmdline", strings.Fields(s.Cmdline)); err != nil {
		return nil, err
	}
	if err := add("extra kernel arguments", s.ExtraArgs); err != nil {
		return nil, err
	}
	args = append(args,
		"initrd="+InitrdName,
		"gpurack.rootfs="+s.RootfsURL,
		"BOOTIF=01-${net0/mac:hexhyp}",
	)
	if s.EnrollAddr != "" {
		args = append(args, "gpurack.enroll="+s.EnrollAddr, "gpurack.enroll.ca="+s.EnrollCAPin)
	}
	return args, nil
}

// reservedPrefixes are the arguments BootArgs sets itself.
var reservedPrefixes = []string{"initrd=", "gpurack.rootfs=", "BOOTIF=", "gpurack.enroll=", "gpurack.enroll.ca="}

func reserved(arg string) bool {
	for _, p := range reservedPrefixes {
		if strings.HasPrefix(arg, p) {
			return true
		}
	}
	return false
}

// checkArg refuses a kernel argument iPXE would expand, split or choke on.
func checkArg(a string) error {
	if a == "" {
		return fmt.Errorf("empty argument: %w", ErrUnsafe)
	}
	for i := 0; i < len(a); i++ {
		c := a[i]
		if c <= ' ' || c >= 0x7f || c == '$' || c == '"' || c == '\'' || c == '\\' || c == '{' || c == '}' {
			return fmt.Errorf("argument %q has %q at byte %d: %w (iPXE expands ${…} and splits on quotes and spaces)", a, c, i, ErrUnsafe)
		}
	}
	return nil
}

func checkText(name, v string) error {
	if v == "" {
		return fmt.Errorf("%s is empty", name)
	}
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c < ' ' || c >= 0x7f || c == '$' || c == '"' || c == '\'' || c == '\\' || c == '{' || c == '}' || c == ';' || c == '|' || c == '&' {
			return fmt.Errorf("%s %q has %q at byte %d: %w", name, v, c, i, ErrUnsafe)
		}
	}
	return nil
}

// checkURL accepts an absolute http(s) URL made of URL characters only.
func checkURL(name, v string) error {
	if v == "" {
		return fmt.Errorf("%s is empty", name)
	}
	if !safeRE.MatchString(v) {
		return fmt.Errorf("%s %q: %w: only URL characters are allowed", name, v, ErrUnsafe)
	}
	u, err := url.Parse(v)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%s %q: want an absolute http:// or https:// URL", name, v)
	}
	return nil
}
