#!/usr/bin/env bash
# Builds the break-glass debug image archive (images/debug, packed by hack/imagearchive
# as root: it must chroot into the node's root) into $1. Static (CGO_ENABLED=0),
# -trimpath, no VCS stamp and an empty build id: the same source and Go toolchain
# (go.mod) give the same bytes, at any commit. DEBUG_IMAGE sets the tag.
set -euo pipefail
out=${1:?usage: hack/debug-image.sh OUT.tar}
tag=${DEBUG_IMAGE:-gpurack.io/debug:v1}
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$(dirname "$out")"
(cd "$repo" && CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go build -trimpath -buildvcs=false -ldflags "-s -w -buildid=" -o "$work/gpurack-debug" ./images/debug)
(cd "$repo" && go run ./hack/imagearchive -binary "$work/gpurack-debug" -tag "$tag" -user 0:0 -out "$work/debug.tar")
mv "$work/debug.tar" "$out"
echo "$out: $tag, sha256 $(sha256sum "$out" | cut -d' ' -f1)"
