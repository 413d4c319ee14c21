package main

import (
	"strings"
	"testing"
	"time"
)

// A publication's delay is counted once, when the watch delivers the very resourceVersion that
// carried the change; other versions of the node (a heartbeat, an older write) are not.
func TestAPublishedChangeIsTimedAtTheWatchEventOfItsOwnWrite(t *testing.T) {
	var w publicationWatch
	t0 := time.Now()
	w.expect("n1", "20", t0)
	w.saw("n1", "19", t0.Add(100*time.Millisecond)) // an earlier write
	w.saw("n2", "20", t0.Add(100*time.Millisecond)) // another node
	w.saw("n1", "20", t0.Add(1500*time.Millisecond))
	w.saw("n1", "20", t0.Add(2*time.Second)) // delivered again (a re-list): not counted twice
	got := w.take()
	if len(got) != 1 || got[0] != 1500 {
		t.Fatalf("delays %v, want [1500]", got)
	}
	if len(w.take()) != 0 {
		t.Fatal("take did not reset")
	}
	// The watch delivers the write before its writer has the answer.
	w.saw("n3", "31", t0.Add(300*time.Millisecond))
	w.saw("n3", "32", t0.Add(400*time.Millisecond))
	w.expect("n3", "32", t0)
	if got := w.take(); len(got) != 1 || got[0] != 400 {
		t.Fatalf("delays %v, want [400] (the event came first)", got)
	}
	s := delaySummary([]float64{200, 400, 1000, 1500})
	if !strings.Contains(s, "3 of 4 within 1 s (75.0 %)") || !strings.Contains(s, "max 1500 ms") {
		t.Fatalf("summary %q", s)
	}
	if delaySummary(nil) != "not measured" {
		t.Fatal("no delays should read not measured")
	}
}

// A node's change keeps the time of the oldest change not yet published.
func TestAHollowNodeKeepsItsOldestUnpublishedChange(t *testing.T) {
	hn := &hnode{}
	t0 := time.Now()
	hn.changed(t0)
	hn.changed(t0.Add(time.Second))
	if !hn.dirty || !hn.changedAt.Equal(t0) {
		t.Fatalf("changedAt %v dirty %v, want %v true", hn.changedAt, hn.dirty, t0)
	}
	// A publication took the change and failed; a newer change came meanwhile; the failed one's
	// change is given back and is the oldest.
	hn.changedAt, hn.dirty = time.Time{}, false
	hn.changed(t0.Add(2 * time.Second))
	hn.changed(t0)
	if !hn.changedAt.Equal(t0) {
		t.Fatalf("changedAt %v after a failed publication gave back %v", hn.changedAt, t0)
	}
}
