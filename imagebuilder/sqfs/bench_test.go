package sqfs

import (
	"fmt"
	"io"
	iofs "io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/gpurack/gpurack/internal/testreq"
)

// BenchmarkLargestFiles lists an image's regular files and picks the 15 largest, as gpuimage
// inspect does, and for comparison runs `unsquashfs -lls` (the listing inspect used to parse)
// on the same image. The image is $GPURACK_SQFS_BENCH_IMAGE when set (a built
// rootfs.squashfs is the realistic case); otherwise one is packed with mksquashfs -comp zstd
// from the first 50 MB of regular files under /usr/lib.
//
//	GPURACK_SQFS_BENCH_IMAGE=OUT/<id>/rootfs.squashfs go test ./imagebuilder/sqfs/ -run '^$' -bench LargestFiles -benchtime 10x
func BenchmarkLargestFiles(b *testing.B) {
	img := os.Getenv("GPURACK_SQFS_BENCH_IMAGE")
	if img == "" {
		src := b.TempDir()
		if n := copyTree(b, "/usr/lib", src, 50<<20); n < 10<<20 {
			testreq.Missing(b, fmt.Sprintf("only %d bytes of files under /usr/lib to pack", n), "set GPURACK_SQFS_BENCH_IMAGE to a built rootfs.squashfs")
		}
		img = mksquashfs(b, src, "zstd")
	}
	st, err := os.Stat(img)
	if err != nil {
		b.Fatal(err)
	}
	_, count, err := LargestFiles(img, 15)
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("%s: %d bytes, %d regular files", img, st.Size(), count)

	b.Run("go-diskfs", func(b *testing.B) {
		for b.Loop() {
			if _, _, err := LargestFiles(img, 15); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("unsquashfs-lls", func(b *testing.B) {
		testreq.Tool(b, "unsquashfs", "apt-get install squashfs-tools (hack/deps.sh lists it)")
		for b.Loop() {
			cmd := exec.Command("unsquashfs", "-lls", "-d", "", img)
			cmd.Stdout = io.Discard
			if err := cmd.Run(); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// copyTree copies regular files (and the directories above them) from src to dst, in lexical
// order, until limit bytes; unreadable files are skipped. It returns the bytes copied.
func copyTree(b *testing.B, src, dst string, limit int64) int64 {
	var total int64
	filepath.WalkDir(src, func(p string, d iofs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		if total >= limit {
			return filepath.SkipAll
		}
		data, err := os.ReadFile(p)
		if err != nil || total+int64(len(data)) > limit {
			return nil
		}
		r, _ := filepath.Rel(src, p)
		out := filepath.Join(dst, r)
		if os.MkdirAll(filepath.Dir(out), 0o755) != nil || os.WriteFile(out, data, 0o644) != nil {
			b.Fatalf("copy %s to %s failed", p, out)
		}
		total += int64(len(data))
		return nil
	})
	return total
}
