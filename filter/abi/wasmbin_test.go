package abi_test

import (
	"bytes"
	"encoding/binary"
	"errors"
)

// reactorAsCommand renames the module's "_initialize" export to "_start".
// proxytest instantiates modules with wazero's default start function,
// _start, but a Go c-shared (reactor) module exports _initialize, which must
// run before any other export.
func reactorAsCommand(wasm []byte) ([]byte, error) {
	if len(wasm) < 8 || !bytes.Equal(wasm[:4], []byte("\x00asm")) {
		return nil, errors.New("not a wasm module")
	}
	out := append([]byte(nil), wasm[:8]...)
	renamed := false
	for p := 8; p < len(wasm); {
		id := wasm[p]
		size, n := binary.Uvarint(wasm[p+1:])
		if n <= 0 || p+1+n+int(size) > len(wasm) {
			return nil, errors.New("malformed section header")
		}
		body := wasm[p+1+n : p+1+n+int(size)]
		p += 1 + n + int(size)
		if id == 7 { // export section
			var err error
			if body, renamed, err = renameExport(body, "_initialize", "_start"); err != nil {
				return nil, err
			}
		}
		out = append(out, id)
		out = binary.AppendUvarint(out, uint64(len(body)))
		out = append(out, body...)
	}
	if !renamed {
		return nil, errors.New("module has no _initialize export")
	}
	return out, nil
}

func renameExport(sec []byte, from, to string) ([]byte, bool, error) {
	count, n := binary.Uvarint(sec)
	if n <= 0 {
		return nil, false, errors.New("malformed export section")
	}
	out := binary.AppendUvarint(nil, count)
	renamed := false
	p := n
	for i := uint64(0); i < count; i++ {
		l, n := binary.Uvarint(sec[p:])
		if n <= 0 || p+n+int(l) > len(sec) {
			return nil, false, errors.New("malformed export name")
		}
		name := string(sec[p+n : p+n+int(l)])
		p += n + int(l)
		if name == from {
			name, renamed = to, true
		}
		out = binary.AppendUvarint(out, uint64(len(name)))
		out = append(out, name...)
		out = append(out, sec[p]) // kind
		_, n = binary.Uvarint(sec[p+1:])
		if n <= 0 {
			return nil, false, errors.New("malformed export index")
		}
		out = append(out, sec[p+1:p+1+n]...)
		p += 1 + n
	}
	return out, renamed, nil
}
