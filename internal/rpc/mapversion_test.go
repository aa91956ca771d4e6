package rpc

import (
	"testing"
	"time"
)

// TestGroupRespReadsAsGroupInfo: an older caller that decodes the answer
// of a group change as a GroupInfo reads the group and leaves the version
// (the transport, like this test, checks a decoded answer's error and not
// that it was read to its end); an older answer (a GroupInfo) decodes as a
// GroupResp of version 0.
func TestGroupRespReadsAsGroupInfo(t *testing.T) {
	g := GroupInfo{ID: 3, Epoch: 7, Primary: 4, Secondary: 9, State: GroupDegraded, PrimaryAddr: "a:1", SecondaryAddr: "b:2"}
	var old GroupInfo
	d := NewDec(Marshal(&GroupResp{Group: g, Version: 1 << 40}))
	if old.Decode(d); d.Err() != nil || old != g {
		t.Fatalf("GroupResp read as GroupInfo: %+v, %v; want %+v", old, d.Err(), g)
	}
	var nw GroupResp
	if err := Unmarshal(Marshal(&g), &nw); err != nil || nw.Group != g || nw.Version != 0 {
		t.Fatalf("GroupInfo read as GroupResp: %+v, %v", nw, err)
	}
}

// TestMapGate: older full maps are refused, newer and equal ones taken;
// unknown versions are taken and leave the version unknown; a run of older
// maps lasting MapRegressAfter is taken (the service went back).
func TestMapGate(t *testing.T) {
	var g MapGate
	t0 := time.Unix(1000, 0)
	step := func(v MapVersion, at time.Duration, wantOK, wantBack bool, wantVersion MapVersion) {
		t.Helper()
		ok, back := g.Admit(v, t0.Add(at))
		if ok != wantOK || back != wantBack || g.Version != wantVersion {
			t.Fatalf("Admit(%d) at +%v: ok %v back %v version %d; want %v %v %d", v, at, ok, back, g.Version, wantOK, wantBack, wantVersion)
		}
	}
	step(10, 0, true, false, 10)
	step(10, 0, true, false, 10)
	step(9, time.Second, false, false, 10)
	step(12, 2*time.Second, true, false, 12) // a newer one ends the run of refusals
	step(11, 3*time.Second, false, false, 12)
	step(11, 3*time.Second+MapRegressAfter-time.Millisecond, false, false, 12)
	step(11, 3*time.Second+MapRegressAfter, true, true, 11)
	step(0, 4*time.Second+MapRegressAfter, true, false, 0)
	step(5, 5*time.Second+MapRegressAfter, true, false, 5)
}
