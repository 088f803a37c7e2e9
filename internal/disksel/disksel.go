// Package disksel is the data-disk selector: the rules a profile, and gpuboot per rack
// or machine selector, write under dataDisks to say which of a node's disks gpurack may
// use (docs/storage.md), parsed with errors that name the rule and what to write, and
// matched against a disk as sysfs describes it. It is pure (no I/O), so the profile
// schema, gpuboot's configuration and the agent (agent/datadisk) share one parser.
package disksel

import (
	"errors"
	"fmt"
	"math/big"
	"path"
	"strings"
)

// Transport is how a disk is attached, as the agent reads it from sysfs.
type Transport string

// The transports the agent tells apart (agent/datadisk.Discover). TransportLoop is only
// ever seen in the agent's tests; no rule may name it.
const (
	TransportNVMe    Transport = "nvme"
	TransportSATA    Transport = "sata"
	TransportSAS     Transport = "sas"
	TransportSCSI    Transport = "scsi"
	TransportVirtio  Transport = "virtio"
	TransportUSB     Transport = "usb"
	TransportMMC     Transport = "mmc"
	TransportLoop    Transport = "loop"
	TransportUnknown Transport = ""
)

var transports = []Transport{TransportNVMe, TransportSATA, TransportSAS, TransportSCSI, TransportVirtio, TransportUSB, TransportMMC, TransportLoop}

// RuleSpec is one data-disk rule as the profile, and gpuboot per rack or selector, write
// it (YAML). Every field that is set must match; an empty field matches any disk. A rule
// with no field set is an error, not "every disk".
//
//	dataDisks:
//	  - transport: nvme
//	    model: "SAMSUNG MZ*"
//	    minSize: 1.92T
//	  - path: /dev/sdb
type RuleSpec struct {
	// Path is a glob over the device path, e.g. /dev/nvme*n1 (path.Match syntax).
	Path string `yaml:"path,omitempty" json:"path,omitempty"`
	// Model is a glob over the disk's model as sysfs reports it, spaces trimmed, e.g.
	// "SAMSUNG MZQL2*"; case matters.
	Model string `yaml:"model,omitempty" json:"model,omitempty"`
	// MinSize and MaxSize bound the disk's size, inclusive: bytes, or a number with a
	// decimal (K M G T P, also KB…PB) or binary (KiB…PiB) unit, e.g. 960G, 3.84T, 1TiB.
	MinSize string `yaml:"minSize,omitempty" json:"minSize,omitempty"`
	MaxSize string `yaml:"maxSize,omitempty" json:"maxSize,omitempty"`
	// Transport is one of nvme, sata, sas, scsi, virtio, usb, mmc.
	Transport string `yaml:"transport,omitempty" json:"transport,omitempty"`
}

// Rule is a parsed RuleSpec.
type Rule struct {
	Path, Model      string    // globs; "" matches any
	MinSize, MaxSize int64     // bytes; 0 is no bound
	Transport        Transport // "" matches any
}

// Selector says which disks gpurack may use as data disks: a disk is selected when any
// rule matches it. The zero Selector selects no disk, which is the default: with no
// rules, nothing is touched.
type Selector struct {
	Rules []Rule
}

// ParseSelector parses the rules of field (the name the errors use, e.g.
// "dataDisks"). The errors name the rule and its field and say what to write.
func ParseSelector(field string, specs []RuleSpec) (Selector, error) {
	var s Selector
	var errs []error
	for i, spec := range specs {
		r, err := ParseRule(spec)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s[%d].%w", field, i, err))
			continue
		}
		s.Rules = append(s.Rules, r)
	}
	if len(errs) > 0 {
		return Selector{}, errors.Join(errs...)
	}
	return s, nil
}

// FieldError is what is wrong with one field of a rule: Field is the RuleSpec's YAML
// name (path, model, minSize, maxSize, transport), Msg says what to write instead.
type FieldError struct {
	Field, Msg string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Msg }

