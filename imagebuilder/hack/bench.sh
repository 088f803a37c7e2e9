#!/usr/bin/env bash
# bench.sh: cold and warm `gpuimage build` of a profile, each artifact's size, and the
# squashfs stage against plain `mksquashfs -comp zstd` on the same tree, as one table.
# Usage: imagebuilder/hack/bench.sh [PROFILE]   (root; needs what gpuimage build needs)
# "cold" = empty .deb cache, apt state and kernel-module cache (an NVIDIA profile
# compiles its modules); "warm" = the same cache again.
set -euo pipefail
profile=${1:-profiles/tiny.yaml}
repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
go build -o "$work/gpuimage" ./imagebuilder/cmd/gpuimage

lock="$work/$(basename "${profile%.yaml}").lock.json"
cp "$profile" "$work/"
p="$work/$(basename "$profile")"
"$work/gpuimage" lock "$p" --cache "$work/cache" >/dev/null

t() { local s=$(date +%s.%N); "$@" >"$work/last.log" 2>&1; awk -v a="$s" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}'; }
unit=agent/systemd/gpuagent.service
cold=$(t "$work/gpuimage" build "$p" --agent-unit "$unit" --out "$work/cold" --cache "$work/cache")
warm=$(t "$work/gpuimage" build "$p" --agent-unit "$unit" --out "$work/warm" --cache "$work/cache")
cp "$work/last.log" "$work/warm.log"
dir=$(ls -d "$work"/warm/*/)

# The same tree through mksquashfs directly, from the image's own squashfs.
unsquashfs -q -d "$work/tree" "$dir/rootfs.squashfs" >/dev/null
sq=$(t env SOURCE_DATE_EPOCH=1 mksquashfs "$work/tree" "$work/plain.sqfs" -comp zstd -noappend -quiet -no-progress)

printf '%-34s %12s\n' "measure" "value"
printf '%-34s %12.1f s\n' "build $(basename "$profile") cold" "$cold"
printf '%-34s %12.1f s\n' "build $(basename "$profile") warm" "$warm"
grep -E 'stage .* done in' "$work/warm.log" | sed -E 's/.*stage [0-9]+\/[0-9]+ (.*): done in (.*)/  warm stage \1|\2/' | awk -F'|' '{printf "%-34s %12s\n", $1, $2}'
for f in vmlinuz initrd.img rootfs.squashfs cmdline manifest.json manifest.sig sbom.spdx.json; do
  printf '%-34s %12s B\n' "$f" "$(stat -c %s "$dir/$f")"
done
printf '%-34s %12s B\n' "mksquashfs -comp zstd, same tree" "$(stat -c %s "$work/plain.sqfs")"
printf '%-34s %12.1f s\n' "mksquashfs -comp zstd, time" "$sq"
# The cold and the warm build ran with different cache states into different
# directories: every artifact must still be the same bytes.
colddir=$(ls -d "$work"/cold/*/)
same=yes
for f in vmlinuz initrd.img rootfs.squashfs cmdline manifest.json manifest.sig sbom.spdx.json; do
  cmp -s "$colddir/$f" "$dir/$f" || same="no ($f differs)"
done
printf '%-34s %12s\n' "cold and warm artifacts identical" "$same"
