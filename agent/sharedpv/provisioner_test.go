package sharedpv

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller"

	"github.com/gpurack/gpurack/internal/sharedvol"
)

// exportRig is a Provisioner over a directory standing in for the mounted export
// (Export's work is plain directory work; the NFS mount is TestRack's), with claims
// and volumes in maps.
type exportRig struct {
	dir     string
	claims  map[string]*corev1.PersistentVolumeClaim
	volumes map[string]*corev1.PersistentVolume
	mounts  []string
	deleted []string
	p       *Provisioner
}

func newExportRig(t *testing.T) *exportRig {
	r := &exportRig{dir: t.TempDir(), claims: map[string]*corev1.PersistentVolumeClaim{}, volumes: map[string]*corev1.PersistentVolume{}}
	r.p = &Provisioner{
		Mount: func(_ context.Context, server, share string, opts []string) (string, error) {
			r.mounts = append(r.mounts, server+":"+share+" "+strings.Join(opts, ","))
			return r.dir, nil
		},
		Claim: func(ns, name string) (*corev1.PersistentVolumeClaim, error) {
			if c, ok := r.claims[ns+"/"+name]; ok {
				return c, nil
			}
			return nil, errors.New("not found")
		},
		Volume: func(name string) (*corev1.PersistentVolume, error) {
			if v, ok := r.volumes[name]; ok {
				return v, nil
			}
			return nil, errors.New("not found")
		},
		Views: func(name string) ([]string, error) {
			var out []string
			for _, v := range r.volumes {
				if v.Labels[sharedvol.LabelView] == name {
					out = append(out, v.Name)
				}
			}
			return out, nil
		},
		Deleted: func(pv, what string) { r.deleted = append(r.deleted, pv+": "+what) },
		Now:     func() time.Time { return time.Date(2026, 12, 6, 9, 30, 0, 0, time.UTC) },
	}
	return r
}

func sharedClaim(ns, name string, modes ...corev1.PersistentVolumeAccessMode) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.PersistentVolumeClaimSpec{AccessModes: modes,
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}},
	}
}

func sharedClass(params map[string]string) *storagev1.StorageClass {
	p := map[string]string{sharedvol.ParamServer: "10.0.2.15", sharedvol.ParamShare: "/srv/gpurack"}
	for k, v := range params {
		p[k] = v
	}
	return &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: sharedvol.StorageClass}, Provisioner: sharedvol.Provisioner,
		Parameters: p, MountOptions: []string{"nfsvers=4.1", "hard"}}
}

// provision provisions claim as volume pv and records both, bound, as the apiserver would.
func (r *exportRig) provision(t *testing.T, claim *corev1.PersistentVolumeClaim, pv string, class *storagev1.StorageClass) (*corev1.PersistentVolume, error) {
	t.Helper()
	v, _, err := r.p.Provision(context.Background(), controller.ProvisionOptions{StorageClass: class, PVName: pv, PVC: claim})
	if err != nil {
		return nil, err
	}
	v.Annotations = mergeMaps(v.Annotations, map[string]string{annProvisionedBy: sharedvol.Provisioner})
	r.volumes[pv] = v
	claim.Spec.VolumeName, claim.Status.Phase = pv, corev1.ClaimBound
	r.claims[claim.Namespace+"/"+claim.Name] = claim
	return v, nil
}

