package ociarchive

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"
	"time"
)

// epoch is every timestamp Pack writes, so that the same binary gives the same bytes.
var epoch = time.Unix(0, 0).UTC()

type tarFile struct {
	name string
	mode int64
	data []byte
}

func tarFiles(files []tarFile) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		hdr := &tar.Header{Name: f.name, Mode: f.mode, Size: int64(len(f.data)), ModTime: epoch, Typeflag: tar.TypeReg, Format: tar.FormatPAX}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func hexDigest(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// Pack returns a docker archive (what `docker save` writes and `ctr images import`
// reads) of a single-layer linux/amd64 image: the static binary as /NAME, its
// entrypoint, run as user 65535, tagged tag. Every timestamp is zero and the entries
// come in a fixed order, so the same binary, name and tag give the same bytes.
func Pack(name string, binary []byte, tag string) ([]byte, error) {
	return PackAs(name, binary, tag, NobodyUser)
}

// NobodyUser is the user Pack's images run as: no account on a node, no file owner.
const NobodyUser = "65535:65535"

// PackAs is Pack with the image's user ("UID:GID"): "0:0" for an image that must act
// as root on the node, such as the break-glass debug image (images/debug).
func PackAs(name string, binary []byte, tag, user string) ([]byte, error) {
	if !validUser(user) {
		return nil, fmt.Errorf("pack: user %q: want UID:GID in numbers, for example 65535:65535", user)
	}
	if name == "" || path.Base(name) != name || name == "." || name == ".." {
		return nil, errors.New("pack: the binary's name must be a plain file name")
	}
	if tag == "" {
		return nil, errors.New("pack: an image reference (tag) is required")
	}
	layer, err := tarFiles([]tarFile{{name, 0o755, binary}})
	if err != nil {
		return nil, err
	}
	layerID := hexDigest(layer)
	config, err := json.Marshal(map[string]any{
		"architecture": "amd64",
		"os":           "linux",
		"created":      epoch.Format(time.RFC3339),
		"config":       map[string]any{"Entrypoint": []string{"/" + name}, "User": user},
		"rootfs":       map[string]any{"type": "layers", "diff_ids": []string{"sha256:" + layerID}},
	})
	if err != nil {
		return nil, err
	}
	configName := hexDigest(config) + ".json"
	manifest, err := json.Marshal([]map[string]any{{
		"Config":   configName,
		"RepoTags": []string{tag},
		"Layers":   []string{layerID + "/layer.tar"},
	}})
	if err != nil {
		return nil, err
	}
	return tarFiles([]tarFile{
		{configName, 0o644, config},
		{layerID + "/layer.tar", 0o644, layer},
		{"manifest.json", 0o644, manifest},
	})
}

// validUser reports whether user is "UID:GID", both decimal numbers below 2^32.
func validUser(user string) bool {
	uid, gid, ok := strings.Cut(user, ":")
	for _, n := range []string{uid, gid} {
		if _, err := strconv.ParseUint(n, 10, 32); err != nil || !ok {
			return false
		}
	}
	return true
}
