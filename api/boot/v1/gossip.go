package bootv1

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"slices"
)

// GossipKeyFingerprint names a gossip key without revealing it: the first 16 hex
// digits of its SHA-256.
func GossipKeyFingerprint(key []byte) string {
	sum := sha256.Sum256(key)
	return hex.EncodeToString(sum[:8])
}

// GossipKeyringDigest names a gossip key ring: the key members encrypt with and the
// others they accept, in any order. Agents report it in HeartbeatRequest.gossip_keyring
// and gpuboot compares it with the rack's ring. Empty for no key.
func GossipKeyringDigest(primary []byte, accepted [][]byte) string {
	if len(primary) == 0 {
		return ""
	}
	rest := make([][]byte, 0, len(accepted))
	for _, k := range accepted {
		if len(k) > 0 && !bytes.Equal(k, primary) {
			rest = append(rest, k)
		}
	}
	slices.SortFunc(rest, bytes.Compare)
	rest = slices.CompactFunc(rest, bytes.Equal)
	h := sha256.New()
	h.Write([]byte{byte(len(primary))})
	h.Write(primary)
	for _, k := range rest {
		h.Write([]byte{byte(len(k))})
		h.Write(k)
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}
