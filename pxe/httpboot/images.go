package httpboot

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/gpurack/gpurack/internal/manifest"
)

var imageIDRE = regexp.MustCompile(`^[0-9a-f]{40}$`)

// ErrUnverified marks an image whose manifest or artifacts do not verify.
var ErrUnverified = errors.New("image does not verify")

// imageCache holds one verification verdict per image id.
type imageCache struct {
	store string
	keys  []ed25519.PublicKey
	// copies is the directory of the private copies (created unlinked).
	copies string

	mu      sync.Mutex
	entries map[string]*imageEntry
}

// imageEntry is one verification; ready is closed when it is done, so
// concurrent requests for an image being verified wait for the one run.
type imageEntry struct {
	ready    chan struct{}
	dirMtime time.Time
	m        *manifest.Manifest
	files    map[string]*verifiedFile
	err      error
}

// verifiedFile is one artifact as verified: a private copy whose bytes were hashed
// as they were copied and matched the signed manifest, and the stamp of the store's
// file they were read from.
type verifiedFile struct {
	// copy is unlinked as soon as it is created: nothing but this process can
	// reach it, so what is served from it is what was hashed, whatever happens to
	// the store's file afterwards.
	copy  *os.File
	info  os.FileInfo // of copy, to recognise it when reopened
	size  int64
	stamp fileStamp
}

// fileStamp identifies a file's content cheaply. Size and mtime can be restored by
// whoever rewrites a file in place; the inode change time (ctime) cannot, short of
// changing the clock, so a rewrite of the store's file is noticed on the next
// request, which then verifies the image again. What is served never depends on
// it: it comes from the verified copy.
type fileStamp struct {
	size         int64
	mtime, ctime time.Time
	dev, ino     uint64
}

func stampOf(fi os.FileInfo) fileStamp {
	st := fileStamp{size: fi.Size(), mtime: fi.ModTime()}
	if sys, ok := fi.Sys().(*syscall.Stat_t); ok {
		st.ctime = time.Unix(sys.Ctim.Unix())
		st.dev, st.ino = uint64(sys.Dev), uint64(sys.Ino)
	}
	return st
}

// verifiedImage is a verified image directory.
type verifiedImage struct {
	dir   string
	m     *manifest.Manifest
	files map[string]*verifiedFile
}

func newImageCache(store string, keys []ed25519.PublicKey, copies string) *imageCache {
	return &imageCache{store: store, keys: keys, copies: copies, entries: map[string]*imageEntry{}}
}

// get returns the verified image id, verifying it if it has not been, or
// if its directory changed since.
func (c *imageCache) get(id string) (*verifiedImage, error) {
	if !imageIDRE.MatchString(id) {
		return nil, fmt.Errorf("%q is not an image id (40 lowercase hex digits)", id)
	}
	dir := filepath.Join(c.store, id)
	fi, err := os.Stat(dir)
	if err != nil {
		// Drop a verdict of a removed image: its copies are closed (and their disk
		// space freed) once no request reads them.
		c.forget(id)
		return nil, fmt.Errorf("image %s is not in the store: %w", id, err)
	}
	c.mu.Lock()
	e, ok := c.entries[id]
	if ok {
		select {
		case <-e.ready:
			if !e.dirMtime.Equal(fi.ModTime()) {
				ok = false // the directory changed: verify again
			}
		default: // being verified: wait below
		}
	}
	if !ok {
		e = &imageEntry{ready: make(chan struct{}), dirMtime: fi.ModTime()}
		c.entries[id] = e
		c.mu.Unlock()
		c.verify(dir, e)
	} else {
		c.mu.Unlock()
	}
	<-e.ready
	if e.err != nil {
		return nil, e.err
	}
	return &verifiedImage{dir: dir, m: e.m, files: e.files}, nil
}

// maxSignatureSize bounds manifest.sig (a valid one is 64 bytes).
const maxSignatureSize = 4096

// verify checks the image directory dir and copies each artifact it verifies. Every
// file is opened through an os.Root on dir (a link leading outside is refused), the
// manifest's signature is checked against the trusted keys, and each artifact is
// hashed while it is copied: only bytes whose sha256 and size match the signed
// manifest are ever served, from the copy.
func (c *imageCache) verify(dir string, e *imageEntry) {
	defer close(e.ready)
	m, files, err := c.verifyCopy(dir)
	if err != nil {
		e.err = fmt.Errorf("%w: %w", ErrUnverified, err)
		return
	}
	e.m, e.files = m, files
}

