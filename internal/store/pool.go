package store

import (
	"math/bits"
	"sync"

	"github.com/stratafs/strata/internal/rpc"
)

// Buffer pool: size classes of powers of two from 4 KiB to 128 MiB, so
// that the data path allocates no large buffer per request.
const (
	poolMinShift = 12
	poolClasses  = 16
)

var bufPools [poolClasses]sync.Pool

func poolClass(n int) int {
	if n <= 1<<poolMinShift {
		return 0
	}
	return bits.Len(uint(n-1)) - poolMinShift
}

// getBuf returns a buffer of length n; give it back with putBuf.
func getBuf(n int) *[]byte {
	c := poolClass(n)
	if c >= poolClasses {
		b := make([]byte, n)
		return &b
	}
	if p, ok := bufPools[c].Get().(*[]byte); ok {
		*p = (*p)[:n]
		return p
	}
	b := make([]byte, n, 1<<(poolMinShift+c))
	return &b
}

func putBuf(p *[]byte) {
	if p == nil {
		return
	}
	c := poolClass(cap(*p))
	if c >= poolClasses || cap(*p) != 1<<(poolMinShift+c) {
		return
	}
	bufPools[c].Put(p)
}

// readResp is an rpc.ReadResp whose Data lives in a pooled buffer. The rpc
// server calls Release after writing the answer to the socket.
type readResp struct {
	rpc.ReadResp
	buf *[]byte
}

// Release returns the buffer to the pool. Safe on a nil receiver.
func (r *readResp) Release() {
	if r == nil {
		return
	}
	putBuf(r.buf)
	r.buf, r.Data = nil, nil
}
