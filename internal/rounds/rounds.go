// Package rounds is the group commit shared by the storage servers' syncs
// and intent logs (internal/store) and the NFS gateway's metadata syncs
// (internal/nfs).
package rounds

import "sync"

// Rounds is the group commit that the storage servers' syncfs rounds
// (groupSync), the targets' intent logs (dirtyLog, mirrorLog) and the NFS
// gateway's metadata syncs on sync exports share: a caller joins
// the next round that starts after it arrived — never the one running,
// which may have begun before the caller's writes — and waits for its end.
// The first caller with no round running runs it at once (nobody sleeps to
// wait for company); the round joined meanwhile starts as soon as the one
// running ends, in a goroutine of its own, so that the caller of the ended
// round returns. The metadata log's syncer (consensus/wal.go) is the same
// idea with its own bookkeeping.
type Rounds[T any] struct {
	mu      sync.Mutex
	running bool
	next    *round[T] // the round new callers join; nil: none yet
}

// round is one run of a Rounds' work that its callers wait for.
type round[T any] struct {
	done  chan struct{}
	err   error // set before done is closed
	items []T   // guarded by rounds.mu until the round starts
}

// Join adds item to the next round and waits for its end, running it with
// do (the same function on every call of one Rounds) when no round runs.
func (g *Rounds[T]) Join(item T, do func(items []T) error) error {
	g.mu.Lock()
	r := g.next
	if r == nil {
		r = &round[T]{done: make(chan struct{})}
		g.next = r
	}
	r.items = append(r.items, item)
	if g.running {
		g.mu.Unlock()
		<-r.done
		return r.err
	}
	g.running = true
	g.next = nil
	g.mu.Unlock()
	g.run(r, do)
	return r.err
}

// run runs r, then hands the round joined meanwhile to a goroutine of its
// own, so that r's caller returns at once.
func (g *Rounds[T]) run(r *round[T], do func(items []T) error) {
	r.err = do(r.items)
	close(r.done)
	g.mu.Lock()
	next := g.next
	g.next = nil
	g.running = next != nil
	g.mu.Unlock()
	if next != nil {
		go g.run(next, do)
	}
}

// Waiting reports how many callers have joined the next round (tests).
func (g *Rounds[T]) Waiting() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.next == nil {
		return 0
	}
	return len(g.next.items)
}
