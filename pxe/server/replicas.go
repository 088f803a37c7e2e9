package server

import (
	"context"
	"fmt"
	"os"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/gpurack/gpurack/pxe/inventory"
	"github.com/gpurack/gpurack/pxe/inventory/kubestore"
	"github.com/gpurack/gpurack/pxe/nodecontrol"
)

// The node controller's Lease (decision 0704): a replica that stops renewing it for
// LeaseDuration loses it to another; one that shuts down releases it at once.
const (
	leaseDuration = 15 * time.Second
	renewDeadline = 10 * time.Second
	retryPeriod   = 2 * time.Second
)

// OpenClusterStore opens the inventory kept in the cluster that kubeconfig (the
// enroller's) reaches, and checks that the API serves Machines to it.
func OpenClusterStore(ctx context.Context, kubeconfig string) (*kubestore.Store, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("inventory in the cluster: kubeconfig %s: %w", kubeconfig, err)
	}
	cfg.UserAgent = "gpuboot"
	ks, err := kubestore.New(cfg)
	if err != nil {
		return nil, err
	}
	if err := ks.Check(ctx); err != nil {
		return nil, err
	}
	return ks, nil
}

// electedNodeController returns the node controller's loop for a replica on the
// cluster store: it runs a controller only while this replica holds the Lease
// kube-system/gpuboot-node-controller, and goes back to waiting for it when it loses
// it. Every replica serves boot and enrollment; only the holder reconciles Nodes.
func (g *gpuboot) electedNodeController(ctx context.Context, newController func() *nodecontrol.Controller) (func() error, error) {
	host, _ := os.Hostname()
	id := fmt.Sprintf("%s_%d_%s", host, os.Getpid(), inventory.NewID())
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: kubestore.LeaseNamespace, Name: kubestore.LeaseName},
		Client:     g.cluster.Client().CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: id},
	}
	lec := leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   leaseDuration,
		RenewDeadline:   renewDeadline,
		RetryPeriod:     retryPeriod,
		ReleaseOnCancel: true,
		Name:            kubestore.LeaseName,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				g.log.Info("this replica holds the node controller's Lease: reconciling Nodes", "lease", kubestore.LeaseNamespace+"/"+kubestore.LeaseName, "identity", id)
				if err := newController().Run(ctx); err != nil && ctx.Err() == nil {
					g.log.Error("node controller", "err", err)
				}
			},
			OnStoppedLeading: func() {
				g.log.Info("this replica no longer holds the node controller's Lease", "identity", id)
			},
			OnNewLeader: func(holder string) {
				if holder != id {
					g.log.Info("the node controller runs on another replica", "holder", holder)
				}
			},
		},
	}
	if _, err := leaderelection.NewLeaderElector(lec); err != nil {
		return nil, fmt.Errorf("node controller election: %w", err)
	}
	return func() error {
		// Run returns when this replica stops holding the Lease: a fresh elector
		// competes for it again.
		for ctx.Err() == nil {
			le, err := leaderelection.NewLeaderElector(lec)
			if err != nil {
				return fmt.Errorf("node controller election: %w", err)
			}
			le.Run(ctx)
		}
		return nil
	}, nil
}
