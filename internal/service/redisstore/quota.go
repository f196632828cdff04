package redisstore

import (
	_ "embed"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"

	"github.com/redis/rueidis"
)

// Calendar quotas (docs/rls.md, "Quotas"): the consumption of one key in
// one period lives in a hash "qt:{<rule>:<composite>}:<period start>" (u:
// units used, t: thresholds crossed), and a key's runtime override in a
// hash "ov:{<rule>:<composite>}" (limit for a quota, rate and burst for a
// token bucket). The hash tag is the token bucket's, so that a key's
// bucket, quota and override are in one Redis Cluster slot and one script
// reads two of them (three with a stream's receipt,
// "qt:{<rule>:<composite>}:<period start>:r:<id>": receipt.go). quota.lua
// decides.

//go:embed quota.lua
var quotaLua string

var quotaScript = withKeys(newScript(quotaLua), 2)

// QuotaKey returns the Redis key of a quota's consumption for the
// composite key in the period starting at start (unix seconds):
// "qt:{<rule>:<composite>}:<start>".
func QuotaKey(rule, composite string, start int64) string {
	return "qt:{" + rule + ":" + composite + "}:" + strconv.FormatInt(start, 10)
}

// OverrideKey returns the Redis key of the runtime override of rule's
// limit for the composite key: "ov:{<rule>:<composite>}", a hash with
// optional fields OverrideLimit, OverrideRate and OverrideBurst.
func OverrideKey(rule, composite string) string {
	return "ov:{" + rule + ":" + composite + "}"
}

// The fields of an override hash (OverrideKey).
const (
	// OverrideLimit replaces a quota's limit (units per period).
	OverrideLimit = "limit"
	// OverrideRate and OverrideBurst replace a token bucket's rate
	// (tokens per second) and burst (tokens).
	OverrideRate  = "rate"
	OverrideBurst = "burst"
)

// OverrideOf returns the override key of a token bucket's key
// "tb:{<rule>:<composite>}" (BucketKey): "ov:{<rule>:<composite>}", the
// OverrideKey of the same rule and composite; "" for any other key.
func OverrideOf(bucket string) string {
	if !strings.HasPrefix(bucket, "tb:") {
		return ""
	}
	return "ov:" + bucket[3:]
}

// QuotaKeyOf returns the consumption key, in the period starting at start,
// of the quota whose token bucket's key is bucket (BucketKey): the QuotaKey
// of the same rule and composite; "" for any other key.
func QuotaKeyOf(bucket string, start int64) string {
	if !strings.HasPrefix(bucket, "tb:") {
		return ""
	}
	return "qt:" + bucket[3:] + ":" + strconv.FormatInt(start, 10)
}

// QuotaMode is what a quota op does with its units.
type QuotaMode string

// Quota modes (quota.lua's ARGV[2]).
const (
	// QuotaTake admits the units if they fit under the limit, else
	// changes nothing (a denied request is not counted).
	QuotaTake QuotaMode = "take"
	// QuotaCharge adds the units whatever the limit: a cost the response
	// reported after admission.
	QuotaCharge QuotaMode = "charge"
	// QuotaRefund gives the units back, never below zero consumption;
	// with a receipt, at most what the receipt holds.
	QuotaRefund QuotaMode = "refund"
	// QuotaReset deletes the period's consumption; with a receipt, it
	// gives back what the receipt holds instead.
	QuotaReset QuotaMode = "reset"
	// QuotaRead changes nothing.
	QuotaRead QuotaMode = "read"
)