func mergeMaps(a, b map[string]string) map[string]string {
	out := map[string]string{}
	for _, m := range []map[string]string{a, b} {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

// TestProvisionAndArchive: a ReadWriteMany claim gets its own directory on the export,
// as an nfs volume with the class's mount options; a view of it is read-only and
// holds back the volume's deletion until it is gone; deleting the volume then
// archives the directory with its data; a class saying onDelete: delete removes it.
func TestProvisionAndArchive(t *testing.T) {
	r := newExportRig(t)
	data := sharedClaim("alpha", "datasets", corev1.ReadWriteMany)
	pv, err := r.provision(t, data, "pvc-a1", sharedClass(nil))
	if err != nil {
		t.Fatal(err)
	}
	dirName := "alpha_datasets_pvc-a1"
	if pv.Spec.NFS == nil || pv.Spec.NFS.Server != "10.0.2.15" || pv.Spec.NFS.Path != "/srv/gpurack/volumes/"+dirName || pv.Spec.NFS.ReadOnly {
		t.Fatalf("volume source %+v", pv.Spec.NFS)
	}
	if strings.Join(pv.Spec.MountOptions, ",") != "nfsvers=4.1,hard" || pv.Spec.NodeAffinity != nil {
		t.Errorf("mount options %v, node affinity %v; want the class's, none", pv.Spec.MountOptions, pv.Spec.NodeAffinity)
	}
	if err := os.WriteFile(filepath.Join(r.dir, "volumes", dirName, "train.csv"), []byte("1,2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	view := sharedClaim("alpha", "datasets-ro", corev1.ReadOnlyMany)
	view.Annotations = map[string]string{sharedvol.AnnViewOf: "datasets"}
	vpv, err := r.provision(t, view, "pvc-a2", sharedClass(nil))
	if err != nil {
		t.Fatal(err)
	}
	if vpv.Spec.NFS.Path != pv.Spec.NFS.Path || !vpv.Spec.NFS.ReadOnly || vpv.Labels[sharedvol.LabelView] != "pvc-a1" {
		t.Errorf("view: %+v labels %v; want the same path, read-only, labelled", vpv.Spec.NFS, vpv.Labels)
	}
	// kubelet reads a pod's claim reference for read-only, not nfs.readOnly: the mount
	// options carry it.
	if got := strings.Join(vpv.Spec.MountOptions, ","); got != "nfsvers=4.1,hard,ro" {
		t.Errorf("view's mount options %s; want the class's and ro", got)
	}
	if got := strings.Join(readOnlyOptions([]string{"rw", "soft", "ro"}), ","); got != "soft,ro" {
		t.Errorf("readOnlyOptions(rw, soft, ro) = %s; want soft,ro", got)
	}
	if err := r.p.Delete(context.Background(), pv); err == nil || !strings.Contains(err.Error(), "pvc-a2") {
		t.Errorf("deleting a volume with a view: %v; want an error naming the view", err)
	}
	if err := r.p.Delete(context.Background(), vpv); err != nil {
		t.Fatalf("deleting the view: %v", err)
	}
	delete(r.volumes, "pvc-a2")
	if err := r.p.Delete(context.Background(), pv); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(r.dir, "archived", dirName+".20261206T093000Z", "train.csv")); err != nil || string(got) != "1,2\n" {
		t.Errorf("archived data: %q %v", got, err)
	}
	if want := "pvc-a1: archived " + dirName + " as archived/" + dirName + ".20261206T093000Z"; len(r.deleted) != 1 || r.deleted[0] != want {
		t.Errorf("told %q, want %q", r.deleted, want)
	}
	if len(r.mounts) == 0 || r.mounts[0] != "10.0.2.15:/srv/gpurack nfsvers=4.1,hard" {
		t.Errorf("mounts %q", r.mounts)
	}

	scratch := sharedClaim("beta", "scratch", corev1.ReadWriteMany)
	spv, err := r.provision(t, scratch, "pvc-b1", sharedClass(map[string]string{sharedvol.ParamOnDelete: "delete", sharedvol.ParamDirectoryMode: "0770"}))
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(r.dir, "volumes", "beta_scratch_pvc-b1")); err != nil || fi.Mode().Perm() != 0o770 {
		t.Errorf("directory mode: %v %v", fi, err)
	}
	if err := r.p.Delete(context.Background(), spv); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(r.dir, "volumes", "beta_scratch_pvc-b1")); !os.IsNotExist(err) {
		t.Errorf("onDelete: delete left the directory: %v", err)
	}
}

// TestProvisionRefusals: each bad class, claim or view gets an error saying what to
// change, and nothing is made on the export.
func TestProvisionRefusals(t *testing.T) {
	r := newExportRig(t)
	block := corev1.PersistentVolumeBlock
	blockClaim := sharedClaim("a", "b", corev1.ReadWriteMany)
	blockClaim.Spec.VolumeMode = &block
	noSize := sharedClaim("a", "nosize", corev1.ReadWriteMany)
	noSize.Spec.Resources.Requests = nil
	rwView := sharedClaim("a", "rwview", corev1.ReadWriteMany)
	rwView.Annotations = map[string]string{sharedvol.AnnViewOf: "src"}
	orphanView := sharedClaim("a", "orphan", corev1.ReadOnlyMany)
	orphanView.Annotations = map[string]string{sharedvol.AnnViewOf: "missing"}
	for _, tc := range []struct {
		claim  *corev1.PersistentVolumeClaim
		params map[string]string
		want   string
	}{
		{sharedClaim("a", "c", corev1.ReadWriteMany), map[string]string{"sever": "x"}, `unknown parameter "sever"`},
		{sharedClaim("a", "c", corev1.ReadWriteMany), map[string]string{sharedvol.ParamShare: "/"}, "not / itself"},
		{sharedClaim("a", "c", corev1.ReadWriteMany), map[string]string{sharedvol.ParamShare: "srv"}, "clean absolute path"},
		{sharedClaim("a", "c", corev1.ReadWriteMany), map[string]string{sharedvol.ParamServer: "nfs:2049"}, "without a port"},
		{sharedClaim("a", "c", corev1.ReadWriteMany), map[string]string{sharedvol.ParamOnDelete: "keep"}, `want "archive" or "delete"`},
		{sharedClaim("a", "c", corev1.ReadWriteMany), map[string]string{sharedvol.ParamDirectoryMode: "777"}, "not an octal mode"},
		{blockClaim, nil, "block volume"},
		{noSize, nil, "requests no storage"},
		{rwView, nil, "a view is ReadOnlyMany only"},
		{orphanView, nil, "a view of claim missing"},
	} {
		_, err := r.provision(t, tc.claim, "pvc-x", sharedClass(tc.params))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("claim %s, params %v: %v; want %q", tc.claim.Name, tc.params, err, tc.want)
		}
	}
	if left, _ := os.ReadDir(filepath.Join(r.dir, "volumes")); len(left) > 0 {
		t.Errorf("the export holds %v after refusals", left)
	}
}

