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
	// soft are the softdeps (modules.softdep, pre: and post:) by module name, and
	// aliases the module names each alias stands for (modules.alias): a softdep may
	// name an alias ("libcrc32c pre: crc32c"), which modprobe loads through it.
	soft    map[string][]string
	aliases map[string][]string
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
	md := &ModuleDeps{paths: map[string]string{}, deps: map[string][]string{}, soft: map[string][]string{}, aliases: map[string][]string{}}
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

// ReadSoftdeps adds the softdeps of modules.softdep and the aliases of modules.alias
// (both as depmod writes them beside modules.dep) to md, so that Closure also ships
// what modprobe loads by softdep. Without it a module such as nf_tables ships without
// the crc32c its libcrc32c asks for, and fails to load on the node. A missing file
// adds nothing.
func (md *ModuleDeps) ReadSoftdeps(softdepFile, aliasFile string) error {
	if data, err := os.ReadFile(softdepFile); err == nil {
		for _, l := range strings.Split(string(data), "\n") {
			f := strings.Fields(l)
			if len(f) < 3 || f[0] != "softdep" {
				continue
			}
			mod := ModuleName(f[1])
			for _, d := range f[2:] {
				if d == "pre:" || d == "post:" {
					continue
				}
				md.soft[mod] = append(md.soft[mod], d)
			}
		}
	} else if !os.IsNotExist(err) {
		return err
	}
	if data, err := os.ReadFile(aliasFile); err == nil {
		for _, l := range strings.Split(string(data), "\n") {
			f := strings.Fields(l)
			if len(f) != 3 || f[0] != "alias" || strings.ContainsAny(f[1], "*?[") {
				continue
			}
			md.aliases[f[1]] = append(md.aliases[f[1]], ModuleName(f[2]))
		}
	} else if !os.IsNotExist(err) {
		return err
	}
	return nil
}

// softTargets are the module names a softdep entry d of a module stands for: the
// module itself, or every module carrying d as an alias (modprobe loads them all).
func (md *ModuleDeps) softTargets(d string) []string {
	if n := ModuleName(d); md.paths[n] != "" {
		return []string{n}
	}
	t := append([]string{}, md.aliases[d]...)
	sort.Strings(t)
	return t
}

// Closure returns the module files (paths relative to the modules directory) that
// loading names needs, dependencies before dependants, with the modules their
// softdeps name when ReadSoftdeps was called (a softdep that names nothing known is
// left out: it is soft). Names that are built into the kernel (builtin) are skipped;
// an unknown name is an error.
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
		for _, d := range md.soft[n] {
			for _, t := range md.softTargets(d) {
				// A softdep back to a module being visited is no cycle: it loads anyway.
				if t != n && md.paths[t] != "" && state[t] != 2 {
					if err := visit(t); err != nil {
						return err
					}
				}
			}
		}
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
