package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpurack/gpurack/internal/strictyaml"
)

// FuzzParse feeds arbitrary bytes to the gpuboot.yaml parser: it must never panic,
// every problem must name the file, and an accepted configuration must validate.
func FuzzParse(f *testing.F) {
	if b, err := os.ReadFile(filepath.Join("..", "..", "docs", "examples", "gpuboot.yaml")); err == nil {
		f.Add(b)
	}
	f.Add([]byte(minimal))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse("/etc/gpuboot/f.yaml", data)
		if err != nil {
			var es strictyaml.Errors
			if !errors.As(err, &es) || len(es) == 0 {
				t.Fatalf("error is not a non-empty strictyaml.Errors: %#v", err)
			}
			for _, e := range es {
				if !strings.HasPrefix(e.Error(), "/etc/gpuboot/f.yaml") {
					t.Fatalf("problem without the file name: %v", e)
				}
			}
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("Parse accepted a config that does not validate: %v", err)
		}
	})
}
