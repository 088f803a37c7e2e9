//go:build linux

// Package memtrim gives back the pages of a process's own executable that it touched
// while starting and no longer uses.
//
// A Go binary with a large dependency tree maps most of its text and read-only data
// while its package initialisers run (the kernel maps 64 KiB around every fault), so
// gpuagent's resident set is about 60 MiB of its own file pages before it does any
// work, against about 10 MiB of private memory. On a diskless node those pages are
// page cache over a squashfs held in RAM: memory the node does not otherwise get back.
// Trim asks the kernel (madvise MADV_PAGEOUT, Linux 5.4 and later) to reclaim the
// executable's file-backed pages mapped only by this process; the ones the process
// still uses fault back in (decompressed again on squashfs) as it runs. Nothing
// private or dirty is touched: only the executable's own read-only mappings are.
package memtrim

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Result is what Trim did: the mappings advised, their size, and the process's
// resident file pages (RssFile) before and after, in KiB.
type Result struct {
	Mappings             int
	Bytes                uint64
	RssFileKiB, AfterKiB uint64
}

// Trim pages out the current executable's read-only file mappings (text, rodata,
// pclntab). It returns what it did, or an error when the maps cannot be read or the
// kernel refuses the advice (EINVAL before Linux 5.4).
func Trim() (Result, error) {
	exe, err := os.Executable()
	if err != nil {
		return Result{}, err
	}
	ranges, err := exeRanges("/proc/self/maps", exe)
	if err != nil {
		return Result{}, err
	}
	var r Result
	r.RssFileKiB, _ = RssFile()
	for _, m := range ranges {
		// MADV_RANDOM first: the pages that fault back are then read one at a time,
		// not with the readahead window around each, so what comes back is what runs.
		for _, advice := range []struct {
			name string
			v    uintptr
		}{{"MADV_RANDOM", unix.MADV_RANDOM}, {"MADV_PAGEOUT", unix.MADV_PAGEOUT}} {
			if _, _, errno := unix.Syscall(unix.SYS_MADVISE, m[0], m[1]-m[0], advice.v); errno != 0 {
				return r, fmt.Errorf("madvise(%s) %#x-%#x of %s: %w", advice.name, m[0], m[1], exe, errno)
			}
		}
		r.Mappings++
		r.Bytes += uint64(m[1] - m[0])
	}
	r.AfterKiB, _ = RssFile()
	return r, nil
}

// exeRanges returns the [start, end) address ranges of exe's mappings in the maps file
// that are neither writable nor shared: the ones MADV_PAGEOUT may drop and that fault
// back unchanged from the file.
func exeRanges(maps, exe string) ([][2]uintptr, error) {
	f, err := os.Open(maps)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out [][2]uintptr
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// 00400000-02157000 r-xp 00000000 fd:01 1234   /usr/bin/gpuagent
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 || strings.Join(fields[5:], " ") != exe {
			continue
		}
		perms := fields[1]
		if len(perms) != 4 || perms[1] == 'w' || perms[3] != 'p' || perms[0] != 'r' {
			continue
		}
		lo, hi, ok := strings.Cut(fields[0], "-")
		if !ok {
			return nil, fmt.Errorf("%s: bad address range %q", maps, fields[0])
		}
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 != nil || err2 != nil || end <= start {
			return nil, fmt.Errorf("%s: bad address range %q", maps, fields[0])
		}
		out = append(out, [2]uintptr{uintptr(start), uintptr(end)})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s maps no read-only part of %s", maps, exe)
	}
	return out, nil
}

// RssFile is the process's resident file-backed memory in KiB (RssFile in
// /proc/self/status).
func RssFile() (uint64, error) {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "RssFile:"); ok {
			return strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		}
	}
	return 0, fmt.Errorf("/proc/self/status has no RssFile")
}
