package rootfs

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Node is what gpuimage adds to the Debian system to make a gpurack node (CONTRACTS §6).
type Node struct {
	ImageID     string
	ProfileJSON []byte // the canonical profile, /etc/gpurack/profile.json
	Kubelet     string // path of the kubelet binary
	KubeProxy   string // path of the kube-proxy binary; empty: none shipped
	// NodeExporter is the path of the node_exporter binary, shipped with
	// node-exporter.service (decision 0693); empty: none shipped.
	NodeExporter  string
	PauseImage    string // path of the pause image archive (docker archive)
	PauseTag      string // its tag, containerd's sandbox_image
	Agent         string // path of the gpuagent binary
	AgentUnit     string // path of the gpuagent.service to install and enable
	KernelVersion string
	KernelModules string   // the extracted kernel's lib/modules/<version> directory
	Modules       []string // module files to ship, relative to KernelModules
	InstalledList string   // where the customize hook writes dpkg's installed list
	// ExtraModules maps a module file under /usr/lib/modules/<version>/ (for example
	// updates/dkms/nvidia-current.ko) to the built file to ship there.
	ExtraModules map[string]string
	// Images are the profile's container image archives, imported after the pause
	// image by gpurack-images.service.
	Images []ImageArchive
	// GPURuntime is how containers get GPUs (GPURuntimeFor); CDIHook and NvidiaRuntime
	// are the built nvidia-cdi-hook and nvidia-container-runtime it ships.
	GPURuntime             GPURuntime
	CDIHook, NvidiaRuntime string
}

// ImageArchive is one container image archive the rootfs ships.
type ImageArchive struct {
	Src   string   // the checked archive on the build host
	Dst   string   // its absolute path in the rootfs, under /usr/share/gpurack/images
	Names []string // the image references it carries, for the unit's comment
}

// NodeModules are the kernel modules every node loads or may load: what kubelet,
// containerd, the CNI plugins, kube-proxy and the NetworkPolicy enforcement need, and
// the data disks (NVMe, SATA/SAS, virtio; XFS, docs/storage.md), with their
// dependencies.
var NodeModules = []string{
	"overlay", "br_netfilter", "bridge", "veth", "vxlan", "nf_conntrack", "nf_nat",
	"ip_tables", "iptable_filter", "iptable_nat", "iptable_mangle", "iptable_raw",
	"ip6_tables", "ip6table_filter", "ip6table_nat", "ip6table_mangle",
	"xt_conntrack", "xt_MASQUERADE", "xt_addrtype", "xt_comment", "xt_mark", "xt_multiport",
	"xt_nat", "xt_statistic", "xt_tcpudp", "ipt_REJECT", "ip6t_REJECT", "nf_tables", "nft_compat",
	"nft_chain_nat", "nft_ct", "nft_nat", "nft_masq", "nft_numgen", "nft_reject", "nft_reject_inet", "nft_reject_ipv4", "nft_reject_ipv6",
	"nft_fib", "nft_fib_inet", "nft_fib_ipv4", "nft_fib_ipv6", "nft_limit", "nft_hash", "nft_redir", "ip_vs", "ip_vs_rr", "ip_vs_wrr", "ip_vs_sh", "ip_set", "autofs4", "loop", "squashfs",
	"nf_conntrack_netlink", "nfnetlink_queue", "nft_queue", "virtio_net", "virtio_blk", "virtio_pci", "virtio_console", "tls", "configfs", "efivarfs",
	"xfs", "nvme", "ahci", "sd_mod", "virtio_scsi",
	// The NFS client of gpurack-shared volumes (docs/storage.md), v4 and v3.
	"nfs", "nfsv4", "nfsv3",
}

