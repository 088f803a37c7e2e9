#!/usr/bin/env bash
# pxe.sh: the real `gpuboot serve` against its peers, side by side in one session, in a
# private pair of network namespaces joined by a veth link. It writes the PXE section
# of the benchmark table, docs/bench/pxe.md, and reassembles docs/benchmarks.md.
#
#   HTTP boot storm  HTTP_CLIENTS concurrent downloads of one image's rootfs.squashfs
#                    over loopback, from gpuboot's /images/… and from nginx (sendfile).
#   TFTP             TFTP_CLIENTS concurrent fetches of ipxe.efi (blksize 1468, tsize)
#                    over the veth link, from gpuboot and from tftpd-hpa.
#   DHCP full mode   perfdhcp (kea) DORA exchanges at each rate in DHCP_RATES for
#                    DHCP_SECONDS from DHCP_CLIENTS simulated clients, against gpuboot
#                    (dhcp.mode: full) and dnsmasq, each started fresh for every run.
#
# gpuboot is built from this tree, set up with `gpuboot init` and run with `gpuboot
# serve --config` and a gpuboot.yaml with default logging (info, to a file) and its
# metrics. Every side is warmed before it is measured, runs RUNS times, and the order
# of the two sides alternates from run to run. The section reports the median and the
# min–max of the runs, and gpuboot/peer ratios of the medians.
#
# The image: IMAGE_DIR (a built image directory, <store>/<image-id>, for example the
# tiny profile's) with IMAGE_KEY (the public key that signed it); without them, a
# random file of HTTP_BYTES bytes in a freshly signed store (the section says which).
#
# Needs root, iproute2, nginx, tftpd-hpa, dnsmasq, perfdhcp (Debian: nginx tftpd-hpa
# dnsmasq-base kea-admin) and the ipxe package. The services those packages ship are
# not used. OUT=FILE writes the section there instead and leaves docs/ alone.
set -euo pipefail
cd "$(dirname "$0")/../.."
. test/bench/lib.sh

RUNS=${RUNS:-3}
HTTP_CLIENTS=${HTTP_CLIENTS:-100}
HTTP_BYTES=${HTTP_BYTES:-141000000}
TFTP_CLIENTS=${TFTP_CLIENTS:-160}
DHCP_RATES=${DHCP_RATES:-1000 3000}
DHCP_SECONDS=${DHCP_SECONDS:-10}
DHCP_CLIENTS=${DHCP_CLIENTS:-60000}
IMAGE_DIR=${IMAGE_DIR:-}
IMAGE_KEY=${IMAGE_KEY:-}
OUT=${OUT:-}

for tool in ip nginx in.tftpd dnsmasq perfdhcp go; do
  command -v "$tool" >/dev/null || {
    echo "pxe.sh: $tool not found (apt-get install iproute2 nginx tftpd-hpa dnsmasq-base kea-admin)" >&2
    exit 1
  }
done
[ -e /usr/lib/ipxe/ipxe.efi ] || { echo "pxe.sh: /usr/lib/ipxe/ipxe.efi not found (apt-get install ipxe)" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "pxe.sh: needs root for network namespaces" >&2; exit 1; }
if [ -n "$IMAGE_DIR" ] && [ ! -f "$IMAGE_DIR/rootfs.squashfs" -o ! -f "$IMAGE_KEY" ]; then
  echo "pxe.sh: IMAGE_DIR must be an image directory holding rootfs.squashfs and IMAGE_KEY the public key that signed it" >&2
  exit 1
fi
[ "$RUNS" -ge 1 ] 2>/dev/null || { echo "pxe.sh: RUNS=$RUNS: want a positive number" >&2; exit 1; }

work=$(mktemp -d)
tag=$(printf '%06x' $((RANDOM * RANDOM % 16777216)))
srv=gpr-$tag-bs cli=gpr-$tag-bc
sif=gpr-$tag-a cif=gpr-$tag-b
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  ip netns del "$srv" 2>/dev/null || true
  ip netns del "$cli" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
