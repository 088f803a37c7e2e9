package assemble

import (
	"bufio"
	"fmt"
	"os"
	"path"
	"sort"
	"strings"
)

// ModuleDeps is a parsed modules.dep: module name to its path and direct dependencies.
type ModuleDeps struct {
	paths map[string]string
	deps  map[string][]string
}

// ModuleName is the name modprobe uses for a module file: base name without .ko
// (and compression suffix), '-' as '_'.
func ModuleName(p string) string {
	b := path.Base(p)
	for _, s := range []string{".xz", ".zst", ".gz"} {
		b = strings.TrimSuffix(b, s)
	}
	return strings.ReplaceAll(strings.TrimSuffix(b, ".ko"), "-", "_")
}

// ParseModulesDep reads a modules.dep file as depmod writes it.
func ParseModulesDep(file string) (*ModuleDeps, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	md := &ModuleDeps{paths: map[string]string{}, deps: map[string][]string{}}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		mod, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		n := ModuleName(mod)
		md.paths[n] = mod
		for _, d := range strings.Fields(rest) {
			md.deps[n] = append(md.deps[n], ModuleName(d))
		}
	}
	return md, sc.Err()
}

// Closure returns the module files (paths relative to the modules directory) that
// loading names needs, dependencies before dependants. Names that are built into the
// kernel (builtin) are skipped; an unknown name is an error.
func (md *ModuleDeps) Closure(names []string, builtin map[string]bool) ([]string, error) {
	var out []string
	state := map[string]int{}
	var visit func(n string) error
	visit = func(n string) error {
		switch state[n] {
		case 1:
			return nil
		case 2:
			return fmt.Errorf("module dependency cycle at %s", n)
		}
		state[n] = 2
		deps := append([]string{}, md.deps[n]...)
		sort.Strings(deps)
		for _, d := range deps {
			if err := visit(d); err != nil {
				return err
			}
		}
		state[n] = 1
		out = append(out, md.paths[n])
		return nil
	}
	for _, n := range names {
		n = strings.ReplaceAll(n, "-", "_")
		if _, ok := md.paths[n]; !ok {
			if builtin[n] {
				continue
			}
			return nil, fmt.Errorf("kernel module %s is neither in modules.dep nor built in", n)
		}
		if err := visit(n); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// ParseBuiltin reads modules.builtin into a set of module names.
func ParseBuiltin(file string) map[string]bool {
	out := map[string]bool{}
	data, err := os.ReadFile(file)
	if err != nil {
		return out
	}
	for _, l := range strings.Fields(string(data)) {
		out[ModuleName(l)] = true
	}
	return out
}
