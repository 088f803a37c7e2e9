package gossip

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/gpurack/gpurack/internal/checkid"
)

// Meta is the health summary a member announces in its memberlist node metadata
// (at most memberlist.MetaMaxSize = 512 bytes, so it is packed).
type Meta struct {
	// State is the health state (agent/health.State numbering: 0 unknown, 1 healthy,
	// 2 degraded, 3 unhealthy).
	State uint8
	// Failing are the failing check ids known to this agent's checkid.All.
	Failing     []string
	ImageID     string
	Driver      string
	GPUs        uint8
	HealthyGPUs uint8
	// Observer marks gpuboot watching the rack (no GPUs).
	Observer bool
	// Figures for rack.peer-outlier; NaN when unknown.
	MaxTemperatureC, PCIeReplaysPerMin, ECCCorrectedPerHour float32
}

const (
	metaVersion  = 1
	maxImageID   = 64
	maxDriver    = 32
	fixedMetaLen = 1 + 1 + 1 + 1 + 1 + 8 + 12 + 1 + 1
)

// Encode packs m: version, state, GPUs, healthy GPUs, flags, a 64-bit mask of failing
// ids by position in checkid.All (ids are append-only, so positions are stable), three
// float32 figures, then the image id and driver version, each length-prefixed.
func (m Meta) Encode() []byte {
	b := make([]byte, 0, fixedMetaLen+len(m.ImageID)+len(m.Driver))
	var flags byte
	if m.Observer {
		flags |= 1
	}
	b = append(b, metaVersion, m.State, m.GPUs, m.HealthyGPUs, flags)
	var mask uint64
	for _, id := range m.Failing {
		if i := slices.Index(checkid.All, checkid.ID(id)); i >= 0 && i < 64 {
			mask |= 1 << i
		}
	}
	b = binary.BigEndian.AppendUint64(b, mask)
	for _, f := range []float32{m.MaxTemperatureC, m.PCIeReplaysPerMin, m.ECCCorrectedPerHour} {
		b = binary.BigEndian.AppendUint32(b, math.Float32bits(f))
	}
	img, drv := m.ImageID, m.Driver
	if len(img) > maxImageID {
		img = img[:maxImageID]
	}
	if len(drv) > maxDriver {
		drv = drv[:maxDriver]
	}
	b = append(b, byte(len(img)))
	b = append(b, img...)
	b = append(b, byte(len(drv)))
	b = append(b, drv...)
	return b
}

// DecodeMeta unpacks what Encode packed. Metadata comes from the network: every
// length is checked.
func DecodeMeta(b []byte) (Meta, error) {
	var m Meta
	if len(b) == 0 {
		return m, errors.New("gossip meta: empty")
	}
	if b[0] != metaVersion {
		return m, fmt.Errorf("gossip meta: version %d, this agent reads %d", b[0], metaVersion)
	}
	if len(b) < fixedMetaLen {
		return m, fmt.Errorf("gossip meta: %d bytes, want at least %d", len(b), fixedMetaLen)
	}
	m.State, m.GPUs, m.HealthyGPUs, m.Observer = b[1], b[2], b[3], b[4]&1 != 0
	if m.State > 3 {
		return Meta{}, fmt.Errorf("gossip meta: state %d out of range", m.State)
	}
	mask := binary.BigEndian.Uint64(b[5:13])
	for i, id := range checkid.All {
		if i < 64 && mask&(1<<i) != 0 {
			m.Failing = append(m.Failing, string(id))
		}
	}
	f := func(off int) float32 { return math.Float32frombits(binary.BigEndian.Uint32(b[off:])) }
	m.MaxTemperatureC, m.PCIeReplaysPerMin, m.ECCCorrectedPerHour = f(13), f(17), f(21)
	rest := b[25:]
	str := func(max int) (string, error) {
		if len(rest) < 1 || int(rest[0]) > len(rest)-1 || int(rest[0]) > max {
			return "", errors.New("gossip meta: truncated or oversized string")
		}
		n := int(rest[0])
		s := string(rest[1 : 1+n])
		rest = rest[1+n:]
		return s, nil
	}
	var err error
	if m.ImageID, err = str(maxImageID); err != nil {
		return Meta{}, err
	}
	if m.Driver, err = str(maxDriver); err != nil {
		return Meta{}, err
	}
	if len(rest) != 0 {
		return Meta{}, fmt.Errorf("gossip meta: %d trailing bytes", len(rest))
	}
	return m, nil
}
