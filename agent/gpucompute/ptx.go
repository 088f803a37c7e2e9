package gpucompute

import (
	_ "embed"
	"fmt"
	"regexp"
	"strings"
)

// The kernels, as PTX text. The driver JIT-compiles them (cuModuleLoadDataEx) for the
// GPU it runs on; .target sm_70 lets any Volta or later GPU run them.
var (
	//go:embed ptx/sgemm.ptx
	SGEMMPTX string
	//go:embed ptx/copy.ptx
	CopyPTX string
)

// Kernel is one PTX entry the launcher calls, with the parameter types it passes, in
// order. The C launch wrappers (cuda.go) build kernelParams in exactly this order;
// TestKernelsMatchPTX holds the PTX text to it.
type Kernel struct {
	PTX    *string
	Entry  string
	Params []string // PTX parameter types: "u64" (a device pointer), "u32", ...
}

// Kernels are the entries the launcher uses.
var Kernels = []Kernel{
	{PTX: &SGEMMPTX, Entry: "sgemm_tiled", Params: []string{"u64", "u64", "u64", "u32"}},
	{PTX: &CopyPTX, Entry: "copy_f4", Params: []string{"u64", "u64", "u64"}},
}

// Entry is a kernel entry as declared in PTX text.
type Entry struct {
	Name   string
	Params []Param
}

// Param is one .param of an entry.
type Param struct{ Type, Name string }

var (
	entryRE   = regexp.MustCompile(`(?s)\.visible\s+\.entry\s+([A-Za-z_$][\w$]*)\s*\(([^)]*)\)`)
	paramRE   = regexp.MustCompile(`^\.param\s+\.([a-z0-9]+)\s+([A-Za-z_$][\w$]*)$`)
	versionRE = regexp.MustCompile(`(?m)^\.version\s+([0-9]+)\.([0-9]+)\s*$`)
	targetRE  = regexp.MustCompile(`(?m)^\.target\s+(sm_[0-9]+)\s*$`)
)

// Module is what ParsePTX reads from a PTX module's text: enough to check it against
// the launcher, not a PTX parser.
type Module struct {
	Version      string // "7.0"
	Major, Minor int
	Target       string // "sm_70"
	Entries      []Entry
}

// ParsePTX reads the version, target and entry declarations of a PTX module.
func ParsePTX(text string) (*Module, error) {
	m := &Module{}
	v := versionRE.FindStringSubmatch(text)
	if v == nil {
		return nil, fmt.Errorf("PTX: no .version directive")
	}
	m.Version = v[1] + "." + v[2]
	fmt.Sscan(v[1], &m.Major)
	fmt.Sscan(v[2], &m.Minor)
	t := targetRE.FindStringSubmatch(text)
	if t == nil {
		return nil, fmt.Errorf("PTX: no .target directive")
	}
	m.Target = t[1]
	for _, e := range entryRE.FindAllStringSubmatch(text, -1) {
		ent := Entry{Name: e[1]}
		for _, p := range strings.Split(e[2], ",") {
			p = strings.Join(strings.Fields(p), " ")
			if p == "" {
				continue
			}
			pm := paramRE.FindStringSubmatch(p)
			if pm == nil {
				return nil, fmt.Errorf("PTX entry %s: parameter %q is not \".param .TYPE NAME\"", ent.Name, p)
			}
			ent.Params = append(ent.Params, Param{Type: pm[1], Name: pm[2]})
		}
		m.Entries = append(m.Entries, ent)
	}
	if len(m.Entries) == 0 {
		return nil, fmt.Errorf("PTX: no .visible .entry")
	}
	return m, nil
}

// Entry returns the entry with the name, or nil.
func (m *Module) Entry(name string) *Entry {
	for i := range m.Entries {
		if m.Entries[i].Name == name {
			return &m.Entries[i]
		}
	}
	return nil
}