// TestDeleteRefusesForeignPaths: a volume whose path is not <share>/volumes/<its own
// directory> is refused before anything is mounted or touched.
func TestDeleteRefusesForeignPaths(t *testing.T) {
	r := newExportRig(t)
	for _, p := range []string{"/srv/gpurack", "/srv/gpurack/volumes", "/srv/gpurack/volumes/", "/srv/gpurack/volumes/.",
		"/srv/gpurack/volumes/alpha_x_pvc-other", "/volumes/alpha_x_pvc-1", "/srv/gpurack/other/alpha_x_pvc-1", "/srv/gpurack/volumes/a/alpha_x_pvc-1"} {
		pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pvc-1"},
			Spec: corev1.PersistentVolumeSpec{PersistentVolumeSource: corev1.PersistentVolumeSource{NFS: &corev1.NFSVolumeSource{Server: "s", Path: p}}}}
		if err := r.p.Delete(context.Background(), pv); err == nil || !strings.Contains(err.Error(), "nothing deleted") {
			t.Errorf("path %s: %v; want 'nothing deleted'", p, err)
		}
	}
	if len(r.mounts) > 0 {
		t.Errorf("mounted %v for refused volumes", r.mounts)
	}
}

// TestProvisionerOptions: the provisioner's own mount is soft and writable whatever the
// class or a read-only volume says.
func TestProvisionerOptions(t *testing.T) {
	for in, want := range map[string]string{"": "soft", "nfsvers=4.1,hard": "nfsvers=4.1,soft", "softerr,timeo=50": "softerr,timeo=50",
		"nfsvers=4.1,soft,ro": "nfsvers=4.1,soft"} {
		var opts []string
		if in != "" {
			opts = []string{in}
		}
		if got := strings.Join(provisionerOptions(opts), ","); got != want {
			t.Errorf("%q: %q, want %q", in, got, want)
		}
	}
}

// FuzzDeletePath: whatever path a volume names, Delete touches only
// <export>/volumes/<the volume's own directory> (or refuses): a file beside it and the
// export's other directories stay.
func FuzzDeletePath(f *testing.F) {
	for _, s := range []string{"/srv/gpurack/volumes/a_b_pvc-1", "/srv/gpurack/volumes/..", "/srv/gpurack/volumes/a_b_pvc-1/..", "/", "", "/srv/gpurack/volumes//a_b_pvc-1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		r := newExportRig(t)
		keep := filepath.Join(r.dir, "volumes", "a_keep_pvc-2", "k")
		if err := os.MkdirAll(filepath.Dir(keep), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(keep, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		pv := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pvc-1", Annotations: map[string]string{annOnDelete: sharedvol.OnDeleteDelete}},
			Spec: corev1.PersistentVolumeSpec{PersistentVolumeSource: corev1.PersistentVolumeSource{NFS: &corev1.NFSVolumeSource{Server: "s", Path: p}}}}
		_ = r.p.Delete(context.Background(), pv)
		if _, err := os.Stat(keep); err != nil {
			t.Fatalf("path %q: another volume's file: %v", p, err)
		}
	})
}
