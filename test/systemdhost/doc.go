// Package systemdhost tests the systemd units gpurack ships where systemd is PID 1:
// the node image's own root filesystem (the tiny image of test/rigimage, from the
// image cache) booted under systemd-nspawn, with systemd as the container's PID 1, on
// the host's kernel, in a network namespace the test makes. It is not a QEMU guest:
// the kernel, its modules and the hardware are the host's, and nothing here boots
// through firmware or PXE (test/qemu does that).
//
// TestGpubootService installs pxe/systemd's gpuboot.service, its sysusers.d and
// sysctl.d files and a gpuboot built from this tree with the commands docs/pxe.md
// gives ("Running gpuboot under systemd"), run as written, and checks the unit's user,
// capabilities, sandbox, service on the network, journal, restart on failure, clean
// stop and state directory.
// TestControlPlaneUnits runs `controlplane-bootstrap init` without --foreground, so
// that it installs and starts the control plane's units over D-Bus, and checks them:
// active, etcd ready before kube-apiserver starts, /readyz, a killed kube-apiserver
// restarted, the journal, init run again, and the units brought up again in order by
// a power cycle of the container.
//
// The tests need root, systemd-nspawn (systemd-container), network namespaces, the
// image tools and the pinned Kubernetes binaries; without them they skip through
// internal/testreq, and under `make test` they fail instead.
package systemdhost