func (c *imageCache) verifyCopy(dir string) (*manifest.Manifest, map[string]*verifiedFile, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("verify image: %w", err)
	}
	defer root.Close()
	data, err := readRoot(root, manifest.ManifestFile, manifest.MaxManifestSize)
	if err != nil {
		return nil, nil, fmt.Errorf("verify image %s: %w", dir, err)
	}
	sig, err := readRoot(root, manifest.SignatureFile, maxSignatureSize)
	if err != nil {
		return nil, nil, fmt.Errorf("verify image %s: %w", dir, err)
	}
	if err := manifest.Verify(c.keys, data, sig); err != nil {
		return nil, nil, fmt.Errorf("verify image %s: %w", dir, err)
	}
	m, err := manifest.Parse(data)
	if err != nil {
		return nil, nil, fmt.Errorf("verify image %s: %s: %w", dir, manifest.ManifestFile, err)
	}
	files := map[string]*verifiedFile{}
	var errs []error
	for _, a := range m.Artifacts {
		vf, err := c.copyArtifact(root, a)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		files[a.Name] = vf
	}
	if len(errs) > 0 {
		for _, vf := range files {
			vf.copy.Close()
		}
		return nil, nil, fmt.Errorf("verify image %s: %w", dir, errors.Join(errs...))
	}
	return m, files, nil
}

// openRegular opens name through root and checks that it is a regular file (not a
// FIFO or device, which could block or never end).
func openRegular(root *os.Root, name string) (*os.File, os.FileInfo, error) {
	f, err := root.Open(name)
	if err != nil {
		return nil, nil, err
	}
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		f.Close()
		return nil, nil, fmt.Errorf("%s is not a regular file", name)
	}
	return f, fi, nil
}

func readRoot(root *os.Root, name string, limit int64) ([]byte, error) {
	f, _, err := openRegular(root, name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%s is larger than %d bytes", name, limit)
	}
	return data, nil
}

// copyArtifact copies a's file from root into an unlinked file in c.copies, hashing
// what it copies, and keeps the copy only if size and sha256 match a.
func (c *imageCache) copyArtifact(root *os.Root, a manifest.Artifact) (*verifiedFile, error) {
	want := manifest.FileDigest{SHA256: a.SHA256, Size: a.Size}
	src, fi, err := openRegular(root, a.Name)
	if err != nil {
		return nil, &manifest.ArtifactError{Name: a.Name, Want: want, Err: err}
	}
	defer src.Close()
	// The stamp is taken before the bytes are read: a write while copying leaves
	// the file with a newer ctime, so the next request verifies again.
	stamp := stampOf(fi)
	if fi.Size() != a.Size {
		return nil, &manifest.ArtifactError{Name: a.Name, Want: want, Got: manifest.FileDigest{Size: fi.Size()}}
	}
	dst, err := os.CreateTemp(c.copies, "gpuboot-verified-*")
	if err != nil {
		return nil, fmt.Errorf("copy %s for serving: %w", a.Name, err)
	}
	os.Remove(dst.Name())
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(dst, h), io.LimitReader(src, a.Size+1))
	if err != nil {
		dst.Close()
		return nil, &manifest.ArtifactError{Name: a.Name, Want: want, Err: err}
	}
	if got := (manifest.FileDigest{SHA256: hex.EncodeToString(h.Sum(nil)), Size: n}); got != want {
		dst.Close()
		return nil, &manifest.ArtifactError{Name: a.Name, Want: want, Got: got}
	}
	info, err := dst.Stat()
	if err != nil {
		dst.Close()
		return nil, fmt.Errorf("copy %s for serving: %w", a.Name, err)
	}
	return &verifiedFile{copy: dst, info: info, size: n, stamp: stamp}, nil
}

// forget drops id's verdict, so the next get verifies again.
func (c *imageCache) forget(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.entries, id)
}

// unchanged reports whether the store's file name still has the stamp it had when it
// was verified. It only notices tampering (so the image is verified again, and
// refused if it no longer verifies); what is served comes from the copy either way.
func (img *verifiedImage) unchanged(name string) error {
	fi, err := os.Stat(filepath.Join(img.dir, name))
	if err != nil {
		return err
	}
	if stampOf(fi) != img.files[name].stamp {
		return errChanged
	}
	return nil
}

// open returns a reader of the verified copy of an artifact, after checking that
// the store's file was not changed since it was verified (then the image is refused
// until verified again). The caller closes the reader.
func (img *verifiedImage) open(name string) (io.ReadSeekCloser, manifest.Artifact, error) {
	a, ok := img.m.Artifact(name)
	if !ok {
		return nil, manifest.Artifact{}, os.ErrNotExist
	}
	if err := img.unchanged(name); err != nil {
		return nil, a, err
	}
	r, err := img.files[name].reader()
	return r, a, err
}

// reader opens the copy anew (its own offset, so concurrent requests do not share
// one), through /proc/self/fd, as an *os.File so that whole-file responses still go
// out with sendfile. Where /proc is not mounted it reads the copy with pread.
func (vf *verifiedFile) reader() (io.ReadSeekCloser, error) {
	f, err := os.Open("/proc/self/fd/" + strconv.FormatUint(uint64(vf.copy.Fd()), 10))
	runtime.KeepAlive(vf.copy) // the fd stays this copy's until the open is done
	if err == nil {
		if fi, err := f.Stat(); err == nil && os.SameFile(fi, vf.info) {
			return f, nil
		}
		f.Close()
	}
	return struct {
		*io.SectionReader
		io.Closer
	}{io.NewSectionReader(vf.copy, 0, vf.size), io.NopCloser(nil)}, nil
}

