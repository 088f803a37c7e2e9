#!/usr/bin/env bash
# storage.sh: gpurack-local volumes against the same data disk mounted directly, on the
# QEMU node (make bench-storage).
#
# Runs TestRack (test/qemu) RUNS times with GPURACK_STORAGE_FIGURES: in each run, once
# machine B's data disks are prepared, a pod on B writes and reads 128 MiB with O_DIRECT
# (sequential, 1 MiB requests, fsync after the writes) through a gpurack-local volume
# and through a directory on the same data disk (a hostPath, the peer), alternating,
# three times each (`probe bench`); and the claim's time from its first pod's creation
# to its volume's; and, at the end of node A's branch, the same through a gpurack-shared
# volume against the NFS export mounted directly (shared_test.go). Then it writes the
# "storage" section of docs/benchmarks.md.
#
#   test/bench/storage.sh                one TestRack run (RUNS=1): 3 alternating samples a side
#   RUNS=3 test/bench/storage.sh         three runs, 9 samples a side
#   FIGURES=FILE COMMIT=REV test/bench/storage.sh
#                                        no run: write the section from the figures a run
#                                        of commit REV with GPURACK_STORAGE_FIGURES=FILE left
#   OUT=FILE test/bench/storage.sh       write the section to FILE instead of docs/bench/
set -euo pipefail
cd "$(dirname "$0")/../.."
. test/bench/lib.sh
RUNS=${RUNS:-1}
OUT=${OUT:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
figures=${FIGURES:-}
if [ -z "$figures" ]; then
  figures=$work/figures.tsv
  bench_testrack storage "$RUNS" GPURACK_STORAGE_FIGURES "$figures" "$work" || exit 1
fi
if [ ! -s "$figures" ]; then
  echo "storage bench: no figures in $figures (TestRack writes them in its gpurack-local subtest)" >&2
  exit 1
fi
commit=${COMMIT:-$(bench_commit)}
cell() { # NAME -> "median (min–max), n=N"
  local n
  n=$(awk -F'\t' -v n="$1" '$1 == n' "$figures" | wc -l)
  set -- $(awk -F'\t' -v n="$1" '$1 == n { print $2 }' "$figures" | bench_spread)
  if [ "$n" = 1 ]; then echo "$1, n=1"; else echo "$1 ($2–$3), n=$n"; fi
}
median() { awk -F'\t' -v n="$1" '$1 == n { print $2 }' "$figures" | bench_spread | cut -d' ' -f1; }
# tables A A-TEXT B B-TEXT CLAIM-TEXT CLAIM-FIGURE: the MiB/s table of volume A
# against its peer B (figures storage-A-write and so on) and the claim's seconds.
tables() {
  local kind
  echo "| figure | MiB/s |"
  echo "|---|---|"
  for kind in write read; do
    echo "| $kind $2 | $(cell "storage-$1-$kind") |"
    echo "| $kind $4 | $(cell "storage-$3-$kind") |"
    echo "| $kind: volume / direct (medians) | $(bench_ratio "$(median "storage-$1-$kind")" "$(median "storage-$3-$kind")") |"
  done
  echo
  echo "| figure | seconds |"
  echo "|---|---|"
  echo "| claim -> volume: $5 | $(cell "$6") |"
}
section=$(mktemp)
{
  echo "## Storage: a gpurack-local volume against its data disk mounted directly"
  echo
  echo "Machine: $(bench_machine)."
  echo "Command: \`make bench-storage\` (test/bench/storage.sh, RUNS=$RUNS), commit $commit: TestRack"
  echo "boots the simulated GPU image under QEMU -accel tcg (2 vCPUs) with a 2 GiB qcow2 data"
  echo "disk (virtio-blk, the host's file system underneath), prepared by the agent (GPT, XFS"
  echo "with project quotas). A pod on that node runs \`probe bench /data /direct 3 128\`: 128 MiB"
  echo "written with O_DIRECT in 1 MiB requests and fsynced, then read back with O_DIRECT, in"
  echo "the volume (A) and in a directory on the same XFS mounted into the pod as a hostPath"
  echo "(B, the peer), alternately, three times each per run. Emulated CPUs and a file-backed"
  echo "disk: the rates are not a real NVMe's; only the ratio within a run means something."
  echo
  tables local "through the gpurack-local volume" direct "in the data disk's directory (peer)" \
    "first pod created -> PersistentVolume created (WaitForFirstConsumer)" storage-claim-bound
  echo
  echo "The reads spread most: QEMU opens the qcow2 file with its default cache (writeback),"
  echo "so the guest's O_DIRECT reads may still be served from the host's page cache, by luck"
  echo "of what it holds; with three samples a side the read ratio is not a finding about the"
  echo "volume. Both sides are the same XFS on the same partition: a volume differs only by its"
  echo "directory's project id, which XFS accounts when blocks are allocated, not per read."
  echo "More runs (RUNS=3) narrow it."
  echo
  echo "The claim's time runs from the pod's creation (the claim waited for a consumer) through"
  echo "scheduling with the published capacity, the controller-manager's hand-off to the"
  echo "provisioner, and the agent's directory, project quota and PersistentVolume, at the"
  echo "apiserver's one-second timestamps."
  echo
  echo "### gpurack-shared (NFS) against the same export mounted directly"
  echo
  echo "In the same run, node A (the rig's storage host: nfs-kernel-server and the kernel's"
  echo "nfsd in A's image, exporting a tmpfs, sync) serves the export; a pod on node B runs"
  echo "\`probe bench /data /direct 3 64\`: 64 MiB written with O_DIRECT in 1 MiB requests and"
  echo "fsynced, then read back with O_DIRECT, through a gpurack-shared volume (A) and through a"
  echo "directory of the same export that the test mounts on B with the class's mount options"
  echo "(B, the peer), alternately, three times each per run. Both sides cross the same"
  echo "emulated network from B to A: only the ratio means something."
  echo
  tables shared "through the gpurack-shared volume" nfsdirect "through the export mounted directly (peer)" \
    "claim created -> PersistentVolume created (Immediate; the elected agent mounts the export on its first claim)" storage-shared-bound
} >"$section"
if [ -n "$OUT" ]; then
  cat "$section" >"$OUT"
  rm -f "$section"
else
  bench_section storage "$section"
fi
cat "${OUT:-docs/bench/storage.md}"
