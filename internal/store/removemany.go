package store

import (
	"context"

	"github.com/stratafs/strata/internal/rpc"
)

// handleRemoveMany removes many chunks (absent ones are fine), trying all
// of them, and answers the first error.
func (s *Server) handleRemoveMany(ctx context.Context, r *rpc.ChunksReq) (*rpc.Empty, error) {
	var errs []error
	for _, ch := range r.Chunks {
		if _, err := s.handleRemove(ctx, &rpc.ChunkReq{Chunk: ch}); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return nil, errs[0]
	}
	return &rpc.Empty{}, nil
}