// Write lays the node's files out in overlay (copied over the tree by mmdebstrap) and
// returns the customize-hook commands that finish the tree ($1 is the tree).
//
// mmdebstrap copies the overlay with cp -a, so its modes become the image's: overlay
// itself becomes the root directory and overlay/etc becomes /etc. Every directory
// Write makes is therefore 0755 and every file has its stated mode, whatever the
// builder's umask.
func (n *Node) Write(overlay string) ([]string, error) {
	if n.AgentUnit == "" {
		return nil, fmt.Errorf("node files: no gpuagent unit given (the image installs and enables gpuagent.service)")
	}
	copies, err := n.copies()
	if err != nil {
		return nil, err
	}
	// overlay may exist already; it becomes the root directory.
	if err := mkdir(overlay); err != nil {
		return nil, err
	}
	if err := os.Chmod(overlay, 0o755); err != nil {
		return nil, err
	}
	for name, content := range n.files() {
		mode := os.FileMode(0o644)
		if strings.HasPrefix(name, "usr/lib/gpurack/") {
			mode = 0o755
		}
		if err := writeFile(filepath.Join(overlay, name), []byte(content), mode); err != nil {
			return nil, err
		}
	}
	if err := writeFile(filepath.Join(overlay, "etc/gpurack/profile.json"), n.ProfileJSON, 0o644); err != nil {
		return nil, err
	}
	if err := n.writeGPURuntime(overlay); err != nil {
		return nil, err
	}
	for dst, c := range copies {
		if err := copyFile(c.src, filepath.Join(overlay, dst), c.mode); err != nil {
			return nil, err
		}
	}
	return n.hookCommands(), nil
}

// files are the files Write writes from memory, by path under the overlay.
func (n *Node) files() map[string]string {
	return map[string]string{
		"etc/hostname":                                "",
		"etc/gpurack/image-id":                        n.ImageID + "\n",
		"etc/containerd/config.toml":                  containerdConfig(n.PauseTag, n.GPURuntime),
		"etc/sysctl.d/90-gpurack-kubernetes.conf":     sysctls,
		"etc/modules-load.d/gpurack-kubernetes.conf":  "overlay\nbr_netfilter\nnf_conntrack\nnfnetlink_queue\n",
		"etc/systemd/system/kubelet.service":          kubeletUnit,
		"etc/systemd/system/kube-proxy.service":       kubeProxyUnit,
		"etc/systemd/system/node-exporter.service":    nodeExporterUnit,
		"etc/systemd/system/var-lib-containerd.mount": containerdStateMount,
		"etc/systemd/system/containerd.service.d/gpurack-state.conf": "# gpurack: containerd's state on its own tmpfs (var-lib-containerd.mount).\n" +
			"[Unit]\nRequiresMountsFor=/var/lib/containerd\n",
		"etc/systemd/system/gpurack-images.service":          imagesUnit(n.PauseTag, n.Images),
		"etc/systemd/system/gpurack-boot-report.service":     bootReportUnit,
		"usr/lib/gpurack/boot-report":                        bootReport,
		"etc/systemd/network/80-gpurack-dhcp.network":        networkdConfig,
		"etc/systemd/network/10-gpurack-pod-network.network": networkdPodLinks,
		"etc/systemd/networkd.conf.d/gpurack.conf":           networkdForeign,
		"etc/systemd/journald.conf.d/gpurack.conf":           "[Journal]\nStorage=volatile\n",
	}
}

// copied is a file Write copies into the overlay.
type copied struct {
	src  string
	mode os.FileMode
}

