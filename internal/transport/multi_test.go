package transport

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stratafs/strata/internal/rpc"
	"github.com/stratafs/strata/internal/testutil"
)

// fakeVoter is a real transport server on loopback that answers MCreate as
// a metadata voter would in the role the test gives it, and records the
// headers of the requests it got.
type fakeVoter struct {
	addr string
	srv  *Server
	mu   struct {
		sync.Mutex
		role   func(r *rpc.CreateReq) error // nil: lead (answer success)
		got    []rpc.ReqHeader
		served []rpc.ReqHeader // answered with success
	}
}

func startFakeVoter(t *testing.T) *fakeVoter {
	t.Helper()
	v := &fakeVoter{srv: NewServer([]byte("k"))}
	Handle(v.srv, rpc.MCreate, func(ctx context.Context, r *rpc.CreateReq) (*rpc.ChangeResp, error) {
		v.mu.Lock()
		v.mu.got = append(v.mu.got, r.Hdr)
		role := v.mu.role
		v.mu.Unlock()
		if role != nil {
			if err := role(r); err != nil {
				return nil, err
			}
		}
		v.mu.Lock()
		v.mu.served = append(v.mu.served, r.Hdr)
		v.mu.Unlock()
		return &rpc.ChangeResp{Attr: rpc.Attr{Ino: 100 + r.Hdr.Seq}}, nil
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	v.addr = ln.Addr().String()
	go v.srv.Serve(ln)
	t.Cleanup(func() { v.srv.Close() })
	return v
}

func (v *fakeVoter) setRole(role func(r *rpc.CreateReq) error) {
	v.mu.Lock()
	v.mu.role = role
	v.mu.Unlock()
}

func (v *fakeVoter) headers() (got, served []rpc.ReqHeader) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return append([]rpc.ReqHeader(nil), v.mu.got...), append([]rpc.ReqHeader(nil), v.mu.served...)
}

// notLeader is the role of a follower that knows the leader (hint) or not ("").
func notLeader(hint string) func(*rpc.CreateReq) error {
	return func(*rpc.CreateReq) error { return rpc.NotLeader(hint, "test voter is not the leader") }
}

func newTestMulti(addrs []string, onChange func(old, cur string)) *Multi {
	return NewMulti(addrs, MultiConfig{
		ClientConfig:   ClientConfig{Key: []byte("k"), NoLocal: true, DialTimeout: time.Second},
		AttemptTimeout: time.Second,
		OnLeaderChange: onChange,
	})
}

// create sends one MCreate with header hdr through m.
func create(m *Multi, d time.Duration, hdr rpc.ReqHeader) (rpc.ChangeResp, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var resp rpc.ChangeResp
	err := m.Call(ctx, rpc.MCreate, &rpc.CreateReq{Hdr: hdr, Parent: 1, Name: "f", Mode: 0o100644}, &resp)
	return resp, err
}

// onlyHeader fails unless every header in hs is want.
func onlyHeader(t *testing.T, who string, hs []rpc.ReqHeader, want rpc.ReqHeader) {
	t.Helper()
	for _, h := range hs {
		if h != want {
			t.Fatalf("%s got header %+v, want %+v (the request must be repeated unchanged)", who, h, want)
		}
	}
}

// TestMultiFindsTheLeader: a follower naming the leader, a dead address
// and a voter without a leader hint all lead to the leader, which gets
// the request with the header it was sent with, exactly once.
func TestMultiFindsTheLeader(t *testing.T) {
	leader := startFakeVoter(t)
	hinting := startFakeVoter(t)
	hinting.setRole(notLeader(leader.addr))
	clueless := startFakeVoter(t)
	clueless.setRole(notLeader(""))
	dead := testutil.FreePort(t) // nobody listens there
	for _, tc := range []struct {
		name  string
		addrs []string
	}{
		{"hint", []string{hinting.addr, leader.addr}},
		{"hint outside the list", []string{hinting.addr}},
		{"dead first", []string{dead, leader.addr}},
		{"no hint", []string{clueless.addr, leader.addr}},
		{"all kinds", []string{dead, clueless.addr, hinting.addr}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newTestMulti(tc.addrs, nil)
			defer m.Close()
			hdr := rpc.ReqHeader{ClientID: 7, Seq: uint64(len(tc.name))}
			_, beforeServed := leader.headers()
			resp, err := create(m, 5*time.Second, hdr)
			if err != nil {
				t.Fatalf("call over %v: %v", tc.addrs, err)
			}
			if resp.Attr.Ino != 100+hdr.Seq {
				t.Fatalf("answer %+v is not the leader's", resp.Attr)
			}
			_, served := leader.headers()
			served = served[len(beforeServed):]
			if len(served) != 1 {
				t.Fatalf("the leader served the request %d times", len(served))
			}
			onlyHeader(t, "leader", served, hdr)
			if m.Addr() != leader.addr {
				t.Fatalf("Addr() = %s after the call, want the leader %s", m.Addr(), leader.addr)
			}
			// The next call goes straight to the leader.
			_, before := hinting.headers()
			_, cbefore := clueless.headers()
			if _, err := create(m, 5*time.Second, rpc.ReqHeader{ClientID: 7, Seq: 1000}); err != nil {
				t.Fatal(err)
			}
			_, after := hinting.headers()
			_, cafter := clueless.headers()
			if len(after) != len(before) || len(cafter) != len(cbefore) {
				t.Fatal("a second call went to a follower again")
			}
		})
	}
	got, _ := hinting.headers()
	onlyHeader(t, "follower", got[:1], rpc.ReqHeader{ClientID: 7, Seq: 4}) // "hint"
}

