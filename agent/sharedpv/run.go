package sharedpv

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller"

	"github.com/gpurack/gpurack/internal/localvol"
	"github.com/gpurack/gpurack/internal/sharedvol"
)

// The election's timing. Every node takes part, so a candidate asks for the lock
// only every retryPeriod (160 nodes: 16 requests a second); a leader that stops is
// replaced within about leaseDuration + retryPeriod, which a claim waits out.
const (
	leaseDuration = 60 * time.Second
	renewDeadline = 40 * time.Second
	retryPeriod   = 10 * time.Second
	// classPoll is how often an agent looks for a gpurack-shared class before it
	// takes part in the election: a cluster without an NFS export costs nothing more.
	classPoll = 30 * time.Second
)

// Status is what Run tells its caller as it goes.
type Status struct {
	Classes int  // StorageClasses of sharedvol.Provisioner
	Leading bool // this agent provisions
	Leader  string
}

// Mounts mounts exports for the provisioner (Mounter does, with mount.nfs).
type Mounts interface {
	Mount(ctx context.Context, server, share string, options []string) (string, error)
	UnmountAll(log *slog.Logger)
}

// Options are Run's.
type Options struct {
	Node   string
	Mounts Mounts
	Log    *slog.Logger
	// Told hears the service's state as it changes.
	Told func(Status)
	// The election's timing and the look for a class; zero: the constants above.
	LeaseDuration, RenewDeadline, RetryPeriod, ClassPoll time.Duration
}

// Run provisions gpurack-shared claims while this node's agent leads the election
// (on ConfigMap sharedvol.Lease in localvol.Namespace: configMapLock), once a class
// of the provisioner exists, until ctx ends or the lead is lost; then it returns (an
// error on a lost lead, for the caller to run it again). client authenticates as the
// node: the cluster's RBAC and admission policy (controlplane-bootstrap/localvolumes)
// let a node write only gpurack-shared volumes on the cluster's export.
func Run(ctx context.Context, client kubernetes.Interface, o Options) error {
	dur := func(d, def time.Duration) time.Duration { return cmp.Or(d, def) }
	n, err := awaitClass(ctx, client, o.Told, dur(o.ClassPoll, classPoll))
	if err != nil || n == 0 {
		return err
	}
	lock := &configMapLock{client: client.CoreV1(), namespace: localvol.Namespace, name: sharedvol.Lease, identity: o.Node}
	lost := make(chan struct{})
	var leading bool
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: lock, LeaseDuration: dur(o.LeaseDuration, leaseDuration), RenewDeadline: dur(o.RenewDeadline, renewDeadline),
		RetryPeriod: dur(o.RetryPeriod, retryPeriod), ReleaseOnCancel: true, Name: sharedvol.Lease,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(lctx context.Context) {
				leading = true
				o.Told(Status{Classes: n, Leading: true, Leader: o.Node})
				o.Log.Info("leading the gpurack-shared provisioners: provisioning", "lock", lock.Describe())
				provision(lctx, client, o.Mounts, o.Log)
			},
			OnStoppedLeading: func() { close(lost) },
			OnNewLeader: func(id string) {
				if id != o.Node {
					o.Told(Status{Classes: n, Leader: id})
				}
			},
		},
	})
	if err != nil {
		return err
	}
	le.Run(ctx) // returns when ctx ends or the lead is lost
	o.Mounts.UnmountAll(o.Log)
	<-lost
	if leading && ctx.Err() == nil {
		return fmt.Errorf("lost the lead of the gpurack-shared provisioners (%s not renewed in time)", lock.Describe())
	}
	return nil
}

// awaitClass waits until a StorageClass of sharedvol.Provisioner exists and returns
// how many there are (0 when ctx ended first).
func awaitClass(ctx context.Context, client kubernetes.Interface, told func(Status), poll time.Duration) (int, error) {
	for {
		l, err := client.StorageV1().StorageClasses().List(ctx, metav1.ListOptions{})
		if err != nil && ctx.Err() == nil {
			return 0, fmt.Errorf("list StorageClasses: %w", err)
		}
		n := 0
		if l != nil {
			for _, c := range l.Items {
				if c.Provisioner == sharedvol.Provisioner {
					n++
				}
			}
		}
		if n > 0 {
			return n, nil
		}
		told(Status{})
		select {
		case <-ctx.Done():
			return 0, nil
		case <-time.After(poll):
		}
	}
}

// provision runs the provisioner library's controller until ctx ends.
func provision(ctx context.Context, client kubernetes.Interface, mounts Mounts, log *slog.Logger) {
	f := informers.NewSharedInformerFactory(client, 0)
	claims, classes, volumes := f.Core().V1().PersistentVolumeClaims(), f.Storage().V1().StorageClasses(), f.Core().V1().PersistentVolumes()
	p := &Provisioner{
		Mount: mounts.Mount,
		Claim: func(ns, name string) (*corev1.PersistentVolumeClaim, error) {
			return claims.Lister().PersistentVolumeClaims(ns).Get(name)
		},
		Volume: func(name string) (*corev1.PersistentVolume, error) { return volumes.Lister().Get(name) },
		Views: func(name string) ([]string, error) {
			vs, err := volumes.Lister().List(labels.SelectorFromSet(labels.Set{sharedvol.LabelView: name}))
			var out []string
			for _, v := range vs {
				out = append(out, v.Name)
			}
			return out, err
		},
		Deleted: func(pv, what string) { log.Info("gpurack-shared volume deleted", "volume", pv, "directory", what) },
	}
	lctx := klog.NewContext(ctx, klog.FromContext(ctx).WithName("shared-volumes"))
	pc := controller.NewProvisionController(lctx, client, sharedvol.Provisioner, p,
		controller.LeaderElection(false), controller.Threadiness(2), controller.MetricsPort(0),
		// A claim or deletion that failed (the export unreachable, a view left) is
		// tried again after 2 s, doubling to 5 minutes (the library's default starts
		// at 15 s).
		controller.RateLimiter(workqueue.NewTypedItemExponentialFailureRateLimiter[string](2*time.Second, 5*time.Minute)),
		controller.ClaimsInformer(claims.Informer()), controller.ClassesInformer(classes.Informer()),
		controller.VolumesInformer(volumes.Informer()))
	f.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), claims.Informer().HasSynced, classes.Informer().HasSynced, volumes.Informer().HasSynced) {
		return
	}
	pc.Run(lctx)
}
