package main

import (
	"bytes"
	"os/exec"
	"strings"
	"testing"

	"github.com/gpurack/gpurack/controlplane-bootstrap/clusterconfig"
	"github.com/gpurack/gpurack/controlplane-bootstrap/components"
)

// TestEtcdEnv: etcd-env's exports, read back by bash, point etcdctl at this host's
// member with the apiserver's etcd client certificate and name the member as the
// control plane starts it.
func TestEtcdEnv(t *testing.T) {
	cfg := clusterconfig.Default()
	cfg.NodeName, cfg.APIServer.AdvertiseAddress, cfg.Etcd.ClientPort, cfg.Etcd.PeerPort = "cp-1", "10.0.0.2", 2379, 2380
	var out bytes.Buffer
	writeEtcdEnv(&out, &cfg, components.Layout{Dir: "/var/lib/gpurack/cluster"})
	got, err := exec.Command("bash", "-c", out.String()+`echo "$ETCDCTL_ENDPOINTS|$ETCDCTL_CACERT|$ETCDCTL_CERT|$ETCDCTL_KEY|$GPURACK_ETCD_NAME|$GPURACK_ETCD_PEER_URL|$GPURACK_ETCD_DATA_DIR"`).CombinedOutput()
	if err != nil {
		t.Fatalf("bash: %v\n%s\n%s", err, out.String(), got)
	}
	want := "https://127.0.0.1:2379|/var/lib/gpurack/cluster/pki/etcd/ca.crt|/var/lib/gpurack/cluster/pki/apiserver-etcd-client.crt|" +
		"/var/lib/gpurack/cluster/pki/apiserver-etcd-client.key|cp-1|https://10.0.0.2:2380|/var/lib/gpurack/cluster/etcd"
	if strings.TrimSpace(string(got)) != want {
		t.Errorf("etcd-env read back by bash:\n%s\nwant\n%s", got, want)
	}
}
