package clusterconfig

import (
	"strings"
	"testing"
	"time"
)

// vipYAML is an apiServer block that listens on every address, with a vip block of
// the given fields (each "key: value", indented under vip).
func vipYAML(fields ...string) string {
	y := "apiServer:\n  advertiseAddress: 10.0.0.11\n  bindAddress: 0.0.0.0\n  vip:\n"
	for _, f := range fields {
		y += "    " + f + "\n"
	}
	return y
}

// TestVIPDefaults: no vip block is no VIP and the endpoint stays the advertise
// address; a VIP gets the TTL and health port defaults and becomes the endpoint; an
// explicit endpoint is kept.
func TestVIPDefaults(t *testing.T) {
	cfg, err := Parse("x.yaml", []byte("apiServer:\n  advertiseAddress: 10.0.0.11\n"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.APIServer.VIP.Enabled() || cfg.APIServer.Endpoint != "10.0.0.11:6443" {
		t.Errorf("without a vip block: vip %+v, endpoint %s", cfg.APIServer.VIP, cfg.APIServer.Endpoint)
	}
	cfg, err = Parse("x.yaml", []byte(vipYAML("address: 10.0.0.10/24", "interface: eth0")))
	if err != nil {
		t.Fatal(err)
	}
	v := cfg.APIServer.VIP
	if v.TTL != 5*time.Second || v.HealthPort != 9446 || v.Interface != "eth0" {
		t.Errorf("vip defaults: %+v", v)
	}
	if cfg.APIServer.Endpoint != "10.0.0.10:6443" || cfg.EndpointURL() != "https://10.0.0.10:6443" {
		t.Errorf("endpoint %s, want the VIP's address and the API port", cfg.APIServer.Endpoint)
	}
	cfg, err = Parse("x.yaml", []byte(vipYAML("address: 10.0.0.10/24", "interface: eth0", "ttl: 10s")+"  port: 7443\n"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.APIServer.Endpoint != "10.0.0.10:7443" || cfg.APIServer.VIP.TTL != 10*time.Second {
		t.Errorf("endpoint %s (want the VIP with apiServer.port), ttl %v", cfg.APIServer.Endpoint, cfg.APIServer.VIP.TTL)
	}
	cfg, err = Parse("x.yaml", []byte(vipYAML("address: 10.0.0.10/24", "interface: eth0")+"  endpoint: cp.example.org:6443\n"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.APIServer.Endpoint != "cp.example.org:6443" {
		t.Errorf("an explicit endpoint became %s", cfg.APIServer.Endpoint)
	}
	out, err := cfg.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	again, err := Parse("out.yaml", out)
	if err != nil || again.APIServer.VIP != cfg.APIServer.VIP {
		t.Errorf("round trip: %+v, %v\n%s", again.APIServer.VIP, err, out)
	}
}

// TestVIPErrorsNameTheField: every bad vip value is an error that names its field
// (and line) and says what to write.
func TestVIPErrorsNameTheField(t *testing.T) {
	for _, tc := range []struct {
		name, yaml string
		want       []string
	}{
		{"no prefix length", vipYAML("address: 10.0.0.10", "interface: eth0"), []string{"x.yaml:5: apiServer.vip.address", "prefix length", "10.0.0.10/24"}},
		{"not an address", vipYAML("address: api.example/24", "interface: eth0"), []string{"x.yaml:5: apiServer.vip.address", "not an IPv4 address"}},
		{"IPv6", vipYAML("address: 2001:db8::10/64", "interface: eth0"), []string{"x.yaml:5: apiServer.vip.address", "IPv6 is not supported"}},
		{"network address", vipYAML("address: 10.0.0.0/24", "interface: eth0"), []string{"apiServer.vip.address", "network address", "10.0.0.1/24"}},
		{"broadcast address", vipYAML("address: 10.0.0.255/24", "interface: eth0"), []string{"apiServer.vip.address", "broadcast address"}},
		{"loopback", vipYAML("address: 127.0.0.10/8", "interface: eth0"), []string{"apiServer.vip.address", "not a unicast address"}},
		{"own address", vipYAML("address: 10.0.0.11/24", "interface: eth0"), []string{"apiServer.vip.address", "apiServer.advertiseAddress, this host's own address"}},
		{"no interface", vipYAML("address: 10.0.0.10/24"), []string{"apiServer.vip.interface: is required", "such as eth0"}},
		{"long interface", vipYAML("address: 10.0.0.10/24", "interface: a-very-long-ifname0"), []string{"x.yaml:6: apiServer.vip.interface", "longer than 15 bytes"}},
		{"slash in interface", vipYAML("address: 10.0.0.10/24", "interface: eth0/1"), []string{"x.yaml:6: apiServer.vip.interface", "not a Linux interface name"}},
		{"interface without address", vipYAML("interface: eth0"), []string{"apiServer.vip.address: is required when apiServer.vip.interface is set"}},
		{"ttl under a second", vipYAML("address: 10.0.0.10/24", "interface: eth0", "ttl: 500ms"), []string{"x.yaml:7: apiServer.vip.ttl", "less than 1s", "5s"}},
		{"ttl negative", vipYAML("address: 10.0.0.10/24", "interface: eth0", "ttl: -5s"), []string{"x.yaml:7: apiServer.vip.ttl", "less than 1s"}},
		{"ttl not whole seconds", vipYAML("address: 10.0.0.10/24", "interface: eth0", "ttl: 2500ms"), []string{"x.yaml:7: apiServer.vip.ttl", "not whole seconds"}},
		{"ttl not a duration", vipYAML("address: 10.0.0.10/24", "interface: eth0", "ttl: five"), []string{"x.yaml:7: apiServer.vip.ttl"}},
		{"health port clash", vipYAML("address: 10.0.0.10/24", "interface: eth0", "healthPort: 2379"), []string{"apiServer.vip.healthPort: 2379 is also etcd.clientPort"}},
		{"health port range", vipYAML("address: 10.0.0.10/24", "interface: eth0", "healthPort: 70000"), []string{"x.yaml:7: apiServer.vip.healthPort: 70000 is not a port"}},
		{"health port clash with queues", "queues:\n  enabled: true\n  healthPort: 9446\n" + vipYAML("address: 10.0.0.10/24", "interface: eth0"),
			[]string{"9446 is also", "apiServer.vip.healthPort", "queues.healthPort"}},
		{"bind address", "apiServer:\n  advertiseAddress: 10.0.0.11\n  bindAddress: 10.0.0.11\n  vip: {address: 10.0.0.10/24, interface: eth0}\n",
			[]string{"x.yaml:3: apiServer.bindAddress", "does not take apiServer.vip.address", "0.0.0.0"}},
		{"unknown field", vipYAML("address: 10.0.0.10/24", "interface: eth0", "tll: 5s"), []string{"x.yaml:7: apiServer.vip.tll: unknown field"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("x.yaml", []byte(tc.yaml))
			if err == nil {
				t.Fatalf("no error for:\n%s", tc.yaml)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "apiServer.endpoint") {
				t.Errorf("a bad vip is reported again as the endpoint: %v", err)
			}
		})
	}
}

// TestVIPOffIsNotValidated: without an address, the vip's other defaulted fields are
// not held to anything, and its health port takes no port from the others.
func TestVIPOffIsNotValidated(t *testing.T) {
	if _, err := Parse("x.yaml", []byte("apiServer:\n  vip:\n    ttl: 500ms\n    healthPort: 6443\n")); err != nil {
		t.Errorf("vip off: %v", err)
	}
	for _, y := range []string{
		vipYAML("address: 10.0.0.10/32", "interface: eth0"),
		vipYAML("address: 192.0.2.1/31", "interface: br-api.100", "ttl: 1s"),
		"apiServer:\n  advertiseAddress: 10.0.0.11\n  bindAddress: \"::\"\n  vip: {address: 10.0.0.10/24, interface: eth0, ttl: 1m}\n",
	} {
		if _, err := Parse("x.yaml", []byte(y)); err != nil {
			t.Errorf("%s: %v", y, err)
		}
	}
}