var errChanged = errors.New("artifact changed since it was verified")

// readSmall returns a small artifact's verified bytes.
func (img *verifiedImage) readSmall(name string, limit int64) ([]byte, error) {
	if _, ok := img.m.Artifact(name); !ok {
		return nil, fmt.Errorf("%s: %w", name, os.ErrNotExist)
	}
	if err := img.unchanged(name); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	vf := img.files[name]
	if vf.size > limit {
		return nil, fmt.Errorf("%s is larger than %d bytes", name, limit)
	}
	data := make([]byte, vf.size)
	if _, err := vf.copy.ReadAt(data, 0); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return data, nil
}

// serveImageFile handles /images/{id}/{file}.
func (h *Handler) serveImageFile(w http.ResponseWriter, r *http.Request) {
	id, name := r.PathValue("id"), r.PathValue("file")
	if !imageIDRE.MatchString(id) || name == "" || name == "." || name == ".." {
		h.metrics.refusals.WithLabelValues("bad-name").Inc()
		http.Error(w, "gpuboot: not an image file URL: want /images/<40 hex digits>/<file>", http.StatusNotFound)
		return
	}
	img, err := h.images.get(id)
	if err != nil {
		if errors.Is(err, ErrUnverified) {
			h.metrics.refusals.WithLabelValues("unverified").Inc()
			h.log.Error("images: refusing unverified image", "image", id, "err", err)
			http.Error(w, "gpuboot: image "+id+" does not verify against the trusted signing keys; it is not served (see the server log)", http.StatusForbidden)
			return
		}
		h.metrics.refusals.WithLabelValues("not-found").Inc()
		http.Error(w, "gpuboot: image "+id+" is not in the store", http.StatusNotFound)
		return
	}
	f, a, err := img.open(name)
	if errors.Is(err, errChanged) {
		// Verify again (the file was replaced since), then retry once.
		h.images.forget(id)
		if img, err = h.images.get(id); err == nil {
			f, a, err = img.open(name)
		}
	}
	if err != nil {
		if errors.Is(err, ErrUnverified) || errors.Is(err, errChanged) {
			h.metrics.refusals.WithLabelValues("unverified").Inc()
			h.log.Error("images: refusing unverified image", "image", id, "err", err)
			http.Error(w, "gpuboot: image "+id+" does not verify; it is not served", http.StatusForbidden)
			return
		}
		h.metrics.refusals.WithLabelValues("not-found").Inc()
		http.Error(w, "gpuboot: image "+id+" has no file "+url.PathEscape(name), http.StatusNotFound)
		return
	}
	defer f.Close()
	w.Header().Set("ETag", `"sha256:`+a.SHA256+`"`)
	w.Header().Set("Cache-Control", "public, max-age=31536000, immutable")
	w.Header().Set("Content-Type", "application/octet-stream")
	cw := &countingWriter{ResponseWriter: w, count: h.metrics.bytes.WithLabelValues("images")}
	start := time.Now()
	http.ServeContent(cw, r, name, img.files[name].stamp.mtime, f)
	// One line per image file served: which machine fetched which part of its image,
	// and when (a boot shows as vmlinuz, initrd.img, then rootfs.squashfs).
	h.log.Info("images: sent", "image", id, "file", name, "to", remoteAddr(r), "bytes", cw.sent,
		"range", r.Header.Get("Range") != "", "took", time.Since(start).Round(time.Millisecond))
}

// serveIPXE handles /ipxe/{file}.
func (h *Handler) serveIPXE(w http.ResponseWriter, r *http.Request) {
	p, ok := h.ipxe[r.PathValue("file")]
	if !ok {
		h.metrics.refusals.WithLabelValues("bad-name").Inc()
		http.NotFound(w, r)
		return
	}
	f, err := os.Open(p)
	if err != nil {
		http.Error(w, "gpuboot: "+err.Error(), http.StatusInternalServerError)
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		http.Error(w, "gpuboot: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/efi")
	http.ServeContent(&countingWriter{ResponseWriter: w, count: h.metrics.bytes.WithLabelValues("ipxe")}, r, fi.Name(), fi.ModTime(), f)
}

// listFiles returns the top-level regular files of dir (links resolved
// once, as the Debian ipxe package links ipxe.efi to /boot).
func listFiles(dir string) (map[string]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, e := range entries {
		p, err := filepath.EvalSymlinks(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			out[e.Name()] = p
		}
	}
	return out, nil
}

// VerifyImage returns an error unless image id is in the store and verifies (its
// manifest signed by a trusted key, every artifact matching it): what a rollout checks
// before it touches a machine (pxe/rollout.Images). The verdict is cached as for
// serving.
func (h *Handler) VerifyImage(id string) error {
	_, err := h.images.get(id)
	return err
}