// copies are the files Write copies, by path under the overlay: the binaries, the
// gpuagent unit, the image archives and the kernel modules.
func (n *Node) copies() (map[string]copied, error) {
	copies := map[string]copied{
		"usr/bin/kubelet":                     {n.Kubelet, 0o755},
		"usr/bin/gpuagent":                    {n.Agent, 0o755},
		pauseArchive:                          {n.PauseImage, 0o644},
		"etc/systemd/system/gpuagent.service": {n.AgentUnit, 0o644},
	}
	if n.KubeProxy != "" {
		copies["usr/bin/kube-proxy"] = copied{n.KubeProxy, 0o755}
	}
	if n.NodeExporter != "" {
		copies["usr/bin/node_exporter"] = copied{n.NodeExporter, 0o755}
	}
	for _, im := range n.Images {
		dst := strings.TrimPrefix(im.Dst, "/")
		if !strings.HasPrefix(dst, "usr/share/gpurack/images/") || strings.Contains(dst, "..") || dst == pauseArchive {
			return nil, fmt.Errorf("node files: image archive %s: %q is not a file in /usr/share/gpurack/images", im.Src, im.Dst)
		}
		copies[dst] = copied{im.Src, 0o644}
	}
	modules := filepath.Join("usr/lib/modules", n.KernelVersion)
	for dst, src := range n.ExtraModules {
		copies[filepath.Join(modules, dst)] = copied{src, 0o644}
	}
	for _, m := range n.Modules {
		copies[filepath.Join(modules, m)] = copied{filepath.Join(n.KernelModules, m), 0o644}
	}
	for _, f := range []string{"modules.order", "modules.builtin", "modules.builtin.modinfo"} {
		if _, err := os.Stat(filepath.Join(n.KernelModules, f)); err == nil {
			copies[filepath.Join(modules, f)] = copied{filepath.Join(n.KernelModules, f), 0o644}
		}
	}
	return copies, nil
}

// hookCommands are the customize-hook commands that finish the tree ($1 is the tree).
func (n *Node) hookCommands() []string {
	enable := []string{"var-lib-containerd.mount", "systemd-networkd.service", "systemd-resolved.service", "gpurack-images.service", "gpurack-boot-report.service", "gpuagent.service"}
	cmds := []string{}
	if len(n.ExtraModules) > 0 {
		// What nvidia-kernel-dkms would ship: modprobe.d entry for Debian's driver
		// alternative, which maps nvidia* to the nvidia-current* module files.
		cmds = append(cmds, "ln -sf /etc/nvidia/nvidia-modprobe.conf \"$1/etc/modprobe.d/nvidia.conf\"")
	}
	cmds = append(cmds, []string{
		"depmod -b \"$1\" " + n.KernelVersion,
		// gpuagent's pod network writes its conflist here (agent/podnet); its unit
		// opens only this directory of /etc for writing, which must then exist.
		"install -d -m 0755 \"$1/etc/cni/net.d\"",
		"systemctl --root=\"$1\" enable " + strings.Join(enable, " "),
		// nfs-common brings rpcbind, enabled, listening on port 111: an NFS v4 client
		// (gpurack-shared's mounts) needs no portmapper, so a node that is not an NFS
		// server does not run one.
		"[ -e \"$1/usr/lib/systemd/system/nfs-server.service\" ] || [ ! -e \"$1/usr/lib/systemd/system/rpcbind.socket\" ] || systemctl --root=\"$1\" mask rpcbind.service rpcbind.socket",
		"printf 'IMAGE_ID=gpurack\\nIMAGE_VERSION=" + n.ImageID + "\\nDEFAULT_HOSTNAME=gpurack\\n' >> \"$1/usr/lib/os-release\"",
		"rm -f \"$1/etc/apt/sources.list\" && rm -rf \"$1\"/var/lib/apt/lists/* \"$1\"/var/cache/apt/*.bin",
		// No static hostname: hostnamed lets a static one override the transient
		// hostname, and the agent sets the node name as the transient one (CONTRACTS
		// §6), which kubelet then registers. Until then the fallback from os-release
		// (DEFAULT_HOSTNAME) names the machine.
		": > \"$1/etc/hostname\"",
		"chroot \"$1\" dpkg-query -W -f='${Package} ${Version} ${Architecture}\\n' > " + shellQuote(n.InstalledList),
	}...)
	return cmds
}

