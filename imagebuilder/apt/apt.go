package apt

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"github.com/gpurack/gpurack/internal/profile"
)

// Env is a private apt configuration and state directory. Nothing of the host's apt
// configuration, state or cache is read or written, apart from the keyring named in
// each Source.
type Env struct {
	Dir     string
	Sources []Source
	// Pins are apt preferences stanzas written to the private preferences file.
	Pins string
}

// NewEnv prepares dir for apt. It is safe to reuse a dir: the lists stay as a cache.
func NewEnv(dir string, sources []Source, pins string) (*Env, error) {
	e := &Env{Dir: dir, Sources: sources, Pins: pins}
	for _, d := range []string{"etc/apt.conf.d", "etc/sources.list.d", "etc/preferences.d", "etc/trusted.gpg.d", "lists/partial", "cache/archives/partial", "state", "log"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return nil, err
		}
	}
	var list strings.Builder
	for _, s := range sources {
		list.WriteString(s.Line() + "\n")
	}
	conf := fmt.Sprintf(`Dir::Etc "%[1]s/etc";
Dir::Etc::Main "%[1]s/etc/apt.conf";
Dir::Etc::Parts "%[1]s/etc/apt.conf.d";
Dir::Etc::SourceList "%[1]s/etc/sources.list";
Dir::Etc::SourceParts "%[1]s/etc/sources.list.d";
Dir::Etc::Preferences "%[1]s/etc/preferences";
Dir::Etc::PreferencesParts "%[1]s/etc/preferences.d";
Dir::Etc::Trusted "%[1]s/etc/trusted.gpg";
Dir::Etc::TrustedParts "%[1]s/etc/trusted.gpg.d";
Dir::State "%[1]s/state";
Dir::State::Lists "%[1]s/lists";
Dir::State::status "%[1]s/state/status";
Dir::Cache "%[1]s/cache";
Dir::Log "%[1]s/log";
APT::Architecture "amd64";
APT::Architectures { "amd64"; };
APT::Install-Recommends "false";
APT::Install-Suggests "false";
APT::Sandbox::User "root";
Acquire::Languages "none";
Acquire::Retries "3";
Debug::NoLocking "true";
Binary::apt-get::Acquire::AllowInsecureRepositories "false";
`, dir)
	files := map[string]string{
		"apt.conf":         conf,
		"etc/apt.conf":     "",
		"etc/sources.list": list.String(),
		"etc/preferences":  pins,
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			return nil, err
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "state/status"), nil, 0o644); err != nil {
		return nil, err
	}
	return e, nil
}

func (e *Env) run(ctx context.Context, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), "APT_CONFIG="+filepath.Join(e.Dir, "apt.conf"), "LC_ALL=C", "DEBIAN_FRONTEND=noninteractive")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}

// Update downloads and verifies the InRelease and Packages files of every source.
// apt refuses an unsigned or badly signed InRelease; so does Update, as does any
// source that cannot be reached.
func (e *Env) Update(ctx context.Context) error {
	out, err := e.run(ctx, "apt-get", "update", "-q", "-o", "APT::Update::Error-Mode=any")
	if err != nil {
		return fmt.Errorf("apt update from %s: %w\ncheck that the archive is reachable (or set base.mirror in the profile) and signed by %s",
			e.describe(), err, e.Sources[0].Keyring)
	}
	if strings.Contains(out, "Err:") {
		return fmt.Errorf("apt update from %s failed:\n%s", e.describe(), out)
	}
	return nil
}

func (e *Env) describe() string {
	var s []string
	for _, src := range e.Sources {
		s = append(s, src.URI+" "+src.Suite)
	}
	return strings.Join(s, ", ")
}

// Installed is one package that apt's solver would install.
type Installed struct{ Name, Version, Arch string }

var instRE = regexp.MustCompile(`^Inst (\S+) (?:\[\S+\] )?\((\S+) .*\[(\S+)\]\)`)

// Simulate asks apt what installing pkgs (names, name=version or apt patterns such as
// ?essential) into an empty system gives.
func (e *Env) Simulate(ctx context.Context, pkgs []string) ([]Installed, error) {
	args := append([]string{"install", "-s", "-q", "--no-install-recommends"}, pkgs...)
	out, err := e.run(ctx, "apt-get", args...)
	if err != nil {
		return nil, fmt.Errorf("resolve %s: %w", strings.Join(pkgs, " "), err)
	}
	var res []Installed
	for _, line := range strings.Split(out, "\n") {
		if m := instRE.FindStringSubmatch(line); m != nil {
			name := m[1]
			if i := strings.IndexByte(name, ':'); i > 0 {
				name = name[:i]
			}
			res = append(res, Installed{Name: name, Version: m[2], Arch: m[3]})
		}
	}
	if len(res) == 0 {
		return nil, fmt.Errorf("resolve %s: apt would install nothing:\n%s", strings.Join(pkgs, " "), out)
	}
	return res, nil
}

