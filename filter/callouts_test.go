package filter

import (
	"slices"
	"testing"
)

// answerLog records the answers handed to owners.
type answerLog struct{ got []string }

type testOwner struct {
	name string
	log  *answerLog
}

func (o *testOwner) answered(_ *Plugin, numHeaders, bodySize int) {
	o.log.got = append(o.log.got, o.name)
}

// TestCalloutTable: each token's answer goes to its one owner, once; a
// token that is not in the table (dropped, answered already, or not ours)
// reaches nobody.
func TestCalloutTable(t *testing.T) {
	var l answerLog
	var tab calloutTable
	a, b, c := &testOwner{"a", &l}, &testOwner{"b", &l}, &testOwner{"c", &l}
	tab.add(7, a)
	tab.add(3, b)
	tab.add(9, c)
	steps := []struct {
		token uint32
		want  calloutOwner
		left  int
	}{
		{3, b, 2},
		{3, nil, 2},  // answered already
		{42, nil, 2}, // not ours
		{9, c, 1},
		{7, a, 0},
		{7, nil, 0},
	}
	for i, st := range steps {
		if got := tab.take(st.token); got != st.want {
			t.Errorf("step %d: take(%d) got %v, want %v", i, st.token, got, st.want)
		}
		if got := tab.len(); got != st.left {
			t.Errorf("step %d: %d left, want %d", i, got, st.left)
		}
	}
}

// TestOnHTTPCallResponseOwner: OnHTTPCallResponse hands the answer to the
// owner of its token and to no other; an unknown token is dropped.
func TestOnHTTPCallResponseOwner(t *testing.T) {
	var l answerLog
	p := &Plugin{}
	p.callouts.add(1, &testOwner{"lease", &l})
	p.callouts.add(2, &testOwner{"cluster", &l})
	p.callouts.add(3, &testOwner{"settle", &l})
	for _, token := range []uint32{2, 5, 3, 2, 1} {
		p.OnHTTPCallResponse(token, 1, 0, 0)
	}
	if want := []string{"cluster", "settle", "lease"}; !slices.Equal(l.got, want) {
		t.Errorf("answers went to %v, want %v", l.got, want)
	}
}
