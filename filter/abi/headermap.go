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
