package consensus

import (
	"testing"
	"time"
)

// TestLeaseFromSendTimes: the lease runs from the send time of the
// majority-th latest accepted request (the leader counting itself), in
// one term; requests sent before a reset (a transfer) and answers of an
// older term do not count; a single voter holds it always.
func TestLeaseFromSendTimes(t *testing.T) {
	l := newReadLease(time.Hour, "me") // a 30 min lease: held() is about q only
	conf := []Server{{ID: "me", Voter: true}, {ID: "a", Voter: true}, {ID: "b", Voter: true}}
	l.setVoters(conf)
	if l.held(3) {
		t.Fatal("held with no answer")
	}
	l.ack("a", 3, 10)
	if s := l.state.Load(); s.q != 10 || !l.held(3) || l.held(4) {
		t.Fatalf("one of two followers: %+v held %v", s, l.held(3))
	}
	l.ack("a", 3, 5) // an older request's answer arriving late
	l.ack("b", 3, 20)
	if s := l.state.Load(); s.q != 20 {
		t.Fatalf("q %v, want the majority-th latest send time 20", s.q)
	}
	l.ack("a", 2, 30) // an answer of an older term
	if s := l.state.Load(); s.q != 20 || s.term != 3 {
		t.Fatalf("after an old term's answer: %+v", s)
	}
	l.beginTransfer()
	if l.held(3) {
		t.Fatal("held during a transfer")
	}
	l.ack("a", 3, 25) // sent before the transfer began
	l.endTransfer()
	if s := l.state.Load(); s.q != 0 || l.held(3) {
		t.Fatalf("a request sent before the transfer counts: %+v", s)
	}
	l.ack("a", 4, l.now())
	if !l.held(4) {
		t.Fatal("not held in the new term")
	}
	five := append(conf, Server{ID: "c", Voter: true}, Server{ID: "d", Voter: true}, Server{ID: "x"})
	l.setVoters(five)
	if l.held(4) {
		t.Fatal("held with 2 of 5 voters")
	}
	l.setVoters([]Server{{ID: "me", Voter: true}})
	if !l.held(9) || !l.state.Load().single {
		t.Fatal("a single voter does not hold its lease")
	}
}

// TestSingleVoterReads: a single voter answers reads from its lease, with
// no acknowledgement to wait for.
func TestSingleVoterReads(t *testing.T) {
	n := startNode(t, t.TempDir(), openCounter(t, t.TempDir()))
	defer n.Close()
	if err := n.VerifyRead(2 * time.Second); err != nil {
		t.Fatal(err)
	}
	if !n.lease.held(n.Term()) {
		t.Fatal("a single voter does not hold its lease")
	}
}
