package controlplane

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/gpurack/gpurack/agent/registryhosts"
	"github.com/gpurack/gpurack/controlplane-bootstrap/components"
	"github.com/gpurack/gpurack/imagebuilder/rootfs"
	"github.com/gpurack/gpurack/internal/testreq"
)

// A node's containerd pulls from the cluster registry because of what gpuagent writes
// (docs/registry.md, How nodes pull): the real registry with a pushed image, Debian's
// containerd 1.6 with the image's CRI registry section (config_path, pointed at a
// folder of the test's), and registryhosts.Apply writing into that folder as the agent
// does. Before Apply a CRI pull (kubelet's path) fails on the unknown authority; after
// it, the same containerd, not restarted, pulls. ctr with --hosts-dir pulls too, and
// without it fails on the certificate.
func TestNodeContainerdPullsWithHostsTOML(t *testing.T) {
	testreq.Root(t, "containerd runs as root (its snapshotter mounts)")
	testreq.File(t, "/usr/bin/containerd", "apt-get install containerd (hack/deps.sh lists it)")
	ctr := testreq.Tool(t, "ctr", "apt-get install containerd (hack/deps.sh lists it)")
	// Not loopback: containerd speaks plain HTTP to a loopback registry that has no
	// hosts.toml, and the check that only the CA makes the pull work needs TLS.
	r := newRegistryRigAt(t, nonLoopbackIPv4(t))
	img := writeOCIImage(t, filepath.Join(r.dir, "app"), "1", "hello from the cluster registry")
	r.push(t, img, "team/app:1")
	registry := strings.TrimPrefix(components.RegistryURL(r.cfg), "https://")
	ref := registry + "/team/app:1"

	dir, err := os.MkdirTemp("", "gpr-nodepull-") // short: containerd's socket path
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	hostsDir := filepath.Join(dir, "certs.d")
	sock := startContainerd(t, dir, rootfs.RegistryCRIConfig(hostsDir))

	// No hosts.toml yet: containerd knows no CA for the registry.
	if _, err := criPull(sock, ref, rigUser, rigPassword); err == nil || !strings.Contains(err.Error(), "certificate signed by unknown authority") {
		t.Fatalf("CRI pull with no hosts.toml: %v; want an unknown-authority error", err)
	}
	caPEM, err := os.ReadFile(r.l.PKI("ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := registryhosts.Apply(hostsDir, registry, caPEM); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s:\n%s", filepath.Join(hostsDir, registry, registryhosts.HostsFile), readFile(t, filepath.Join(hostsDir, registry, registryhosts.HostsFile)))
	imageRef, err := criPull(sock, ref, rigUser, rigPassword)
	if err != nil || imageRef != img.config { // CRI's image ID is its config's digest
		t.Fatalf("CRI pull through hosts.toml: %q, %v\n%s", imageRef, err, tailContainerdLog(dir))
	}
	t.Logf("CRI pulled %s: %s", ref, imageRef)
	// A wrong password: the token issuer refuses, and so does the pull.
	if _, err := criPull(sock, ref, rigUser, "wrong"); err == nil {
		t.Error("CRI pull with a wrong password succeeded")
	}

	run := func(args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, ctr, append([]string{"--address", sock, "--namespace", "gpurack-test"}, args...)...).CombinedOutput()
		return string(out), err
	}
	if out, err := run("images", "pull", "--user", rigUser+":"+rigPassword, ref); err == nil || !strings.Contains(out, "certificate signed by unknown authority") {
		t.Errorf("ctr pull without --hosts-dir: %v; want an unknown-authority error\n%s", err, out)
	}
	if out, err := run("images", "pull", "--hosts-dir", hostsDir, "--user", rigUser+":"+rigPassword, ref); err != nil {
		t.Fatalf("ctr pull --hosts-dir: %v\n%s", err, out)
	}
	if out, err := run("images", "ls", "-q"); err != nil || !strings.Contains(out, ref) {
		t.Errorf("ctr images ls: %v\n%s", err, out)
	}
}

