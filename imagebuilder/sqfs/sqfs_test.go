package sqfs

import (
	"bytes"
	"errors"
	"fmt"
	iofs "io/fs"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"runtime/debug"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/diskfs/go-diskfs/backend/file"
	"github.com/klauspost/compress/zstd"

	"github.com/gpurack/gpurack/internal/testreq"
)

// mksquashfs packs src into a new image in a temporary directory, compressed with comp, and
// returns the image's path; it skips the test when squashfs-tools is not installed.
func mksquashfs(tb testing.TB, src, comp string) string {
	tb.Helper()
	testreq.Tool(tb, "mksquashfs", "apt-get install squashfs-tools (hack/deps.sh lists it); these tests build real images with it")
	img := filepath.Join(tb.TempDir(), "test.sqfs")
	out, err := exec.Command("mksquashfs", src, img, "-comp", comp, "-noappend", "-no-progress", "-processors", "1").CombinedOutput()
	if err != nil {
		if strings.Contains(string(out), "Compressor") || strings.Contains(string(out), "compressor") {
			testreq.Missing(tb, fmt.Sprintf("this mksquashfs cannot write %s: %s", comp, lastLine(out)), "install a squashfs-tools built with "+comp)
		}
		tb.Fatalf("mksquashfs %s: %v\n%s", comp, err, out)
	}
	return img
}

func lastLine(b []byte) string {
	l := strings.Split(strings.TrimSpace(string(b)), "\n")
	return l[len(l)-1]
}

