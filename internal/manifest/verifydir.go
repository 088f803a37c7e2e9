package manifest

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/gpurack/gpurack/internal/atomicfile"
)

// maxSignatureSize bounds how much of manifest.sig VerifyDir reads; a valid
// one is 64 bytes, and a little more lets the error say how big it is.
const maxSignatureSize = 4096

// ArtifactError reports an artifact of an image directory that does not
// match its manifest entry.
type ArtifactError struct {
	// Name is the artifact's file name in the image directory.
	Name string
	// Want is the manifest's entry; Got what the file holds (zero when Err
	// is set).
	Want, Got FileDigest
	// Err is set when the file could not be read at all: missing, not a
	// regular file, a symbolic link leading outside the directory.
	Err error
}

func (e *ArtifactError) Error() string {
	switch {
	case e.Err != nil:
		return fmt.Sprintf("%s: %v", e.Name, e.Err)
	case e.Got.Size != e.Want.Size:
		return fmt.Sprintf("%s: size is %d bytes, the signed manifest says %d: the file is truncated or was replaced after signing; re-copy or rebuild the image",
			e.Name, e.Got.Size, e.Want.Size)
	default:
		return fmt.Sprintf("%s: sha256 is %s, the signed manifest says %s: the file is corrupt or was changed after signing; re-copy or rebuild the image",
			e.Name, e.Got.SHA256, e.Want.SHA256)
	}
}

func (e *ArtifactError) Unwrap() error { return e.Err }

// VerifyDir checks an image directory: it reads manifest.json and
// manifest.sig, checks the signature against pubs (any one key suffices),
// parses the manifest, then reads every artifact it lists and checks its
// size and sha256. It returns the manifest only if all of that passes.
//
// Files are opened through an os.Root on dir, so an artifact that is a
// symbolic link leading outside dir is refused; a link inside dir is
// followed. Artifacts must be regular files. Every artifact is checked even
// after one fails, and the error lists each failure as an *ArtifactError
// (use errors.As), naming the file and the expected and actual digest.
func VerifyDir(dir string, pubs []ed25519.PublicKey) (*Manifest, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("verify image: %w", err)
	}
	defer root.Close()

	data, err := readSmall(root, ManifestFile, MaxManifestSize)
	if err != nil {
		return nil, fmt.Errorf("verify image %s: %w", dir, err)
	}
	sig, err := readSmall(root, SignatureFile, maxSignatureSize)
	if err != nil {
		return nil, fmt.Errorf("verify image %s: %w", dir, err)
	}
	if err := Verify(pubs, data, sig); err != nil {
		return nil, fmt.Errorf("verify image %s: %w", dir, err)
	}
	m, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("verify image %s: %s: %w", dir, ManifestFile, err)
	}
	var errs []error
	for _, a := range m.Artifacts {
		if err := checkArtifact(root, a); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("verify image %s: %w", dir, errors.Join(errs...))
	}
	return m, nil
}

// openRegular opens name in root and checks that it is a regular file
// (not a directory, device or FIFO, which could block or never end).
func openRegular(root *os.Root, name string) (*os.File, fs.FileInfo, error) {
	fi, err := root.Stat(name)
	if err != nil {
		if lfi, lerr := root.Lstat(name); lerr == nil && lfi.Mode()&fs.ModeSymlink != 0 {
			return nil, nil, fmt.Errorf("is a symbolic link leading outside %s or to nothing; the image directory must hold the file itself (%v)", root.Name(), err)
		}
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil, fmt.Errorf("missing from %s", root.Name())
		}
		return nil, nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, nil, fmt.Errorf("is not a regular file (mode %v)", fi.Mode())
	}
	f, err := root.Open(name)
	if err != nil {
		return nil, nil, err
	}
	fi, err = f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		f.Close()
		return nil, nil, fmt.Errorf("is not a regular file")
	}
	return f, fi, nil
}

func readSmall(root *os.Root, name string, limit int64) ([]byte, error) {
	f, _, err := openRegular(root, name)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%s is larger than %d bytes: not a gpurack %s", name, limit, name)
	}
	return data, nil
}

func checkArtifact(root *os.Root, a Artifact) error {
	want := FileDigest{SHA256: a.SHA256, Size: a.Size}
	f, fi, err := openRegular(root, a.Name)
	if err != nil {
		return &ArtifactError{Name: a.Name, Want: want, Err: err}
	}
	defer f.Close()
	if fi.Size() != a.Size {
		return &ArtifactError{Name: a.Name, Want: want, Got: FileDigest{Size: fi.Size()}}
	}
	got, err := digest(f)
	if err != nil {
		return &ArtifactError{Name: a.Name, Want: want, Err: err}
	}
	if got != want {
		return &ArtifactError{Name: a.Name, Want: want, Got: got}
	}
	return nil
}

// digest streams r through SHA-256.
func digest(r io.Reader) (FileDigest, error) {
	h := sha256.New()
	n, err := io.Copy(h, r)
	if err != nil {
		return FileDigest{}, err
	}
	return FileDigest{SHA256: hex.EncodeToString(h.Sum(nil)), Size: n}, nil
}

// DigestFile returns the size and sha256 of the file at path, streaming it
// (for building a manifest's binaries and artifacts).
func DigestFile(path string) (FileDigest, error) {
	f, err := os.Open(path)
	if err != nil {
		return FileDigest{}, err
	}
	defer f.Close()
	d, err := digest(f)
	if err != nil {
		return FileDigest{}, fmt.Errorf("%s: %w", path, err)
	}
	return d, nil
}

// ArtifactOf returns the Artifact entry for the file called name in dir.
func ArtifactOf(dir, name string) (Artifact, error) {
	if err := checkFileName(name); err != nil {
		return Artifact{}, fmt.Errorf("artifact name: %w", err)
	}
	d, err := DigestFile(filepath.Join(dir, name))
	if err != nil {
		return Artifact{}, err
	}
	return Artifact{Name: name, SHA256: d.SHA256, Size: d.Size}, nil
}

// WriteSigned writes m's canonical bytes to dir/manifest.json and their
// signature by priv to dir/manifest.sig (mode 0644 each, each atomically:
// temporary file, then rename, replacing what was there). It does not check
// that the artifacts match; VerifyDir does.
func WriteSigned(dir string, m *Manifest, priv ed25519.PrivateKey) error {
	if len(priv) != ed25519.PrivateKeySize {
		return fmt.Errorf("sign manifest: the signing key is %d bytes, want an ed25519 private key (%d)", len(priv), ed25519.PrivateKeySize)
	}
	data, err := Marshal(m)
	if err != nil {
		return fmt.Errorf("sign manifest: %w", err)
	}
	sig := Sign(priv, data)
	if err := atomicfile.Write(filepath.Join(dir, ManifestFile), data, 0o644); err != nil {
		return fmt.Errorf("sign manifest: %w", err)
	}
	if err := atomicfile.Write(filepath.Join(dir, SignatureFile), sig, 0o644); err != nil {
		return fmt.Errorf("sign manifest: %w", err)
	}
	return nil
}
