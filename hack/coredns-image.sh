#!/usr/bin/env bash
# Builds the CoreDNS image archive into $1: images/coredns (CoreDNS at the version its
# go.mod pins, with the cluster's plugins only) packed by hack/imagearchive as the
# image controlplane-bootstrap's Deployment runs (clusterdns.Image). Static
# (CGO_ENABLED=0), -trimpath, no VCS stamp and an empty build id: the same source and
# Go toolchain give the same bytes.
set -euo pipefail
out=${1:?usage: hack/coredns-image.sh OUT.tar}
repo=$(cd "$(dirname "$0")/.." && pwd)
version=$(cd "$repo/images/coredns" && go list -m -f '{{.Version}}' github.com/coredns/coredns)
tag=gpurack.io/coredns:$version
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$(dirname "$out")"
(cd "$repo/images/coredns" && CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go build -trimpath -buildvcs=false -ldflags "-s -w -buildid=" -o "$work/coredns" .)
(cd "$repo" && go run ./hack/imagearchive -binary "$work/coredns" -tag "$tag" -out "$work/coredns.tar")
mv "$work/coredns.tar" "$out"
echo "$out: $tag, sha256 $(sha256sum "$out" | cut -d' ' -f1)"
