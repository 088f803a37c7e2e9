// Package buildinfo holds the version every gpurack binary reports. It is set at link
// time (-X github.com/gpurack/gpurack/internal/buildinfo.Version=...) by `make build`;
// without it, the module version from the Go build info is used, then the VCS revision
// the go command stamped (devel+REV, devel+REV+dirty), or "dev".
//
// gpuimage folds this version into the image id (CONTRACTS §7), so a gpuimage built
// from another commit makes other ids even when its own changes touch no artifact.
package buildinfo

import "runtime/debug"

// Version is the release this binary was built from.
var Version = ""

// String returns Version, falling back to the build info.
func String() string {
	if Version != "" {
		return Version
	}
	bi, _ := debug.ReadBuildInfo()
	return fromBuildInfo(bi)
}

func fromBuildInfo(bi *debug.BuildInfo) string {
	if bi == nil {
		return "dev"
	}
	if bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	var rev, modified string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			modified = s.Value
		}
	}
	if rev == "" {
		return "dev"
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if modified == "true" {
		return "devel+" + rev + "+dirty"
	}
	return "devel+" + rev
}
