#!/usr/bin/env bash
# Builds the probe image archive (test/probe packed by hack/imagearchive) into $1.
# Static (CGO_ENABLED=0), -trimpath, no VCS stamp and an empty build id: the same source
# and Go toolchain (go.mod) give the same bytes, at any commit. PROBE_IMAGE sets the tag.
set -euo pipefail
out=${1:?usage: hack/probe-image.sh OUT.tar}
tag=${PROBE_IMAGE:-gpurack.io/probe:v1}
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$(dirname "$out")"
(cd "$repo" && CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go build -trimpath -buildvcs=false -ldflags "-s -w -buildid=" -o "$work/probe" ./test/probe)
(cd "$repo" && go run ./hack/imagearchive -binary "$work/probe" -tag "$tag" -out "$work/probe.tar")
mv "$work/probe.tar" "$out"
echo "$out: $tag, sha256 $(sha256sum "$out" | cut -d' ' -f1)"
