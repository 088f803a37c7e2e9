#!/usr/bin/env bash
# k8s-bins.sh builds the pinned Kubernetes, etcd and test-tool binaries from the Go
# module proxy into a cache outside the repository, and does nothing for a binary that
# is already there.
#
#   GPURACK_CACHE   cache root            (default: ${XDG_CACHE_HOME:-~/.cache}/gpurack)
#   GPURACK_K8S_DIR this version's folder (default: $GPURACK_CACHE/k8s/v1.34.2)
#
# Layout:  $GPURACK_K8S_DIR/bin/{kube-apiserver,...,etcd,etcdctl,etcdutl,grpcurl,promtool,
#          prometheus,alertmanager,amtool,kube-state-metrics,node_exporter,
#          victoria-logs,kueue,registry,staticcheck}
#          $GPURACK_K8S_DIR/bin/kueue-manifests/{crds/*.yaml,role.yaml,webhooks.yaml} (Kueue's)
#          $GPURACK_K8S_DIR/images/pause.tar  (docker archive, tag $PAUSE_IMAGE)
#
# Why a throwaway module: k8s.io/kubernetes and etcd's server carry replace directives,
# so `go install pkg@version` refuses them. A scratch module that requires them and pins
# each k8s.io staging module to the matching v0.x release builds them unchanged.
#
# Only what the tests and `make lint` run is built (the protobuf plugins of `make
# generate` are hack/generate.sh's to install). The nine groups (Kubernetes, etcd, the
# test tools, kube-state-metrics, node_exporter, VictoriaLogs, Kueue, the image registry,
# the pause image) build at once, each in its own module: on a cold machine one group's
# module downloads overlap another's compiling. Each group's lines carry its name; a group that fails fails the
# script, after the others finish.
set -euo pipefail

K8S_VERSION=v1.34.2
ETCD_VERSION=v3.6.16
GRPCURL_VERSION=v1.9.4
PROMETHEUS_VERSION=v0.316.0
ALERTMANAGER_VERSION=v0.35.0 # docs/decisions/0691: its UI is not built
KSM_VERSION=v2.20.0 # kube-state-metrics
NODE_EXPORTER_VERSION=v1.12.1 # shipped in every node image (imagebuilder reads it from bin/)
VICTORIALOGS_VERSION=v1.52.1 # the log store (docs/decisions/0694)
KUEUE_VERSION=v0.17.0 # job queues (docs/decisions/0696)
REGISTRY_VERSION=v3.1.2 # the in-cluster image registry, CNCF distribution (docs/decisions/0697)
STATICCHECK_VERSION=v0.8.2
PAUSE_IMAGE=registry.k8s.io/pause:3.10.1

repo=$(cd "$(dirname "$0")/.." && pwd)
cache=${GPURACK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpurack}
dir=${GPURACK_K8S_DIR:-$cache/k8s/$K8S_VERSION}
bin=$dir/bin
mkdir -p "$bin" "$dir/images" "$dir/work"

K8S_CMDS=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl kubeadm)

log() { printf 'k8s-bins: %s\n' "$*"; }
need() { [ ! -x "$bin/$1" ]; }

started=$(date +%s)

