// Package volclaim holds what gpurack's two provisioners, gpurack-local
// (agent/localpv) and gpurack-shared (agent/sharedpv), check alike: both make a
// directory per claim, so both refuse the same claims and read a directory mode
// the same way. Each error names the class and says what to change.
package volclaim

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// CheckDirectoryClaim refuses a claim that a directory of class cannot be: a block
// volume, a selector (the provisioner makes new volumes, it matches none), no size.
func CheckDirectoryClaim(c *corev1.PersistentVolumeClaim, class string) error {
	if c.Spec.VolumeMode != nil && *c.Spec.VolumeMode == corev1.PersistentVolumeBlock {
		return fmt.Errorf("claim %s/%s asks for a block volume; %s volumes are directories (volumeMode: Filesystem)", c.Namespace, c.Name, class)
	}
	if c.Spec.Selector != nil {
		return fmt.Errorf("claim %s/%s has a selector; %s makes new volumes and cannot match one", c.Namespace, c.Name, class)
	}
	req, ok := c.Spec.Resources.Requests[corev1.ResourceStorage]
	if !ok || req.Value() <= 0 {
		return fmt.Errorf("claim %s/%s requests no storage; set resources.requests.storage", c.Namespace, c.Name)
	}
	return nil
}

// ParseMode reads StorageClass class's parameter param, an octal directory mode
// written with its leading 0 ("0770").
func ParseMode(class, param, v string) (os.FileMode, error) {
	n, err := strconv.ParseUint(v, 8, 32)
	if err != nil || n > 0o7777 || !strings.HasPrefix(v, "0") {
		return 0, fmt.Errorf("StorageClass %s: parameter %s=%q is not an octal mode such as \"0770\"", class, param, v)
	}
	return os.FileMode(n) & os.ModePerm, nil
}
