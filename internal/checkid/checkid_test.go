package checkid

import (
	"regexp"
	"testing"
)

func TestIDsAreUniqueAndWellFormed(t *testing.T) {
	shape := regexp.MustCompile(`^(gpu|rack)(\.[a-z0-9]+(-[a-z0-9]+)*)+$`)
	seen := map[ID]bool{}
	for _, id := range All {
		if seen[id] {
			t.Errorf("id %q listed twice", id)
		}
		seen[id] = true
		if !shape.MatchString(string(id)) {
			t.Errorf("id %q does not have the dotted lowercase shape", id)
		}
		if !Known(string(id)) {
			t.Errorf("Known(%q) = false", id)
		}
	}
	if len(All) != 28 {
		t.Errorf("CONTRACTS §9 (with §19's gpu.compute) defines 28 ids, All has %d", len(All))
	}
	if Known("gpu.made-up") {
		t.Error("Known accepted an undefined id")
	}
}
