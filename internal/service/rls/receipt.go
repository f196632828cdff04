package rls

import (
	"context"

	"google.golang.org/grpc/metadata"

	"github.com/tokengate/tokengate/internal/service/redisstore"
	"github.com/tokengate/tokengate/rlscontract"
)

// Receipts (docs/rls.md#receipts). The filter sends a random id of the
// stream (rlscontract.ReceiptHeader) with the admission of a request whose
// cluster rules settle, and again with its settlement. The takes of those
// rules add what they took to the stream's receipt (redisstore.ReceiptKey,
// internal/service/redisstore/tokenbucket.lua; for a quota rule, the
// receipt of the period's consumption, internal/service/redisstore/quota.lua),
// and a settlement's
// refund gives back at most what the receipt holds, a reset needs one
// (internal/service/redisstore/settle.lua; a quota's reset gives back what
// it holds). A quota's receipt names its period: a settlement that lands
// in the next period finds none and gives nothing back. A settlement without a
// valid id is checked against a receipt no take writes: it gives nothing
// back. So even an authenticated proxy gives back only what its own
// streams took and were not given back.

// noReceipt is the id a settlement without a valid one is checked with:
// ValidReceipt refuses it, so no take ever writes its receipt.
const noReceipt = "-"

// receiptID returns the call's receipt id, "" when it has none or an
// invalid one.
func receiptID(ctx context.Context) string {
	for _, v := range metadata.ValueFromIncomingContext(ctx, rlscontract.ReceiptHeader) {
		if rlscontract.ValidReceipt(v) {
			return v
		}
	}
	return ""
}

// addReceipts makes the takes of rules that settle add to the stream's
// receipt, when the call has an id. Other calls do not read the header.
func addReceipts(ctx context.Context, items []item) {
	rid := ""
	for i := range items {
		it := &items[i]
		if it.rule.Settle == nil || it.rule.Lease != nil || it.op.Lease || it.op.Window > 0 {
			continue
		}
		if rid == "" {
			if rid = receiptID(ctx); rid == "" {
				return
			}
		}
		it.op.Receipt = redisstore.ReceiptKey(it.op.Key, rid)
	}
}

// settleReceipt bounds op by the receipt of stream rid ("" none): a
// refund or reset without a valid id reads a receipt that holds nothing; a
// charge without one is applied as before, bounded by boundSettle.
func settleReceipt(op *redisstore.SettleOp, rid string) {
	switch {
	case rid != "":
		op.Receipt = redisstore.ReceiptKey(op.Key, rid)
	case op.Kind != rlscontract.SettleCharge:
		op.Receipt = redisstore.ReceiptKey(op.Key, noReceipt)
	}
}
