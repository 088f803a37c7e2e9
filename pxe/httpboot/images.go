package httpboot

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"sync"
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

	mu      sync.Mutex
	entries map[string]*imageEntry
}

// imageEntry is one verification; ready is closed when it is done, so
// concurrent requests for an image being verified wait for the one run.
type imageEntry struct {
	ready    chan struct{}
	dirMtime time.Time
	m        *manifest.Manifest
	files    map[string]fileStamp // artifact → size and mtime at verification
	err      error
}

type fileStamp struct {
	size  int64
	mtime time.Time
}

// verifiedImage is a verified image directory.
type verifiedImage struct {
	dir   string
	m     *manifest.Manifest
	files map[string]fileStamp
}

func newImageCache(store string, keys []ed25519.PublicKey) *imageCache {
	return &imageCache{store: store, keys: keys, entries: map[string]*imageEntry{}}
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

func (c *imageCache) verify(dir string, e *imageEntry) {
	defer close(e.ready)
	m, err := manifest.VerifyDir(dir, c.keys)
	if err != nil {
		e.err = fmt.Errorf("%w: %w", ErrUnverified, err)
		return
	}
	e.m = m
	e.files = map[string]fileStamp{}
	for _, a := range m.Artifacts {
		fi, err := os.Stat(filepath.Join(dir, a.Name))
		if err != nil {
			e.err = fmt.Errorf("%w: %s: %w", ErrUnverified, a.Name, err)
			return
		}
		e.files[a.Name] = fileStamp{size: fi.Size(), mtime: fi.ModTime()}
	}
}

// forget drops id's verdict, so the next get verifies again.
func (c *imageCache) forget(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.entries, id)
}

// open opens an artifact of the image and checks that it is the file that
// was verified (same size and modification time).
func (img *verifiedImage) open(name string) (*os.File, manifest.Artifact, error) {
	a, ok := img.m.Artifact(name)
	if !ok {
		return nil, manifest.Artifact{}, os.ErrNotExist
	}
	f, err := os.Open(filepath.Join(img.dir, name))
	if err != nil {
		return nil, a, err
	}
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		f.Close()
		return nil, a, fmt.Errorf("%s is not a regular file", name)
	}
	if st := img.files[name]; fi.Size() != st.size || !fi.ModTime().Equal(st.mtime) {
		f.Close()
		return nil, a, errChanged
	}
	return f, a, nil
}

var errChanged = errors.New("artifact changed since it was verified")

func (img *verifiedImage) readSmall(name string, limit int64) ([]byte, error) {
	f, _, err := img.open(name)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%s is larger than %d bytes", name, limit)
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
	fi, _ := f.Stat()
	http.ServeContent(&countingWriter{ResponseWriter: w, count: h.metrics.bytes.WithLabelValues("images")}, r, name, fi.ModTime(), f)
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
