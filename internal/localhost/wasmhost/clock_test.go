package wasmhost

import (
	"testing"
	"time"
)

func TestFakeClock(t *testing.T) {
	start := time.Unix(1_700_000_000, 250)
	c := NewFakeClock(start)
	steps := []struct {
		move     func()
		wallSec  int64
		wallNsec int32
		mono     int64
	}{
		{func() {}, 1_700_000_000, 250, 1},
		{func() { c.Advance(1500 * time.Millisecond) }, 1_700_000_001, 500_000_250, 1_500_000_001},
		{func() { c.Advance(-time.Second) }, 1_700_000_000, 500_000_250, 1_500_000_001},
		{func() { c.Set(start.Add(3 * time.Second)) }, 1_700_000_003, 250, 4_000_000_001},
		{func() { c.Set(time.Unix(-1, 0)) }, -1, 0, 4_000_000_001},
	}
	for i, s := range steps {
		s.move()
		sec, nsec := c.Walltime()
		if sec != s.wallSec || nsec != s.wallNsec || c.Nanotime() != s.mono {
			t.Errorf("step %d: got wall %d.%09d mono %d, want %d.%09d mono %d", i, sec, nsec, c.Nanotime(), s.wallSec, s.wallNsec, s.mono)
		}
	}
}
