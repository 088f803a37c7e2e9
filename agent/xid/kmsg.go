package xid

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Record is one XID line from the kernel log.
type Record struct {
	// PCIBusID is the bus id in the line, normalised to NVML's form
	// ("00000000:3B:00.0").
	PCIBusID string
	Code     uint32
	// PID and Process are set when the line names them.
	PID     uint32
	Process string
	// Message is the text after the code and the pid/name fields.
	Message string
	// SinceBoot is the kmsg timestamp (CLOCK_MONOTONIC); zero for a bare line.
	SinceBoot time.Duration
	// Seq is the kmsg sequence number; 0 for a bare line.
	Seq uint64
}

// ParseKmsg parses one /dev/kmsg record ("PRIO,SEQ,USEC,FLAGS;MESSAGE", continuation
// lines after "\n " ignored) or a bare kernel log message, and returns the XID it
// reports. ok is false for any line that is not an NVRM Xid line; err says what is
// wrong with one that is. Formats seen in driver 470 to 570 logs:
//
//	NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.
//	NVRM: Xid (PCI:0000:18:00): 13, pid=12345, name=python, Graphics SM Warp Exception ...
//	NVRM: Xid (0000:01:00): 31, Ch 00000008, intr 10000000. MMU Fault ...
func ParseKmsg(line string) (rec Record, ok bool, err error) {
	line, _, _ = strings.Cut(line, "\n")
	msg := line
	if semi := strings.IndexByte(line, ';'); semi > 0 && !strings.Contains(line[:semi], " ") {
		fields := strings.Split(line[:semi], ",")
		if len(fields) >= 3 {
			seq, err1 := strconv.ParseUint(fields[1], 10, 64)
			usec, err2 := strconv.ParseUint(fields[2], 10, 63)
			if err1 == nil && err2 == nil {
				rec.Seq = seq
				rec.SinceBoot = time.Duration(min(usec, uint64(1<<63-1)/1000)) * time.Microsecond
			}
		}
		msg = line[semi+1:]
	}
	const tag = "NVRM: Xid ("
	i := strings.Index(msg, tag)
	if i < 0 {
		return Record{}, false, nil
	}
	rest := msg[i+len(tag):]
	bad := func(format string, args ...any) (Record, bool, error) {
		return Record{}, true, fmt.Errorf("kmsg Xid line %q: %s", truncate(msg, 120), fmt.Sprintf(format, args...))
	}
	pci, rest, found := strings.Cut(rest, "): ")
	if !found {
		return bad("no closing \"): \" after the PCI id")
	}
	bus, perr := NormalizeBusID(strings.TrimPrefix(pci, "PCI:"))
	if perr != nil {
		return bad("%v", perr)
	}
	rec.PCIBusID = bus
	codeText, rest, _ := strings.Cut(rest, ",")
	code, cerr := strconv.ParseUint(strings.TrimSpace(codeText), 10, 32)
	if cerr != nil || code == 0 {
		return bad("XID code %q is not a positive number", codeText)
	}
	rec.Code = uint32(code)
	rest = strings.TrimSpace(rest)
	if v, after, found := field(rest, "pid="); found {
		if n, err := strconv.ParseUint(strings.Trim(v, "'"), 10, 32); err == nil {
			rec.PID = uint32(n)
		}
		rest = after
	}
	if v, after, found := field(rest, "name="); found {
		if v != "<unknown>" {
			rec.Process = v
		}
		rest = after
	}
	rec.Message = strings.TrimSpace(rest)
	return rec, true, nil
}

// field reads "key=VALUE, rest" at the start of s.
func field(s, key string) (value, rest string, ok bool) {
	if !strings.HasPrefix(s, key) {
		return "", s, false
	}
	v, r, _ := strings.Cut(s[len(key):], ",")
	return strings.TrimSpace(v), strings.TrimSpace(r), true
}

// NormalizeBusID turns a PCI id as the kernel log ("0000:3b:00"), sysfs
// ("0000:3b:00.0") or NVML ("00000000:3B:00.0") writes it into NVML's form:
// 8-hex-digit domain, uppercase hex, function.
func NormalizeBusID(s string) (string, error) {
	parts := strings.Split(s, ":")
	if len(parts) == 2 {
		parts = append([]string{"0"}, parts...)
	}
	if len(parts) != 3 {
		return "", fmt.Errorf("PCI id %q is not DOMAIN:BUS:DEVICE[.FUNCTION]", s)
	}
	dev, fn, hasFn := strings.Cut(parts[2], ".")
	if !hasFn {
		fn = "0"
	}
	var n [4]uint64
	for i, p := range []struct {
		s    string
		bits int
	}{{parts[0], 32}, {parts[1], 8}, {dev, 5}, {fn, 3}} {
		if p.s == "" || len(p.s) > 8 {
			return "", fmt.Errorf("PCI id %q is not DOMAIN:BUS:DEVICE[.FUNCTION]", s)
		}
		v, err := strconv.ParseUint(p.s, 16, p.bits)
		if err != nil {
			return "", fmt.Errorf("PCI id %q is not DOMAIN:BUS:DEVICE[.FUNCTION]", s)
		}
		n[i] = v
	}
	return fmt.Sprintf("%08X:%02X:%02X.%X", n[0], n[1], n[2], n[3]), nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
