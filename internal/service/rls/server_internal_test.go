package rls

import (
	"math"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tokengate/tokengate/ratelimitheader"
)

// TestSetDuration: the fields durationpb.New gives the rounded-up wait,
// for waits from none to past the cap.
func TestSetDuration(t *testing.T) {
	for _, secs := range []float64{math.NaN(), math.Inf(-1), -1, 0, 1e-10, 1e-9, 0.5, 1, 1.0000000001, 59.999999999, 3600.25,
		1e6 + 1e-7, ratelimitheader.MaxSeconds - 0.5, ratelimitheader.MaxSeconds, 1e12, math.Inf(1)} {
		var want *durationpb.Duration
		switch {
		case !(secs > 0):
			want = durationpb.New(0)
		case secs >= ratelimitheader.MaxSeconds:
			want = durationpb.New(ratelimitheader.MaxSeconds * time.Second)
		default:
			want = durationpb.New(time.Duration(math.Ceil(secs * 1e9)))
		}
		if got := duration(secs); !proto.Equal(got, want) {
			t.Errorf("%v s: got %v, want %v", secs, got, want)
		}
	}
}
