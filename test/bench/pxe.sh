#!/usr/bin/env bash
# pxe.sh: gpuboot's HTTP and TFTP servers against nginx and tftpd-hpa, side by side in
# one run, in a private pair of network namespaces (veth), with the same client for both.
#
#   HTTP: CLIENTS concurrent downloads of one SIZE_MIB file (rootfs.squashfs of a
#         signed test image), from gpuboot's /images/… and from nginx (sendfile on).
#   TFTP: CLIENTS concurrent fetches of ipxe.efi with blksize 1468 and tsize, from
#         gpuboot's TFTP server and from tftpd-hpa.
#   DHCP: DHCP_N broadcast PXE DHCPDISCOVERs (distinct MACs, at most 64 unanswered) to
#         gpuboot's proxyDHCP and to dnsmasq in proxy mode, one after the other; OFFERs
#         per second, latency percentiles, lost (unanswered after 1 s). perfdhcp (kea)
#         cannot be used for proxyDHCP: it expects yiaddr in the OFFER.
#
# Needs root, iproute2, nginx and tftpd-hpa (apt-get install nginx tftpd-hpa); the
# services those packages ship are not used. Defaults follow issue 4 (160 clients,
# 256 MiB); on a small machine start smaller: CLIENTS=32 SIZE_MIB=64 test/bench/pxe.sh
set -euo pipefail

CLIENTS=${CLIENTS:-160}
SIZE_MIB=${SIZE_MIB:-256}
cd "$(dirname "$0")/../.."

DHCP_N=${DHCP_N:-20000}
for tool in ip nginx in.tftpd dnsmasq go; do
  command -v "$tool" >/dev/null || { echo "pxe.sh: $tool not found (apt-get install iproute2 nginx tftpd-hpa dnsmasq-base)" >&2; exit 1; }
done
[ "$(id -u)" = 0 ] || { echo "pxe.sh: needs root for network namespaces" >&2; exit 1; }

work=$(mktemp -d)
tag=$(printf '%06x' $((RANDOM * RANDOM % 16777216)))
srv=gpr-$tag-bs cli=gpr-$tag-bc
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  ip netns del "$srv" 2>/dev/null || true
  ip netns del "$cli" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

go build -o "$work/pxebench" ./test/bench/pxebench

ip netns add "$srv"; ip netns add "$cli"
ip -n "$srv" link set lo up; ip -n "$cli" link set lo up
ip link add "gpr-$tag-a" netns "$srv" type veth peer name "gpr-$tag-b" netns "$cli"
ip -n "$srv" addr add 10.90.0.1/24 dev "gpr-$tag-a"; ip -n "$srv" link set "gpr-$tag-a" up
ip -n "$cli" addr add 10.90.0.2/24 dev "gpr-$tag-b"; ip -n "$cli" link set "gpr-$tag-b" up

# The same files for both servers: a signed image, and the iPXE binaries copied with
# links resolved (tftpd-hpa --secure chroots and cannot follow ipxe.efi -> /boot).
mkdir -p "$work/store" "$work/tftp"
id=$("$work/pxebench" mkimage -store "$work/store" -size $((SIZE_MIB << 20)) -pub "$work/pub.pem")
cp -L /usr/lib/ipxe/ipxe.efi /usr/lib/ipxe/snponly.efi /usr/lib/ipxe/undionly.kpxe "$work/tftp/"

ip netns exec "$srv" "$work/pxebench" serve -http 10.90.0.1:8080 -tftp 10.90.0.1:69 \
  -store "$work/store" -pub "$work/pub.pem" -ipxe "$work/tftp" 2>"$work/gpuboot.log" &
pids+=($!)

mkdir -p "$work/nginx"
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
    listen 10.90.0.1:8081;
    location /images/ { alias $work/store/; }
  }
}
CONF
ip netns exec "$srv" nginx -p "$work/nginx" -c "$work/nginx/nginx.conf" -g 'daemon off;' &
pids+=($!)
ip netns exec "$srv" in.tftpd --foreground --listen --user root --address 10.90.0.1:6969 \
  --secure --blocksize 1468 "$work/tftp" &
