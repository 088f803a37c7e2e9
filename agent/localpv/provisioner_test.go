package localpv

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestClassMode: directoryMode is the one parameter; a typo and a bad mode are errors
// naming them.
func TestClassMode(t *testing.T) {
	for _, tc := range []struct {
		params map[string]string
		mode   uint32
		err    string
	}{
		{nil, 0o777, ""},
		{map[string]string{"directoryMode": "0750"}, 0o750, ""},
		{map[string]string{"directoryMod": "0750"}, 0, `unknown parameter "directoryMod"`},
		{map[string]string{"directoryMode": "750"}, 0, "not an octal mode"},
		{map[string]string{"directoryMode": "0999"}, 0, "not an octal mode"},
	} {
		m, err := classMode("c", tc.params)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%v: %v, want %q", tc.params, err, tc.err)
			}
			continue
		}
		if err != nil || uint32(m) != tc.mode {
			t.Errorf("%v: %o, %v", tc.params, m, err)
		}
	}
}

// TestCheckClaim: block, shared access modes, selectors and no size are refused with
// what to change.
func TestCheckClaim(t *testing.T) {
	ok := func() *corev1.PersistentVolumeClaim {
		c := &corev1.PersistentVolumeClaim{}
		c.Namespace, c.Name = "ns", "c"
		c.Spec.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}
		c.Spec.Resources.Requests = corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}
		return c
	}
	if err := checkClaim(ok()); err != nil {
		t.Fatal(err)
	}
	block := corev1.PersistentVolumeBlock
	for want, edit := range map[string]func(*corev1.PersistentVolumeClaim){
		"block volume": func(c *corev1.PersistentVolumeClaim) { c.Spec.VolumeMode = &block },
		"gpurack-shared": func(c *corev1.PersistentVolumeClaim) {
			c.Spec.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}
		},
		"selector":            func(c *corev1.PersistentVolumeClaim) { c.Spec.Selector = &metav1.LabelSelector{} },
		"requests no storage": func(c *corev1.PersistentVolumeClaim) { c.Spec.Resources.Requests = nil },
	} {
		c := ok()
		edit(c)
		if err := checkClaim(c); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v", want, err)
		}
	}
}