// QuotaOp makes an Op a quota decision (quota.lua) on the consumption at
// Op.Key: Op.Cost units (a negative cost with QuotaTake is a refund of
// -Cost, as the service's all-or-nothing refunds send it). Op.Receipt,
// when set (ReceiptKey of Op.Key), is the stream's receipt: a take adds
// what it took, a refund gives back at most what it holds (receipt.go).
type QuotaOp struct {
	// Override is the key's override hash (OverrideKey).
	Override string
	// Limit is the limit without an override: the rule's, or the
	// identity's bounded by the rule's max_limit.
	Limit float64
	// Mode is QuotaTake unless set.
	Mode QuotaMode
	// TTL is the consumption's time to live in seconds (QuotaTTL).
	TTL int64
	// Thresholds are the rule's thresholds (ascending shares of the limit).
	Thresholds []float64
	// Forget, for a refund, are the thresholds (bit i: Thresholds[i]) to
	// mark as not crossed: those the refunded take crossed.
	Forget uint8
	// Args, when set, are Num(Limit) and Num of each threshold, formatted
	// once per rule by the caller: the script's arguments.
	Args []string
}

// QuotaTTL returns the time to live, in seconds, of the consumption at key
// of a period that ends in untilEnd seconds: an hour after the end, plus
// up to ten minutes that the key's hash chooses, so that the keys of one
// period do not all expire in the same second.
func QuotaTTL(key string, untilEnd int64) int64 {
	h := fnv.New32a()
	h.Write([]byte(key))
	return max(untilEnd, 0) + 3600 + int64(h.Sum32()%600)
}

// QuotaResult is quota.lua's answer, in an Outcome.
type QuotaResult struct {
	// Used is the units consumed in the period after the call.
	Used float64
	// Limit is the limit applied: the override's when Override.
	Limit    float64
	Override bool
	// Crossed is the bitmask of the thresholds (bit i: Thresholds[i])
	// this call crossed first in the period.
	Crossed uint8
}

func (op Op) quotaArgs() []string {
	q := op.Quota
	mode, units := q.Mode, op.Cost
	if mode == "" {
		mode = QuotaTake
		if units < 0 {
			mode, units = QuotaRefund, -units
		}
	}
	a := make([]string, 0, 6+len(q.Thresholds))
	limit := ""
	if len(q.Args) == 1+len(q.Thresholds) {
		limit = q.Args[0]
	} else {
		limit = Num(q.Limit)
	}
	a = append(a, q.Override, limit, string(mode), Num(units), strconv.FormatInt(q.TTL, 10), strconv.Itoa(int(q.Forget)))
	if len(q.Args) == 1+len(q.Thresholds) {
		return append(a, q.Args[1:]...)
	}
	for _, t := range q.Thresholds {
		a = append(a, Num(t))
	}
	return a
}

// quotaOutcome reads quota.lua's answer.
func quotaOutcome(r rueidis.RedisResult) Outcome {
	arr, err := r.ToArray()
	if err != nil {
		return Outcome{Err: err}
	}
	if len(arr) != 2 && len(arr) != 3 {
		return Outcome{Err: fmt.Errorf("redis: quota script returned %d values, want 3", len(arr))}
	}
	allowed, err := arr[0].AsInt64()
	if err != nil {
		return Outcome{Err: fmt.Errorf("redis: quota script: %w", err)}
	}
	s, err := arr[1].ToString()
	if err != nil {
		return Outcome{Err: fmt.Errorf("redis: quota script: %w", err)}
	}
	var n [4]float64
	rest := s
	for i := range n {
		var f string
		f, rest, _ = strings.Cut(rest, " ")
		if n[i], err = strconv.ParseFloat(f, 64); err != nil {
			return Outcome{Err: fmt.Errorf("redis: quota script returned %q", s)}
		}
	}
	q := &QuotaResult{Used: n[0], Limit: n[1], Crossed: uint8(n[2]), Override: n[3] == 1}
	o := Outcome{Allowed: allowed == 1, Tokens: max(q.Limit-q.Used, 0), Quota: q}
	if len(arr) == 3 { // whether the receipt cut a refund or a reset
		cut, _ := arr[2].AsInt64()
		o.Cut = cut == 1
	}
	return o
}
