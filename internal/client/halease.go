package client

import (
	"context"
	"fmt"
	"time"

	"github.com/stratafs/strata/internal/rpc"
)

// HALease asks the metadata service for the named lease for holder, for
// ttl from the leader's receipt (a renewal when holder holds it), or gives
// it up (release). The call follows the leader among the voters until
// ctx's deadline (at most the IOTimeout). A granted lease is the caller's
// for ttl counted from before this call: the service counts it from
// later. See docs/design/0015 § HA pair.
func (c *Client) HALease(ctx context.Context, name, holder string, ttl time.Duration, release bool) (rpc.HALeaseResp, error) {
	var r rpc.HALeaseResp
	req := &rpc.HALeaseReq{Name: name, Holder: holder, TTLMs: uint32(ttl.Milliseconds()), Release: release}
	if err := c.metaCall(ctx, rpc.MHALease, req, &r); err != nil {
		return r, fmt.Errorf("lease %q: %w", name, err)
	}
	return r, nil
}