// TestMultiFollowsALeaderChange: calls go to the leader; the leader steps
// down mid-way (it applies a request and then fails before the answer, as
// a leader killed between apply and reply) and the same request, header
// unchanged, reaches the new leader; later calls go there directly, and
// the change is reported once.
func TestMultiFollowsALeaderChange(t *testing.T) {
	a, b := startFakeVoter(t), startFakeVoter(t)
	b.setRole(notLeader(a.addr))
	var changes []string
	var mu sync.Mutex
	m := newTestMulti([]string{b.addr, a.addr}, func(old, cur string) {
		mu.Lock()
		changes = append(changes, old+"->"+cur)
		mu.Unlock()
	})
	defer m.Close()
	for seq := uint64(1); seq <= 3; seq++ {
		if _, err := create(m, 5*time.Second, rpc.ReqHeader{ClientID: 9, Seq: seq}); err != nil {
			t.Fatal(err)
		}
	}
	// a "applies" the next request, then loses leadership without
	// answering it; b leads from then on.
	a.setRole(func(r *rpc.CreateReq) error {
		b.setRole(nil)
		return rpc.NotLeader(b.addr, "leadership lost before the answer")
	})
	hdr := rpc.ReqHeader{ClientID: 9, Seq: 4}
	resp, err := create(m, 5*time.Second, hdr)
	if err != nil {
		t.Fatalf("call across the leader change: %v", err)
	}
	if resp.Attr.Ino != 104 {
		t.Fatalf("answer %+v", resp.Attr)
	}
	gotA, _ := a.headers()
	_, servedB := b.headers()
	if len(servedB) != 1 {
		t.Fatalf("new leader served %d requests, want 1", len(servedB))
	}
	onlyHeader(t, "new leader", servedB, hdr)
	onlyHeader(t, "old leader", gotA[len(gotA)-1:], hdr)
	if m.Addr() != b.addr {
		t.Fatalf("Addr() = %s, want the new leader %s", m.Addr(), b.addr)
	}
	// The old leader dies; calls go to the new one without delay.
	a.srv.Close()
	if _, err := create(m, 5*time.Second, rpc.ReqHeader{ClientID: 9, Seq: 5}); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(changes) != 1 || changes[0] != a.addr+"->"+b.addr {
		t.Fatalf("leader changes reported: %v, want [%s->%s]", changes, a.addr, b.addr)
	}
}

// TestMultiFinalAnswers: an errno other than ENOTCONN is the answer: no
// other address is asked.
func TestMultiFinalAnswers(t *testing.T) {
	a, b := startFakeVoter(t), startFakeVoter(t)
	a.setRole(func(*rpc.CreateReq) error { return rpc.Errorf(syscall.EEXIST, "file exists") })
	m := newTestMulti([]string{a.addr, b.addr}, nil)
	defer m.Close()
	_, err := create(m, 5*time.Second, rpc.ReqHeader{ClientID: 1, Seq: 1})
	if !errors.Is(err, syscall.EEXIST) {
		t.Fatalf("got %v, want EEXIST", err)
	}
	if got, _ := b.headers(); len(got) != 0 {
		t.Fatalf("the other voter was asked %d times after a final answer", len(got))
	}
	if got, _ := a.headers(); len(got) != 1 {
		t.Fatalf("the answering voter was asked %d times, want once", len(got))
	}
}

// TestMultiGivesUpAtTheDeadline: when no address leads, the call ends at
// its context's deadline with an error that names every address tried and
// still tests as what the last attempt got.
func TestMultiGivesUpAtTheDeadline(t *testing.T) {
	clueless := startFakeVoter(t)
	clueless.setRole(notLeader(""))
	dead := testutil.FreePort(t) // nobody listens there
	m := newTestMulti([]string{dead, clueless.addr}, nil)
	defer m.Close()
	start := time.Now()
	_, err := create(m, 700*time.Millisecond, rpc.ReqHeader{ClientID: 1, Seq: 1})
	took := time.Since(start)
	if err == nil {
		t.Fatal("call without a leader succeeded")
	}
	if took < 600*time.Millisecond || took > 5*time.Second {
		t.Fatalf("gave up after %v, want at the 700ms deadline", took)
	}
	msg := err.Error()
	for _, want := range []string{dead, clueless.addr, "no metadata voter answered"} {
		if !strings.Contains(msg, want) {
			t.Fatalf("error %q does not name %q", msg, want)
		}
	}
	if !Retryable(err) {
		t.Fatalf("error %v lost its kind (ErrUnavailable or ENOTCONN)", err)
	}
	got, _ := clueless.headers()
	if len(got) < 2 {
		t.Fatalf("the voter was asked %d times in 700ms: no retry rounds", len(got))
	}
	onlyHeader(t, "voter", got, rpc.ReqHeader{ClientID: 1, Seq: 1})
}