log() { echo "pxe.sh: $*" >&2; }

go build -o "$work/gpuboot" ./pxe/cmd/gpuboot
go build -o "$work/pxebench" ./test/bench/pxebench

ip netns add "$srv"
ip netns add "$cli"
ip -n "$srv" link set lo up
ip -n "$cli" link set lo up
ip link add "$sif" netns "$srv" type veth peer name "$cif" netns "$cli"
ip -n "$srv" addr add 10.90.0.1/16 dev "$sif"
ip -n "$srv" link set "$sif" up
ip -n "$cli" addr add 10.90.0.2/16 dev "$cif"
ip -n "$cli" link set "$cif" up
in_srv() { ip netns exec "$srv" "$@"; }
in_cli() { ip netns exec "$cli" "$@"; }

# The same files for every server: a signed image store, and the iPXE binaries copied
# with links resolved (tftpd-hpa --secure chroots and cannot follow ipxe.efi -> /boot).
mkdir -p "$work/store" "$work/tftp"
if [ -n "$IMAGE_DIR" ]; then
  id=$(basename "$IMAGE_DIR")
  ln -s "$(realpath "$IMAGE_DIR")" "$work/store/$id"
  cp "$IMAGE_KEY" "$work/pub.pem"
  image_note="rootfs.squashfs of image $id ($(stat -L -c %s "$IMAGE_DIR/rootfs.squashfs") bytes)"
else
  id=$("$work/pxebench" mkimage -store "$work/store" -size "$HTTP_BYTES" -pub "$work/pub.pem")
  image_note="a random file of $HTTP_BYTES bytes as rootfs.squashfs of a freshly signed image (no built image was given)"
fi
cp -L /usr/lib/ipxe/ipxe.efi /usr/lib/ipxe/snponly.efi /usr/lib/ipxe/undionly.kpxe "$work/tftp/"
ipxe_bytes=$(stat -c %s "$work/tftp/ipxe.efi")

"$work/gpuboot" init --state-dir "$work/state" --advertise 10.90.0.1 --rack r1 >/dev/null
cat >"$work/gpuboot.yaml" <<CONF
stateDir: state
advertise: 10.90.0.1
listen:
  http: ":8080"
  tls: "127.0.0.1:8443"
interfaces:
  - name: $sif
dhcp:
  mode: full
  pool:
    start: 10.90.1.1
    end: 10.90.255.254
    netmask: 255.255.0.0
    leaseTime: 1h
tftp:
  dir: tftp
images:
  store: store
  trustedKeys: [pub.pem]
racks:
  - name: r1
    defaultImage: $id
CONF

server_pid=
start_gpuboot() {
  # Not through in_srv: $! must be the server's pid, not a subshell's.
  ip netns exec "$srv" "$work/gpuboot" serve --config "$work/gpuboot.yaml" 2>>"$work/gpuboot.log" &
  server_pid=$!
  pids+=("$server_pid")
  for _ in $(seq 100); do
    in_srv bash -c 'exec 3<>/dev/tcp/127.0.0.1/8080' 2>/dev/null && return 0
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.1
  done
  log "gpuboot serve did not start; its log:"
  tail -n 20 "$work/gpuboot.log" >&2
  exit 1
}
stop_pid() { kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }

mkdir -p "$work/nginx/tmp"
cat >"$work/nginx/nginx.conf" <<CONF
user root;
worker_processes auto;
pid $work/nginx/nginx.pid;
error_log $work/nginx/error.log;
events { worker_connections 1024; }
http {
  access_log off;
  sendfile on; tcp_nopush on;
  client_body_temp_path $work/nginx/tmp;
  server {
    listen 127.0.0.1:8081;
    location /images/ { alias $work/store/; }
  }
}
CONF

