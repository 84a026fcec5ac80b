package redact

import "encoding/binary"

// The scan's filter: every four-byte window of every needle, at the offsets the scan's
// stride needs, sets a bit; the scan looks at the needles only where a window's bit is set.

// window is where a four-byte window occurs in a needle.
type window struct {
	needle int
	offset int
}

// minStride is the scan's stride for needles of MinLength bytes, the shortest: one window
// for each of their first three offsets.
const minStride = MinLength - 4 + 1

// maxStride bounds the stride: past it, fewer windows looked at save little more, while
// each needle's windows keep filling the filter.
const maxStride = 16

// maxFilterFill is how many of the filter's bits the indexed windows may set, at most, for
// a stride above minStride: beyond one in 16, the scan would often stop at a set bit for
// nothing, and the shorter stride is then the cheaper one.
const maxFilterFill = filterBits / 16

const filterBits = 1 << 16

// strideFor is the scan's stride for needles whose shortest is minLen bytes: every
// position of minLen-3 in a row holds a window of such a needle, so the scan may skip
// that many. More needles mean more windows indexed per stride step; the stride shrinks
// to keep the filter sparse, but never below minStride, the stride for the shortest
// secret possible.
func strideFor(minLen, needles int) int {
	if needles == 0 {
		return minStride
	}
	return max(minStride, min(minLen-3, maxStride, maxFilterFill/needles))
}

// key is the four-byte window at p.
func key(p []byte) uint32 { return binary.LittleEndian.Uint32(p) }

func setBit(f *[filterBits / 64]uint64, k uint32) {
	h := hash(k)
	f[h/64] |= 1 << (h % 64)
}

func hash(k uint32) uint32 { return (k * 0x9E3779B1) >> 16 }
