// Package attesttest is for tests only: it creates an agent/attest Attester on a
// software TPM started by internal/swtpmtest, so that internal/swtpmtest need not
// import the agent.
package attesttest

import (
	"testing"

	"github.com/gpurack/gpurack/agent/attest"
	"github.com/gpurack/gpurack/internal/swtpmtest"
)

// New creates the EK and AK in tpm and returns their Attester, which closes when t
// ends.
func New(t testing.TB, tpm *swtpmtest.TPM) *attest.Attester {
	t.Helper()
	a, err := attest.New(tpm.Dial(t))
	if err != nil {
		t.Fatalf("swtpm %s: %v", tpm.Dir, err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}