# HTTP and TFTP: gpuboot, nginx and tftpd-hpa run side by side; the load alternates.
start_gpuboot
ip netns exec "$srv" nginx -p "$work/nginx" -c "$work/nginx/nginx.conf" -g 'daemon off;' >>"$work/peers.log" 2>&1 &
pids+=($!)
ip netns exec "$srv" in.tftpd --foreground --listen --user root --address 10.90.0.1:6969 \
  --secure --blocksize 1468 "$work/tftp" >>"$work/peers.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do
  in_srv bash -c 'exec 3<>/dev/tcp/127.0.0.1/8081' 2>/dev/null && break
  sleep 0.1
done

path=/images/$id/rootfs.squashfs
http_cmd() { echo "pxebench httpload -url http://127.0.0.1:$1$path -c $HTTP_CLIENTS"; }
tftp_cmd() { echo "pxebench tftpload -addr 10.90.0.1:$1 -file ipxe.efi -c $TFTP_CLIENTS -blksize 1468"; }
declare -A port=([gpuboot]=8080 [nginx]=8081 [gpuboot-tftp]=69 [tftpd-hpa]=6969)

# Warm-up: gpuboot verifies the image on its first request (reads it once); both
# sides then have the file in the page cache.
log "warming HTTP and TFTP"
in_srv "$work/pxebench" httpload -url "http://127.0.0.1:8080$path" -c 2 >/dev/null
in_srv "$work/pxebench" httpload -url "http://127.0.0.1:8081$path" -c 2 >/dev/null
in_cli "$work/pxebench" tftpload -addr 10.90.0.1:69 -file ipxe.efi -c 4 >/dev/null
in_cli "$work/pxebench" tftpload -addr 10.90.0.1:6969 -file ipxe.efi -c 4 >/dev/null

# measure SIDE KIND: one run; appends "MiB/s failed" to $work/KIND-SIDE.
measure() {
  local side=$1 kind=$2 line
  if [ "$kind" = http ]; then
    line=$(in_srv "$work"/$(http_cmd "${port[$side]}"))
  else
    line=$(in_cli "$work"/$(tftp_cmd "${port[$side]}"))
  fi
  log "$kind $side: $line"
  set -- $line # "MiB/s" MiB/s seconds s bytes bytes failed failed
  echo "$1 $7" >>"$work/$kind-$side"
}
for i in $(seq "$RUNS"); do
  if [ $((i % 2)) = 1 ]; then order="a b"; else order="b a"; fi
  for s in $order; do
    if [ "$s" = a ]; then measure gpuboot http; else measure nginx http; fi
  done
  for s in $order; do
    if [ "$s" = a ]; then measure gpuboot-tftp tftp; else measure tftpd-hpa tftp; fi
  done
done
stop_pid "$server_pid"

# DHCP: one server at a time on the link, started fresh (empty lease table) per run.
dnsmasq_args=(--no-daemon --conf-file=/dev/null --user=root --port=0 --pid-file=
  --bind-interfaces --interface="$sif" --log-facility="$work/dnsmasq.log"
  --leasefile-ro --dhcp-range=10.90.1.1,10.90.255.254,255.255.0.0,1h
  --dhcp-lease-max=70000 --dhcp-boot=undionly.kpxe --no-ping)
