package kubejoin

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// WriteKubeletFiles makes the kubelet directories and writes the bootstrap kubeconfig
// 0600 (it holds the token) and config.yaml 0644, replacing what was there.
func TestWriteKubeletFilesModes(t *testing.T) {
	dir := t.TempDir()
	p := KubeletPaths{
		BootstrapKubeconfig: filepath.Join(dir, "var", "lib", "kubelet", "bootstrap-kubeconfig"),
		Config:              filepath.Join(dir, "var", "lib", "kubelet", "config.yaml"),
	}
	os.MkdirAll(filepath.Dir(p.Config), 0o755)
	os.WriteFile(p.Config, []byte("old"), 0o600)
	j := KubeletJoin{Server: "https://192.0.2.10:6443", ClusterCAPEM: []byte("ca"), Token: "abcdef.0123456789abcdef", CgroupDriver: "systemd"}
	if err := WriteKubeletFiles(p, j); err != nil {
		t.Fatal(err)
	}
	for path, mode := range map[string]os.FileMode{p.BootstrapKubeconfig: 0o600, p.Config: 0o644} {
		st, err := os.Stat(path)
		if err != nil || st.Mode().Perm() != mode {
			t.Errorf("%s: mode %v (%v), want %v", path, st.Mode().Perm(), err, mode)
		}
	}
	if b, _ := os.ReadFile(p.Config); !strings.Contains(string(b), "KubeletConfiguration") {
		t.Errorf("config.yaml not replaced: %q", b)
	}
	if b, _ := os.ReadFile(p.BootstrapKubeconfig); !strings.Contains(string(b), "abcdef.0123456789abcdef") {
		t.Errorf("bootstrap kubeconfig lacks the token")
	}
	entries, _ := os.ReadDir(filepath.Dir(p.Config))
	if len(entries) != 2 {
		t.Errorf("temporary files left behind: %v", entries)
	}
}

// TestWriteKubeletFilesClientCA: with a ClientCA path the cluster CA lands there and
// config.yaml names it as authentication.x509.clientCAFile, so kubelet accepts the
// apiserver's kubelet client (logs, exec); without one, no x509 section.
func TestWriteKubeletFilesClientCA(t *testing.T) {
	dir := t.TempDir()
	p := KubeletPaths{BootstrapKubeconfig: filepath.Join(dir, "bootstrap-kubeconfig"), Config: filepath.Join(dir, "config.yaml"),
		ClientCA: filepath.Join(dir, "cluster-ca.crt")}
	j := KubeletJoin{Server: "https://192.0.2.10:6443", ClusterCAPEM: []byte("the cluster CA"), Token: "abcdef.0123456789abcdef", CgroupDriver: "systemd"}
	if err := WriteKubeletFiles(p, j); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(p.ClientCA); err != nil || string(b) != "the cluster CA" {
		t.Errorf("client CA file: %q %v", b, err)
	}
	var cfg struct {
		Authentication struct {
			X509 struct {
				ClientCAFile string `json:"clientCAFile"`
			} `json:"x509"`
		} `json:"authentication"`
	}
	b, _ := os.ReadFile(p.Config)
	if err := yaml.Unmarshal(b, &cfg); err != nil || cfg.Authentication.X509.ClientCAFile != p.ClientCA {
		t.Errorf("config.yaml clientCAFile %q (%v), want %s:\n%s", cfg.Authentication.X509.ClientCAFile, err, p.ClientCA, b)
	}
	if conf, _ := KubeletConfig(KubeletJoin{CgroupDriver: "systemd"}); strings.Contains(string(conf), "x509") {
		t.Errorf("KubeletConfig without a client CA has an x509 section:\n%s", conf)
	}
}
