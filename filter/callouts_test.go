package filter

import (
	"slices"
	"testing"
)

// answerLog records the answers handed to owners.
type answerLog struct{ got []string }

// owner returns an owner that records its name and the answer's sizes.
func (l *answerLog) owner(name string) calloutOwner {
	return func(_ *Plugin, numHeaders, bodySize int) {
		l.got = append(l.got, name)
	}
}

// TestCalloutTable: each token's answer goes to its one owner, once; a
// token that is not in the table (dropped, answered already, or not ours)
// reaches nobody.
func TestCalloutTable(t *testing.T) {
	var l answerLog
	var tab calloutTable
	tab.add(7, l.owner("a"))
	tab.add(3, l.owner("b"))
	tab.add(9, l.owner("c"))
	steps := []struct {
		token uint32
		want  string // "": no owner
		left  int
	}{
		{3, "b", 2},
		{3, "", 2},  // answered already
		{42, "", 2}, // not ours
		{9, "c", 1},
		{7, "a", 0},
		{7, "", 0},
	}
	for i, st := range steps {
		l.got = nil
		if o := tab.take(st.token); o != nil {
			o(nil, 1, 0)
		}
		got := ""
		if len(l.got) > 0 {
			got = l.got[0]
		}
		if got != st.want || len(l.got) > 1 {
			t.Errorf("step %d: take(%d) reached %v, want %q", i, st.token, l.got, st.want)
		}
		if n := len(tab.c); n != st.left {
			t.Errorf("step %d: %d left, want %d", i, n, st.left)
		}
	}
}

// TestOnHTTPCallResponseOwner: OnHTTPCallResponse hands the answer to the
// owner of its token and to no other; an unknown token is dropped.
func TestOnHTTPCallResponseOwner(t *testing.T) {
	var l answerLog
	p := &Plugin{}
	p.callouts.add(1, l.owner("lease"))
	p.callouts.add(2, l.owner("cluster"))
	p.callouts.add(3, l.owner("settle"))
	for _, token := range []uint32{2, 5, 3, 2, 1} {
		p.OnHTTPCallResponse(token, 1, 0, 0)
	}
	if want := []string{"cluster", "settle", "lease"}; !slices.Equal(l.got, want) {
		t.Errorf("answers went to %v, want %v", l.got, want)
	}
}
