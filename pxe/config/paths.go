package config

import (
	"errors"
	"fmt"

	"go.yaml.in/yaml/v3"
)

// Paths is a setting that names one file or several: in YAML either one file name
// (`allowlist: rack-r1.csv`) or a list of them (`allowlist: [rack-r1.csv,
// rack-r2.csv]`). Relative names are resolved against the configuration file's
// directory.
type Paths []string

// UnmarshalYAML takes a file name or a list of file names; anything else (a mapping, a
// boolean, a nested list) is an error saying which forms are accepted.
func (p *Paths) UnmarshalYAML(n *yaml.Node) error {
	switch n.Kind {
	case yaml.ScalarNode:
		name, err := pathOf(n)
		if err != nil {
			return err
		}
		*p = Paths{name}
		if name == "" {
			*p = nil
		}
		return nil
	case yaml.SequenceNode:
		out := make(Paths, 0, len(n.Content))
		for i, item := range n.Content {
			if item.Kind != yaml.ScalarNode {
				return fmt.Errorf("item %d: expected a file name, found %s; write one file name or a list of file names", i+1, kindWord(item))
			}
			name, err := pathOf(item)
			if err != nil {
				return fmt.Errorf("item %d: %w", i+1, err)
			}
			if name == "" {
				return fmt.Errorf("item %d is empty: give a file name", i+1)
			}
			out = append(out, name)
		}
		*p = out
		return nil
	}
	return fmt.Errorf("expected a file name or a list of file names, found %s (write `allowlist: rack-r1.csv` or `allowlist: [rack-r1.csv, rack-r2.csv]`)", kindWord(n))
}

// pathOf is the file name a scalar node gives.
func pathOf(n *yaml.Node) (string, error) {
	if n.Tag == "!!bool" {
		return "", fmt.Errorf("expected a file name, found the boolean %s; quote it if it is one", n.Value)
	}
	if n.Tag == "!!null" {
		return "", nil
	}
	if n.Value == "" && n.Tag != "!!str" {
		return "", errors.New("expected a file name")
	}
	return n.Value, nil
}

func kindWord(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	}
	return "a value"
}
