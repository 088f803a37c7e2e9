package nodecontract

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

// TestNamesAreValidKeys: every name is a key the apiserver accepts (a qualified name),
// the agent's labels and taints live under the gpurack.io/ prefix the profile
// validation reserves, and the sharing labels under GPU feature discovery's
// nvidia.com/, which it reserves too.
func TestNamesAreValidKeys(t *testing.T) {
	for _, k := range []string{TaintUnvalidated, TaintGPUUnhealthy, ConditionGPUHealthy, LabelImage, LabelDriverVersion,
		LabelGPUProduct, LabelGPUCount, LabelSimulated, ResourceGPU, LabelGPUReplicas, LabelGPUSharingStrategy} {
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			t.Errorf("%q is not a valid key: %v", k, errs)
		}
	}
	for _, k := range []string{LabelGPUReplicas, LabelGPUSharingStrategy} {
		if !strings.HasPrefix(k, "nvidia.com/gpu.") {
			t.Errorf("%q is not one of GPU feature discovery's nvidia.com/gpu.* names", k)
		}
	}
	for _, v := range []string{SharingTimeSlicing, SharingNone} {
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			t.Errorf("%q is not a valid label value: %v", v, errs)
		}
	}
	for _, k := range []string{TaintUnvalidated, TaintGPUUnhealthy, LabelImage, LabelDriverVersion, LabelGPUProduct, LabelGPUCount, LabelSimulated} {
		if !strings.HasPrefix(k, LabelPrefix) {
			t.Errorf("%q is outside %s", k, LabelPrefix)
		}
	}
}
