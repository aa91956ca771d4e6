package rpc

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// TestMembershipAnswersBounded: a configuration of MaxVoters servers with
// long addresses fits the methods' frame limit; one more server is
// refused as malformed rather than allocated.
func TestMembershipAnswersBounded(t *testing.T) {
	var vs []VoterInfo
	for i := 0; i <= MaxVoters; i++ {
		a := fmt.Sprintf("%s.example.org:%d", strings.Repeat("h", 200), 7400+i)
		vs = append(vs, VoterInfo{ID: a, Addr: a, RaftAddr: a, Voter: true})
	}
	full := &MetaInfoResp{Addr: vs[0].Addr, Voters: vs[:MaxVoters], Health: []string{strings.Repeat("e", 4096)}}
	if n := len(Marshal(full)); n > ResponseLimit(MMetaInfo) {
		t.Fatalf("MetaInfoResp with %d voters is %d bytes, over the limit %d", MaxVoters, n, ResponseLimit(MMetaInfo))
	}
	if n := len(Marshal(&MembershipResp{Voters: vs[:MaxVoters]})); n > ResponseLimit(MAddVoter) {
		t.Fatalf("MembershipResp with %d voters is %d bytes, over the limit", MaxVoters, n)
	}
	var got MetaInfoResp
	if err := Unmarshal(Marshal(&MetaInfoResp{Voters: vs}), &got); !errors.Is(err, ErrMalformed) {
		t.Fatalf("%d voters decode: %v, want ErrMalformed", len(vs), err)
	}
}
