package redisstore

// Receipts (docs/rls.md#receipts)
//
// A stream that may settle (a cluster rule with count_statuses,
// reset_on_statuses or a response cost) sends an id of its own with its
// admission and its settlement (rlscontract.ReceiptHeader). Each take the
// service makes for it also adds what it took to the stream's receipt, a
// key in the bucket's Cluster slot (ReceiptKey), in the same script call
// (tokenbucket.lua); a settlement gives back at most what that receipt
// still holds and takes it off (settle.lua). So a refund or reset never
// gives back more than that stream took and was not given back: a proxy
// cannot give back tokens other streams took, nor give a stream's tokens
// back twice.
//
// Calendar quotas keep receipts the same way: a take or a charge of a
// quota rule that settles adds what it added to the period's consumption
// to the receipt of that period's key, "qt:{<rule>:<composite>}:<start>:r:<id>",
// and a refund or a reset gives back at most what it holds (quota.lua).
// The receipt names the period, so a settlement that lands in the next
// period finds none there and gives nothing back: usage settled after a
// period boundary is charged, never refunded.

// receiptSep ends a bucket's key in its receipt's key.
const receiptSep = ":r:"

// keySep joins a script's bucket key and its receipt's key in the key a
// call names (runEach): no key holds a NUL (composite keys are
// percent-encoded, receipt ids are checked).
const keySep = "\x00"

// ReceiptKey returns the key of the receipt of stream id for the bucket or
// quota period at key: "tb:{<rule>:<composite>}:r:<id>" for a bucket
// (BucketKey), "qt:{<rule>:<composite>}:<start>:r:<id>" for a quota's
// consumption (QuotaKey), in that key's hash slot, and never a bucket's
// or a consumption's key (those end at the brace, or at the period's
// digits). The id must be one rlscontract.ValidReceipt accepts.
func ReceiptKey(key, id string) string { return key + receiptSep + id }

// withReceipt is the key a call names for a script on key with the
// receipt at receipt ("": none).
func withReceipt(key, receipt string) string {
	if receipt == "" {
		return key
	}
	return key + keySep + receipt
}
