package components

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/gpurack/gpurack/controlplane-bootstrap/vip"
)

const vipConfig = "nodeName: cp-2\napiServer:\n  advertiseAddress: 10.0.0.12\n  bindAddress: 0.0.0.0\n  vip: {address: 10.0.0.10/24, interface: eth0, ttl: 7s}\n"

// TestVIPSpec: with apiServer.vip the holder is controlplane-bootstrap's vip
// subcommand, on this host's etcd member with the API server's etcd client
// credentials and the node's name, healthy on its loopback /healthz; without it, or
// without a node name, it is absent or has no --name.
func TestVIPSpec(t *testing.T) {
	l := Layout{Dir: "/cluster"}
	if _, ok := Spec(defaultConfig(t, ""), l, VIP); ok {
		t.Fatal("a vip component without apiServer.vip")
	}
	cfg := defaultConfig(t, vipConfig)
	c, ok := Spec(cfg, l, VIP)
	if !ok {
		t.Fatal("no vip component with apiServer.vip.address")
	}
	want := []string{VIPCommand, "--address=10.0.0.10/24", "--etcd=https://127.0.0.1:2379", "--etcd-ca=/cluster/pki/etcd/ca.crt",
		"--etcd-cert=/cluster/pki/apiserver-etcd-client.crt", "--etcd-key=/cluster/pki/apiserver-etcd-client.key",
		"--health-listen=127.0.0.1:9446", "--interface=eth0", "--name=cp-2", "--ttl=7s"}
	if !slices.Equal(c.Args, want) || !c.Self || c.HealthURL != "http://127.0.0.1:9446/healthz" {
		t.Errorf("vip: %+v\nwant args %v", c, want)
	}
	if len(c.Ports) != 1 || c.Ports[0].Addr() != "127.0.0.1:9446" || c.Ports[0].Field != "apiServer.vip.healthPort" {
		t.Errorf("ports: %+v", c.Ports)
	}
	if VIPLeaderURL(cfg) != "http://127.0.0.1:9446/leader" {
		t.Errorf("leader URL %s", VIPLeaderURL(cfg))
	}
	if got := Using(Specs(cfg, l), []string{"/cluster/pki/apiserver-etcd-client.crt"}); !slices.Equal(got, []string{APIServer, VIP}) {
		t.Errorf("renewing the API server's etcd client certificate restarts %v, want the API server and the vip", got)
	}
	cfg.NodeName = ""
	if c, _ := Spec(cfg, l, VIP); slices.ContainsFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--name") }) {
		t.Errorf("no node name, yet %v (the vip command defaults to the host name)", c.Args)
	}
	if d := defaultConfig(t, "apiServer:\n  bindAddress: 0.0.0.0\n  vip: {address: 10.0.0.10/24, interface: eth0}\n"); d.APIServer.VIP.TTL != vip.DefaultTTL {
		t.Errorf("cluster.yaml's default TTL %v is not the vip command's %v", d.APIServer.VIP.TTL, vip.DefaultTTL)
	}
}

// TestVIPStartsAfterTheCore: the holder starts right after the four core components
// (etcd, which it campaigns in, and the API server it points at), before every optional
// component, and is a known component in that place.
func TestVIPStartsAfterTheCore(t *testing.T) {
	cfg := defaultConfig(t, vipConfig+"monitoring:\n  enabled: true\nqueues:\n  enabled: true\nregistry:\n  enabled: true\n")
	var names []string
	for _, c := range Specs(cfg, Layout{Dir: "/cluster"}) {
		names = append(names, c.Name)
	}
	if len(names) < 6 || !slices.Equal(names[:5], append(slices.Clone(Names), VIP)) || slices.Index(names, VIP) != 4 {
		t.Errorf("start order %v: want the vip fifth, after %v", names, Names)
	}
	if !slices.Equal(AllNames, names) {
		t.Errorf("AllNames %v, want every component in start order %v", AllNames, names)
	}
}

