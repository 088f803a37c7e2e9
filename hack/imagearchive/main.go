// Command imagearchive packs one static binary into a single-layer container image and
// writes it as a docker-archive tar that `ctr images import` accepts. Every timestamp is
// zero and entries are written in a fixed order, so the same binary gives the same bytes
// (the packer is imagebuilder/ociarchive.Pack; gpuimage checks such archives with
// ociarchive.Inspect before it ships them).
package main

import (
	"flag"
	"fmt"
	"os"
	"path"

	"github.com/gpurack/gpurack/imagebuilder/ociarchive"
)

func main() {
	binary := flag.String("binary", "", "static binary to place at / in the image")
	tag := flag.String("tag", "", "image reference, for example registry.k8s.io/pause:3.10.1")
	out := flag.String("out", "", "archive to write")
	user := flag.String("user", ociarchive.NobodyUser, "UID:GID the image runs as")
	flag.Parse()
	if *binary == "" || *tag == "" || *out == "" {
		fmt.Fprintln(os.Stderr, "imagearchive: -binary, -tag and -out are required")
		os.Exit(2)
	}
	if err := run(*binary, *tag, *out, *user); err != nil {
		fmt.Fprintln(os.Stderr, "imagearchive:", err)
		os.Exit(1)
	}
}

func run(binary, tag, out, user string) error {
	bin, err := os.ReadFile(binary)
	if err != nil {
		return err
	}
	if _, err := ociarchive.Normalize(tag); err != nil {
		return fmt.Errorf("-tag: %w", err)
	}
	archive, err := ociarchive.PackAs(path.Base(binary), bin, tag, user)
	if err != nil {
		return err
	}
	return os.WriteFile(out, archive, 0o644)
}
