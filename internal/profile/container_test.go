package profile

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpurack/gpurack/internal/testreq"
)

const containerYAML = `kind: container
name: train
base:
  distro: debian
  suite: bookworm
packages: [python3-torch, python3-sklearn]
files:
  - source: train.py
    path: /opt/train/train.py
    mode: "0755"
image:
  name: gpurack.example/workloads/train
  tag: "1.0"
  user: {name: trainer, uid: 1000, gid: 1000}
  env: {CHECKPOINT_DIR: /work/checkpoints}
  entrypoint: [python3, /opt/train/train.py]
  ports: [8888/tcp]
  labels: {org.opencontainers.image.title: train}
`

func TestParseContainerGood(t *testing.T) {
	c, err := ParseContainer("train.yaml", []byte(containerYAML))
	if err != nil {
		t.Fatal(err)
	}
	if c.Ref() != "gpurack.example/workloads/train:1.0" || c.Image.Workdir != DefaultWorkdir || c.Base.Components[0] != "main" {
		t.Fatalf("ref %s workdir %s components %v", c.Ref(), c.Image.Workdir, c.Base.Components)
	}
	if c.Files[0].FileMode() != 0o755 {
		t.Fatalf("mode %o", c.Files[0].FileMode())
	}
	if KindOf([]byte(containerYAML)) != KindContainer || KindOf([]byte(tiny)) != "" {
		t.Fatal("KindOf does not tell the kinds apart")
	}
	// The digest covers the image config too: a changed entrypoint stales the lock.
	d, err := ParseContainer("train.yaml", []byte(strings.Replace(containerYAML, "/opt/train/train.py]", "/opt/train/train.py, --fast]", 1)))
	if err != nil {
		t.Fatal(err)
	}
	if d.Digest() == c.Digest() {
		t.Fatal("a changed entrypoint keeps the digest")
	}
}

// TestParseContainerBad: every mistake is named by its field and line.
func TestParseContainerBad(t *testing.T) {
	cases := []struct{ old, new, want string }{
		{"kind: container", "kind: container\nimagee: {}", `train.yaml:2: imagee: unknown field`},
		{"uid: 1000, gid: 1000", "uid: 0, gid: 1000", "train.yaml:14: image.user.uid: is 0 (root"},
		{"name: trainer", "name: root", "image.user.name: the image must not run as root"},
		{"uid: 1000", "uid: 999", "image.user.uid: is 999, a system id"},
		{"gpurack.example/workloads/train", "Workloads/Train", "image.name: \"Workloads/Train\" must start with a registry host"},
		{"gpurack.example/workloads/train", "gpurack.example/Train", "is not a repository name"},
		{`tag: "1.0"`, `tag: "-x"`, "image.tag:"},
		{"source: train.py", "source: ../train.py", "files[0].source: \"../train.py\" must be a file in the profile's folder"},
		{"path: /opt/train/train.py", "path: opt/train.py", "files[0].path:"},
		{`mode: "0755"`, `mode: "rwx"`, "files[0].mode:"},
		{"ports: [8888/tcp]", "ports: [99999/tcp]", "image.ports[0]: port 99999"},
		{"ports: [8888/tcp]", "ports: [http]", "image.ports[0]:"},
		{"  entrypoint: [python3, /opt/train/train.py]\n", "", "image.entrypoint: the image needs"},
		{"kind: container", "kind: node", "kind: is \"node\""},
		{"env: {CHECKPOINT_DIR", "env: {1X: a, CHECKPOINT_DIR", "image.env.1X"},
		{"packages: [python3-torch,", "packages: [python3-torch=1.13,", "packages[0]: \"python3-torch=1.13\" carries a version"},
	}
	for _, c := range cases {
		in := strings.Replace(containerYAML, c.old, c.new, 1)
		if in == containerYAML {
			t.Fatalf("case %q does not apply", c.old)
		}
		_, err := ParseContainer("train.yaml", []byte(in))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s → %s: got %v, want %q", c.old, c.new, err, c.want)
		}
	}
}

func TestLoadContainerMissingFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "train.yaml")
	if err := os.WriteFile(p, []byte(containerYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := LoadContainer(p)
	if err == nil || !strings.Contains(err.Error(), "train.yaml:8: files[0].source: train.py does not exist") {
		t.Fatalf("got %v, want the missing source named with its line", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "train.py"), []byte("print(1)\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadContainer(p); err != nil {
		t.Fatal(err)
	}
}

// TestShippedContainerProfilesAreValid loads every sample under profiles/workloads.
func TestShippedContainerProfilesAreValid(t *testing.T) {
	paths, _ := filepath.Glob("../../profiles/workloads/*.yaml")
	if len(paths) < 3 {
		t.Fatalf("want the three sample workload profiles, found %v", paths)
	}
	for _, path := range paths {
		c, err := LoadContainer(path)
		if err != nil {
			t.Errorf("%s: %v", path, err)
			continue
		}
		if want := strings.TrimSuffix(filepath.Base(path), ".yaml"); c.Name != want {
			t.Errorf("%s: name %q, want %q", path, c.Name, want)
		}
		if _, err := LoadLock(LockPath(path)); err != nil {
			t.Errorf("%s: %v", path, err)
		}
	}
}

// FuzzParseContainer: the container parser never panics, locates its errors, and an
// accepted profile re-validates from its canonical form with the same digest.
func FuzzParseContainer(f *testing.F) {
	f.Add([]byte(containerYAML))
	f.Add([]byte(strings.Replace(containerYAML, "uid: 1000", "uid: 0", 1)))
	f.Add([]byte("kind: container\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseContainer("f.yaml", data)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "f.yaml") {
				t.Fatalf("error without the file name: %v", err)
			}
			return
		}
		if c.Image.User.UID < MinContainerID || c.Image.User.GID < MinContainerID || c.Image.User.Name == "root" {
			t.Fatalf("accepted a root or system user: %+v", c.Image.User)
		}
		d, err := ParseContainer("f.json", c.Canonical())
		if err != nil {
			t.Fatalf("canonical form rejected: %v\n%s", err, c.Canonical())
		}
		if d.Digest() != c.Digest() {
			t.Fatal("digest changed through the canonical form")
		}
	})
}

// TestSampleScriptsParse: the samples' Python files compile and their shell scripts
// parse (the images are not built by make test; a syntax error would first show there).
func TestSampleScriptsParse(t *testing.T) {
	python := testreq.Tool(t, "python3", "apt-get install python3")
	paths, _ := filepath.Glob("../../profiles/workloads/*.yaml")
	n := 0
	for _, path := range paths {
		c, err := LoadContainer(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range c.Files {
			src := filepath.Join(filepath.Dir(path), f.Source)
			var cmd *exec.Cmd
			switch {
			case strings.HasSuffix(src, ".py"):
				cmd = exec.Command(python, "-c", "import ast, sys; ast.parse(open(sys.argv[1]).read(), sys.argv[1])", src)
			case strings.HasSuffix(src, ".sh"):
				cmd = exec.Command("sh", "-n", src)
			default:
				continue
			}
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("%s: %v\n%s", src, err, out)
			}
			n++
		}
	}
	if n < 6 {
		t.Fatalf("checked %d scripts; want every sample's", n)
	}
}
