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
	"strconv"
	"strings"
	"time"
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
