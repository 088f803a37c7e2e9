package datadisk

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
)

// Probe is what blkid's low-level probe (`blkid -p -o export`) found in one place of a
// disk: its fields (TYPE, USAGE, LABEL, PTTYPE, …), or Ambivalent when it found more than
// one signature and named none.
type Probe struct {
	Fields     map[string]string
	Ambivalent bool
}

// Found reports whether the probe saw anything.
func (p Probe) Found() bool { return p.Ambivalent || len(p.Fields) > 0 }

// blkid's exit codes with -p (blkid(8)): 2 nothing was identified, 8 an ambivalent result.
const (
	blkidNothing    = 2
	blkidAmbivalent = 8
)

// probeBlkid runs blkid's low-level probe on path, read-only, at offset bytes and for
// size bytes (0: to the end). blkid opens the device O_RDONLY and never writes.
func probeBlkid(ctx context.Context, path string, offset, size int64) (Probe, error) {
	args := []string{"-p", "-o", "export"}
	if offset > 0 {
		args = append(args, "-O", strconv.FormatInt(offset, 10))
	}
	if size > 0 {
		args = append(args, "-S", strconv.FormatInt(size, 10))
	}
	args = append(args, path)
	cmd := exec.CommandContext(ctx, "blkid", args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit) && exit.ExitCode() == blkidNothing:
		return Probe{}, nil
	case errors.As(err, &exit) && exit.ExitCode() == blkidAmbivalent:
		return Probe{Ambivalent: true}, nil
	case errors.Is(err, exec.ErrNotFound):
		return Probe{}, fmt.Errorf("blkid is not in PATH; it is part of util-linux, which the image must carry")
	default:
		return Probe{}, fmt.Errorf("blkid %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	fields, err := parseBlkidExport(stdout.Bytes())
	if err != nil {
		return Probe{}, fmt.Errorf("blkid %s: %w", strings.Join(args, " "), err)
	}
	delete(fields, "DEVNAME")
	return Probe{Fields: fields}, nil
}

// parseBlkidExport reads `blkid -o export` output: one KEY=value a line, keys in upper
// case, values with shell-special characters escaped by a backslash (util-linux
// misc-utils/blkid.c, safe_print). Blank lines separate devices; this reads one device.
// The bytes come from a disk's content (labels are anyone's), so this is fuzzed.
func parseBlkidExport(out []byte) (map[string]string, error) {
	fields := map[string]string{}
	for n, line := range strings.Split(string(out), "\n") {
		if line == "" {
			continue
		}
		key, value, ok := strings.Cut(line, "=")
		if !ok || !validBlkidKey(key) {
			return nil, fmt.Errorf("output line %d is not KEY=value: %q", n+1, line)
		}
		if _, dup := fields[key]; dup {
			return nil, fmt.Errorf("output line %d repeats %s", n+1, key)
		}
		fields[key] = unescapeBlkid(value)
	}
	return fields, nil
}

func validBlkidKey(k string) bool {
	if k == "" {
		return false
	}
	for _, c := range k {
		if !(c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// unescapeBlkid undoes safe_print's backslash before a character.
func unescapeBlkid(v string) string {
	if !strings.Contains(v, `\`) {
		return v
	}
	var b strings.Builder
	for i := 0; i < len(v); i++ {
		if v[i] == '\\' && i+1 < len(v) {
			i++
		}
		b.WriteByte(v[i])
	}
	return b.String()
}
