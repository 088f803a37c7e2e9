package localpv

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"sigs.k8s.io/sig-storage-lib-external-provisioner/v13/controller"

	"github.com/gpurack/gpurack/internal/localvol"
)

// publishEvery is how often the capacity is published and pending claims looked at
// without a change having asked for it (a disk mounted, another node's figure).
const publishEvery = 30 * time.Second

// Run provisions node's gpurack-local volumes in store and publishes its capacity
// until ctx ends. client authenticates as the node (its kubelet's credentials): the
// cluster's RBAC and admission policy (controlplane-bootstrap/localvolumes) let a node
// write only its own volumes and capacity. published is called after each
// publication with the disks' space it published, or its error.
func Run(ctx context.Context, client kubernetes.Interface, node string, store *Store, log *slog.Logger, published func([]DiskSpace, error)) error {
	all := informers.NewSharedInformerFactory(client, 0)
	mine := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.LabelSelector = labels.Set{localvol.LabelNode: node}.String()
	}))
	caps := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(localvol.Namespace))
	claims, classes := all.Core().V1().PersistentVolumeClaims(), all.Storage().V1().StorageClasses()
	volumes, capacities := mine.Core().V1().PersistentVolumes(), caps.Storage().V1().CSIStorageCapacities()
	kick := make(chan struct{}, 1)
	changed := func() {
		select {
		case kick <- struct{}{}:
		default:
		}
	}
	prov := &Provisioner{Node: node, Store: store, Changed: changed}
	lctx := klog.NewContext(ctx, klog.FromContext(ctx).WithName("local-volumes"))
	pc := controller.NewProvisionController(lctx, client, localvol.Provisioner, prov,
		controller.LeaderElection(false), controller.Threadiness(2), controller.MetricsPort(0),
		controller.ClaimsInformer(claims.Informer()), controller.ClassesInformer(classes.Informer()),
		controller.VolumesInformer(volumes.Informer()))
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	defer broadcaster.Shutdown()
	capacity := &Capacity{Node: node, Store: store, Client: client, Classes: classes.Lister(), Capacities: capacities.Lister(),
		Claims: claims.Lister(), Log: log,
		Events: broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "gpuagent", Host: node})}
	for _, inf := range []cache.SharedIndexInformer{claims.Informer(), classes.Informer(), capacities.Informer()} {
		_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: func(any) { changed() }, UpdateFunc: func(any, any) { changed() }})
	}
	all.Start(ctx.Done())
	mine.Start(ctx.Done())
	caps.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), claims.Informer().HasSynced, classes.Informer().HasSynced, volumes.Informer().HasSynced, capacities.Informer().HasSynced) {
		return ctx.Err()
	}
	go pc.Run(lctx)
	return publishLoop(ctx, capacity, kick, published)
}

// publishLoop publishes the capacity and tells unplaceable claims on every kick and
// every publishEvery, until ctx ends.
func publishLoop(ctx context.Context, c *Capacity, kick <-chan struct{}, published func([]DiskSpace, error)) error {
	t := time.NewTicker(publishEvery)
	defer t.Stop()
	for {
		spaces, err := c.Publish(ctx)
		if err == nil {
			err = c.TellUnplaceable()
		}
		if err != nil {
			err = fmt.Errorf("local volumes: %w", err)
		}
		if published != nil {
			published(spaces, err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-kick:
		case <-t.C:
		}
	}
}
