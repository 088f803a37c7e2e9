// Package buildinfo holds the version every gpurack binary reports. It is set at link
// time (-X github.com/gpurack/gpurack/internal/buildinfo.Version=...) by `make build`;
// without it, the module version from the Go build info is used, or "dev".
package buildinfo

import "runtime/debug"

// Version is the release this binary was built from.
var Version = ""

// String returns Version, falling back to the main module's version.
func String() string {
	if Version != "" {
		return Version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}
