package controlplane_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster"
)

// One control plane serves every test in this package that does not need a
// private one (testcluster.Shared); TestMain stops it.
func TestMain(m *testing.M) { os.Exit(testcluster.Main(m)) }

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
