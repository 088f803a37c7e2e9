package node

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
)

// serviceHost records the units it is asked to run; err fails them.
type serviceHost struct {
	units map[string][]string
	err   error
}

func (h *serviceHost) SetTransientHostname(context.Context, string) error { return nil }
func (h *serviceHost) StartUnit(context.Context, string) error            { return nil }
func (h *serviceHost) EnsureService(_ context.Context, unit, _ string, argv []string) (bool, error) {
	if h.err != nil {
		return false, h.err
	}
	h.units[unit] = argv
	return true, nil
}

// plainHost cannot run services of the agent's own.
type plainHost struct{}

func (plainHost) SetTransientHostname(context.Context, string) error { return nil }
func (plainHost) StartUnit(context.Context, string) error            { return nil }

// TestStartAPILB: the balancer's unit runs `gpuagent apilb` over the bundle's API
// servers (or the endpoint's host when the bundle lists none) with the cluster CA
// written for it, and kubelet is pointed at it; when it is off, the host cannot run
// it, or it fails, kubelet talks to the API server directly and the log says why.
func TestStartAPILB(t *testing.T) {
	const ca = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
	withList := &bootv1.JoinBundle{ApiServerEndpoint: "https://10.0.0.2:6443", ClusterCaPem: ca, ApiServers: []string{"10.0.0.2:6443", "10.0.0.3:6443", "10.0.0.4:6443"}}
	alone := &bootv1.JoinBundle{ApiServerEndpoint: "https://10.0.0.2:6443", ClusterCaPem: ca}
	for _, tc := range []struct {
		name      string
		bundle    *bootv1.JoinBundle
		upstreams []string
	}{
		{"three API servers", withList, []string{"10.0.0.2:6443", "10.0.0.3:6443", "10.0.0.4:6443"}},
		{"the endpoint's alone", alone, []string{"10.0.0.2:6443"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			n := &node{cfg: Config{KeyDir: dir, APILB: "127.0.0.1:7445"}, log: slog.New(slog.DiscardHandler)}
			h := &serviceHost{units: map[string][]string{}}
			server, ok := n.startAPILB(context.Background(), h, tc.bundle)
			if !ok || server != "https://127.0.0.1:7445" {
				t.Fatalf("startAPILB: %q, %v; want kubelet pointed at https://127.0.0.1:7445", server, ok)
			}
			argv := h.units[APILBUnit]
			var upstreams []string
			for i, a := range argv {
				if a == "--upstream" && i+1 < len(argv) {
					upstreams = append(upstreams, argv[i+1])
				}
			}
			if len(argv) < 2 || argv[1] != "apilb" || !slices.Equal(upstreams, tc.upstreams) || !slices.Contains(argv, "127.0.0.1:7445") {
				t.Errorf("unit %s runs %q; want gpuagent apilb --listen 127.0.0.1:7445 with upstreams %v", APILBUnit, argv, tc.upstreams)
			}
			i := slices.Index(argv, "--ca")
			if i < 0 || i+1 >= len(argv) {
				t.Fatalf("no --ca in %q", argv)
			}
			if got, err := os.ReadFile(argv[i+1]); err != nil || string(got) != ca || filepath.Dir(argv[i+1]) != dir {
				t.Errorf("--ca %s: %q, %v; want the bundle's cluster CA in the key directory", argv[i+1], got, err)
			}
		})
	}

	var log lockedBuffer
	for _, tc := range []struct {
		name, listen string
		host         interface {
			SetTransientHostname(context.Context, string) error
			StartUnit(context.Context, string) error
		}
		bundle *bootv1.JoinBundle
		says   string
	}{
		{"off", "", &serviceHost{units: map[string][]string{}}, withList, ""},
		{"a host without services", "127.0.0.1:7445", plainHost{}, withList, ""},
		{"no API server", "127.0.0.1:7445", &serviceHost{units: map[string][]string{}}, &bootv1.JoinBundle{}, ""},
		{"the unit fails", "127.0.0.1:7445", &serviceHost{err: errors.New("Unit gpurack-apilb.service failed")}, withList, "Unit gpurack-apilb.service failed"},
	} {
		n := &node{cfg: Config{KeyDir: t.TempDir(), APILB: tc.listen}, log: slog.New(slog.NewTextHandler(&log, nil))}
		if server, ok := n.startAPILB(context.Background(), tc.host, tc.bundle); ok || server != "" {
			t.Errorf("%s: %q, %v; want kubelet left on the API server", tc.name, server, ok)
		}
		if tc.says != "" && !strings.Contains(log.String(), tc.says) {
			t.Errorf("%s: the log does not say why:\n%s", tc.name, log.String())
		}
	}
}