// testTree writes a tree that covers what a root filesystem holds: empty, small, fragment-
// sized, block-sized and multi-block files (compressible and not), nested and empty
// directories, odd names, symlinks (to a file, to a directory, dangling), a hard link and a
// FIFO. It returns the tree's root.
func testTree(t *testing.T) string {
	t.Helper()
	src := t.TempDir()
	rnd := rand.New(rand.NewSource(550))
	random := func(n int) []byte {
		b := make([]byte, n)
		rnd.Read(b)
		return b
	}
	var text bytes.Buffer
	for i := 0; text.Len() < 3<<20; i++ {
		text.WriteString("Package: pkg")
		text.WriteString(strings.Repeat("x", i%13))
		text.WriteString("\nVersion: 1.0\nInstalled-Size: 42\n\n")
	}
	files := map[string][]byte{
		"hello.txt":                  []byte("hello\n"),
		"empty":                      nil,
		"var/lib/dpkg/status":        []byte("Package: base-files\nVersion: 12.4\nInstalled-Size: 394\n\n"),
		"a/big.bin":                  random(3 << 20),
		"a/b/text.txt":               text.Bytes(),
		"a/b/c/d/e/deep.bin":         random(100000),
		"a/b/c/exact-block.bin":      random(128 << 10),
		"a/b/c/block-plus-one.bin":   random(128<<10 + 1),
		"usr/share/doc/name with sp": []byte("spaces in the name\n"),
		"usr/share/doc/ünïcode":      []byte("utf-8 name\n"),
		"zero.bin":                   make([]byte, 300000), // sparse blocks in the image
	}
	for name, data := range files {
		p := filepath.Join(src, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{"emptydir", "a/b/c/empty"} {
		if err := os.MkdirAll(filepath.Join(src, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for link, target := range map[string]string{"link": "hello.txt", "a/dangling": "../nowhere", "lib": "usr/share", "a/b/abs": "/a/big.bin"} {
		if err := os.Symlink(target, filepath.Join(src, link)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Link(filepath.Join(src, "hello.txt"), filepath.Join(src, "a/hardlink.txt")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(src, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	return src
}

// sourceFiles lists the regular files under src as Walk should report them.
func sourceFiles(t *testing.T, src string) []File {
	t.Helper()
	var files []File
	err := filepath.WalkDir(src, func(p string, d iofs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		r, _ := filepath.Rel(src, p)
		files = append(files, File{Path: "/" + filepath.ToSlash(r), Size: fi.Size()})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// TestReadsMksquashfsImages packs a tree with mksquashfs and checks that every regular file
// comes back with its exact size and content, and nothing else is listed. zstd is what
// gpuimage builds; gzip and xz are checked too.
func TestReadsMksquashfsImages(t *testing.T) {
	src := testTree(t)
	want := sourceFiles(t, src)
	for _, comp := range []string{"zstd", "gzip", "xz"} {
		t.Run(comp, func(t *testing.T) {
			if errs := checkImage(t, mksquashfs(t, src, comp), src, want); len(errs) > 0 {
				t.Error(strings.Join(errs, "\n"))
			}
		})
	}
}

// TestOtherCompressorsNeverWrong: go-diskfs v1.9.4 cannot read mksquashfs's lz4 images (it
// decodes LZ4 frames; squashfs stores raw LZ4 blocks) nor some lzo data blocks ("lzo:
// output overrun"). gpuimage does not use either; what matters is that such an image gives
// an error, never a wrong listing or wrong bytes.
func TestOtherCompressorsNeverWrong(t *testing.T) {
	src := testTree(t)
	want := sourceFiles(t, src)
	for _, comp := range []string{"lz4", "lzo"} {
		t.Run(comp, func(t *testing.T) {
			for _, e := range checkImage(t, mksquashfs(t, src, comp), src, want) {
				if strings.Contains(e, "differ") {
					t.Error(e)
				} else {
					t.Logf("known go-diskfs limitation, an error as it should be: %s", e)
				}
			}
		})
	}
}

// checkImage compares the image img with the tree src it was made from, whose regular files
// are want. It returns what did not match: "... differ ..." for wrong results, anything else
// for errors.
func checkImage(t *testing.T, img, src string, want []File) (errs []string) {
	im, err := Open(img)
	if err != nil {
		return []string{err.Error()}
	}
	defer im.Close()

	got, err := im.Files()
	if err != nil {
		return []string{err.Error()}
	}
	// WalkDir and Walk both go in lexical order; the lists must be equal exactly.
	if !reflect.DeepEqual(got, want) {
		errs = append(errs, fmt.Sprintf("Files() differ from the source tree:\n got  %v\n want %v", got, want))
	}
	for _, f := range got {
		switch f.Path {
		case "/link", "/lib", "/a/dangling", "/a/b/abs", "/fifo":
			errs = append(errs, fmt.Sprintf("listing differs: %s is not a regular file but was listed", f.Path))
		}
	}
	for _, f := range want {
		data, err := im.ReadFile(f.Path)
		if err != nil {
			errs = append(errs, fmt.Sprintf("ReadFile(%s): %v", f.Path, err))
			continue
		}
		orig, _ := os.ReadFile(filepath.Join(src, f.Path))
		if !bytes.Equal(data, orig) {
			errs = append(errs, fmt.Sprintf("ReadFile(%s): %d bytes differ from the %d put in", f.Path, len(data), len(orig)))
		}
	}
	// the leading slash is optional
	if data, err := im.ReadFile("var/lib/dpkg/status"); err == nil && !strings.HasPrefix(string(data), "Package: base-files\n") {
		errs = append(errs, fmt.Sprintf("ReadFile(var/lib/dpkg/status) = %q: content differs", data))
	}
	return errs
}

func TestLargestFiles(t *testing.T) {
	src := testTree(t)
	img := mksquashfs(t, src, "zstd")
	want := sourceFiles(t, src)
	sort.Slice(want, func(i, j int) bool {
		return want[i].Size > want[j].Size || want[i].Size == want[j].Size && want[i].Path < want[j].Path
	})
	for _, n := range []int{0, 1, 3, len(want), len(want) + 10} {
		got, count, err := LargestFiles(img, n)
		if err != nil {
			t.Fatal(err)
		}
		if count != len(want) {
			t.Errorf("LargestFiles(%d): count %d, want %d", n, count, len(want))
		}
		w := want[:min(n, len(want))]
		if len(got) != len(w) || len(got) > 0 && !reflect.DeepEqual(got, w) {
			t.Errorf("LargestFiles(%d) = %v, want %v", n, got, w)
		}
	}
}

func TestReadFileErrors(t *testing.T) {
	src := testTree(t)
	img := mksquashfs(t, src, "zstd")
	for p, want := range map[string]string{
		"/link":            "not a regular file",
		"/fifo":            "not a regular file",
		"/a/b":             "not a regular file",
		"/":                "is a directory",
		"/no/such/file":    "could not find path",
		"/a/no-such-file":  "file does not exist",
		"/hello.txt/child": "hello.txt",
	} {
		_, err := ReadFile(img, p)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ReadFile(%s): error %v, want one containing %q", p, err, want)
		}
		if err != nil && !strings.Contains(err.Error(), img) {
			t.Errorf("ReadFile(%s): error %q does not name the image", p, err)
		}
	}
	if _, err := ReadFile(img, "/a/no-such-file"); !errors.Is(err, iofs.ErrNotExist) {
		t.Errorf("missing file: %v is not ErrNotExist", err)
	}
	if _, err := ReadFile(filepath.Join(t.TempDir(), "absent.sqfs"), "/x"); !errors.Is(err, iofs.ErrNotExist) {
		t.Errorf("missing image: %v is not ErrNotExist", err)
	}
	notImage := filepath.Join(t.TempDir(), "manifest.json")
	os.WriteFile(notImage, []byte(`{"not":"squashfs"}`), 0o644)
	if _, _, err := LargestFiles(notImage, 5); err == nil || !strings.Contains(err.Error(), "not a readable squashfs image") {
		t.Errorf("non-image: %v", err)
	}
}

// TestCommittedSeedImage reads the valid image committed as a fuzz seed (zstd, 4 KiB
// blocks, made by mksquashfs 4.5 from a tree with a multi-block file and a symlink), so the
// reader is checked on a real image even where squashfs-tools is not installed.
func TestCommittedSeedImage(t *testing.T) {
	im, err := openBytes(readSeed(t, "valid-zstd-4k-blocks"))
	if err != nil {
		t.Fatal(err)
	}
	files, err := im.Files()
	want := []File{{"/hello", 3}, {"/usr/bin/tool", 13893}, {"/var/lib/dpkg/status", 104}}
	if err != nil || !reflect.DeepEqual(files, want) {
		t.Fatalf("Files() = %v, %v; want %v", files, err, want)
	}
	var seq strings.Builder
	for i := 1; i <= 3000; i++ {
		fmt.Fprintf(&seq, "%d\n", i)
	}
	if data, err := im.ReadFile("/usr/bin/tool"); err != nil || string(data) != seq.String() {
		t.Errorf("ReadFile(/usr/bin/tool): %d bytes, %v; want the output of seq 1 3000", len(data), err)
	}
	if data, err := im.ReadFile("/var/lib/dpkg/status"); err != nil || !strings.HasPrefix(string(data), "Package: base-files\nVersion: 12.4\n") {
		t.Errorf("ReadFile(/var/lib/dpkg/status) = %q, %v", data, err)
	}
	if _, err := im.ReadFile("/usr/bin/link"); err == nil {
		t.Error("ReadFile of a symlink succeeded")
	}
}

// readSeed returns the bytes of a committed FuzzOpen seed.
func readSeed(t *testing.T, name string) []byte {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata/fuzz/FuzzOpen", name))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(raw), "\n")
	q, err := strconv.Unquote(strings.TrimSuffix(strings.TrimPrefix(lines[1], "[]byte("), ")"))
	if err != nil {
		t.Fatal(err)
	}
	return []byte(q)
}

// TestZstdBomb: a 321-byte image (found by FuzzOpen) whose metadata block is a zstd frame
// announcing 2.4 GB made go-diskfs's decoder allocate that much; announcing 64 GB, it kills
// the process. It must be an error, with next to nothing allocated.
func TestZstdBomb(t *testing.T) {
	b := readSeed(t, "a22e9f4d308bbdaa")
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	_, err := openBytes(b)
	runtime.ReadMemStats(&m1)
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "zstd data") {
		t.Errorf("error %v, want a corrupt-image error about the zstd data", err)
	}
	if a := m1.TotalAlloc - m0.TotalAlloc; a > 64<<20 {
		t.Errorf("allocated %d bytes", a)
	}

	enc, _ := zstd.NewWriter(nil)
	defer enc.Close()
	block := bytes.Repeat([]byte("inode "), 8192/6)
	one := enc.EncodeAll(block, nil)
	if got := zstdBound(one); got != uint64(len(block)) {
		t.Errorf("zstdBound(one frame of %d bytes) = %d", len(block), got)
	}
	if got := zstdBound(append(bytes.Clone(one), one...)); got != 2*uint64(len(block)) {
		t.Errorf("zstdBound(two frames) = %d", got)
	}
	// a frame header announcing 60 GiB (single segment, 8-byte content size), then one
	// empty raw block
	bomb := []byte{0x28, 0xb5, 0x2f, 0xfd, 0xe0, 0, 0, 0, 0, 15, 0, 0, 0, 1, 0, 0}
	if got := zstdBound(bomb); got != 60<<30 {
		t.Errorf("zstdBound(bomb) = %d, want %d", got, uint64(60<<30))
	}
	if got := zstdBound([]byte("hsqs, not zstd")); got != 0 {
		t.Errorf("zstdBound(not zstd) = %d", got)
	}
}

// TestCorruptImages flips bytes and truncates a real image: every result is an error or a
// listing, and it comes back promptly.
func TestCorruptImages(t *testing.T) {
	src := testTree(t)
	good, err := os.ReadFile(mksquashfs(t, src, "zstd"))
	if err != nil {
		t.Fatal(err)
	}
	panics := map[string]int{}
	onPanic = func(r any) {
		site := panicSite(string(debug.Stack()))
		panics[fmt.Sprintf("%v at %s", r, site[strings.LastIndex(site, "/")+1:])]++
	}
	defer func() { onPanic = nil }()
	rnd := rand.New(rand.NewSource(1))
	deadline := time.Now().Add(20 * time.Second)
	n := 0
	for ; n < 400 && time.Now().Before(deadline); n++ {
		b := bytes.Clone(good)
		switch n % 3 {
		case 0:
			b = b[:rnd.Intn(len(b))]
		default:
			// the metadata (inode, directory, fragment, id tables) sits at the end
			for k := 0; k < 1+rnd.Intn(8); k++ {
				i := len(b) - 1 - rnd.Intn(min(len(b), 16<<10))
				if rnd.Intn(4) == 0 {
					i = rnd.Intn(96) // the superblock
				}
				b[i] = byte(rnd.Intn(256))
			}
		}
		done := make(chan struct{})
		go func() { exercise(b); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			os.WriteFile(filepath.Join(t.TempDir(), "hang.sqfs"), b, 0o644)
			t.Fatalf("corrupted image %d: still reading after 10s", n)
		}
	}
	t.Logf("%d corrupted images read without a panic escaping or a hang", n)
	for p, c := range panics {
		t.Logf("%d panics recovered and reported as errors: %s", c, p)
	}
}

// memFile is an in-memory image for go-diskfs's file backend.
type memFile struct{ *bytes.Reader }

func (memFile) Stat() (iofs.FileInfo, error) { return nil, errors.New("in memory") }
func (memFile) Close() error                 { return nil }

func openBytes(b []byte) (*Image, error) {
	return open(file.New(memFile{bytes.NewReader(b)}, true), int64(len(b)), "fuzz.sqfs")
}

// exercise does with b what inspect does with an image: open it, list the files, read a few.
func exercise(b []byte) {
	im, err := openBytes(b)
	if err != nil {
		return
	}
	files, _ := im.Files()
	for i, f := range files {
		if i == 8 {
			break
		}
		if f.Size <= 4<<20 {
			im.ReadFile(f.Path)
		}
	}
	im.ReadFile("/var/lib/dpkg/status")
}

// FuzzOpen feeds arbitrary bytes to the reader as an image: it must give errors, never
// panic, hang or exhaust memory. The seeds are a small real image (built here with mksquashfs
// when it is installed, and committed as testdata/fuzz/FuzzOpen/valid-zstd-4k-blocks), a few
// broken ones, and what earlier fuzzing found under testdata/fuzz/FuzzOpen: two go-diskfs
// panics (6da9…, d5fb…), an endless read past the end (bc96…), a zstd bomb (a22e…).
func FuzzOpen(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte("hsqs"))
	f.Add(bytes.Repeat([]byte{0xff}, 96))
	if _, err := exec.LookPath("mksquashfs"); err == nil {
		src := f.TempDir()
		os.MkdirAll(filepath.Join(src, "var/lib/dpkg"), 0o755)
		os.WriteFile(filepath.Join(src, "var/lib/dpkg/status"), []byte("Package: a\nVersion: 1\n\n"), 0o644)
		os.WriteFile(filepath.Join(src, "big"), bytes.Repeat([]byte("0123456789"), 20000), 0o644)
		os.Symlink("big", filepath.Join(src, "link"))
		img := filepath.Join(f.TempDir(), "seed.sqfs")
		if out, err := exec.Command("mksquashfs", src, img, "-comp", "zstd", "-noappend", "-no-progress", "-processors", "1").CombinedOutput(); err != nil {
			f.Fatalf("mksquashfs: %v\n%s", err, out)
		}
		b, _ := os.ReadFile(img)
		f.Add(b)
	}
	if os.Getenv("SQFS_FUZZ_UNRECOVERED") != "" {
		// To find inputs that make go-diskfs itself panic (for seeds, or an upstream report):
		// re-panic, unless the panic's site in go-diskfs is one of SQFS_FUZZ_KNOWN
		// (comma-separated "file.go:line"), so that a new kind of panic can be searched for.
		onPanic = func(r any) {
			site := panicSite(string(debug.Stack()))
			for _, k := range strings.Split(os.Getenv("SQFS_FUZZ_KNOWN"), ",") {
				if k != "" && strings.HasSuffix(site, "/"+k) {
					return
				}
			}
			panic(fmt.Sprintf("go-diskfs panicked at %s: %v", site, r))
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		exercise(b)
	})
}

// panicSite is the file:line of the go-diskfs frame that panicked, from a stack taken while
// recovering.
func panicSite(stack string) string {
	lines := strings.Split(stack, "\n")
	for i, l := range lines {
		if !strings.HasPrefix(l, "panic(") {
			continue
		}
		for _, l := range lines[i+1:] {
			if l = strings.TrimSpace(l); strings.Contains(l, "go-diskfs") && strings.Contains(l, ".go:") {
				return strings.Fields(l)[0]
			}
		}
	}
	return "unknown"
}
