package ociimage

import (
	"archive/tar"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Config is the image config a profile gives (profile.ImageSpec, resolved).
type Config struct {
	User       string // "UID:GID", never root
	Workdir    string
	Env        map[string]string
	Entrypoint []string
	Cmd        []string
	Ports      []string
	Labels     map[string]string
	// History is the comment of the layer's history entry (the profile's name).
	History string
}

// DefaultPath is the PATH an image gets unless its env sets one.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// fileLayer is a v1.Layer of a LayerFile, with its digests as WriteLayer computed them.
type fileLayer struct{ f *LayerFile }

func (l fileLayer) Digest() (v1.Hash, error) { return v1.NewHash(l.f.Digest) }
func (l fileLayer) DiffID() (v1.Hash, error) { return v1.NewHash(l.f.DiffID) }
func (l fileLayer) Size() (int64, error)     { return l.f.Size, nil }
func (l fileLayer) MediaType() (types.MediaType, error) {
	return types.OCILayer, nil
}
func (l fileLayer) Compressed() (io.ReadCloser, error) { return os.Open(l.f.Path) }
func (l fileLayer) Uncompressed() (io.ReadCloser, error) {
	f, err := os.Open(l.f.Path)
	if err != nil {
		return nil, err
	}
	zr, err := gzip.NewReader(f)
	if err != nil {
		f.Close()
		return nil, err
	}
	return struct {
		io.Reader
		io.Closer
	}{zr, f}, nil
}

// Image is the linux/amd64 OCI image of one layer with cfg, every timestamp epoch.
func Image(layer *LayerFile, cfg Config, epoch time.Time) (v1.Image, error) {
	created := v1.Time{Time: epoch.UTC()}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err := mutate.Append(img, mutate.Addendum{Layer: fileLayer{layer}, MediaType: types.OCILayer,
		History: v1.History{Created: created, CreatedBy: "gpuimage container build", Comment: cfg.History}})
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS, cf.Created = "amd64", "linux", created
	cf.Config = v1.Config{User: cfg.User, WorkingDir: cfg.Workdir, Env: envList(cfg.Env), Entrypoint: cfg.Entrypoint, Cmd: cfg.Cmd, Labels: cfg.Labels}
	if len(cfg.Ports) > 0 {
		cf.Config.ExposedPorts = map[string]struct{}{}
		for _, p := range cfg.Ports {
			cf.Config.ExposedPorts[p] = struct{}{}
		}
	}
	return mutate.ConfigFile(img, cf)
}

// envList is env as sorted NAME=VALUE, with DefaultPath unless env sets PATH.
func envList(env map[string]string) []string {
	out := []string{}
	if _, ok := env["PATH"]; !ok {
		out = append(out, "PATH="+DefaultPath)
	}
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// WriteArchive writes img as an OCI image-layout tar archive to out, naming it ref (the
// index's io.containerd.image.name, and its tag as org.opencontainers.image.ref.name,
// as ctr export does). The archive is written beside out and renamed over it only when
// complete, so a failure leaves an earlier archive as it was. scratch holds the layout
// directory while the archive is written.
func WriteArchive(img v1.Image, ref, tag, out, scratch string, epoch time.Time) error {
	dir := filepath.Join(scratch, "oci-layout")
	os.RemoveAll(dir)
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	ann := map[string]string{"io.containerd.image.name": ref, "org.opencontainers.image.ref.name": tag}
	if err := p.AppendImage(img, layout.WithAnnotations(ann), layout.WithPlatform(v1.Platform{OS: "linux", Architecture: "amd64"})); err != nil {
		return fmt.Errorf("write the OCI layout: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(out), "."+filepath.Base(out)+".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tarDir(tmp, dir, epoch); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	os.RemoveAll(dir)
	return os.Rename(tmp.Name(), out)
}

// tarDir writes the layout directory as a tar: sorted, root-owned, 0755 directories
// and 0644 files, every mtime epoch.
func tarDir(w io.Writer, dir string, epoch time.Time) error {
	tw := tar.NewWriter(w)
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}
		h := &tar.Header{Name: filepath.ToSlash(rel), Mode: 0o644, ModTime: epoch.UTC(), Typeflag: tar.TypeReg, Size: fi.Size(), Format: tar.FormatPAX}
		if fi.IsDir() {
			h.Name, h.Mode, h.Typeflag, h.Size = h.Name+"/", 0o755, tar.TypeDir, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if fi.IsDir() {
			return nil
		}
		return copyFile(tw, p, fi.Size())
	})
	if err != nil {
		return err
	}
	return tw.Close()
}
