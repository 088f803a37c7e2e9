package rollout

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"github.com/gpurack/gpurack/internal/atomicfile"
)

// idPattern is a rollout id: "r" and a UTC time to the second, e.g. r20261203T140501Z,
// with a "-N" suffix when two start in the same second.
var idPattern = regexp.MustCompile(`^r[0-9]{8}T[0-9]{6}Z(-[0-9]+)?$`)

// store keeps rollouts as DIR/ID.json.
type store struct{ dir string }

// load reads every rollout in the directory, oldest first. A file that does not parse
// is an error naming it: gpuboot must not forget a rollout that pinned machines.
func (s store) load() ([]*Rollout, error) {
	entries, err := os.ReadDir(s.dir)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("rollouts: %w", err)
	}
	var out []*Rollout
	for _, e := range entries {
		id, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || !idPattern.MatchString(id) {
			continue
		}
		data, err := os.ReadFile(filepath.Join(s.dir, e.Name()))
		if err != nil {
			return nil, fmt.Errorf("rollouts: %w", err)
		}
		var r Rollout
		if err := json.Unmarshal(data, &r); err != nil || r.ID != id {
			return nil, fmt.Errorf("rollouts: %s is not a rollout record (%v): move it away and restart gpuboot", filepath.Join(s.dir, e.Name()), err)
		}
		out = append(out, &r)
	}
	sort.Slice(out, func(i, j int) bool { return less(out[i].ID, out[j].ID) })
	return out, nil
}

// less orders rollout ids by start time, then suffix.
func less(a, b string) bool {
	ab, as, _ := strings.Cut(a, "-")
	bb, bs, _ := strings.Cut(b, "-")
	if ab != bb {
		return ab < bb
	}
	if len(as) != len(bs) {
		return len(as) < len(bs)
	}
	return as < bs
}

// save writes r atomically.
func (s store) save(r *Rollout) error {
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.WriteMkdirAll(filepath.Join(s.dir, r.ID+".json"), append(data, '\n'), 0o600, 0o700); err != nil {
		return fmt.Errorf("rollout %s: saving: %w", r.ID, err)
	}
	return nil
}
