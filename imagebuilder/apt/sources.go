// Package apt resolves a profile into a lock with apt itself, run under a private
// configuration and state directory (never the host's), so that the lock names exactly
// what mmdebstrap will install. apt verifies each InRelease against the Debian archive
// keyring. This package is not a resolver of its own: it drives apt-get and parses what
// apt prints and stores.
package apt

import (
	"bufio"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// DefaultKeyring is the keyring of the debian-archive-keyring package.
const DefaultKeyring = "/usr/share/keyrings/debian-archive-keyring.gpg"

// Source is one Debian archive base to read one suite from.
type Source struct {
	URI        string
	Suite      string
	Components []string
	Keyring    string
}

// Line renders s as a one-line sources.list entry.
func (s Source) Line() string {
	return fmt.Sprintf("deb [signed-by=%s] %s %s %s", s.Keyring, s.URI, s.Suite, strings.Join(s.Components, " "))
}

// hostEntry is one Debian entry of the host's apt configuration.
type hostEntry struct {
	uri, keyring string
	suites       []string
}

// HostDebianSources reads the host's apt source configuration (one-line .list and
// deb822 .sources files under etcApt) and returns the Debian archive bases in it,
// re-pointed at suite: an entry for bookworm and bookworm-updates gives suite and
// suite-updates; one for bookworm-security gives suite-security. Entries that are not
// Debian archives (signed by another keyring, or not under a /debian path) are ignored.
func HostDebianSources(etcApt, suite string, components []string) ([]Source, error) {
	var entries []hostEntry
	files, _ := filepath.Glob(filepath.Join(etcApt, "sources.list.d", "*"))
	files = append([]string{filepath.Join(etcApt, "sources.list")}, files...)
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		switch {
		case strings.HasSuffix(f, ".sources"):
			entries = append(entries, parseDeb822(string(data))...)
		case strings.HasSuffix(f, ".list"):
			entries = append(entries, parseOneLine(string(data))...)
		}
	}
	seen := map[string]bool{}
	var out []Source
	for _, e := range entries {
		if !isDebian(e) {
			continue
		}
		kr := e.keyring
		if kr == "" {
			kr = DefaultKeyring
		}
		for _, s := range e.suites {
			suffix := ""
			if i := strings.LastIndexByte(s, '-'); i > 0 {
				suffix = s[i:]
			}
			if suffix != "" && suffix != "-updates" && suffix != "-security" {
				continue // backports, proposed-updates: not part of an image
			}
			src := Source{URI: strings.TrimRight(e.uri, "/"), Suite: suite + suffix, Components: components, Keyring: kr}
			if k := src.URI + " " + src.Suite; !seen[k] {
				seen[k] = true
				out = append(out, src)
			}
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no Debian archive is configured in %s (sources.list, sources.list.d); configure one there, or set base.mirror in the profile", etcApt)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Suite < out[j].Suite })
	return out, nil
}

// MirrorSources is the source list for a profile that sets base.mirror: the mirror
// serves the suite and its -updates suite.
func MirrorSources(mirror, suite string, components []string) []Source {
	m := strings.TrimRight(mirror, "/")
	return []Source{
		{URI: m, Suite: suite, Components: components, Keyring: DefaultKeyring},
		{URI: m, Suite: suite + "-updates", Components: components, Keyring: DefaultKeyring},
	}
}

func isDebian(e hostEntry) bool {
	if e.keyring != "" {
		return strings.Contains(filepath.Base(e.keyring), "debian-archive-keyring")
	}
	u, err := url.Parse(e.uri)
	if err != nil {
		return false
	}
	p := strings.TrimRight(u.Path, "/")
	return strings.HasSuffix(p, "/debian") || strings.HasSuffix(p, "/debian-security")
}

func parseDeb822(s string) []hostEntry {
	var out []hostEntry
	for _, stanza := range splitStanzas(s) {
		f := stanza
		if !strings.Contains(" "+f["Types"]+" ", " deb ") || strings.EqualFold(f["Enabled"], "no") {
			continue
		}
		for _, uri := range strings.Fields(f["URIs"]) {
			out = append(out, hostEntry{uri: uri, keyring: strings.TrimSpace(f["Signed-By"]), suites: strings.Fields(f["Suites"])})
		}
	}
	return out
}

func parseOneLine(s string) []hostEntry {
	var out []hostEntry
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		fields := strings.Fields(line)
		if len(fields) < 3 || fields[0] != "deb" {
			continue
		}
		fields = fields[1:]
		kr := ""
		if strings.HasPrefix(fields[0], "[") {
			var opts []string
			for len(fields) > 0 {
				opts = append(opts, fields[0])
				done := strings.HasSuffix(fields[0], "]")
				fields = fields[1:]
				if done {
					break
				}
			}
			for _, o := range opts {
				o = strings.Trim(o, "[]")
				if v, ok := strings.CutPrefix(o, "signed-by="); ok {
					kr = v
				}
			}
		}
		if len(fields) < 2 {
			continue
		}
		out = append(out, hostEntry{uri: fields[0], keyring: kr, suites: []string{fields[1]}})
	}
	return out
}

// splitStanzas parses RFC 822-style control data (Packages, Release, deb822 sources)
// into one map per stanza. Continuation lines are joined with newlines.
func splitStanzas(s string) []map[string]string {
	var out []map[string]string
	cur := map[string]string{}
	last := ""
	flush := func() {
		if len(cur) > 0 {
			out = append(out, cur)
		}
		cur, last = map[string]string{}, ""
	}
	for _, line := range strings.Split(s, "\n") {
		line = strings.TrimRight(line, "\r")
		switch {
		case strings.TrimSpace(line) == "":
			flush()
		case strings.HasPrefix(line, "#"):
		case line[0] == ' ' || line[0] == '\t':
			if last != "" {
				cur[last] += "\n" + strings.TrimSpace(line)
			}
		default:
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				continue
			}
			last = strings.TrimSpace(k)
			cur[last] = strings.TrimSpace(v)
		}
	}
	flush()
	return out
}
