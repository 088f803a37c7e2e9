package nodecontract

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

// TestNamesAreValidKeys: every name is a key the apiserver accepts (a qualified name),
// and the agent's labels and taints live under the gpurack.io/ prefix the profile
// validation reserves.
func TestNamesAreValidKeys(t *testing.T) {
	for _, k := range []string{TaintUnvalidated, TaintGPUUnhealthy, ConditionGPUHealthy, LabelImage, LabelDriverVersion,
		LabelGPUProduct, LabelGPUCount, LabelSimulated, ResourceGPU} {
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			t.Errorf("%q is not a valid key: %v", k, errs)
		}
	}
	for _, k := range []string{TaintUnvalidated, TaintGPUUnhealthy, LabelImage, LabelDriverVersion, LabelGPUProduct, LabelGPUCount, LabelSimulated} {
		if !strings.HasPrefix(k, LabelPrefix) {
			t.Errorf("%q is outside %s", k, LabelPrefix)
		}
	}
}
