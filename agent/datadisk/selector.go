package datadisk

import "github.com/gpurack/gpurack/internal/disksel"

// The selector is internal/disksel's, shared with the profile schema and gpuboot's
// configuration; these names keep the package's vocabulary in one place.
type (
	Transport = disksel.Transport
	RuleSpec  = disksel.RuleSpec
	Rule      = disksel.Rule
	Selector  = disksel.Selector
)

// The transports Discover tells apart (TransportLoop only with
// DiscoverOptions.IncludeLoop, which only tests set).
const (
	TransportNVMe    = disksel.TransportNVMe
	TransportSATA    = disksel.TransportSATA
	TransportSAS     = disksel.TransportSAS
	TransportSCSI    = disksel.TransportSCSI
	TransportVirtio  = disksel.TransportVirtio
	TransportUSB     = disksel.TransportUSB
	TransportMMC     = disksel.TransportMMC
	TransportLoop    = disksel.TransportLoop
	TransportUnknown = disksel.TransportUnknown
)

// ParseSelector is disksel.ParseSelector.
func ParseSelector(field string, specs []RuleSpec) (Selector, error) {
	return disksel.ParseSelector(field, specs)
}

// Candidate is d as the selector's rules see it.
func (d Disk) Candidate() disksel.Disk {
	return disksel.Disk{Path: d.Path, Model: d.Model, Size: d.Size, Transport: d.Transport,
		ReadOnly: d.ReadOnly, Removable: d.Removable}
}

// Select returns the disks of disks that s selects, in their order.
func Select(s Selector, disks []Disk) []Disk {
	var out []Disk
	for _, d := range disks {
		if s.Selects(d.Candidate()) {
			out = append(out, d)
		}
	}
	return out
}
