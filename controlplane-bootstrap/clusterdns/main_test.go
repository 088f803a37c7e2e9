package clusterdns_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster"
)

// One control plane, started by controlplane.Init as `controlplane-bootstrap init`
// does, serves every test here; TestMain stops it.
func TestMain(m *testing.M) { os.Exit(testcluster.Main(m)) }

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
