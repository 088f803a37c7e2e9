package nodecontrol

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/gpurack/gpurack/pxe/inventory"
)

// Lifecycle is what the controller needs from the enrollment service.
type Lifecycle interface {
	// NodeRegistered tells it the Node exists (joining → commissioning).
	NodeRegistered(ctx context.Context, nodeName, nodeBootID string) (*inventory.Machine, error)
	// StateByNode returns the lifecycle state of the machine with that node name.
	StateByNode(ctx context.Context, nodeName string) (inventory.State, bool, error)
}

// Queue holds the names of the Nodes the controller is to look at. The enrollment
// service adds to it when a machine's state changes (e.g. to ready); the controller
// takes from it. It is made before either, so each is built complete with it.
type Queue struct {
	q workqueue.TypedRateLimitingInterface[string]
}

// NewQueue returns an empty queue.
func NewQueue() *Queue {
	return &Queue{q: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "gpuboot-nodes"})}
}

// Enqueue asks the controller to look at a Node; "" is ignored.
func (q *Queue) Enqueue(nodeName string) {
	if nodeName != "" {
		q.q.Add(nodeName)
	}
}

// Options configure a Controller.
type Options struct {
	// Queue is where the controller takes Node names from, besides its Node watch;
	// nil: a queue of its own, filled by the watch alone.
	Queue *Queue
	// Effect of gpurack.io/gpu-unhealthy: NoSchedule (default) or NoExecute.
	Effect corev1.TaintEffect
	// Workers reconciling Nodes in parallel; default 4.
	Workers int
	Log     *slog.Logger
	Now     func() time.Time
}

// Controller watches Nodes and keeps gpurack's taints in step.
type Controller struct {
	cluster *Cluster
	life    Lifecycle
	opts    Options
	queue   workqueue.TypedRateLimitingInterface[string]
	lister  cache.Indexer
	synced  cache.InformerSynced
	factory informers.SharedInformerFactory
}

// NewController returns a controller; Run starts it.
func NewController(c *Cluster, life Lifecycle, opts Options) *Controller {
	if opts.Effect == "" {
		opts.Effect = corev1.TaintEffectNoSchedule
	}
	if opts.Workers == 0 {
		opts.Workers = 4
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Queue == nil {
		opts.Queue = NewQueue()
	}
	ctl := &Controller{cluster: c, life: life, opts: opts, queue: opts.Queue.q}
	ctl.factory = informers.NewSharedInformerFactory(c.client, 10*time.Minute)
	inf := ctl.factory.Core().V1().Nodes().Informer()
	inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { ctl.enqueueObj(obj) },
		UpdateFunc: func(_, obj any) { ctl.enqueueObj(obj) },
	})
	ctl.lister = inf.GetIndexer()
	ctl.synced = inf.HasSynced
	return ctl
}

func (c *Controller) enqueueObj(obj any) {
	if n, ok := obj.(*corev1.Node); ok {
		c.queue.Add(n.Name)
	}
}

// Run watches until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	defer c.queue.ShutDown()
	c.factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), c.synced) {
		return fmt.Errorf("node controller: cache did not sync: %w", ctx.Err())
	}
	for i := 0; i < c.opts.Workers; i++ {
		go func() {
			for c.next(ctx) {
			}
		}()
	}
	<-ctx.Done()
	c.factory.Shutdown()
	return nil
}

func (c *Controller) next(ctx context.Context) bool {
	name, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(name)
	if err := c.reconcile(ctx, name); err != nil {
		c.opts.Log.Warn("node controller", "node", name, "err", err)
		c.queue.AddRateLimited(name)
	} else {
		c.queue.Forget(name)
	}
	return true
}

func (c *Controller) reconcile(ctx context.Context, name string) error {
	obj, exists, err := c.lister.GetByKey(name)
	if err != nil || !exists {
		return err
	}
	node := obj.(*corev1.Node)
	if _, err := c.life.NodeRegistered(ctx, name, node.Status.NodeInfo.BootID); err != nil {
		return err
	}
	st, known, err := c.life.StateByNode(ctx, name)
	if err != nil {
		return err
	}
	facts := Facts{Known: known, Ready: st == inventory.Ready, Effect: c.opts.Effect}
	// The informer's copy may lag the API server (the node lifecycle controller
	// patches Nodes too): when the guarded patch fails, decide again on a fresh read
	// rather than waiting for the cache and a rate-limited requeue.
	for attempt := 0; ; attempt++ {
		d := Decide(node, facts, c.opts.Now())
		if !d.Changed {
			return nil
		}
		err := c.cluster.patchTaints(ctx, node, d.Taints)
		if err == nil {
			c.opts.Log.Info("node taints updated", "node", name, "taints", taintKeys(d.Taints))
			return nil
		}
		if !errors.Is(err, errStale) || attempt == 4 {
			return err
		}
		if node, err = c.cluster.client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{}); err != nil {
			return err
		}
	}
}

// errStale: the Node changed since the decision was made.
var errStale = errors.New("the Node changed meanwhile")

// patchTaints replaces the Node's taints with a JSON patch that first tests the
// resourceVersion the decision was made on (the enroller may patch, not update), so a
// concurrent change makes it fail and retry instead of overwriting.
func (c *Cluster) patchTaints(ctx context.Context, node *corev1.Node, taints []corev1.Taint) error {
	if taints == nil {
		taints = []corev1.Taint{}
	}
	ops := []map[string]any{
		{"op": "test", "path": "/metadata/resourceVersion", "value": node.ResourceVersion},
	}
	if node.Spec.Taints == nil {
		ops = append(ops, map[string]any{"op": "add", "path": "/spec/taints", "value": taints})
	} else {
		ops = append(ops, map[string]any{"op": "replace", "path": "/spec/taints", "value": taints})
	}
	body, _ := json.Marshal(ops)
	_, err := c.client.CoreV1().Nodes().Patch(ctx, node.Name, types.JSONPatchType, body, metav1.PatchOptions{FieldManager: "gpuboot"})
	if apierrors.IsInvalid(err) || apierrors.IsConflict(err) {
		return fmt.Errorf("node %s: %w (%v)", node.Name, errStale, err)
	}
	return err
}

func taintKeys(ts []corev1.Taint) []string {
	var out []string
	for _, t := range ts {
		out = append(out, t.Key+":"+string(t.Effect))
	}
	return out
}
