package manifest

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"hash"
	"slices"
)

// imageIDDomain starts every image id hash, so the hash cannot collide with
// a SHA-256 computed over the same bytes for another purpose.
const imageIDDomain = "gpurack-image-id-v1\x00"

// ImageID returns the image id for a build's inputs (docs/contracts.md §7): the
// first 40 lowercase hex characters (160 bits) of a SHA-256. It fits a
// Kubernetes label value (at most 63 characters).
//
// The hash input is framed so that no two different sets of inputs give the
// same bytes. With u64(n) an 8-byte big-endian unsigned integer and
// field(b) = u64(len(b)) || b, it is:
//
//	"gpurack-image-id-v1\x00"
//	field(canonicalProfile) field(lock) field(builderVersion)
//	u64(number of binaries)
//	for each binary, in byte order of its name: field(name) field(digest)
//	only when archiveDigests is not empty:
//	u64(number of archives)
//	for each archive, in the given order: field(digest)
//
// canonicalProfile and lock are the exact bytes of the canonical profile
// and of the lock file; binaryDigests maps each bundled binary's name
// ("gpuagent", "kubelet") to its digest as the caller records it (lowercase
// hex SHA-256 by convention; the bytes are hashed as given). archiveDigests
// are the digests of the container image archives the image ships, in the
// profile's order (the canonical profile names their paths, this their
// content): a changed archive changes the id. Without archives the framing,
// and so every id, is what it was before archives existed.
func ImageID(canonicalProfile, lock []byte, builderVersion string, binaryDigests map[string]string, archiveDigests []string) string {
	h := sha256.New()
	h.Write([]byte(imageIDDomain))
	writeField(h, canonicalProfile)
	writeField(h, lock)
	writeField(h, []byte(builderVersion))
	names := make([]string, 0, len(binaryDigests))
	for name := range binaryDigests {
		names = append(names, name)
	}
	slices.Sort(names)
	writeUint64(h, uint64(len(names)))
	for _, name := range names {
		writeField(h, []byte(name))
		writeField(h, []byte(binaryDigests[name]))
	}
	if len(archiveDigests) > 0 {
		writeUint64(h, uint64(len(archiveDigests)))
		for _, d := range archiveDigests {
			writeField(h, []byte(d))
		}
	}
	return hex.EncodeToString(h.Sum(nil))[:40]
}

func writeField(h hash.Hash, b []byte) {
	writeUint64(h, uint64(len(b)))
	h.Write(b)
}

func writeUint64(h hash.Hash, n uint64) {
	var buf [8]byte
	binary.BigEndian.PutUint64(buf[:], n)
	h.Write(buf[:])
}
