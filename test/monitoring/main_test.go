package monitoring

import (
	"os"
	"testing"

	"github.com/gpurack/gpurack/controlplane-bootstrap/testcluster"
)

// TestMain answers the log gateway's subcommand: the control planes of these tests
// run with monitoring, so with the log store, whose gateway is this test binary
// (testcluster.Main).
func TestMain(m *testing.M) { os.Exit(testcluster.Main(m)) }
