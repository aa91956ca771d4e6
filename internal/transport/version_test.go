package transport

import (
	"testing"

	"github.com/stratafs/strata/internal/rpc"
)

func TestWireVersionIsTheMagicsLastByte(t *testing.T) {
	if got := magic[len(magic)-1]; got != rpc.WireVersion {
		t.Fatalf("handshake magic ends in version %d, WireVersion is %d", got, rpc.WireVersion)
	}
}
