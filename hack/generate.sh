#!/usr/bin/env bash
# generate.sh regenerates the Go code for the protobuf APIs under api/ (the .pb.go and
# _grpc.pb.go files beside each .proto). The generated files are committed; `make
# generate` runs this script. It is not a build step: nothing else calls protoc.
#
# Output must be byte-for-byte reproducible, so every input is pinned:
#   protoc              Debian's protobuf-compiler package (libprotoc 3.21.12 in Debian 12);
#                       its version is written into every generated file's header.
#   protoc-gen-go       google.golang.org/protobuf/cmd/protoc-gen-go      v1.36.11
#   protoc-gen-go-grpc  google.golang.org/grpc/cmd/protoc-gen-go-grpc     v1.6.0
# The plugins are run from the tools folder `make k8s-bins` (hack/k8s-bins.sh) fills, never
# from $PATH:
#   GPURACK_CACHE   cache root            (default: ${XDG_CACHE_HOME:-~/.cache}/gpurack)
#   GPURACK_K8S_DIR this version's folder (default: $GPURACK_CACHE/k8s/v1.34.2)
# A plugin missing there is installed there with `go install module@version`; one of
# another version there is an error (this script does not overwrite a shared tool).
#
# Inputs are named relative to the repository root and sorted, and outputs use
# paths=source_relative, so file names and `source:` headers do not depend on where the
# checkout lives. Generation goes to a scratch folder first; a file in api/ is rewritten
# only when its bytes change, and a generated file whose .proto is gone is removed.
set -euo pipefail

PROTOC_VERSION=3.21.12
PROTOC_GEN_GO_VERSION=v1.36.11
PROTOC_GEN_GO_GRPC_VERSION=v1.6.0
K8S_VERSION=v1.34.2 # names the tools folder shared with hack/k8s-bins.sh

repo=$(cd "$(dirname "$0")/.." && pwd)
cache=${GPURACK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpurack}
dir=${GPURACK_K8S_DIR:-$cache/k8s/$K8S_VERSION}
bin=$dir/bin

log() { printf 'generate: %s\n' "$*"; }
die() { printf 'generate: error: %s\n' "$*" >&2; exit 1; }

# --- protoc -------------------------------------------------------------------------
protoc=$(command -v protoc) ||
  die "protoc not found on PATH: install Debian's protobuf-compiler package (apt-get install protobuf-compiler)"
got=$("$protoc" --version)
[ "$got" = "libprotoc $PROTOC_VERSION" ] ||
  die "$protoc is '$got', want 'libprotoc $PROTOC_VERSION' (Debian 12's protobuf-compiler); its version is written into every generated file, so another one changes them all"
# The well-known types (google/protobuf/timestamp.proto, ...) ship with the compiler,
# in the include folder beside its bin folder.
wkt=$(cd "$(dirname "$protoc")/.." && pwd)/include
[ -f "$wkt/google/protobuf/timestamp.proto" ] ||
  die "the protobuf well-known types are not in $wkt/google/protobuf: install Debian's libprotobuf-dev package"
log "using $protoc ($got), well-known types from $wkt"

# --- plugins ------------------------------------------------------------------------
# plugin NAME MODULE VERSION WANT: installs NAME if missing, then checks that
# `NAME --version` prints exactly WANT.
plugin() {
  local name=$1 module=$2 version=$3 want=$4 have
  if [ ! -x "$bin/$name" ]; then
    log "$name not found in $bin (make k8s-bins installs it there); installing $module@$version"
    mkdir -p "$bin" "$dir/work"
    # Outside the repository, so its go.mod plays no part; same flags as hack/k8s-bins.sh.
    (cd "$dir/work" && GOFLAGS= GOBIN="$bin" CGO_ENABLED=0 go install -trimpath "$module@$version") ||
      die "could not install $module@$version (is the Go module proxy reachable? see GOPROXY)"
  fi
  have=$("$bin/$name" --version 2>&1) || die "$bin/$name --version failed: $have"
  [ "$have" = "$want" ] ||
    die "$bin/$name is '$have', want '$want': remove it and rerun this script (or make k8s-bins) to install $module@$version"
  log "using $bin/$name ($have)"
}
plugin protoc-gen-go google.golang.org/protobuf/cmd/protoc-gen-go \
  "$PROTOC_GEN_GO_VERSION" "protoc-gen-go $PROTOC_GEN_GO_VERSION"
plugin protoc-gen-go-grpc google.golang.org/grpc/cmd/protoc-gen-go-grpc \
  "$PROTOC_GEN_GO_GRPC_VERSION" "protoc-gen-go-grpc ${PROTOC_GEN_GO_GRPC_VERSION#v}"

# --- generate -----------------------------------------------------------------------
cd "$repo"
mapfile -t protos < <(find api -name '*.proto' -type f | LC_ALL=C sort)
[ ${#protos[@]} -gt 0 ] || die "no .proto files under $repo/api"

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
log "protoc ${protos[*]}"
"$protoc" \
  --proto_path=. \
  --proto_path="$wkt" \
  --plugin=protoc-gen-go="$bin/protoc-gen-go" \
  --plugin=protoc-gen-go-grpc="$bin/protoc-gen-go-grpc" \
  --go_out="$out" --go_opt=paths=source_relative \
  --go-grpc_out="$out" --go-grpc_opt=paths=source_relative \
  "${protos[@]}"

# Install what changed; remove generated files no .proto produces any more.
changed=0
mapfile -t generated < <(cd "$out" && find . -type f -name '*.pb.go' | sed 's#^\./##' | LC_ALL=C sort)
for f in "${generated[@]}"; do
  if cmp -s "$out/$f" "$f"; then
    log "unchanged $f"
  else
    mkdir -p "$(dirname "$f")"
    cp "$out/$f" "$f.tmp" && mv "$f.tmp" "$f"
    log "wrote     $f"
    changed=$((changed + 1))
  fi
done
mapfile -t existing < <(find api -type f -name '*.pb.go' | LC_ALL=C sort)
for f in "${existing[@]}"; do
  if [ ! -f "$out/$f" ]; then
    rm -f "$f"
    log "removed   $f (no .proto generates it)"
    changed=$((changed + 1))
  fi
done
log "${#generated[@]} generated file(s), $changed changed"
