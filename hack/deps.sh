#!/usr/bin/env bash
# deps.sh installs the Debian packages that gpurack's build and tests use, when any is
# missing. It is idempotent: with everything present it only checks.
set -euo pipefail

packages=(
  protobuf-compiler libprotobuf-dev # make generate (protoc and the well-known .proto files)
  curl              # tests and bench scripts fetch over loopback
  systemd           # systemd-analyze verifies the image's units
  systemd-container # test/systemdhost: systemd-nspawn boots the node image with systemd as PID 1
  systemd-journal-remote # agent/logship: writes the real journal files journalctl reads in its tests
  cpio              # initramfs inspection in the image tests
  iproute2          # network namespaces in tests
  openssl           # cross-checks of signatures and pins
  jq                # test/runbooks: docs/operations.md's listing loops (pruning the image store)
  ca-certificates
  git
  gcc libc6-dev     # cgo: gpuagent links dynamically for NVML
  mmdebstrap squashfs-tools kmod # gpuimage build: root filesystem, squashfs, depmod
  qemu-system-x86   # gpuimage tests: boot the tiny image (TCG)
  qemu-utils        # test/qemu: qemu-img makes the nodes' qcow2 data disks
  ipxe              # gpuboot: undionly.kpxe, ipxe.efi, snponly.efi served over TFTP
  udhcpc tftp-hpa   # pxe tests: real DHCP and TFTP clients
  ipxe-qemu ovmf    # test/qemu: network boot through SeaBIOS iPXE and OVMF (with qemu-system-x86)
  dnsmasq-base      # test/qemu: the site DHCP server and IPv6 RA beside gpuboot's proxy
  linux-image-amd64 # test/qemu: the guest kernel (/boot/vmlinuz-*)
  containerd runc containernetworking-plugins # controlplane-bootstrap: a real kubelet joins and runs a pod
  chromium          # pxe/report and test/graphs: the HTML rack checklist and the graphs page are opened in headless Chromium
  cmark-gfm         # pxe/report: the markdown rack report is rendered as GitHub would, to prove its escaping
  swtpm swtpm-tools # agent/attest, pxe/enroll: a software TPM 2.0 for the TPM-bound identity tests
  skopeo            # controlplane-bootstrap: the image registry's tests push and pull with a real client (docs/registry.md)
  xfsprogs e2fsprogs lvm2 mdadm # agent/datadisk: XFS with project quotas on data disks; ext4, LVM and RAID disks it must refuse
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "deps: Debian packages present"
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "deps: missing Debian packages: ${missing[*]}; install them as root: apt-get install ${missing[*]}" >&2
  exit 1
fi
echo "deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}"
