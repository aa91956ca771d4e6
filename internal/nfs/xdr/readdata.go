package xdr

import "encoding/binary"

// SplitData takes a successful READ answer's data out of it, so that the
// answer is encoded without it and the data sent from its own memory after
// it (oncrpc's Call.SetTail): the data is the answer's last field, so its
// encoding is the answer's without it — ending in a zero length — with
// EndData's length and padding after that. nil when there is no data.
func (r *READ3res) SplitData() []byte {
	if r.Status != NFS3_OK || len(r.Resok().Data) == 0 {
		return nil
	}
	ok := r.Resok()
	data := ok.Data
	ok.Data = nil
	return data
}

var zeroPad [4]byte

// EndData completes enc, the encoding of an answer whose data SplitData
// took, for data: it sets the data's length (enc's last four bytes) and
// returns the padding to send after the data.
func EndData(enc []byte, data []byte) (pad []byte) {
	binary.BigEndian.PutUint32(enc[len(enc)-4:], uint32(len(data)))
	return zeroPad[:(4-len(data)&3)&3]
}
