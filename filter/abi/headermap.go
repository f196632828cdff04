//go:build wasip1

package abi

import "encoding/binary"

// appendHeaderMap appends pairs to dst in the proxy-wasm header map format:
// u32 count, count × (u32 key length, u32 value length), then every key and
// value followed by a NUL. All integers are little-endian.
func appendHeaderMap(dst []byte, pairs [][2]string) []byte {
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(pairs)))
	for _, p := range pairs {
		dst = binary.LittleEndian.AppendUint32(dst, uint32(len(p[0])))
		dst = binary.LittleEndian.AppendUint32(dst, uint32(len(p[1])))
	}
	for _, p := range pairs {
		dst = append(dst, p[0]...)
		dst = append(dst, 0)
		dst = append(dst, p[1]...)
		dst = append(dst, 0)
	}
	return dst
}

// forEachPair calls f for every pair of a header map in the format above,
// in order; the slices share b's bytes. A malformed map (sizes that do not
// fit) ends the walk where it stops making sense, without a panic.
func forEachPair(b []byte, f func(k, v []byte)) {
	if len(b) < 4 {
		return
	}
	n := binary.LittleEndian.Uint32(b)
	if uint64(n) > uint64(len(b)-4)/8 {
		return
	}
	sizes := b[4 : 4+8*n]
	data := b[4+8*n:]
	for i := range n {
		kl := uint64(binary.LittleEndian.Uint32(sizes[8*i:]))
		vl := uint64(binary.LittleEndian.Uint32(sizes[8*i+4:]))
		if kl+vl+2 > uint64(len(data)) {
			return
		}
		k, v := data[:kl], data[kl+1:kl+1+vl]
		data = data[kl+vl+2:]
		f(k, v)
	}
}