// TestMultiSkipsAHungVoter: a voter that takes the connection and never
// answers costs one AttemptTimeout, then the leader answers.
func TestMultiSkipsAHungVoter(t *testing.T) {
	hung, leader := startFakeVoter(t), startFakeVoter(t)
	release := make(chan struct{})
	defer close(release)
	hung.setRole(func(*rpc.CreateReq) error { <-release; return nil })
	m := newTestMulti([]string{hung.addr, leader.addr}, nil)
	defer m.Close()
	start := time.Now()
	if _, err := create(m, 10*time.Second, rpc.ReqHeader{ClientID: 2, Seq: 1}); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("took %v past a hung voter, want about one AttemptTimeout (1s)", took)
	}
	if _, served := leader.headers(); len(served) != 1 {
		t.Fatalf("leader served %d, want 1", len(served))
	}

	// A call whose time runs out at the hung voter still moves the next
	// call on to another address.
	m2 := newTestMulti([]string{hung.addr, leader.addr}, nil)
	defer m2.Close()
	if _, err := create(m2, 300*time.Millisecond, rpc.ReqHeader{ClientID: 2, Seq: 2}); err == nil {
		t.Fatal("a call that only reached the hung voter succeeded")
	}
	start = time.Now()
	if _, err := create(m2, 900*time.Millisecond, rpc.ReqHeader{ClientID: 2, Seq: 3}); err != nil {
		t.Fatalf("the call after a timed-out one went to the hung voter again: %v", err)
	}
}

func TestParseAddrList(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
		bad  string // in the error
	}{
		{in: "127.0.0.1:7400", want: []string{"127.0.0.1:7400"}},
		{in: "a:1,b:2, c:3", want: []string{"a:1", "b:2", "c:3"}},
		{in: "[::1]:7400,127.0.0.1:7400", want: []string{"[::1]:7400", "127.0.0.1:7400"}},
		{in: "", bad: "no address"},
		{in: "a:1,,b:2", bad: "element 2 of 3 is empty"},
		{in: "a:1,", bad: "element 2 of 2 is empty"},
		{in: "a:1,a:1", bad: "a:1 given twice"},
		{in: "a:1,b:99999", bad: `"b:99999": port "99999"`},
		{in: "a:1,b:0", bad: `port "0"`},
		{in: "a:1,b", bad: `"b": address b: missing port`},
		{in: ":7400", bad: "no host"},
	} {
		got, err := ParseAddrList(tc.in)
		if tc.bad != "" {
			if err == nil || !strings.Contains(err.Error(), tc.bad) {
				t.Errorf("ParseAddrList(%q) = %v, %v; want an error with %q", tc.in, got, err, tc.bad)
			}
			continue
		}
		if err != nil || strings.Join(got, "|") != strings.Join(tc.want, "|") {
			t.Errorf("ParseAddrList(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

// TestMultiWrongKey: a voter that refuses the key (another cluster's
// service on a listed port) is skipped for the others; when every address
// refuses it, the call fails at once with ErrAuth.
func TestMultiWrongKey(t *testing.T) {
	leader := startFakeVoter(t)
	other := NewServer([]byte("another cluster"))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go other.Serve(ln)
	defer other.Close()
	m := newTestMulti([]string{ln.Addr().String(), leader.addr}, nil)
	defer m.Close()
	if _, err := create(m, 5*time.Second, rpc.ReqHeader{ClientID: 3, Seq: 1}); err != nil {
		t.Fatalf("past a voter of another cluster: %v", err)
	}
	alone := newTestMulti([]string{ln.Addr().String()}, nil)
	defer alone.Close()
	start := time.Now()
	_, err = create(alone, 5*time.Second, rpc.ReqHeader{ClientID: 3, Seq: 2})
	if !errors.Is(err, ErrAuth) || time.Since(start) > 2*time.Second {
		t.Fatalf("only a voter of another cluster: %v after %v, want ErrAuth at once", err, time.Since(start))
	}
}

// TestMultiClosed: a call on a closed Multi fails at once.
func TestMultiClosed(t *testing.T) {
	leader := startFakeVoter(t)
	m := newTestMulti([]string{leader.addr}, nil)
	m.Close()
	start := time.Now()
	if _, err := create(m, 5*time.Second, rpc.ReqHeader{ClientID: 4, Seq: 1}); !errors.Is(err, ErrUnavailable) || time.Since(start) > time.Second {
		t.Fatalf("call on a closed Multi: %v after %v, want ErrUnavailable at once", err, time.Since(start))
	}
}
