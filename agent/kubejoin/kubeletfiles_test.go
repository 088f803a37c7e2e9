package kubejoin

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
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
