// Command imagearchive packs one static binary into a single-layer container image and
// writes it as a docker-archive tar that `ctr images import` accepts. Every timestamp is
// zero and entries are written in a fixed order, so the same binary gives the same bytes.
package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path"
	"time"
)

func main() {
	binary := flag.String("binary", "", "static binary to place at / in the image")
	tag := flag.String("tag", "", "image reference, for example registry.k8s.io/pause:3.10.1")
	out := flag.String("out", "", "archive to write")
	flag.Parse()
	if *binary == "" || *tag == "" || *out == "" {
		fmt.Fprintln(os.Stderr, "imagearchive: -binary, -tag and -out are required")
		os.Exit(2)
	}
	if err := run(*binary, *tag, *out); err != nil {
		fmt.Fprintln(os.Stderr, "imagearchive:", err)
		os.Exit(1)
	}
}

var epoch = time.Unix(0, 0).UTC()

func tarFiles(files []struct {
	name string
	mode int64
	data []byte
}) ([]byte, error) {
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

type file = struct {
	name string
	mode int64
	data []byte
}

func digest(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func run(binary, tag, out string) error {
	bin, err := os.ReadFile(binary)
	if err != nil {
		return err
	}
	entry := "/" + path.Base(binary)
	layer, err := tarFiles([]file{{path.Base(binary), 0o755, bin}})
	if err != nil {
		return err
	}
	layerID := digest(layer)
	config, err := json.Marshal(map[string]any{
		"architecture": "amd64",
		"os":           "linux",
		"created":      epoch.Format(time.RFC3339),
		"config":       map[string]any{"Entrypoint": []string{entry}, "User": "65535:65535"},
		"rootfs":       map[string]any{"type": "layers", "diff_ids": []string{"sha256:" + layerID}},
	})
	if err != nil {
		return err
	}
	configName := digest(config) + ".json"
	manifest, err := json.Marshal([]map[string]any{{
		"Config":   configName,
		"RepoTags": []string{tag},
		"Layers":   []string{layerID + "/layer.tar"},
	}})
	if err != nil {
		return err
	}
	archive, err := tarFiles([]file{
		{configName, 0o644, config},
		{layerID + "/layer.tar", 0o644, layer},
		{"manifest.json", 0o644, manifest},
	})
	if err != nil {
		return err
	}
	return os.WriteFile(out, archive, 0o644)
}
