package xdr

// SizeHint is about how many bytes a READ answer encodes to, so that the
// reply buffer is allocated once instead of growing in steps through a
// megabyte.
func (r *READ3res) SizeHint() int {
	if r.Status == NFS3_OK {
		return len(r.Resok().Data) + 128
	}
	return 128
}