// TestVIPUnitKeepsNetworkCapabilities: the holder's unit keeps CAP_NET_ADMIN and
// CAP_NET_RAW and may open packet sockets, each on the one line that sets it; every
// other unit keeps none.
func TestVIPUnitKeepsNetworkCapabilities(t *testing.T) {
	cfg := defaultConfig(t, vipConfig)
	l := Layout{Dir: "/cluster"}
	c, _ := Spec(cfg, l, VIP)
	unit := string(RenderUnit(c, "/usr/local/bin/controlplane-bootstrap", Scheduler, "/cluster"))
	for _, want := range []string{
		"ExecStart=/usr/local/bin/controlplane-bootstrap \\\n\tvip \\\n\t--address=10.0.0.10/24 \\\n",
		"After=network-online.target gpurack-kube-scheduler.service\n",
		"\nCapabilityBoundingSet=CAP_NET_ADMIN CAP_NET_RAW\n",
		"\nRestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX AF_NETLINK AF_PACKET\n",
		"\nNoNewPrivileges=yes\n", "\nProtectSystem=strict\n", "\nReadWritePaths=/cluster\n",
	} {
		if !strings.Contains(unit, want) {
			t.Errorf("vip unit lacks %q:\n%s", want, unit)
		}
	}
	if n := strings.Count(unit, "CapabilityBoundingSet="); n != 1 {
		t.Errorf("%d CapabilityBoundingSet lines:\n%s", n, unit)
	}
	for _, other := range Specs(cfg, l) {
		if other.Name == VIP {
			continue
		}
		u := string(RenderUnit(other, "/bin/"+other.Name, "", "/cluster"))
		if !strings.Contains(u, "\nCapabilityBoundingSet=\n") || strings.Contains(u, "AF_PACKET") {
			t.Errorf("%s's unit is not without capabilities and packet sockets:\n%s", other.Name, u)
		}
	}
}

// TestVIPHealthPortInUse: the port check before init finds the holder's health port
// taken and names its cluster.yaml field.
func TestVIPHealthPortInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cfg := defaultConfig(t, vipConfig)
	cfg.APIServer.VIP.HealthPort = ln.Addr().(*net.TCPAddr).Port
	c, _ := Spec(cfg, Layout{Dir: "/cluster"}, VIP)
	err = CheckPorts([]Component{c})
	var pe *PortInUseError
	if !errors.As(err, &pe) || pe.Component != VIP || pe.Port.Field != "apiServer.vip.healthPort" {
		t.Errorf("CheckPorts = %v, want the vip's health port in use", err)
	}
	if !strings.Contains(err.Error(), "apiServer.vip.healthPort in cluster.yaml") {
		t.Errorf("error %q does not name the field", err)
	}
}

// TestVIPHolder: status reads the holder's name from the local vip's /leader; none is
// "", and a failing or absent holder is an error with the reason.
func TestVIPHolder(t *testing.T) {
	ctx := context.Background()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Query().Get("case") {
		case "held":
			fmt.Fprintln(w, "cp-1")
		case "none":
		default:
			http.Error(w, "vip: read the holder of 10.0.0.10 from etcd: context deadline exceeded", http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	if got, err := VIPHolder(ctx, srv.URL+"/leader?case=held"); got != "cp-1" || err != nil {
		t.Errorf("held: %q, %v", got, err)
	}
	if got, err := VIPHolder(ctx, srv.URL+"/leader?case=none"); got != "" || err != nil {
		t.Errorf("none: %q, %v", got, err)
	}
	if _, err := VIPHolder(ctx, srv.URL+"/leader?case=etcd"); err == nil || !strings.Contains(err.Error(), "HTTP 503: vip: read the holder") {
		t.Errorf("etcd down: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + ln.Addr().String() + "/leader"
	ln.Close()
	if _, err := VIPHolder(ctx, url); err == nil || !strings.Contains(err.Error(), "not listening") {
		t.Errorf("no holder running: %v", err)
	}
}
