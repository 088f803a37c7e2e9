package kubejoin

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// WaitNodeCredentials waits until kubelet has written the node's kubeconfig (after
// its TLS bootstrap) and returns a client configuration from it. It polls every
// second until ctx ends.
func WaitNodeCredentials(ctx context.Context, path string) (*rest.Config, error) {
	for {
		if _, err := os.Stat(path); err == nil {
			cfg, err := clientcmd.BuildConfigFromFlags("", path)
			if err == nil {
				return cfg, nil
			}
			// kubelet may be mid-write; try again.
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for kubelet's node kubeconfig %s: %w (journalctl -u kubelet)", path, ctx.Err())
		case <-time.After(time.Second):
		}
	}
}

// Attach waits for kubelet to register the Node, then merges labels into it with the
// node's own credentials (NodeRestriction lets a node set gpurack.io/* labels on
// itself, not taints). It returns the Node for GPUHealthy updates.
func Attach(ctx context.Context, client kubernetes.Interface, name string, labels map[string]string) (*Node, error) {
	for {
		_, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			break
		}
		if !apierrors.IsNotFound(err) && !apierrors.IsForbidden(err) {
			return nil, fmt.Errorf("node %s: %w", name, err)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for kubelet to register node %s: %w", name, ctx.Err())
		case <-time.After(time.Second):
		}
	}
	if len(labels) > 0 {
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": labels}})
		if err != nil {
			return nil, err
		}
		if _, err := client.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			return nil, fmt.Errorf("label node %s: %w", name, err)
		}
	}
	return &Node{Client: client, Name: name}, nil
}
