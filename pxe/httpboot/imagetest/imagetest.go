// Package imagetest writes signed image directories for tests of gpuboot's
// image serving and of network boots (pxe/httpboot, test/qemu). It is for
// tests only: real images come from gpuimage build.
package imagetest

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/gpurack/gpurack/internal/manifest"
)

// Write creates store/<id>/ with the given files (name → content; missing
// required artifacts get small placeholder content), a manifest listing
// them and its signature by priv, and returns the image id. The id is
// derived from the file contents, so different contents give different
// ids.
func Write(store string, priv ed25519.PrivateKey, files map[string][]byte) (string, error) {
	all := map[string][]byte{
		manifest.ArtifactKernel:  []byte("kernel placeholder\n"),
		manifest.ArtifactInitrd:  []byte("initrd placeholder\n"),
		manifest.ArtifactRootfs:  []byte("rootfs placeholder\n"),
		manifest.ArtifactCmdline: []byte("console=ttyS0,115200\n"),
		manifest.ArtifactSBOM:    []byte("{}\n"),
	}
	for k, v := range files {
		all[k] = v
	}
	names := make([]string, 0, len(all))
	for n := range all {
		names = append(names, n)
	}
	sort.Strings(names)
	h := sha256.New()
	for _, n := range names {
		sum := sha256.Sum256(all[n])
		fmt.Fprintf(h, "%s %x\n", n, sum)
	}
	id := hex.EncodeToString(h.Sum(nil))[:40]
	dir := filepath.Join(store, id)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	m := &manifest.Manifest{
		SchemaVersion:     manifest.SchemaVersion,
		ImageID:           id,
		Profile:           "test",
		ProfileDigest:     strings.Repeat("1", 64),
		LockDigest:        strings.Repeat("2", 64),
		BuilderVersion:    "test",
		Kernel:            manifest.Kernel{Version: "test", Package: "test"},
		KubernetesVersion: "v0.0.0",
		Binaries: map[string]manifest.FileDigest{
			manifest.BinaryAgent:   {SHA256: strings.Repeat("3", 64), Size: 1},
			manifest.BinaryKubelet: {SHA256: strings.Repeat("4", 64), Size: 1},
		},
	}
	for _, n := range names {
		if err := os.WriteFile(filepath.Join(dir, n), all[n], 0o644); err != nil {
			return "", err
		}
		a, err := manifest.ArtifactOf(dir, n)
		if err != nil {
			return "", err
		}
		m.Artifacts = append(m.Artifacts, a)
	}
	if err := manifest.WriteSigned(dir, m, priv); err != nil {
		return "", err
	}
	return id, nil
}
