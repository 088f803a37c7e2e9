// Package queues tests the job queues (docs/tenants.md "Queues"): a real etcd and
// apiserver, and the real Kueue manager that controlplane-bootstrap init starts, with
// the tenants' ClusterQueues and LocalQueues from `tenants apply`.
//
// There are no kubelets: Kueue admits by quota, not by nodes, so what is checked is its
// admission (the Workload's conditions, the Job's spec.suspend). The admitted Jobs' pods
// stay Pending, unscheduled, which is what they would do on a rack whose GPUs were all
// taken; no GPU is used and no container runs.
package queues

import (
	"os"
	"testing"

	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster"
)

func TestMain(m *testing.M) { os.Exit(testcluster.Main(m)) }