pids+=($!)

# Wait for the listeners.
for i in $(seq 100); do
  if ip netns exec "$cli" bash -c 'exec 3<>/dev/tcp/10.90.0.1/8080 && exec 3<>/dev/tcp/10.90.0.1/8081' 2>/dev/null; then break; fi
  sleep 0.1
done
url=/images/$id/rootfs.squashfs
# Warm-up: the first request makes gpuboot verify the image (reads it once).
ip netns exec "$cli" "$work/pxebench" httpload -url "http://10.90.0.1:8080$url" -c 1 >/dev/null
ip netns exec "$cli" "$work/pxebench" httpload -url "http://10.90.0.1:8081$url" -c 1 >/dev/null

row() { # name server result-line
  set -- "$1" "$2" $3
  printf '| %-5s | %-10s | %10s | %8s | %7s |\n' "$1" "$2" "$3" "$5" "${9}"
}
res() { ip netns exec "$cli" "$work/pxebench" "$@"; }

g_http=$(res httpload -url "http://10.90.0.1:8080$url" -c "$CLIENTS")
n_http=$(res httpload -url "http://10.90.0.1:8081$url" -c "$CLIENTS")
g_tftp=$(res tftpload -addr 10.90.0.1:69 -file ipxe.efi -c "$CLIENTS")
t_tftp=$(res tftpload -addr 10.90.0.1:6969 -file ipxe.efi -c "$CLIENTS")

# DHCP: one server at a time on the same link.
dhcp_run() { # command...
  ip netns exec "$srv" "$@" 2>/dev/null &
  local p=$!
  sleep 1
  ip netns exec "$cli" "$work/pxebench" dhcpload -iface "gpr-$tag-b" -n "$DHCP_N"
  kill "$p"; wait "$p" 2>/dev/null || true
}
g_dhcp=$(dhcp_run "$work/pxebench" dhcpserve -iface "gpr-$tag-a" -ip 10.90.0.1)
d_dhcp=$(dhcp_run dnsmasq --no-daemon --conf-file=/dev/null --user=root --port=0 --pid-file= \
  --bind-interfaces --interface="gpr-$tag-a" --log-facility=/dev/null --quiet-dhcp \
  --dhcp-leasefile="$work/leases" --dhcp-range=10.90.0.0,proxy \
  --pxe-service=x86PC,PXE,undionly.kpxe)

echo
echo "$CLIENTS concurrent clients; HTTP file ${SIZE_MIB} MiB; TFTP ipxe.efi $(stat -c %s "$work/tftp/ipxe.efi") bytes, blksize 1468"
echo
echo "| proto | server     |      MiB/s |  seconds | failed |"
echo "|-------|------------|------------|----------|--------|"
row HTTP gpuboot "$g_http"
row HTTP nginx "$n_http"
row TFTP gpuboot "$g_tftp"
row TFTP tftpd-hpa "$t_tftp"
echo
echo "DHCP: $DHCP_N PXE DISCOVERs, at most 64 outstanding"
echo
echo "| server        | OFFERs/s | seconds | p50 ms | p99 ms | lost |"
echo "|---------------|----------|---------|--------|--------|------|"
drow() { set -- "$1" $2; printf '| %-13s | %8s | %7s | %6s | %6s | %4s |\n' "$1" "$2" "$4" "$7" "${10}" "${12}"; }
drow "gpuboot proxy" "$g_dhcp"
drow "dnsmasq proxy" "$d_dhcp"
ratio() { awk -v a="${1%% *}" -v b="${2%% *}" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }
echo
echo "gpuboot/nginx HTTP throughput ratio: $(ratio "$g_http" "$n_http")"
echo "gpuboot/tftpd-hpa TFTP throughput ratio: $(ratio "$g_tftp" "$t_tftp")"
echo "gpuboot/dnsmasq DHCP offer rate ratio: $(ratio "$g_dhcp" "$d_dhcp")"
