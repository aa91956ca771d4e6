package store

import (
	"context"
	"sync"

	"github.com/stratafs/strata/internal/rpc"
)

// removeManyWorkers bounds the removals of one SRemoveMany under way at
// once: each is an unlink (and for a mirror group's chunk a forward to the
// secondary), mostly waiting; one after the other, a call of a few
// hundred mirrored chunks took longer than the reaper's timeout on a
// loaded server.
const removeManyWorkers = 8

// handleRemoveMany removes many chunks (absent ones are fine), trying all
// of them unless the caller gives up, and answers the first error.
func (s *Server) handleRemoveMany(ctx context.Context, r *rpc.ChunksReq) (*rpc.Empty, error) {
	var (
		mu       sync.Mutex
		firstErr error
		wg       sync.WaitGroup
	)
	next := make(chan rpc.ChunkID)
	for range min(removeManyWorkers, len(r.Chunks)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ch := range next {
				if _, err := s.handleRemove(ctx, &rpc.ChunkReq{Chunk: ch}); err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
				}
			}
		}()
	}
feed:
	for _, ch := range r.Chunks {
		select {
		case next <- ch:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	if firstErr == nil && ctx.Err() != nil {
		firstErr = ctx.Err()
	}
	if firstErr != nil {
		return nil, firstErr
	}
	return &rpc.Empty{}, nil
}
