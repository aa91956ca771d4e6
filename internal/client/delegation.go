package client

import (
	"context"
	"fmt"
	"syscall"
	"time"

	"github.com/stratafs/strata/internal/rpc"
)

// Inode ranges, batched creates and directory create delegations
// (docs/design/0016): the calls, with the leader-following retries and
// the dedupe headers of the other metadata calls. Nothing here answers
// the kernel locally yet; the per-directory queue and its flusher are the
// next slice.

// ReserveInos reserves n inode numbers (at most rpc.MaxReserveInos) for
// this session: the range [start, start+count) is the session's until its
// creates use the numbers or the session ends. Answered once durable.
func (c *Client) ReserveInos(ctx context.Context, n uint32) (start, count uint64, err error) {
	var resp rpc.ReserveInosResp
	if err := c.metaCall(ctx, rpc.MReserveInos, &rpc.ReserveInosReq{Hdr: c.hdr(), Count: n}, &resp); err != nil {
		return 0, 0, metaErr(c, "reserve inode numbers", err)
	}
	return resp.Start, resp.Count, nil
}

// CreateBatch makes the creates in one raft entry, in order: empty
// regular files in one directory, with numbers of this session's ranges
// (Ino), and the layout left empty for the service to place each file
// (or chosen from a delegation's template). It fills in each create's Seq:
// a batch retried after a leader change applies nothing twice. The answer
// has one result per create (rpc.BatchResult.Err), so one EEXIST leaves
// the others made; the error is for the batch as a whole (not sent, or
// refused: EINVAL, ESTALE).
func (c *Client) CreateBatch(ctx context.Context, creates []rpc.BatchCreate) ([]rpc.BatchResult, error) {
	return c.createBatch(ctx, creates, false)
}

// createBatch is CreateBatch; durable asks for the answer once the batch
// is on stable storage (rpc.CreateBatchReq.Durable).
func (c *Client) createBatch(ctx context.Context, creates []rpc.BatchCreate, durable bool) ([]rpc.BatchResult, error) {
	if len(creates) == 0 {
		return nil, nil
	}
	if len(creates) > rpc.MaxCreateBatch {
		return nil, fmt.Errorf("a batch of %d creates, at most %d: %w", len(creates), rpc.MaxCreateBatch, syscall.EINVAL)
	}
	for i := range creates {
		if err := checkName(creates[i].Name); err != nil {
			return nil, err
		}
	}
	req := &rpc.CreateBatchReq{Hdr: c.hdr(), Creates: creates, Durable: durable}
	for i := range creates {
		creates[i].Seq = c.seq.Add(1)
	}
	var resp rpc.CreateBatchResp
	gen, at := c.dirs.begin()
	if err := c.metaCall(ctx, rpc.MCreateBatch, req, &resp); err != nil {
		return nil, metaErr(c, "create batch", err)
	}
	if len(resp.Results) != len(creates) {
		return nil, fmt.Errorf("create batch: %d results for %d creates: %w", len(resp.Results), len(creates), syscall.EIO)
	}
	for i := len(resp.Results) - 1; i >= 0; i-- { // the last made has the directory's newest attributes
		if r := &resp.Results[i]; r.Errno == 0 {
			c.dirs.note(&r.Dir, r.Index, gen, at)
			break
		}
	}
	c.m.op("create_batch")
	return resp.Results, nil
}

// Delegate asks for the create delegation on directory dir: EBUSY while
// another session holds it or works on the directory, E2BIG for a
// directory of more than rpc.MaxDelegEntries entries. The answer lists
// every entry and the placement template.
func (c *Client) Delegate(ctx context.Context, dir uint64) (*rpc.DelegateResp, error) {
	var resp rpc.DelegateResp
	if err := c.metaCall(ctx, rpc.MDelegate, &rpc.DelegateReq{Hdr: c.hdr(), Dir: dir}, &resp); err != nil {
		return nil, metaErr(c, "delegate", err)
	}
	return &resp, nil
}

// ReturnDelegation gives back the delegation on dir granted at epoch (0:
// whichever this session holds); the caller has flushed the creates it
// queued there first.
func (c *Client) ReturnDelegation(ctx context.Context, dir, epoch uint64) error {
	var resp rpc.Stamp
	if err := c.metaCall(ctx, rpc.MReturnDelegation, &rpc.ReturnDelegationReq{Hdr: c.hdr(), Dir: dir, Epoch: epoch}, &resp); err != nil {
		return metaErr(c, "return delegation", err)
	}
	return nil
}

// waitRecallMax bounds one WaitRecall poll below the attempt bound of a
// call among several voters (metaAttemptTimeout), which would otherwise
// take a long poll for a hung voter and send it elsewhere.
const waitRecallMax = 2 * time.Second

// WaitRecall waits up to wait (at most 2 s a call: poll again) for the
// service to recall one of this session's delegations, and lists the
// directories recalled (empty: none in that time). A recall stays listed
// until returned.
func (c *Client) WaitRecall(ctx context.Context, wait time.Duration) ([]uint64, error) {
	wait = max(0, min(wait, waitRecallMax))
	var resp rpc.WaitRecallResp
	req := &rpc.WaitRecallReq{Client: c.ClientID(), WaitMs: uint32(wait.Milliseconds())}
	if err := c.metaCall(ctx, rpc.MWaitRecall, req, &resp); err != nil {
		return nil, metaErr(c, "wait for recalls", err)
	}
	return resp.Dirs, nil
}
