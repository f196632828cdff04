package abi

import "encoding/binary"

// encodeHeaderMap serializes pairs in the proxy-wasm header map format:
// u32 count, count × (u32 key length, u32 value length), then every key and
// value followed by a NUL. All integers are little-endian.
func encodeHeaderMap(pairs [][2]string) []byte {
	size := 4 + 8*len(pairs)
	for _, p := range pairs {
		size += len(p[0]) + len(p[1]) + 2
	}
	b := make([]byte, 4, size)
	binary.LittleEndian.PutUint32(b, uint32(len(pairs)))
	for _, p := range pairs {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(p[0])))
		b = binary.LittleEndian.AppendUint32(b, uint32(len(p[1])))
	}
	for _, p := range pairs {
		b = append(b, p[0]...)
		b = append(b, 0)
		b = append(b, p[1]...)
		b = append(b, 0)
	}
	return b
}
