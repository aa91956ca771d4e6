package store

import (
	"sync"
	"testing"
)

// newHealPair pairs two standalone stores (target 1 each) into group 5
// with static group views (staticPeers) in place of the metadata
// service's group map, which this branch does not have (mirror.go's; at
// the merge this file gives way to one built on its test stand-in).
func newHealPair(t *testing.T) *healPair {
	m := &healPair{t: t, pri: newEnv(t, 1, nil), sec: newEnv(t, 1, nil), tp: 1, ts: 1, group: 5, chunks: map[uint64][]byte{}}
	var mu sync.Mutex
	epoch := uint64(3)
	view := func(pri, sec uint64, inSync bool) {
		m.pri.s.setPeerFinder(staticPeers{m.group: {Local: m.tp, PeerTarget: m.ts, PeerAddr: m.sec.s.Addr(), Epoch: pri, Primary: true, InSync: inSync}})
		m.sec.s.setPeerFinder(staticPeers{m.group: {Local: m.ts, PeerTarget: m.tp, PeerAddr: m.pri.s.Addr(), Epoch: sec, InSync: inSync}})
	}
	m.epoch = func() uint64 {
		mu.Lock()
		defer mu.Unlock()
		return epoch
	}
	m.setSync = func(inSync bool) {
		mu.Lock()
		defer mu.Unlock()
		epoch += 2
		view(epoch, epoch, inSync)
	}
	m.splitEpochs = func() {
		mu.Lock()
		defer mu.Unlock()
		view(epoch, epoch+1, true)
	}
	m.write = func(ino, off uint64, data []byte) error {
		if err := m.pri.write(m.tp, ino, off, data, false); err != nil {
			return err
		}
		return m.sec.write(m.ts, ino, off, data, false)
	}
	view(epoch, epoch, true)
	return m
}

// staticPeers is a fixed group view.
type staticPeers map[uint32]groupPeer

func (p staticPeers) peerOf(g uint32) (groupPeer, bool) {
	gp, ok := p[g]
	return gp, ok
}
