package main

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"
)

// The volume commands write and read data on a volume with a checksum, for the storage
// tests (docs/storage.md): a write past a volume's quota fails with the kernel's error
// (ENOSPC), which the termination message carries.
//
//	probe write FILE MIB    write MIB MiB of random data to FILE in 1 MiB writes, fsync
//	                        it, and its sha256 to FILE.sha256; print the sha256 and the
//	                        rate. An error names how many MiB were written before it.
//	probe verify FILE       read FILE and compare its sha256 with FILE.sha256; exit 1 when
//	                        they differ. Prints the rate.

func writeCommand(args []string, stdout io.Writer, termLog string) error {
	if len(args) != 2 {
		return errors.New("usage: probe write FILE MIB")
	}
	mib, err := strconv.Atoi(args[1])
	if err != nil || mib <= 0 {
		return fmt.Errorf("probe write: %q is not a positive number of MiB", args[1])
	}
	sum, took, err := writeRandom(args[0], mib)
	if err != nil {
		report(stdout, termLog, err.Error()+"\n")
		return err
	}
	if err := os.WriteFile(args[0]+".sha256", []byte(sum+"\n"), 0o644); err != nil {
		return err
	}
	report(stdout, termLog, fmt.Sprintf("wrote %d MiB to %s in %s (%.1f MiB/s), sha256 %s\n", mib, args[0], took.Round(time.Millisecond), rate(mib, took), sum))
	return nil
}

// writeRandom writes mib MiB of random data to path and fsyncs it.
func writeRandom(path string, mib int) (string, time.Duration, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	buf := make([]byte, 1<<20)
	start := time.Now()
	for i := range mib {
		rand.Read(buf)
		h.Write(buf)
		if _, err := f.Write(buf); err != nil {
			return "", 0, fmt.Errorf("write %s after %d MiB: %w", path, i, err)
		}
	}
	if err := f.Sync(); err != nil {
		return "", 0, fmt.Errorf("fsync %s after %d MiB: %w", path, mib, err)
	}
	return hex.EncodeToString(h.Sum(nil)), time.Since(start), nil
}

func verifyCommand(args []string, stdout io.Writer, termLog string) error {
	if len(args) != 1 {
		return errors.New("usage: probe verify FILE")
	}
	want, err := os.ReadFile(args[0] + ".sha256")
	if err != nil {
		return err
	}
	f, err := os.Open(args[0])
	if err != nil {
		return err
	}
	defer f.Close()
	h := sha256.New()
	start := time.Now()
	n, err := io.Copy(h, f)
	if err != nil {
		return err
	}
	took := time.Since(start)
	got := hex.EncodeToString(h.Sum(nil))
	if !bytes.Equal([]byte(got), bytes.TrimSpace(want)) {
		err := fmt.Errorf("%s: sha256 %s, but %s.sha256 says %s", args[0], got, args[0], strings.TrimSpace(string(want)))
		report(stdout, termLog, err.Error()+"\n")
		return err
	}
	report(stdout, termLog, fmt.Sprintf("verified %s: %d MiB, sha256 %s, read in %s (%.1f MiB/s)\n", args[0], n>>20, got, took.Round(time.Millisecond), rate(int(n>>20), took)))
	return nil
}

func rate(mib int, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(mib) / d.Seconds()
}

// probe bench A B RUNS MIB: sequential write then read of MIB MiB with O_DIRECT (no
// page cache: the disk's own speed), in A and in B alternately, RUNS times each,
// A first. One line per run and kind ("bench A write 1 123.4" in MiB/s), then the
// medians and the ratio A/B. The storage bench runs it with A a gpurack-local volume and
// B a directory on the same data disk mounted directly.

func benchCommand(args []string, stdout io.Writer, termLog string) error {
	if len(args) != 4 {
		return errors.New("usage: probe bench DIR_A DIR_B RUNS MIB")
	}
	runs, err1 := strconv.Atoi(args[2])
	mib, err2 := strconv.Atoi(args[3])
	if err1 != nil || err2 != nil || runs < 1 || mib < 1 {
		return fmt.Errorf("probe bench: RUNS %q and MIB %q must be positive numbers", args[2], args[3])
	}
	rates := map[string][]float64{}
	var out strings.Builder
	for run := 1; run <= runs; run++ {
		for _, side := range []struct{ name, dir string }{{"A", args[0]}, {"B", args[1]}} {
			w, r, err := benchOnce(side.dir+"/probe-bench.bin", mib)
			if err != nil {
				return fmt.Errorf("bench %s run %d: %w", side.dir, run, err)
			}
			rates[side.name+" write"] = append(rates[side.name+" write"], w)
			rates[side.name+" read"] = append(rates[side.name+" read"], r)
			fmt.Fprintf(&out, "bench %s write %d %.1f\nbench %s read %d %.1f\n", side.name, run, w, side.name, run, r)
		}
	}
	for _, kind := range []string{"write", "read"} {
		a, b := median(rates["A "+kind]), median(rates["B "+kind])
		fmt.Fprintf(&out, "median %s A %.1f B %.1f ratio %.3f\n", kind, a, b, a/b)
	}
	report(stdout, termLog, out.String())
	return nil
}

// benchOnce writes mib MiB to path with O_DIRECT and fsync, reads it back with
// O_DIRECT, removes it, and returns both rates in MiB/s.
func benchOnce(path string, mib int) (write, read float64, err error) {
	buf := alignedBuffer(1 << 20)
	rand.Read(buf)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_DIRECT, 0o644)
	if err != nil {
		return 0, 0, err
	}
	start := time.Now()
	for range mib {
		if _, err := f.Write(buf); err != nil {
			f.Close()
			return 0, 0, err
		}
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return 0, 0, err
	}
	f.Close()
	write = rate(mib, time.Since(start))
	if f, err = os.OpenFile(path, os.O_RDONLY|syscall.O_DIRECT, 0); err != nil {
		return 0, 0, err
	}
	defer os.Remove(path)
	defer f.Close()
	start = time.Now()
	for range mib {
		if _, err := io.ReadFull(f, buf); err != nil {
			return 0, 0, err
		}
	}
	return write, rate(mib, time.Since(start)), nil
}

// alignedBuffer is n bytes aligned to 4096, as O_DIRECT wants.
func alignedBuffer(n int) []byte {
	b := make([]byte, n+4096)
	off := 4096 - int(uintptr(unsafe.Pointer(&b[0]))&4095)
	if off == 4096 {
		off = 0
	}
	return b[off : off+n]
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
