//go:build wasip1

package ratelimitheader

// wire is empty in the wasm guest, whose binding takes the header values
// from AppendFields (see wire_native.go): zero bytes, and, as an alias of
// a type the package has already, no type of its own in the module.
type wire = incomparable

// PrepareHeaders does nothing in the wasm guest.
func (p *Plan) PrepareHeaders() {}