// ruleError is a field's error; ParseSelector prefixes the rule.
func ruleError(field, format string, args ...any) error {
	return &FieldError{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// ParseRule parses one rule; its error is a *FieldError. A caller that reports errors
// by position (the profile's validator) uses it; others use ParseSelector.
func ParseRule(spec RuleSpec) (Rule, error) {
	r := Rule{Path: spec.Path, Model: spec.Model}
	if spec == (RuleSpec{}) {
		return Rule{}, ruleError("path", "the rule sets no field, and gpurack will not take every disk; write at least one of path, model, minSize, maxSize or transport (e.g. transport: nvme)")
	}
	if spec.Path != "" {
		if !strings.HasPrefix(spec.Path, "/dev/") {
			return Rule{}, ruleError("path", "%q is not a device path; write a glob under /dev, e.g. /dev/nvme*n1", spec.Path)
		}
		if _, err := path.Match(spec.Path, ""); err != nil {
			return Rule{}, ruleError("path", "%q is not a valid glob (%v); write e.g. /dev/nvme*n1, with [ ] closed", spec.Path, err)
		}
	}
	if spec.Model != "" {
		if strings.TrimSpace(spec.Model) != spec.Model {
			return Rule{}, ruleError("model", "%q starts or ends with a space; models are compared with spaces trimmed, write e.g. \"SAMSUNG MZQL2*\"", spec.Model)
		}
		if _, err := path.Match(spec.Model, ""); err != nil {
			return Rule{}, ruleError("model", "%q is not a valid glob (%v); write e.g. \"SAMSUNG MZQL2*\", with [ ] closed", spec.Model, err)
		}
	}
	var err error
	if r.MinSize, err = parseSizeField("minSize", spec.MinSize); err != nil {
		return Rule{}, err
	}
	if r.MaxSize, err = parseSizeField("maxSize", spec.MaxSize); err != nil {
		return Rule{}, err
	}
	if r.MinSize > 0 && r.MaxSize > 0 && r.MinSize > r.MaxSize {
		return Rule{}, ruleError("maxSize", "%s is below minSize %s; write a maxSize at least minSize, or leave it out", spec.MaxSize, spec.MinSize)
	}
	if spec.Transport != "" {
		t := Transport(spec.Transport)
		known := false
		for _, k := range transports {
			known = known || (k == t && k != TransportLoop)
		}
		if !known {
			return Rule{}, ruleError("transport", "%q is not a transport; write one of nvme, sata, sas, scsi, virtio, usb, mmc", spec.Transport)
		}
		r.Transport = t
	}
	return r, nil
}

func parseSizeField(field, s string) (int64, error) {
	if s == "" {
		return 0, nil
	}
	n, err := ParseSize(s)
	if err != nil {
		return 0, ruleError(field, "%v", err)
	}
	if n == 0 {
		return 0, ruleError(field, "%q is zero; leave the field out for no bound", s)
	}
	return n, nil
}

var sizeUnits = map[string]int64{
	"": 1, "B": 1,
	"K": 1e3, "KB": 1e3, "M": 1e6, "MB": 1e6, "G": 1e9, "GB": 1e9, "T": 1e12, "TB": 1e12, "P": 1e15, "PB": 1e15,
	"KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "TIB": 1 << 40, "PIB": 1 << 50,
}

// ParseSize reads a size in bytes: a decimal number, maybe with a fraction, and a unit:
// decimal K M G T P (or KB…PB, as drive vendors count), binary KiB…PiB, or none or B for
// bytes. Units are case-insensitive. The result is rounded down to a whole byte.
func ParseSize(s string) (int64, error) {
	bad := func(why string) error {
		return fmt.Errorf("%q is not a size (%s); write a number with a unit, e.g. 960G, 3.84T or 1TiB (decimal K M G T P, binary KiB MiB GiB TiB PiB)", s, why)
	}
	num := strings.TrimSpace(s)
	end := 0
	for end < len(num) && (num[end] >= '0' && num[end] <= '9' || num[end] == '.') {
		end++
	}
	digits, unit := num[:end], strings.ToUpper(strings.TrimSpace(num[end:]))
	if digits == "" || strings.Count(digits, ".") > 1 || digits[0] == '.' || digits[len(digits)-1] == '.' || len(digits) > 30 {
		return 0, bad("no number")
	}
	mult, ok := sizeUnits[unit]
	if !ok {
		return 0, bad(fmt.Sprintf("unknown unit %q", num[end:]))
	}
	v, ok := new(big.Rat).SetString(digits)
	if !ok {
		return 0, bad("no number")
	}
	v.Mul(v, new(big.Rat).SetInt64(mult))
	n := new(big.Int).Quo(v.Num(), v.Denom())
	if !n.IsInt64() {
		return 0, bad("too large")
	}
	return n.Int64(), nil
}

// Disk is what a rule is matched against: a whole disk as sysfs describes it.
type Disk struct {
	Path      string // device node, e.g. /dev/nvme0n1
	Model     string // as sysfs reports it; compared with spaces trimmed
	Size      int64  // bytes
	Transport Transport
	// ReadOnly and Removable disks are never selected (Selector.Selects).
	ReadOnly, Removable bool
}

// Match reports whether r matches d, whatever d's flags (see Selector.Selects).
func (r Rule) Match(d Disk) bool {
	if r.Path != "" {
		if ok, _ := path.Match(r.Path, d.Path); !ok {
			return false
		}
	}
	if r.Model != "" {
		if ok, _ := path.Match(r.Model, strings.TrimSpace(d.Model)); !ok {
			return false
		}
	}
	if r.MinSize > 0 && d.Size < r.MinSize {
		return false
	}
	if r.MaxSize > 0 && d.Size > r.MaxSize {
		return false
	}
	if r.Transport != "" && d.Transport != r.Transport {
		return false
	}
	return r != Rule{} // a zero Rule, built by hand, matches nothing
}

// Selects reports whether some rule matches d. A read-only disk (nothing can be
// prepared on it) and a removable one (a BMC's virtual media, a USB stick) are never
// selected, whatever the rules say.
func (s Selector) Selects(d Disk) bool {
	if d.ReadOnly || d.Removable {
		return false
	}
	for _, r := range s.Rules {
		if r.Match(d) {
			return true
		}
	}
	return false
}