# --- Kubernetes -------------------------------------------------------------------
kubernetes() {
missing=()
for c in "${K8S_CMDS[@]}"; do need "$c" && missing+=("$c"); done
if [ ${#missing[@]} -gt 0 ]; then
  log "building Kubernetes $K8S_VERSION: ${missing[*]} (cold: about 6 min on 2 cores)"
  w=$dir/work/kubernetes
  mkdir -p "$w"
  minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  staging=v0.${K8S_VERSION#v1.}
  gomod=$(cd "$w" && GOFLAGS= go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  [ -n "$gomod" ] || { echo "k8s-bins: could not download k8s.io/kubernetes@$K8S_VERSION from the Go module proxy (check GOPROXY)" >&2; exit 1; }
  {
    echo "module gpurack.local/k8sbuild"
    echo "go 1.24.0"
    echo "godebug default=go1.24"
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo "replace ("
    sed -n 's#^[[:space:]]*\(k8s.io/[^ ]*\) => ./staging/.*#\t\1 => \1 '"$staging"'#p' "$gomod"
    echo ")"
  } >"$w/go.mod"
  log "pinned $(grep -c '=>' "$w/go.mod") staging modules to $staging"
  vpkgs=(k8s.io/component-base/version k8s.io/client-go/pkg/version)
  ld="-s -w"
  for p in "${vpkgs[@]}"; do
    ld+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
    ld+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  pkgs=()
  for c in "${missing[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
  (cd "$w" && GOFLAGS=-mod=mod go list -deps "${pkgs[@]}" >/dev/null)
  (cd "$w" && GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -ldflags "$ld" -o "$bin/" "${pkgs[@]}")
  log "built ${missing[*]}"
fi
}

# --- etcd -------------------------------------------------------------------------
etcd() {
if need etcd || need etcdctl || need etcdutl; then
  log "building etcd $ETCD_VERSION"
  w=$dir/work/etcd
  mkdir -p "$w"
  cat >"$w/go.mod" <<EOF
module gpurack.local/etcdbuild
go 1.26.0
require (
	go.etcd.io/etcd/server/v3 $ETCD_VERSION
	go.etcd.io/etcd/etcdctl/v3 $ETCD_VERSION
	go.etcd.io/etcd/etcdutl/v3 $ETCD_VERSION
)
EOF
  (cd "$w" && GOFLAGS=-mod=mod go list -deps go.etcd.io/etcd/server/v3 go.etcd.io/etcd/etcdctl/v3 go.etcd.io/etcd/etcdutl/v3 >/dev/null)
  # etcdutl restores snapshots (etcdctl's own restore is gone since v3.6): the etcd
  # backup runbook in docs/operations.md uses both. Only the missing ones are built.
  for b in etcd:server etcdctl:etcdctl etcdutl:etcdutl; do
    need "${b%%:*}" || continue
    (cd "$w" && GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$bin/${b%%:*}" "go.etcd.io/etcd/${b#*:}/v3")
  done
  log "built etcd etcdctl etcdutl"
fi
}

# --- test tools -------------------------------------------------------------------
install_tool() { # name module@version [ldflags [tags]]
  if need "$1"; then
    log "installing $2"
    (cd "$dir/work" && GOFLAGS= GOBIN="$bin" CGO_ENABLED=0 go install -trimpath -tags "${4:-}" -ldflags "-s -w ${3:-}" "$2")
  fi
}
# Alertmanager embeds its web UI's compiled assets (ui/app/dist), which its module
# source lacks from v0.32 on: they come from an npm and Elm build that fetches the Elm
# compiler and packages from outside the Go proxy. The module is copied out of the
# module cache, a placeholder page is put where the UI would be, and both commands are
# built from that copy with its own go.mod and go.sum (docs/decisions/0691).
alertmanager_bins() {
if need alertmanager || need amtool; then
  log "building Alertmanager $ALERTMANAGER_VERSION: alertmanager amtool (about 1 min cold)"
  w=$dir/work/alertmanager
  src=$(cd "$dir/work" && GOFLAGS= go mod download -json "github.com/prometheus/alertmanager@$ALERTMANAGER_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  [ -n "$src" ] || { echo "k8s-bins: could not download github.com/prometheus/alertmanager@$ALERTMANAGER_VERSION from the Go module proxy (check GOPROXY)" >&2; exit 1; }
  rm -rf "$w" && mkdir -p "$w" && cp -R "$src" "$w/src" && chmod -R u+w "$w/src"
  # ui/web.go serves an HTML file only as FILE.gz or FILE.br (by Accept-Encoding). The
  # .br is one uncompressed brotli meta-block (RFC 7932, 9.2), so no encoder is needed.
  for ui in elm mantine; do
    page=$w/src/ui/app/dist/$ui/index.html
    mkdir -p "${page%/*}"
    cat >"$page" <<EOF
<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>Alertmanager</title></head>
<body><p>Alertmanager $ALERTMANAGER_VERSION, built by gpurack without its web UI: the UI needs a
JavaScript build that cannot run air-gapped. Use amtool, or the API under /api/v2/.</p></body></html>
EOF
    gzip -9 -n -k "$page"
    h=$(( (($(wc -c <"$page") - 1) << 4) | (1 << 20) ))
    { printf "\\$(printf %03o $((h & 255)))\\$(printf %03o $(((h >> 8) & 255)))\\$(printf %03o $((h >> 16)))"
      cat "$page"; printf '\003'; } >"$page.br"
  done
  pv=github.com/prometheus/common/version
  ld="-s -w -X $pv.Version=${ALERTMANAGER_VERSION#v} -X $pv.Branch=release -X $pv.Revision=module-source"
  (cd "$w/src" && GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -ldflags "$ld" -o "$bin/" ./cmd/alertmanager ./cmd/amtool)
  log "built alertmanager amtool"
fi
}
tools() {
alertmanager_bins
install_tool staticcheck "honnef.co/go/tools/cmd/staticcheck@$STATICCHECK_VERSION"
install_tool grpcurl "github.com/fullstorydev/grpcurl/cmd/grpcurl@$GRPCURL_VERSION" "-X main.version=$GRPCURL_VERSION"
install_tool promtool "github.com/prometheus/prometheus/cmd/promtool@$PROMETHEUS_VERSION" \
  "-X github.com/prometheus/common/version.Version=$PROMETHEUS_VERSION -X github.com/prometheus/common/version.Branch=release" # about 4 min cold
# The metrics server (docs/decisions/0692): only Kubernetes service discovery (the
# cloud providers' are left out by Prometheus' own build tags), and no web UI, whose
# assets need an npm build (the API and gpuboot's graphs page serve instead).
install_tool prometheus "github.com/prometheus/prometheus/cmd/prometheus@$PROMETHEUS_VERSION" \
  "-X github.com/prometheus/common/version.Version=$PROMETHEUS_VERSION -X github.com/prometheus/common/version.Branch=release" \
  remove_all_sd,enable_kubernetes_sd # about 1 min after promtool
}

# --- kube-state-metrics -----------------------------------------------------------
# A group of its own (ksm): its module has no replace directive, so `go install
# pkg@version` builds it with its own go.mod, on its own k8s.io releases (v0.36), not
# gpurack's go.mod's or the Kubernetes group's. The version flags are its Makefile's; client_go_version (of
# kube_state_metrics_build_info) is read from its go.mod. Cold (empty module and build
# caches, 2 cores): about 2 min, 3 min 15 s with other builds beside it; peak RSS 0.9 GB.
ksm() {
if need kube-state-metrics; then
  gomod=$(cd "$dir/work" && GOFLAGS= go mod download -json "k8s.io/kube-state-metrics/v2@$KSM_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  [ -n "$gomod" ] || { echo "k8s-bins: could not download k8s.io/kube-state-metrics/v2@$KSM_VERSION from the Go module proxy (check GOPROXY)" >&2; exit 1; }
  clientgo=$(sed -n 's#^[[:space:]]*k8s.io/client-go \(v[^ ]*\)$#\1#p' "$gomod")
  pv=github.com/prometheus/common/version
  install_tool kube-state-metrics "k8s.io/kube-state-metrics/v2@$KSM_VERSION" \
    "-X $pv.Version=$KSM_VERSION -X $pv.Branch=release -X $pv.Revision=module-source -X k8s.io/kube-state-metrics/v2/pkg/app.ClientGoVersion=$clientgo"
fi
}

# --- node_exporter ----------------------------------------------------------------
# A group of its own (nodeexporter), like ksm: its module has no replace directive, so
# `go install pkg@version` builds it with its own go.mod (exporter-toolkit, whose
# --web.config.file gpuagent writes). The version flags are its .promu.yml's; static
# (CGO off), as its release tarballs for linux are. imagebuilder copies it into every
# node image as /usr/bin/node_exporter (docs/decisions/0693).
nodeexporter() {
if need node_exporter; then
  pv=github.com/prometheus/common/version
  install_tool node_exporter "github.com/prometheus/node_exporter@$NODE_EXPORTER_VERSION" \
    "-X $pv.Version=${NODE_EXPORTER_VERSION#v} -X $pv.Branch=release -X $pv.Revision=module-source"
  log "built node_exporter"
fi
}

# --- VictoriaLogs -----------------------------------------------------------------
# A group of its own (vlogs): its module has no replace directive, so `go install
# pkg@version` builds the victoria-logs command (app/victoria-logs) with its own go.mod
# (which asks for Go 1.26.5 or newer). Its web UI's compiled assets are in the module
# (app/vlselect/vmui), so nothing outside the Go proxy is needed.
# The version string is its Makefile's shape (APP-DATE-TIME-tags-VERSION-…), from which
# /metrics' vm_app_version takes short_version; CGO off, as its "-pure" build.
vlogs() {
if need victoria-logs; then
  log "building VictoriaLogs $VICTORIALOGS_VERSION: victoria-logs (under a minute cold)"
  install_tool victoria-logs "github.com/VictoriaMetrics/VictoriaLogs/app/victoria-logs@$VICTORIALOGS_VERSION" \
    "-X github.com/VictoriaMetrics/VictoriaMetrics/lib/buildinfo.Version=victoria-logs-19700101-000000-tags-$VICTORIALOGS_VERSION-module-source"
  log "built victoria-logs"
fi
}

# --- Kueue -----------------------------------------------------------------------
# A group of its own (kueue): job queues with fair sharing (docs/decisions/0696). Its
# module has no replace directive and its own k8s.io releases (v0.35), so it is built
# with its own go.mod and go.sum, not gpurack's. As Alertmanager's, the module is
# copied out of the module cache and built from the copy, with one change: with its
# internal certificate management off (the cluster CA signs its serving certificate),
# cmd/kueue reads its metrics certificate from a fixed /etc/kueue/metrics/certs, which
# a supervised process on a host should not need; the copy takes that folder from a
# --metrics-cert-dir flag instead (default the same path). The version flags are its
# Makefile's (GitVersion, GitCommit, BuildDate, the date fixed). Its manifests are
# copied beside the binary, into bin/kueue-manifests, for controlplane-bootstrap init to
# apply: the CRDs (config/components/crd/bases), the manager's ClusterRole
# (config/components/rbac/role.yaml) and its webhook configurations
# (config/components/webhook/manifests.yaml, which init points at the host).
kueue() {
if need kueue || [ ! -s "$bin/kueue-manifests/webhooks.yaml" ]; then
  log "building Kueue $KUEUE_VERSION: kueue (about 9 min cold on 2 busy cores)"
  w=$dir/work/kueue
  src=$(cd "$dir/work" && GOFLAGS= go mod download -json "sigs.k8s.io/kueue@$KUEUE_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  [ -n "$src" ] || { echo "k8s-bins: could not download sigs.k8s.io/kueue@$KUEUE_VERSION from the Go module proxy (check GOPROXY)" >&2; exit 1; }
  rm -rf "$w" && mkdir -p "$w" && cp -R "$src" "$w/src" && chmod -R u+w "$w/src"
  main=$w/src/cmd/kueue/main.go
  grep -q 'metricsCertPath := "/etc/kueue/metrics/certs"' "$main" || { echo "k8s-bins: $KUEUE_VERSION's cmd/kueue/main.go no longer fixes its metrics certificate path: revisit the patch (docs/decisions/0696)" >&2; exit 1; }
  sed -i 's#metricsCertPath := "/etc/kueue/metrics/certs"#metricsCertPath := *metricsCertDir#' "$main"
  printf '\n// Added by gpurack'"'"'s hack/k8s-bins.sh (docs/decisions/0696).\nvar metricsCertDir = flag.String("metrics-cert-dir", "/etc/kueue/metrics/certs", "The folder of tls.crt and tls.key for the metrics server when internalCertManagement is off.")\n' >>"$main"
  vp=sigs.k8s.io/kueue/pkg/version
  ld="-s -w -X $vp.GitVersion=$KUEUE_VERSION -X $vp.GitCommit=module-source -X $vp.BuildDate=1970-01-01T00:00:00Z"
  (cd "$w/src" && GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -ldflags "$ld" -o "$bin/kueue" ./cmd/kueue)
  m=$bin/kueue-manifests
  rm -rf "$m.tmp" && mkdir -p "$m.tmp/crds"
  cp "$src"/config/components/crd/bases/*.yaml "$m.tmp/crds/"
  cp "$src/config/components/rbac/role.yaml" "$m.tmp/role.yaml"
  cp "$src/config/components/webhook/manifests.yaml" "$m.tmp/webhooks.yaml"
  echo "$KUEUE_VERSION" >"$m.tmp/VERSION"
  chmod -R u+w,go-w "$m.tmp" && rm -rf "$m" && mv "$m.tmp" "$m"
  log "built kueue; its manifests in $m"
fi
}

# --- image registry --------------------------------------------------------------
# A group of its own (registry): CNCF distribution's registry command, which
# controlplane-bootstrap runs as the cluster's image registry (docs/decisions/0697). Its
# module has no replace directive, so `go install pkg@version` builds it with its own
# go.mod. The version flags are its Makefile's (version.version, version.revision); CGO
# off, as its release binaries are.
registry() {
if need registry; then
  log "building the image registry (distribution) $REGISTRY_VERSION: registry (about a minute cold)"
  dv=github.com/distribution/distribution/v3/version
  install_tool registry "github.com/distribution/distribution/v3/cmd/registry@$REGISTRY_VERSION" \
    "-X $dv.version=$REGISTRY_VERSION -X $dv.revision=module-source"
  log "built registry"
fi
}

# --- pause image ------------------------------------------------------------------
pause() {
if [ ! -s "$dir/images/pause.tar" ]; then
  log "building the pause image $PAUSE_IMAGE"
  (cd "$repo" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$dir/work/pause" ./hack/pause)
  (cd "$repo" && go run ./hack/imagearchive -binary "$dir/work/pause" -tag "$PAUSE_IMAGE" -out "$dir/images/pause.tar.tmp")
  mv "$dir/images/pause.tar.tmp" "$dir/images/pause.tar"
  echo "$PAUSE_IMAGE" >"$dir/images/pause.tag"
  log "built the pause image"
fi
}

# Each group runs in the background with its lines prefixed; wait collects each one's
# status (pipefail: the group's, not sed's).
pids=() groups=(kubernetes etcd tools ksm nodeexporter vlogs kueue registry pause)
for g in "${groups[@]}"; do
  (set -euo pipefail; "$g") 2>&1 | sed -u "s/^k8s-bins: /k8s-bins [$g]: /; t; s/^/k8s-bins [$g]: /" &
  pids+=($!)
done
failed=()
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || failed+=("${groups[$i]}")
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "k8s-bins: failed: ${failed[*]} (their lines above say why)" >&2
  exit 1
fi
log "done in $(( $(date +%s) - started )) s: $dir"
"$bin/kube-apiserver" --version
"$bin/etcd" --version | sed -n 1p # sed reads it all: no SIGPIPE under pipefail