// mkdir makes dir and its missing parents, each with mode 0755 whatever the umask.
func mkdir(dir string) error {
	if st, err := os.Stat(dir); err == nil {
		if !st.IsDir() {
			return fmt.Errorf("%s is not a directory", dir)
		}
		return nil
	}
	if err := mkdir(filepath.Dir(dir)); err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o755); err != nil && !os.IsExist(err) {
		return err
	}
	return os.Chmod(dir, 0o755)
}

func writeFile(path string, data []byte, mode os.FileMode) error {
	if err := mkdir(filepath.Dir(path)); err != nil {
		return err
	}
	if err := os.WriteFile(path, data, mode); err != nil {
		return err
	}
	return os.Chmod(path, mode)
}

func copyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	if err := mkdir(filepath.Dir(dst)); err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Chmod(dst, mode)
}

// containerdConfig is containerd's config: the CRI plugin for kubelet, and the GPU
// container runtime's part (ImageContainerdGPU) where the image has one.
func containerdConfig(pause string, gpu GPURuntime) string {
	return fmt.Sprintf(`# gpurack: containerd for kubelet (CONTRACTS §6). Guests run cgroup v2 under systemd.
version = 2

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
`+ImageContainerdGPU.CRIConfig(gpu)+`
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      SystemdCgroup = true

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "/etc/cni/net.d"
`+RegistryCRIConfig(RegistryHostsDir), pause)
}

// RegistryHostsDir is containerd's registry config_path in the image: the folder of
// HOST:PORT/hosts.toml files gpuagent writes (agent/registryhosts.DefaultDir).
const RegistryHostsDir = "/run/gpurack/containerd/certs.d"

// RegistryCRIConfig is the CRI plugin's registry part of containerd's config, with
// dir as config_path (the image: RegistryHostsDir; tests: a folder of their own).
func RegistryCRIConfig(dir string) string {
	return `
  # Registries: one HOST:PORT/hosts.toml per registry, read on each pull (no restart).
  # gpuagent writes the cluster registry's after the join, from the JoinBundle, with the
  # cluster CA beside it (docs/registry.md, How nodes pull). Under /run: it is this
  # boot's state from this boot's bundle (the node's root is in RAM anyway), and no
  # image build bakes a registry address or CA in.
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = ` + strconv.Quote(dir) + `
`
}

const sysctls = `# gpurack: what kubelet and the CNI plugins need (CONTRACTS §6).
net.ipv4.ip_forward = 1
net.bridge.bridge-nf-call-iptables = 1
net.bridge.bridge-nf-call-ip6tables = 1
`

const kubeletUnit = `# gpurack: kubelet (CONTRACTS §6). Not enabled: gpuagent writes its bootstrap
# kubeconfig and config, then starts it over D-Bus.
[Unit]
Description=kubelet: the Kubernetes node agent
Documentation=https://kubernetes.io/docs/reference/command-line-tools-reference/kubelet/
Wants=containerd.service
After=containerd.service gpurack-images.service network-online.target

[Service]
ExecStart=/usr/bin/kubelet --bootstrap-kubeconfig=/var/lib/kubelet/bootstrap-kubeconfig --kubeconfig=/var/lib/kubelet/kubeconfig --config=/var/lib/kubelet/config.yaml
Restart=always
RestartSec=5

[Install]
WantedBy=multi-user.target
`

const kubeProxyUnit = `# gpurack: kube-proxy, nftables mode (decision 0602). Not enabled: after the join
# gpuagent writes its config, which names kubelet's node kubeconfig, and starts it.
[Unit]
Description=kube-proxy: Kubernetes Service routing
Documentation=https://kubernetes.io/docs/reference/command-line-tools-reference/kube-proxy/
After=kubelet.service network-online.target

[Service]
ExecStart=/usr/bin/kube-proxy --config=/var/lib/kube-proxy/config.yaml
Restart=always
RestartSec=5

[Install]
WantedBy=multi-user.target
`

