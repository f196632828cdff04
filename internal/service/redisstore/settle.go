package redisstore

import (
	"context"
	_ "embed"

	"github.com/tokengate/tokengate/rlscontract"
)

//go:embed settle.lua
var settleLua string

var settleScript = newScript(withParts(settleLua))

// SettleOp is one settlement of one bucket.
type SettleOp struct {
	Key                  string
	Rate, Burst, MaxDebt float64
	// Kind is the settlement's, as settle.lua names it.
	Kind rlscontract.SettleKind
	// Amount is the tokens charged or refunded (> 0; unused by a reset).
	Amount float64
	// Now replaces Redis TIME when not empty (tests).
	Now string
	// Receipt, when set, is the key of the stream's receipt (ReceiptKey),
	// which bounds the settlement (receipt.go); without it a refund is
	// capped at burst only.
	Receipt string
}

func (op SettleOp) args() []string {
	a := []string{Num(op.Rate), Num(op.Burst), Num(op.MaxDebt), string(op.Kind), Num(op.Amount)}
	if op.Now != "" {
		a = append(a, op.Now)
	}
	return a
}

// Settle runs settle.lua for every op in one pipeline (as Run does, NOSCRIPT
// answered by EVAL) and returns their outcomes in order: Allowed is always
// true, Tokens the bucket's tokens after, Cut whether the receipt cut it.
func (s *Store) Settle(ctx context.Context, ops []SettleOp) []Outcome {
	return s.runScripts(ctx, len(ops), func(i int) (*script, string, []string) {
		return settleScript, withReceipt(ops[i].Key, ops[i].Receipt), ops[i].args()
	})
}