// Lock turns installed packages into lock entries with apt's own record of each
// package: Filename, Size and SHA256 from the verified Packages index.
func (e *Env) Lock(ctx context.Context, pkgs []Installed) ([]profile.LockedPackage, error) {
	if len(pkgs) == 0 {
		return nil, nil
	}
	var args []string
	for _, p := range pkgs {
		args = append(args, p.Name+":"+p.Arch+"="+p.Version)
	}
	out, err := e.run(ctx, "apt-cache", append([]string{"show", "--no-all-versions"}, args...)...)
	if err != nil {
		return nil, err
	}
	byKey := map[string]map[string]string{}
	for _, st := range splitStanzas(out) {
		k := st["Package"] + "=" + st["Version"]
		if _, ok := byKey[k]; !ok {
			byKey[k] = st
		}
	}
	var res []profile.LockedPackage
	for _, p := range pkgs {
		st, ok := byKey[p.Name+"="+p.Version]
		if !ok {
			return nil, fmt.Errorf("apt-cache has no record of %s %s", p.Name, p.Version)
		}
		lp, err := lockedFromStanza(st)
		if err != nil {
			return nil, err
		}
		res = append(res, lp)
	}
	sort.Slice(res, func(i, j int) bool { return res[i].Name < res[j].Name })
	return res, nil
}

func lockedFromStanza(st map[string]string) (profile.LockedPackage, error) {
	lp := profile.LockedPackage{Name: st["Package"], Version: st["Version"], Architecture: st["Architecture"], Filename: st["Filename"], SHA256: st["SHA256"]}
	if _, err := fmt.Sscan(st["Size"], &lp.Size); err != nil {
		return lp, fmt.Errorf("package %s: bad Size %q", lp.Name, st["Size"])
	}
	parts := strings.Split(lp.Filename, "/")
	if len(parts) < 3 || parts[0] != "pool" {
		return lp, fmt.Errorf("package %s: Filename %q is not a pool path", lp.Name, lp.Filename)
	}
	lp.Area = parts[1]
	if strings.HasPrefix(lp.Area, "updates") { // old security layout
		lp.Area = "main"
	}
	return lp, nil
}

// Available returns, for each name=version in the verified indexes, its record. Used by
// lock --check to tell whether a locked package can still be fetched.
func (e *Env) Available(ctx context.Context, pkgs []profile.LockedPackage) (map[string]profile.LockedPackage, error) {
	res := map[string]profile.LockedPackage{}
	if len(pkgs) == 0 {
		return res, nil
	}
	var args []string
	for _, p := range pkgs {
		args = append(args, p.Name+":"+p.Architecture+"="+p.Version)
	}
	// apt-cache prints what it finds and fails for the rest: one run answers for all.
	out, _ := e.run(ctx, "apt-cache", append([]string{"show", "--no-all-versions"}, args...)...)
	for _, st := range splitStanzas(out) {
		if lp, err := lockedFromStanza(st); err == nil {
			if _, ok := res[lp.Name+"="+lp.Version]; !ok {
				res[lp.Name+"="+lp.Version] = lp
			}
		}
	}
	return res, nil
}

// Releases describes every InRelease file apt verified.
func (e *Env) Releases() ([]profile.Release, error) {
	files, _ := filepath.Glob(filepath.Join(e.Dir, "lists", "*_InRelease"))
	var out []profile.Release
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		sum := sha256.Sum256(data)
		st := splitStanzas(signedBody(string(data)))
		if len(st) == 0 {
			return nil, fmt.Errorf("%s: no Release fields", f)
		}
		r := st[0]
		label := r["Label"]
		if label == "" {
			label = r["Origin"]
		}
		suite := r["Codename"]
		if suite == "" {
			suite = r["Suite"]
		}
		out = append(out, profile.Release{Suite: suite, Archive: label, Digest: "sha256:" + hex.EncodeToString(sum[:]), Date: r["Date"]})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("apt verified no InRelease file in %s", e.Dir)
	}
	return out, nil
}

// signedBody strips the OpenPGP clear-signature armour of an InRelease file.
func signedBody(s string) string {
	if i := strings.Index(s, "\n\n"); strings.HasPrefix(s, "-----BEGIN PGP SIGNED MESSAGE-----") && i > 0 {
		s = s[i+2:]
	}
	if i := strings.Index(s, "-----BEGIN PGP SIGNATURE-----"); i >= 0 {
		s = s[:i]
	}
	return s
}