// nodeExporterUnit runs node_exporter with the scrape credential (decision 0693). Not
// enabled: after the join gpuagent writes its web configuration, serving certificate
// and key, the cluster CA and LISTEN under /run/gpurack/node-exporter (agent/nodeexporter;
// that directory is the agent's, 0700) and restarts it. node_exporter runs as a
// dynamic user with no capabilities: systemd reads the files as root and hands them
// to it (LoadCredential), and the web configuration names them relative to itself.
// Unprivileged, it reads /proc, /sys and statfs of every mount it can reach (the data
// disks under /var/lib/gpurack/datadisks, mode 0755); mounts made after its start
// propagate into its namespace. kubelet's and containerd's per-pod mounts are left
// out: a dynamic user cannot reach them, and they are the pods', not the node's.
// test/systemdhost's TestNodeExporterService runs it under systemd and scrapes it.
const nodeExporterUnit = `# gpurack: node_exporter, the node's metrics (decision 0693). Not enabled: after the
# join gpuagent writes its TLS web configuration under /run/gpurack/node-exporter and
# restarts it; only the metrics server's client certificate may scrape.
[Unit]
Description=node_exporter: the node's hardware and OS metrics
Documentation=https://github.com/prometheus/node_exporter
After=network-online.target

[Service]
EnvironmentFile=/run/gpurack/node-exporter/env
LoadCredential=web.yml:/run/gpurack/node-exporter/web.yml
LoadCredential=tls.crt:/run/gpurack/node-exporter/tls.crt
LoadCredential=tls.key:/run/gpurack/node-exporter/tls.key
LoadCredential=client-ca.crt:/run/gpurack/node-exporter/client-ca.crt
ExecStart=/usr/bin/node_exporter --web.listen-address=${LISTEN} --web.config.file=%d/web.yml   --collector.filesystem.mount-points-exclude=^/(dev|proc|sys|run/credentials/.+|run/containerd/.+|run/netns/.+|var/lib/kubelet/.+|var/lib/containerd/.+)($$|/)
Restart=always
RestartSec=5
DynamicUser=yes
CapabilityBoundingSet=
AmbientCapabilities=
NoNewPrivileges=yes
ProtectSystem=strict
ProtectHome=yes
PrivateTmp=yes
PrivateDevices=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
ProtectHostname=yes
RestrictNamespaces=yes
RestrictRealtime=yes
RestrictSUIDSGID=yes
LockPersonality=yes
MemoryDenyWriteExecute=yes
RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK
SystemCallArchitectures=native
SystemCallFilter=@system-service
# The timex collector reads the kernel's clock discipline with adjtimex(2) (@clock):
# without CAP_SYS_TIME, which the unit does not have, it can only read. No
# ProtectClock=, which would forbid it.
SystemCallFilter=adjtimex
# A system call outside the filter fails with EPERM instead of killing node_exporter
# in the middle of a scrape.
SystemCallErrorNumber=EPERM
MemoryMax=256M

[Install]
WantedBy=multi-user.target
`

// containerdStateMount gives containerd's state its own tmpfs. The node's root is
// an overlay (the verified squashfs under a tmpfs, gpurack-init), and overlayfs
// cannot take another overlayfs as its upper layer, so containerd's overlayfs
// snapshots, every container's root, fail to mount there ("invalid argument"). The
// node is diskless: the state is in memory either way, and goes at power-off as the
// rest of the root does.
const containerdStateMount = `# gpurack: containerd's state on tmpfs; overlayfs snapshots cannot stack on the
# node's overlay root. containerd.service requires it (RequiresMountsFor).
[Unit]
Description=containerd state (tmpfs)
DefaultDependencies=no
Conflicts=umount.target
Before=local-fs.target umount.target

[Mount]
What=tmpfs
Where=/var/lib/containerd
Type=tmpfs
Options=mode=0711,nosuid,nodev

[Install]
WantedBy=local-fs.target
`