// startContainerd runs Debian's containerd with its root, state and socket under dir
// and criExtra inside its CRI table, until the test ends; it returns the socket.
func startContainerd(t *testing.T, dir, criExtra string) string {
	t.Helper()
	sock := filepath.Join(dir, "containerd.sock")
	config := fmt.Sprintf(`version = 2
root = %q
state = %q
[grpc]
  address = %q
[ttrpc]
  address = %q
[plugins."io.containerd.internal.v1.opt"]
  path = %q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.10.1"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = %q
%s`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), sock, sock+".ttrpc", filepath.Join(dir, "opt"), filepath.Join(dir, "cni"), criExtra)
	path := filepath.Join(dir, "containerd.toml")
	if err := os.WriteFile(path, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	logf, err := os.Create(filepath.Join(dir, "containerd.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("/usr/bin/containerd", "--config", path)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		logf.Close()
		// The pulled image's layers are mounted nowhere (no container ran), so the
		// folder goes with dir.
	})
	// An empty image name: containerd answers InvalidArgument once its CRI serves;
	// Unimplemented says the CRI plugin did not load (a config it refused).
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := criPull(sock, "", "", "")
		code := status.Code(err)
		if code == codes.Unimplemented {
			t.Fatalf("containerd serves no CRI with this config:\n%s\n%s", config, tailContainerdLog(dir))
		}
		if code != codes.Unavailable {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("containerd's CRI does not answer on %s after 30 s: %v\n%s", sock, err, tailContainerdLog(dir))
		}
		time.Sleep(100 * time.Millisecond)
	}
	return sock
}

// criPull is kubelet's image pull: CRI v1 ImageService.PullImage over containerd's
// socket, with user and password as the AuthConfig (what a pull Secret becomes). It
// returns the image's reference (its ID). The messages are encoded by hand (field
// numbers from k8s.io/cri-api's api.proto), which this module does not depend on.
func criPull(sock, image, user, password string) (string, error) {
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return "", err
	}
	defer conn.Close()
	var spec, auth, req []byte
	spec = protowire.AppendTag(spec, 1, protowire.BytesType) // ImageSpec.image
	spec = protowire.AppendString(spec, image)
	auth = protowire.AppendTag(auth, 1, protowire.BytesType) // AuthConfig.username
	auth = protowire.AppendString(auth, user)
	auth = protowire.AppendTag(auth, 2, protowire.BytesType) // AuthConfig.password
	auth = protowire.AppendString(auth, password)
	req = protowire.AppendTag(req, 1, protowire.BytesType) // PullImageRequest.image
	req = protowire.AppendBytes(req, spec)
	req = protowire.AppendTag(req, 2, protowire.BytesType) // PullImageRequest.auth
	req = protowire.AppendBytes(req, auth)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	in, resp := rawMessage(req), rawMessage(nil)
	if err := conn.Invoke(ctx, "/runtime.v1.ImageService/PullImage", &in, &resp, grpc.ForceCodecV2(rawCodec{})); err != nil {
		return "", err
	}
	num, typ, n := protowire.ConsumeTag(resp) // PullImageResponse.image_ref = 1
	if n < 0 || num != 1 || typ != protowire.BytesType {
		return "", fmt.Errorf("PullImageResponse %x: no image_ref", []byte(resp))
	}
	v, m := protowire.ConsumeString(resp[n:])
	if m < 0 {
		return "", fmt.Errorf("PullImageResponse %x: bad image_ref", []byte(resp))
	}
	return v, nil
}

// rawMessage is an encoded protobuf message; rawCodec sends and receives it as is.
type rawMessage []byte

type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*rawMessage))}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*rawMessage) = data.Materialize()
	return nil
}

func (rawCodec) Name() string { return "proto" }

// nonLoopbackIPv4 is an IPv4 address of an interface of this host that is up and not
// loopback, as a node reaches the control plane.
func nonLoopbackIPv4(t *testing.T) string {
	t.Helper()
	ifaces, _ := net.Interfaces()
	for _, ifc := range ifaces {
		if ifc.Flags&net.FlagUp == 0 || ifc.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && n.IP.IsGlobalUnicast() {
				return n.IP.String()
			}
		}
	}
	testreq.Missing(t, "an IPv4 address on an interface other than loopback (containerd pulls from a loopback registry over plain HTTP)",
		"run the test on a host with a network interface", "GPURACK_K8S_REQUIRED")
	return ""
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func tailContainerdLog(dir string) string {
	return components.TailFile(filepath.Join(dir, "containerd.log"), 30)
}
