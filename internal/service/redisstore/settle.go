package redisstore

import (
	"context"
	_ "embed"

	"github.com/redis/rueidis"

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
	// Quota, when not nil, makes the settlement a quota's (quota.lua, its
	// mode from Kind) on the consumption at Key.
	Quota *QuotaOp
	// Receipt, when set, is the key of the stream's receipt (ReceiptKey
	// of Key, a bucket's or a quota period's), which bounds the
	// settlement (receipt.go); without it a bucket's refund is capped at
	// burst only, a quota's at zero consumption.
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
	run := make([]Op, len(ops))
	for i, op := range ops {
		if op.Quota == nil {
			continue
		}
		q := *op.Quota
		q.Mode = QuotaMode(op.Kind) // charge, refund, reset: quota.lua's modes too
		run[i] = Op{Key: op.Key, Cost: op.Amount, Quota: &q, Receipt: op.Receipt}
	}
	out := make([]Outcome, len(ops))
	s.runEach(ctx, len(ops), func(i int) (*script, string, []string) {
		if run[i].Quota != nil {
			return quotaScript, withReceipt(run[i].Key, run[i].Receipt), run[i].quotaArgs()
		}
		return settleScript, withReceipt(ops[i].Key, ops[i].Receipt), ops[i].args()
	}, func(i int, r rueidis.RedisResult, err error) error {
		switch {
		case err != nil:
			out[i] = Outcome{Err: err}
		case run[i].Quota != nil:
			out[i] = quotaOutcome(r)
		default:
			out[i] = outcome(r)
		}
		return out[i].Err
	})
	return out
}
