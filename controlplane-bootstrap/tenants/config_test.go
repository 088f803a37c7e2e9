package tenants

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

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
		"validatingadmissionpolicies " + VolumePolicy, "validatingadmissionpolicybindings " + VolumePolicy,
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

const storageHead = "apiVersion: gpurack.io/v1alpha1\nkind: TenantList\ntenants:\n- name: a\n  quota:\n    storageClasses:\n"

func TestStorageClassQuotaErrors(t *testing.T) {
	for _, tc := range []struct{ name, yaml, want string }{
		{"class name", "      Fast_SSD: {requests: 1Ti}\n",
			`t.yaml:7: tenants[0].quota.storageClasses[Fast_SSD]: tenant "a": "Fast_SSD" is not a StorageClass name (a DNS subdomain`},
		{"class name too long", "      " + strings.Repeat("a", 226) + ": {claims: 1}\n",
			`tenants[0].quota.storageClasses[` + strings.Repeat("a", 226) + `]: tenant "a": StorageClass name "` + strings.Repeat("a", 226) + `" is longer than 225 characters`},
		{"zero size", "      gpurack-local: {requests: \"0\"}\n",
			`t.yaml:7: tenants[0].quota.storageClasses[gpurack-local].requests: tenant "a": "0" is not a positive size; write one such as 500Gi (claims: 0 keeps the tenant off gpurack-local)`},
		{"negative size", "      gpurack-local:\n        requests: -1Gi\n",
			`t.yaml:8: tenants[0].quota.storageClasses[gpurack-local].requests: tenant "a": "-1Gi" is not a positive size`},
		{"garbage size", "      gpurack-local: {requests: lots}\n",
			`t.yaml:7: tenants[0].quota.storageClasses[gpurack-local].requests: tenant "a": "lots" is not a Kubernetes quantity; write a size such as 500Gi or 2Ti`},
		{"negative claims", "      gpurack-local: {claims: -1}\n",
			`t.yaml:7: tenants[0].quota.storageClasses[gpurack-local].claims: tenant "a": "-1" is not a number of claims; write a whole number, 0 or more`},
		{"fractional claims", "      gpurack-local: {claims: 1.5}\n",
			`tenants[0].quota.storageClasses[gpurack-local].claims: tenant "a": "1.5" is not a number of claims`},
		{"claims as a quantity", "      gpurack-local: {claims: 2k}\n",
			`tenants[0].quota.storageClasses[gpurack-local].claims: tenant "a": "2k" is not a number of claims`},
		{"empty entry", "      gpurack-local: {}\n",
			`t.yaml:7: tenants[0].quota.storageClasses[gpurack-local]: tenant "a": StorageClass "gpurack-local" sets no limit; give requests (such as 1Ti), claims (such as 20) or both, or remove it`},
		{"null entry", "      gpurack-local:\n",
			`t.yaml:7: tenants[0].quota.storageClasses[gpurack-local]: tenant "a": StorageClass "gpurack-local" sets no limit`},
		{"unknown field", "      gpurack-local: {request: 1Ti}\n",
			`t.yaml:7: tenants[0].quota.storageClasses[gpurack-local].request: unknown field "request" (did you mean "requests"?)`},
		{"class twice", "      gpurack-local: {claims: 1}\n      gpurack-local: {claims: 2}\n",
			`t.yaml:8: tenants[0].quota.storageClasses[gpurack-local]: key "gpurack-local" is given twice`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("t.yaml", []byte(storageHead+tc.yaml))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v\nwant %s", err, tc.want)
			}
		})
	}
	longest := strings.Repeat("a", maxStorageClassName)
	if _, err := Parse("t.yaml", []byte(storageHead+"      "+longest+": {claims: 1}\n")); err != nil {
		t.Errorf("a class name of %d characters: %v", len(longest), err)
	}
}

// The quota of each StorageClass becomes the two resources Kubernetes counts
// per class, next to the total requests.storage, and renders the same every
// time.
func TestStorageClassQuotaRendersHardLimits(t *testing.T) {
	src := storageHead + "      gpurack-local: {requests: 2Ti, claims: 20}\n      gpurack-shared: {requests: 10Ti}\n      scratch.example.com: {claims: 0}\n    storage: 12Ti\n"
	f, err := Parse("t.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	if got := f.Tenants[0].Quota.StorageClasses["gpurack-local"]; got != (StorageQuota{Requests: "2Ti", Claims: "20"}) {
		t.Errorf("gpurack-local: %+v", got)
	}
	objs, err := Objects(f)
	if err != nil {
		t.Fatal(err)
	}
	var hard map[string]any
	for _, o := range objs {
		if o.Key() == "resourcequotas a/"+QuotaName {
			hard, _, _ = unstructured.NestedMap(o.Obj.Object, "spec", "hard")
		}
	}
	want := map[string]any{
		"requests.storage": "12Ti",
		"gpurack-local.storageclass.storage.k8s.io/requests.storage":             "2Ti",
		"gpurack-local.storageclass.storage.k8s.io/persistentvolumeclaims":       "20",
		"gpurack-shared.storageclass.storage.k8s.io/requests.storage":            "10Ti",
		"scratch.example.com.storageclass.storage.k8s.io/persistentvolumeclaims": "0",
	}
	if !reflect.DeepEqual(hard, want) {
		t.Errorf("hard limits:\n%v\nwant\n%v", hard, want)
	}
	first, _ := json.Marshal(objs)
	for range 5 {
		again, _ := Objects(f)
		if b, _ := json.Marshal(again); !bytes.Equal(b, first) {
			t.Fatal("Objects renders the same file differently")
		}
	}
}

// FuzzParse: tenants.yaml is operator input; every byte string must give a
// located error or a file whose objects can be built.
func FuzzParse(f *testing.F) {
	f.Add(exampleFile(f))
	f.Add([]byte("apiVersion: gpurack.io/v1alpha1\nkind: TenantList\ntenants:\n- name: a\n  quota: {gpus: 1e3}\n"))
	f.Add([]byte("tenants: [{name: a, namespaces: [a, a]}]"))
	f.Add([]byte(storageHead + "      gpurack-local: {requests: 2Ti, claims: 20}\n      gpurack-shared: {requests: 10Ti}\n      x: {}\n"))
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
