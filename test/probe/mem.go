package main

import (
	"bufio"
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

func memCommand(args []string, stdout io.Writer, termLog string) error {
	if len(args) != 1 {
		return errors.New("usage: probe mem COMM")
	}
	text, err := procMem("/proc", args[0])
	if err != nil {
		return err
	}
	report(stdout, termLog, text)
	return nil
}

// procMem describes the memory of every process under procRoot whose comm is comm:
// the kernel's own totals from status, then the resident set by mapping from smaps,
// grouped as hack/agent-cpu.sh groups it (the binary's text, rodata and data,
// anonymous memory, the stack, other files by name). It is an error when no process
// has that name.
func procMem(procRoot, comm string) (string, error) {
	entries, err := os.ReadDir(procRoot)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	found := 0
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		dir := filepath.Join(procRoot, e.Name())
		name, err := os.ReadFile(filepath.Join(dir, "comm"))
		if err != nil || strings.TrimSpace(string(name)) != comm {
			continue // gone, or another process
		}
		text, err := oneProcMem(dir)
		if err != nil {
			return "", fmt.Errorf("%s pid %d: %w", comm, pid, err)
		}
		found++
		fmt.Fprintf(&b, "%s pid %d: %s", comm, pid, text)
	}
	if found == 0 {
		return "", fmt.Errorf("no process named %q under %s", comm, procRoot)
	}
	return b.String(), nil
}

// oneProcMem is one process's line of totals from status and its smaps breakdown.
func oneProcMem(dir string) (string, error) {
	status, err := os.ReadFile(filepath.Join(dir, "status"))
	if err != nil {
		return "", err
	}
	totals := map[string]string{}
	for line := range strings.Lines(string(status)) {
		k, v, ok := strings.Cut(line, ":")
		if ok && slices.Contains([]string{"VmRSS", "VmHWM", "RssAnon", "RssFile"}, k) {
			totals[k] = mib(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
		}
	}
	exe, err := os.Readlink(filepath.Join(dir, "exe"))
	if err != nil {
		return "", err
	}
	f, err := os.Open(filepath.Join(dir, "smaps"))
	if err != nil {
		return "", err
	}
	defer f.Close()
	groups, err := smapsByMapping(f, exe)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "VmRSS %s, VmHWM %s, RssAnon %s, RssFile %s\n", totals["VmRSS"], totals["VmHWM"], totals["RssAnon"], totals["RssFile"])
	for _, g := range groups {
		fmt.Fprintf(&b, "  %-28s %s\n", g.name, mib(strconv.FormatUint(g.kB, 10)))
	}
	return b.String(), nil
}

// mapping is a group of mappings and their resident kilobytes.
type mapping struct {
	name string
	kB   uint64
}

// smapsByMapping sums smaps' Rss lines by mapping group, largest first; groups with
// nothing resident are left out. exe is the path of the process's binary.
func smapsByMapping(r io.Reader, exe string) ([]mapping, error) {
	sums := map[string]uint64{}
	name := ""
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 {
			continue
		}
		if strings.Contains(fields[0], "-") && !strings.HasSuffix(fields[0], ":") { // a mapping's header
			if len(fields) < 5 {
				return nil, fmt.Errorf("smaps: short mapping line %q", sc.Text())
			}
			name = mappingGroup(fields, exe)
			continue
		}
		if fields[0] == "Rss:" && len(fields) >= 2 {
			kB, err := strconv.ParseUint(fields[1], 10, 64)
			if err != nil {
				return nil, fmt.Errorf("smaps: %q: %w", sc.Text(), err)
			}
			sums[name] += kB
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	var out []mapping
	for n, kB := range sums {
		if kB > 0 {
			out = append(out, mapping{n, kB})
		}
	}
	slices.SortFunc(out, func(a, b mapping) int { return cmp.Or(cmp.Compare(b.kB, a.kB), strings.Compare(a.name, b.name)) })
	return out, nil
}

// mappingGroup names the group of a smaps header line's fields (address, perms,
// offset, device, inode, path).
func mappingGroup(fields []string, exe string) string {
	perms, path := fields[1], ""
	if len(fields) >= 6 {
		path = strings.Join(fields[5:], " ")
	}
	switch {
	case path == exe && strings.Contains(perms, "x"):
		return "binary text"
	case path == exe && strings.Contains(perms, "w"):
		return "binary data"
	case path == exe:
		return "binary rodata"
	case path == "":
		return "anonymous (Go heap, stacks)"
	case strings.HasPrefix(path, "["):
		return path
	default:
		return filepath.Base(path)
	}
}

// mib writes a count of kilobytes as MiB with one decimal ("?" when it is not one).
func mib(kB string) string {
	n, err := strconv.ParseFloat(kB, 64)
	if err != nil {
		return "?"
	}
	return fmt.Sprintf("%.1f MiB", n/1024)
}