// pauseArchive is the pause image's archive in the rootfs.
const pauseArchive = "usr/share/gpurack/images/pause.tar"

// imagesUnit imports the pause image and the profile's image archives shipped in the
// image into containerd's k8s.io namespace, so that pods start with no registry
// reachable. The profile's archives are imported for the node's platform only (a
// multi-platform export may hold just that one; gpuimage checked it is complete).
func imagesUnit(pauseTag string, images []ImageArchive) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# gpurack: import the pause image (%s)", pauseTag)
	if len(images) > 0 {
		b.WriteString(" and the profile's image archives")
	}
	b.WriteString(" shipped in the image into containerd.\n")
	for _, im := range images {
		fmt.Fprintf(&b, "# %s: %s\n", im.Dst, strings.Join(im.Names, " "))
	}
	b.WriteString(imagesUnitBody)
	for _, im := range images {
		fmt.Fprintf(&b, "ExecStart=/usr/bin/ctr --namespace k8s.io images import %s\n", im.Dst)
	}
	b.WriteString(imagesUnitInstall)
	return b.String()
}

const imagesUnitBody = `[Unit]
Description=Import the gpurack node's bundled container images
After=containerd.service
Requires=containerd.service
Before=kubelet.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/bin/ctr --namespace k8s.io images import --all-platforms /usr/share/gpurack/images/pause.tar
`

const imagesUnitInstall = `
[Install]
WantedBy=multi-user.target
`

const bootReportUnit = `# gpurack: one line on the console (through /dev/kmsg, which a serial getty's hangup
# does not silence) once the node reached multi-user.target: which image booted, what
# the root is, and the state of the node's services.
[Unit]
Description=Report that the gpurack node booted
After=multi-user.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/lib/gpurack/boot-report

[Install]
WantedBy=multi-user.target
`

const bootReport = `#!/bin/sh
# Writes the gpurack boot milestone to the kernel log.
root=$(findmnt -n -o FSTYPE /)
lower=$(findmnt -n -o FSTYPE /run/gpurack/ro 2>/dev/null || echo none)
state() { printf '%s=%s' "$1" "$(systemctl is-active "$1" 2>/dev/null)"; }
msg="gpurack: booted image $(cat /etc/gpurack/image-id) root=$root lower=$lower $(state multi-user.target) $(state containerd.service) $(state gpurack-images.service) $(state gpuagent.service) $(state systemd-timesyncd.service) cgroup=$(stat -fc %T /sys/fs/cgroup)"
echo "<5>$msg" > /dev/kmsg
echo "$msg"
`

const networkdConfig = `# gpurack: DHCP on every Ethernet NIC (gpurack-init sets the boot NIC down before
# switch_root, so that udev can rename it); keep the address when networkd stops.
# The pod network's links match 10-gpurack-pod-network.network first.
[Match]
Type=ether

[Network]
DHCP=ipv4
KeepConfiguration=dhcp-on-stop
`

// networkdPodLinks keeps systemd-networkd away from the links the pod network makes:
// the CNI bridge, flannel's vxlan device and the pods' veths are all Type=ether, and
// networkd managing one takes a veth out of its bridge (KeepMaster=no) and runs DHCP
// on it, so that pods lose the network at random.
const networkdPodLinks = `# gpurack: the pod network's links (agent/podnet: bridge cni0, flannel's vxlan
# device, the pods' veths) belong to the CNI plugins and flannel, not to networkd.
[Match]
Name=cni0 flannel.* veth*

[Link]
Unmanaged=yes
`

// networkdForeign keeps the routes flannel adds (host-gw: a route per node on the
// managed NIC) when networkd reconfigures a link.
const networkdForeign = `# gpurack: routes and rules that networkd did not make are flannel's; keep them.
[Network]
ManageForeignRoutes=no
ManageForeignRoutingPolicyRules=no
`
