package checks

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/gpurack/gpurack/agent/gpu/snapshot"
)

// minPeers is how many other members a comparison needs (three nodes in all).
const minPeers = 2

// Absolute floors: a node must also differ from the median by at least this much, so
// that a rack of near-identical nodes does not flag noise.
var peerFloors = struct{ tempC, replaysPerMin, eccPerHour float64 }{10, 10, 100}

// peerOutlier: this node's figures against the rack median (modified z-score
// 0.6745·|x − median| / MAD, Iglewicz & Hoaglin), warning above Warn (3.5).
func peerOutlier(in *Input, _ *Check, l Limits, _ *snapshot.GPU) Result {
	if in.Profile.GPU == nil {
		return Result{Status: NotApplicable, Message: "no GPUs to compare"}
	}
	if len(in.Peers) < minPeers {
		return Result{Status: NotApplicable, Message: fmt.Sprintf("%d peers with figures; comparison needs %d", len(in.Peers), minPeers)}
	}
	self := FiguresOf(in)
	type figure struct {
		name, unit string
		get        func(Figures) float64
		floor      float64
	}
	figs := []figure{
		{"max GPU temperature", "°C", func(f Figures) float64 { return f.MaxTemperatureC }, peerFloors.tempC},
		{"PCIe replays", "/min", func(f Figures) float64 { return f.PCIeReplaysPerMin }, peerFloors.replaysPerMin},
		{"corrected ECC", "/h", func(f Figures) float64 { return f.ECCCorrectedPerHour }, peerFloors.eccPerHour},
	}
	var outliers []string
	for _, f := range figs {
		x := f.get(self)
		if math.IsNaN(x) {
			continue
		}
		vals := []float64{x}
		for _, p := range in.Peers {
			if v := f.get(p.Figures); !math.IsNaN(v) {
				vals = append(vals, v)
			}
		}
		if len(vals) < minPeers+1 {
			continue
		}
		z, med := modifiedZ(x, vals)
		if math.Abs(x-med) >= f.floor && isSet(l.Warn) && z > l.Warn {
			outliers = append(outliers, fmt.Sprintf("%s %.1f%s vs rack median %.1f%s", f.name, x, f.unit, med, f.unit))
		}
	}
	exp := fmt.Sprintf("within %g MADs of the rack median", l.Warn)
	if len(outliers) == 0 {
		return pass(fmt.Sprintf("compared with %d peers", len(in.Peers)), exp, "Figures close to the rack's median.")
	}
	obs := strings.Join(outliers, "; ")
	return Result{Status: Warn, Observed: obs, Expected: exp,
		Message: "This node differs from its rack: " + obs + ".",
		Remedy:  "Compare the node's cooling, cabling and GPUs with its neighbours'; it may be failing early."}
}

// modifiedZ returns x's modified z-score within vals, and the median. A MAD of 0
// (most values equal) uses the mean absolute deviation's scale instead, and 1 if that
// is 0 too.
func modifiedZ(x float64, vals []float64) (z, med float64) {
	med = median(vals)
	dev := make([]float64, len(vals))
	sum := 0.0
	for i, v := range vals {
		dev[i] = math.Abs(v - med)
		sum += dev[i]
	}
	mad := median(dev)
	if mad == 0 {
		// 1.253314·MeanAD ≈ 1.4826·MAD for normal data; 0.6745 cancels accordingly.
		mad = sum / float64(len(vals)) * 1.253314 / 1.4826
	}
	if mad == 0 {
		mad = 1
	}
	return 0.6745 * math.Abs(x-med) / mad, med
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// FiguresOf computes this node's comparable figures from the input's snapshots.
func FiguresOf(in *Input) Figures {
	f := Figures{MaxTemperatureC: math.NaN(), PCIeReplaysPerMin: math.NaN(), ECCCorrectedPerHour: math.NaN()}
	if in.Snapshot == nil {
		return f
	}
	for i := range in.Snapshot.GPUs {
		g := &in.Snapshot.GPUs[i]
		if g.TemperatureC.OK() && (math.IsNaN(f.MaxTemperatureC) || float64(g.TemperatureC.V) > f.MaxTemperatureC) {
			f.MaxTemperatureC = float64(g.TemperatureC.V)
		}
		if r, ok := ratePerMinute(in, g, func(p *snapshot.GPU) snapshot.Value[uint64] { return p.PCIe.Replays }); ok {
			f.PCIeReplaysPerMin = nanAdd(f.PCIeReplaysPerMin, r)
		}
		if r, ok := ratePerMinute(in, g, func(p *snapshot.GPU) snapshot.Value[uint64] { return p.ECCCorrected }); ok {
			f.ECCCorrectedPerHour = nanAdd(f.ECCCorrectedPerHour, r*60)
		}
	}
	return f
}

func nanAdd(a, b float64) float64 {
	if math.IsNaN(a) {
		return b
	}
	return a + b
}