perf_args() { echo "-4 -l $cif -r $1 -R $DHCP_CLIENTS -p $DHCP_SECONDS -W 1000000"; }
start_dhcp() { # side
  if [ "$1" = gpuboot ]; then
    start_gpuboot
  else
    ip netns exec "$srv" dnsmasq "${dnsmasq_args[@]}" >>"$work/peers.log" 2>&1 &
    server_pid=$!
    pids+=("$server_pid")
    sleep 0.5
  fi
}
# overflows NS: datagrams the kernel dropped in NS because a socket's receive
# buffer was full, since the namespace was made.
overflows() { ip netns exec "$1" nstat -asz UdpRcvbufErrors | awk '$1 == "UdpRcvbufErrors" { print $2 }'; }
# dhcp_run SIDE RATE: one run; appends "DO-drop% RA-drop% DO-avg-ms RA-avg-ms
# server-overflows client-overflows" to $work/dhcp-RATE-SIDE.
dhcp_run() {
  local side=$1 rate=$2 out s0 c0
  start_dhcp "$side"
  # Warm-up: a second at a tenth of the rate, from other MACs than the run's.
  in_cli perfdhcp -4 -l "$cif" -r $((rate / 10)) -R 1000 -b mac=02:99:00:00:00:00 -p 1 >/dev/null 2>&1 || true
  s0=$(overflows "$srv") c0=$(overflows "$cli")
  out=$(in_cli perfdhcp $(perf_args "$rate") 2>&1) || true
  s0=$(($(overflows "$srv") - s0)) c0=$(($(overflows "$cli") - c0))
  stop_pid "$server_pid"
  echo "$out" | awk '
    /^\*\*\*.*DISCOVER-OFFER/ { x = "do" } /^\*\*\*.*REQUEST-ACK/ { x = "ra" }
    /^sent packets:/ { sub(/^sent packets: /, ""); sent[x] = $1 + 0 }
    /^drops:/ { sub(/^drops: /, ""); drops[x] = $1 + 0 }
    /^avg delay:/ { sub(/^avg delay: /, ""); avg[x] = $1 + 0 }
    function pct(k) { return sent[k] > 0 ? 100 * drops[k] / sent[k] : 100 }
    END { printf "%.2f %.2f %.3f %.3f ", pct("do"), pct("ra"), avg["do"], avg["ra"] }' >>"$work/dhcp-$rate-$side"
  echo "$s0 $c0" >>"$work/dhcp-$rate-$side"
  log "dhcp $side at $rate/s: $(tail -n 1 "$work/dhcp-$rate-$side") (DO drop %, RA drop %, DO avg ms, RA avg ms, server and client socket overflows)"
  grep -q '^sent packets:' <<<"$out" || log "perfdhcp reported no exchanges: $out"
}
for rate in $DHCP_RATES; do
  for i in $(seq "$RUNS"); do
    if [ $((i % 2)) = 1 ]; then dhcp_run gpuboot "$rate"; dhcp_run dnsmasq "$rate"
    else dhcp_run dnsmasq "$rate"; dhcp_run gpuboot "$rate"; fi
  done
done

# The section.
col() { awk -v c="$2" '{ print $c }' "$1" | bench_spread; }  # FILE COLUMN -> median min max
cell() { set -- $(col "$1" "$2"); echo "$1 ($2–$3)"; }
failed() { awk '{ s += $2 } END { print s + 0 }' "$1"; }
ratio() { # FILE-A FILE-B: ratio of the medians (min–max of the per-run ratios)
  local ma mb
  ma=$(col "$1" 1 | cut -d' ' -f1)
  mb=$(col "$2" 1 | cut -d' ' -f1)
  set -- $(paste -d' ' "$1" "$2" | awk '$3 > 0 { printf "%.4f\n", $1 / $3 }' | bench_spread)
  printf '%s (%.2f–%.2f)\n' "$(bench_ratio "$ma" "$mb")" "$2" "$3"
}
version() { dpkg-query -W -f='${Version}' "$1" 2>/dev/null || echo unknown; }
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD -- 2>/dev/null || commit="$commit + local changes"

