package clusterconfig

import (
	"errors"
	"fmt"
	"os"

	"go.yaml.in/yaml/v3"

	"github.com/gpurack/gpurack/internal/strictyaml"
)

// Load reads and parses the file at path; see Parse.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read cluster config: %w", err)
	}
	return Parse(path, data)
}

// Parse decodes cluster.yaml strictly with package strictyaml (unknown fields, wrong
// types, duplicate keys, aliases and a second document are errors), applies the
// defaults and validates the result. name is used in error messages. An empty
// document yields the defaults. The error is a strictyaml.Errors: every problem, one
// per line, each as "FILE:LINE: FIELD: what is wrong and what to write".
func Parse(name string, data []byte) (*Config, error) {
	cfg := &Config{}
	pos, err := strictyaml.Decode(name, data, cfg)
	if err != nil && !errors.Is(err, strictyaml.ErrEmpty) {
		return nil, err
	}
	cfg.applyDefaults()
	if fes := cfg.Validate(); len(fes) > 0 {
		var es strictyaml.Errors
		for _, fe := range fes {
			es = append(es, pos.At(name, fe.Field, fe.Msg))
		}
		return nil, es.Sorted()
	}
	return cfg, nil
}

// Marshal renders c as cluster.yaml (every field, defaults included).
func (c *Config) Marshal() ([]byte, error) {
	return yaml.Marshal(c)
}
