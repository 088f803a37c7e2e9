package tenants

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/gpurack/gpurack/internal/strictyaml"
)

func exampleFile(t testing.TB) []byte {
	_, here, _, _ := runtime.Caller(0)
	data, err := os.ReadFile(filepath.Join(filepath.Dir(here), "..", "..", "docs", "examples", "tenants.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func TestExampleParses(t *testing.T) {
	f, err := Parse("tenants.yaml", exampleFile(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Tenants) != 2 {
		t.Fatalf("tenants: %+v", f.Tenants)
	}
	nlp := f.Tenant("nlp")
	if nlp == nil || len(nlp.Namespaces) != 1 || nlp.Namespaces[0] != "nlp" || nlp.Defaults.CPU != DefaultCPURequest || nlp.PodSecurity != "baseline" {
		t.Errorf("nlp defaults: %+v", nlp)
	}
	objs, err := Objects(f)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, o := range objs {
		if seen[o.Key()] {
			t.Errorf("%s twice", o.Key())
		}
		seen[o.Key()] = true
	}
	for _, want := range []string{
		"priorityclasses vision-inference", "namespaces vision-dev", "resourcequotas vision-dev/gpurack-quota",
		"resourcequotas vision/gpurack-tier-inference", "resourcequotas nlp/gpurack-tier-training",
		"networkpolicies nlp/gpurack-tenant-isolation", "rolebindings vision/gpurack-tenant-admins",
		"clusterrolebindings gpurack:tenant:nlp:admins", "validatingadmissionpolicies " + PriorityPolicy,
	} {
		if !seen[want] {
			t.Errorf("no %s among the objects", want)
		}
	}
}

func TestParseErrorsNameLineAndField(t *testing.T) {
	for _, tc := range []struct{ name, yaml, want string }{
		{"unknown field", "apiVersion: gpurack.io/v1alpha1\nkind: TenantList\ntenants:\n- name: a\n  quota:\n    gpu: 1\n",
			`t.yaml:6: tenants[0].quota.gpu: unknown field "gpu" (did you mean "gpus"?)`},
		{"bad quantity", "apiVersion: gpurack.io/v1alpha1\nkind: TenantList\ntenants:\n- name: a\n  quota:\n    memory: lots\n",
			`t.yaml:6: tenants[0].quota.memory: "lots" is not a Kubernetes quantity`},
		{"fractional gpus", "apiVersion: gpurack.io/v1alpha1\nkind: TenantList\ntenants:\n- name: a\n  quota:\n    gpus: 500m\n",
			`t.yaml:6: tenants[0].quota.gpus: "500m": GPUs are counted whole`},
		{"shared namespace", "apiVersion: gpurack.io/v1alpha1\nkind: TenantList\ntenants:\n- name: a\n- name: b\n  namespaces: [a]\n",
			`t.yaml:6: tenants[1].namespaces[0]: namespace "a" already belongs to tenant "a"`},
		{"system namespace", "apiVersion: gpurack.io/v1alpha1\nkind: TenantList\ntenants:\n- name: a\n  namespaces: [kube-system]\n",
			`t.yaml:5: tenants[0].namespaces[0]: "kube-system" is a system namespace`},
		{"class clash", "apiVersion: gpurack.io/v1alpha1\nkind: TenantList\ntenants:\n- name: a\n  tiers: [{name: b-x}]\n- name: a-b\n  tiers:\n  - name: x\n",
			`t.yaml:8: tenants[1].tiers[0].name: PriorityClass "a-b-x" is also made by tenants[0].tiers[0]`},
		{"priority range", "apiVersion: gpurack.io/v1alpha1\nkind: TenantList\ntenants:\n- name: a\n  tiers:\n  - name: x\n    priority: 2000000000\n",
			`t.yaml:7: tenants[0].tiers[0].priority: 2000000000 is out of range`},
		{"kind", "apiVersion: gpurack.io/v1alpha1\nkind: Tenants\n", `t.yaml:2: kind: is "Tenants"; write "TenantList"`},
		{"pod security", "apiVersion: gpurack.io/v1alpha1\nkind: TenantList\ntenants:\n- name: a\n  podSecurity: none\n",
			`t.yaml:5: tenants[0].podSecurity: "none" is not a Pod Security level`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("t.yaml", []byte(tc.yaml))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v\nwant %s", err, tc.want)
			}
		})
	}
}

// FuzzParse: tenants.yaml is operator input; every byte string must give a
// located error or a file whose objects can be built.
func FuzzParse(f *testing.F) {
	f.Add(exampleFile(f))
	f.Add([]byte("apiVersion: gpurack.io/v1alpha1\nkind: TenantList\ntenants:\n- name: a\n  quota: {gpus: 1e3}\n"))
	f.Add([]byte("tenants: [{name: a, namespaces: [a, a]}]"))
	f.Fuzz(func(t *testing.T, data []byte) {
		file, err := Parse("f.yaml", data)
		if err != nil {
			var es strictyaml.Errors
			if !errors.As(err, &es) || len(es) == 0 {
				t.Fatalf("error is not a strictyaml.Errors: %v", err)
			}
			for _, e := range es {
				if !strings.HasPrefix(e.Error(), "f.yaml") {
					t.Fatalf("error without the file name: %v", e)
				}
			}
			return
		}
		if _, err := Objects(file); err != nil {
			t.Fatalf("a valid file gives no objects: %v", err)
		}
	})
}