section=$(mktemp)
{
  echo "## PXE: gpuboot against nginx, tftpd-hpa and dnsmasq"
  echo
  echo "Machine: $(bench_machine)."
  echo "Command: \`make bench-pxe\` (test/bench/pxe.sh with RUNS=$RUNS HTTP_CLIENTS=$HTTP_CLIENTS"
  echo "TFTP_CLIENTS=$TFTP_CLIENTS DHCP_RATES=\"$DHCP_RATES\" DHCP_SECONDS=$DHCP_SECONDS DHCP_CLIENTS=$DHCP_CLIENTS)."
  echo
  echo "gpuboot: \`gpuboot serve --config gpuboot.yaml\` after \`gpuboot init\`, built from commit"
  echo "$commit, with default logging (info, to a file) and metrics; DHCP in full mode"
  echo "(pool 10.90.1.1–10.90.255.254)."
  echo "Peers, measured in the same run: nginx $(version nginx) (sendfile on, tcp_nopush on,"
  echo "access_log off, worker_processes auto), tftpd-hpa $(version tftpd-hpa) (--blocksize 1468),"
  echo "dnsmasq $(version dnsmasq-base) (the same pool, dhcp-lease-max 70000, no-ping since gpuboot does"
  echo "no ping check either, --leasefile-ro since gpuboot keeps its leases in memory only, default"
  echo "DHCP logging to a file)."
  echo "Each side is warmed first and runs $RUNS times; the order of the two sides alternates from"
  echo "run to run. Cells: median (min–max); ratio: gpuboot/peer of the medians (min–max of the"
  echo "per-run ratios)."
  echo
  echo "| benchmark | gpuboot | peer | peer figure | gpuboot/peer | failed (gpuboot, peer) |"
  echo "|---|---|---|---|---|---|"
  echo "| HTTP boot storm: $HTTP_CLIENTS clients × rootfs.squashfs, loopback, MiB/s | $(cell "$work/http-gpuboot" 1) | nginx | $(cell "$work/http-nginx" 1) | $(ratio "$work/http-gpuboot" "$work/http-nginx") | $(failed "$work/http-gpuboot"), $(failed "$work/http-nginx") |"
  echo "| TFTP: $TFTP_CLIENTS clients × ipxe.efi ($ipxe_bytes bytes), veth, MiB/s | $(cell "$work/tftp-gpuboot-tftp" 1) | tftpd-hpa | $(cell "$work/tftp-tftpd-hpa" 1) | $(ratio "$work/tftp-gpuboot-tftp" "$work/tftp-tftpd-hpa") | $(failed "$work/tftp-gpuboot-tftp"), $(failed "$work/tftp-tftpd-hpa") |"
  echo
  echo "HTTP file: $image_note."
  echo
  echo "DHCP full mode, perfdhcp DORA exchanges (DISCOVER→OFFER, REQUEST→ACK) over the veth"
  echo "link for $DHCP_SECONDS s from $DHCP_CLIENTS simulated clients; a reply not back within 1 s is a drop."
  echo "Socket overflows: datagrams the kernel dropped for a full receive buffer, all runs"
  echo "together, on the server's side and on perfdhcp's (there, not the server's doing)."
  echo
  echo "| DISCOVER/s | server | DISCOVER→OFFER drops % | REQUEST→ACK drops % | OFFER avg ms | ACK avg ms | socket overflows (server, client) |"
  echo "|---|---|---|---|---|---|---|"
  for rate in $DHCP_RATES; do
    for side in gpuboot dnsmasq; do
      f=$work/dhcp-$rate-$side
      echo "| $rate | $side | $(cell "$f" 1) | $(cell "$f" 2) | $(cell "$f" 3) | $(cell "$f" 4) | $(awk '{ s += $5; c += $6 } END { print s + 0 ", " c + 0 }' "$f") |"
    done
  done
  echo
  echo "Commands (in the script's network namespaces):"
  echo
  echo '```'
  echo "HTTP  $(http_cmd 8080 | sed "s/$id/IMAGE-ID/")   # gpuboot"
  echo "      $(http_cmd 8081 | sed "s/$id/IMAGE-ID/")   # nginx"
  echo "TFTP  $(tftp_cmd 69)   # gpuboot"
  echo "      $(tftp_cmd 6969)   # tftpd-hpa"
  for rate in $DHCP_RATES; do
    echo "DHCP  perfdhcp $(perf_args "$rate" | sed "s/$cif/CLIENT-VETH/")"
  done
  echo '```'
} >"$section"

if [ -n "$OUT" ]; then
  cat "$section" >"$OUT"
  rm -f "$section"
  log "wrote $OUT"
else
  bench_section pxe "$section"
fi
cat "${OUT:-docs/bench/pxe.md}"
