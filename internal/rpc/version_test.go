package rpc

import "testing"

func TestWireVersionIsTheMagicsLastByte(t *testing.T) {
	if got := magic[len(magic)-1]; got != WireVersion {
		t.Fatalf("handshake magic ends in version %d, WireVersion is %d", got, WireVersion)
	}
}
