package rpc

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/token"
	"reflect"
	"sort"
	"testing"

	"github.com/stratafs/strata/internal/layout"
)

// messageSamples has samples of every type with a Decode method in
// meta_msgs.go, store_msgs.go and member_msgs.go (TestMessageSamplesExhaustive), keyed by
// type name. Together the samples of a type set every field that is on the
// wire (TestMessageSamplesSetEveryField), so a field that Encode or Decode
// forgets fails the round trip. Slices are nil or non-empty, as decoders
// return them.
func messageSamples() map[string][]Message {
	lay := layout.Layout{StripeSize: 1 << 20, StripeCount: 2, Targets: []uint32{1, 3}}
	attr := Attr{Ino: 5, Mode: 0o100644, Nlink: 2, Uid: 1000, Gid: 100, Rdev: 0x103, Size: 1 << 40,
		Atime: -1, Mtime: 1763885000123456789, Ctime: 3, Layout: lay, Blocks: 8, BlocksKnown: true}
	hdr := ReqHeader{ClientID: 7, Seq: 300}
	chunk := ChunkID{Target: 3, Ino: 1 << 40}
	group := GroupInfo{ID: 3, Epoch: 7, Primary: 4, Secondary: 9, State: GroupResyncing, SinceMs: 1763885000123,
		ResyncDone: 1 << 30, ResyncTotal: 1 << 33, PrimaryAddr: "10.0.0.2:7401", SecondaryAddr: "10.0.0.3:7401",
		PrimaryAlive: true, SecondaryAlive: true}
	inlineAttr := Attr{Ino: 6, Mode: 0o100644, Nlink: 1, Size: 12, Layout: lay, Blocks: 1, BlocksKnown: true, Inline: true}
	voter := VoterInfo{ID: "10.0.0.1:7400", Addr: "10.0.0.1:7400", RaftAddr: "10.0.0.1:7400", Voter: true}
	return map[string][]Message{
		"InodesKnownReq":  {&InodesKnownReq{Inos: []uint64{1, 2, 1 << 33}}},
		"InodesKnownResp": {&InodesKnownResp{NextIno: 1 << 20, Known: []bool{true, false, true}}},
		"Empty":           {&Empty{}},
		"ReqHeader":       {&hdr},
		"Attr":            {&Attr{Ino: 5, Mode: 0o40755, Nlink: 3, Uid: 1, Gid: 2, Rdev: 3, Size: 4, Atime: 5, Mtime: 6, Ctime: 7, Layout: lay}},
		"AttrResp": {&AttrResp{Attr: attr, Stamp: Stamp{Index: 9, Term: 2}},
			&AttrResp{Attr: inlineAttr, Stamp: Stamp{Index: 9, Term: 2}, Data: []byte("inline bytes")}},
		"LinkResp": {&LinkResp{AttrResp: AttrResp{Attr: attr, Stamp: Stamp{Index: 9, Term: 2}}},
			&LinkResp{AttrResp: AttrResp{Attr: attr, Stamp: Stamp{Index: 9, Term: 2}}, Dir: Attr{Ino: 1, Mode: 0o40755, Nlink: 3, Mtime: 8, Ctime: 8}}},
		"Stamp": {&Stamp{Index: 9, Term: 2}},
		"ChangeResp": {&ChangeResp{Attr: attr, Dir: Attr{Ino: 1, Mode: 0o40755, Nlink: 3, Layout: layout.Layout{StripeSize: 1 << 20, StripeCount: 2}},
			Index: 4, Term: 1}},
		"DirChangeResp": {&DirChangeResp{Stamp: Stamp{Index: 9, Term: 2}},
			&DirChangeResp{Stamp: Stamp{Index: 9, Term: 2}, Dir: Attr{Ino: 1, Mode: 0o40755, Nlink: 3, Mtime: 8, Ctime: 8},
				NewDir: Attr{Ino: 4, Mode: 0o40700, Nlink: 2, Uid: 5, Gid: 6, Size: 7, Atime: 1, Mtime: 8, Ctime: 8, Rdev: 1, Layout: lay},
				Entry:  Attr{Ino: 6, Mode: 0o40755, Nlink: 2, Ctime: 8}, Other: Attr{Ino: 7, Mode: 0o100644, Nlink: 1, Ctime: 8}}},
		"SyncReq":         {&SyncReq{Index: 5, Term: 6}},
		"SyncResp":        {&SyncResp{Durable: 5, Term: 6}},
		"SessionOpenReq":  {&SessionOpenReq{Host: "node1", MountPoint: "/mnt/strata", Pid: 4242}},
		"SessionOpenResp": {&SessionOpenResp{ClientID: 9, LeaseMs: 30000}},
		"SessionHeartbeatReq": {&SessionHeartbeatReq{ClientID: 3, OpenInodes: []uint64{4, 5}, LockEpoch: 77, ListedAfter: 1763885000123456789},
			&SessionHeartbeatReq{ClientID: 3, Gateway: &GatewayReport{Address: "10.0.0.1:2049", Exports: []string{"/=rw,sync,clients=*"}, Clients: 2, Ops: 99, OpsPerSec: 7}}},
		"SessionHeartbeatResp": {&SessionHeartbeatResp{LockEpoch: 9, Now: 1763885000123456789}},
		"SessionCloseReq":      {&SessionCloseReq{ClientID: 3}},
		"LookupReq":            {&LookupReq{Parent: 1, Name: "a name"}, &LookupReq{Parent: 1, Name: "b", Client: 9}},
		"GetAttrReq":           {&GetAttrReq{Ino: 1 << 50}, &GetAttrReq{Ino: 2, Client: 9}, &GetAttrReq{Ino: 3, Flags: GetAttrData | GetAttrWrite}},
		"SetAttrReq": {&SetAttrReq{Hdr: hdr, Ino: 5, Valid: SetMode | SetSize, Mode: 0o640, Uid: 1, Gid: 2, Size: 1 << 40,
			Atime: -5, Mtime: 6, Ctime: 7}},
		"CreateReq":    {&CreateReq{Hdr: hdr, Parent: 1, Name: "a", Mode: 0o120777, Uid: 1, Gid: 2, Rdev: 3, SymlinkTarget: "x"}},
		"EntryReq":     {&EntryReq{Hdr: hdr, Parent: 1, Name: "gone"}},
		"RenameReq":    {&RenameReq{Hdr: hdr, OldParent: 1, OldName: "a", NewParent: 2, NewName: "b", Flags: RenameExchange}},
		"LinkReq":      {&LinkReq{Hdr: hdr, Ino: 5, NewParent: 2, NewName: "hard"}},
		"ReadlinkResp": {&ReadlinkResp{Target: "../t"}},
		"ReadDirReq":   {&ReadDirReq{Dir: 1, After: "m", Limit: 128, Plus: true}, &ReadDirReq{Dir: 1, Client: 9}},
		"ReadDirResp": {&ReadDirResp{Entries: []DirEntry{{Name: "a", Ino: 5, Mode: 0o100644, Attr: attr},
			{Name: "b", Ino: 6, Mode: 0o40755}}, EOF: true}},
		"StatFSResp":    {&StatFSResp{TotalBytes: 1 << 40, FreeBytes: 1 << 39, AvailBytes: 1 << 38, Inodes: 5, FreeInodes: 6}},
		"XattrReq":      {&XattrReq{Hdr: hdr, Ino: 5, Name: "user.k", Value: []byte("v\x00"), Flags: XattrCreate}},
		"XattrResp":     {&XattrResp{Value: []byte("value")}},
		"ListXattrResp": {&ListXattrResp{Names: []string{"user.a", "user.b"}}},
		"SetAtimesReq":  {&SetAtimesReq{Hdr: hdr, Inos: []uint64{5, 1 << 40}, Atimes: []int64{-1, 1763885000123456789}}},
		"CommitSizeReq": {&CommitSizeReq{Hdr: hdr, Ino: 5, Size: 9, Mtime: 3, ClearSuid: true, Alloc: []SlotAlloc{{0, 4096}, {3, 1 << 33}}, Deferred: true}},
		"LockReq": {
			&LockReq{ClientID: 1, Ino: 2, Owner: 3, Start: 4, End: ^uint64(0), Type: LockWrite, Pid: 5, Flock: true, Wait: true},
			&LockReq{ClientID: 1, Ino: 2, Start: 3, End: 4, Type: LockRead, Reclaim: true},
			&LockReq{ClientID: 1, Ino: 2, Type: LockUnlock, Handle: 1 << 40, CloseHandle: true},
		},
		"LockGrant":          {&LockGrant{Epoch: 4}},
		"LockResp":           {&LockResp{Start: 1, End: 2, Type: LockWrite, Pid: 3}},
		"SetDirLayoutReq":    {&SetDirLayoutReq{Hdr: hdr, Dir: 2, StripeSize: 1 << 20, StripeCount: 4}, &SetDirLayoutReq{Hdr: hdr, Dir: 2, Mirror: DirMirrorOn}},
		"RegisterServerReq":  {&RegisterServerReq{Addr: "a:1", Host: "h", Targets: []TargetReg{{UUID: "u", Path: "/p", TotalBytes: 5, FreeBytes: 4, FSID: 3, RawFree: 2, PrevID: 1, InoCeiling: 1 << 16}}, Domain: "rack1"}},
		"RegisterServerResp": {&RegisterServerResp{ServerID: 1, TargetIDs: []uint32{1, 2}}},
		"ServerHeartbeatReq": {&ServerHeartbeatReq{ServerID: 1, Targets: []TargetUsage{{1, 2, 3}}, FSIDs: []uint64{7}, RawFree: []uint64{4}, InoCeiling: 1 << 16, Unsynced: []TargetUnsynced{{Chunks: 2, Bytes: 7802, OldestMs: 3500}}}},
		"TargetInfo":         {&TargetInfo{ID: 1, ServerID: 2, Addr: "a:1", Path: "/p", TotalBytes: 5, FreeBytes: 4, Alive: true}},
		"ListTargetsResp":    {&ListTargetsResp{Targets: []TargetInfo{{ID: 1, ServerID: 2, Addr: "a:1", Path: "/p", TotalBytes: 5, FreeBytes: 4, Alive: true}}}},
		"ClusterStatusResp": {&ClusterStatusResp{MetaAddr: "m:1", RaftState: "Leader", Leader: "n1", Term: 2, CommitIndex: 3, AppliedIndex: 4,
			Inodes: 5, Sessions: 6, Servers: []ServerInfo{{ID: 1, Addr: "a:1", Host: "h", Alive: true, LastSeenMs: 7}},
			Targets: []TargetInfo{{ID: 3, ServerID: 1, Addr: "a:1", Path: "/p", TotalBytes: 9, FreeBytes: 8, Alive: true}}, DurableIndex: 4,
			TotalBytes: 10, FreeBytes: 11,
			Clients:    []ClientInfo{{ID: 1, Host: "h", MountPoint: "/m", Pid: 2, OpenedMs: 3, LastSeenMs: 4, OpenFiles: 5, Locks: 6}},
			Locks:      []LockInfo{{Ino: 1, Client: 2, Owner: 3, Pid: 4, Type: LockWrite, Flock: true, Start: 5, End: 6}},
			LocksTotal: 1, LockGrace: true, LockGracePending: 2, Problems: []string{"p"}, FreePendingFiles: 12, FreePendingBytes: 13,
			Unsynced: []TargetUnsynced{{Chunks: 14, Bytes: 15, OldestMs: 16}}, Groups: []GroupInfo{group},
			Gateways:    []GatewayStatus{{Client: 1, Report: GatewayReport{Address: "g:2049", Exports: []string{"/=ro,clients=*"}, Clients: 3, Ops: 4, OpsPerSec: 5}}},
			Delegations: []DelegationInfo{{Client: 1, Dir: 7, Epoch: 30, GrantedMs: 4, Recalled: true}}}},
		"ReserveInosReq":  {&ReserveInosReq{Hdr: hdr, Count: 4096}},
		"ReserveInosResp": {&ReserveInosResp{Start: 1 << 20, Count: 4096, Stamp: Stamp{Index: 9, Term: 2}}},
		"BatchCreate": {&BatchCreate{Seq: 5, Parent: 2, Name: "f", Ino: 1 << 20, Mode: 0o644, Uid: 1, Gid: 2, Time: -3,
			Layout: layout.Layout{StripeSize: 1 << 20, StripeCount: 1, Targets: []uint32{3}}}},
		"CreateBatchReq": {&CreateBatchReq{Hdr: hdr, Creates: []BatchCreate{{Seq: 5, Parent: 2, Name: "f", Ino: 9}, {Seq: 6, Parent: 2, Name: "g", Ino: 10, Mode: 0o600,
			Written: true, Size: 3901, Mtime: 7, Alloc: []SlotAlloc{{Slot: 0, Bytes: 4096}}}}},
			&CreateBatchReq{Hdr: hdr, Creates: []BatchCreate{{Seq: 7, Parent: 2, Name: "i", Ino: 11, Written: true, Size: 5, Mtime: 8, Inline: []byte("hello")}}},
			&CreateBatchReq{Hdr: hdr, Creates: []BatchCreate{{Seq: 8, Parent: 2, Name: "j", Ino: 12}}, Durable: true}},
		"BatchResult": {&BatchResult{Attr: Attr{Ino: 9}, Dir: Attr{Ino: 2}, Stamp: Stamp{Index: 4, Term: 1}},
			&BatchResult{Errno: 17, Msg: "exists"}},
		"CreateBatchResp": {&CreateBatchResp{Results: []BatchResult{{Attr: Attr{Ino: 9}, Dir: Attr{Ino: 2}}, {Errno: 17, Msg: "x"}}, Stamp: Stamp{Index: 4, Term: 1}}},
		"DelegateReq":     {&DelegateReq{Hdr: hdr, Dir: 2}},
		"DelegateResp": {&DelegateResp{Epoch: 40, Dir: Attr{Ino: 2, Mode: 0o40755}, Entries: []DelegEntry{{Name: "a", Ino: 5, Mode: 0o100000}},
			StripeSize: 1 << 20, StripeCount: 2, Cands: []PlacementCand{{ID: 1, FreeBytes: 5}}, RRStart: 7, Stamp: Stamp{Index: 40, Term: 2}}},
		"ReturnDelegationReq": {&ReturnDelegationReq{Hdr: hdr, Dir: 2, Epoch: 40}},
		"WaitRecallReq":       {&WaitRecallReq{Client: 3, WaitMs: 2000}},
		"WaitRecallResp":      {&WaitRecallResp{Dirs: []uint64{2, 1 << 40}}},
		"GatewayReport":       {&GatewayReport{Address: "g:2049", Exports: []string{"/=rw,sync,clients=*", "/s=ro,clients=10.0.0.0/8"}, Clients: 3, Ops: 1 << 40, OpsPerSec: 5}},
		"ClientInfo":          {&ClientInfo{ID: 1, Host: "h", MountPoint: "/m", Pid: 2, OpenedMs: 3, LastSeenMs: 4, OpenFiles: 5, Locks: 6}},
		"LockInfo":            {&LockInfo{Ino: 1, Client: 2, Owner: 3, Pid: 4, Type: LockWrite, Flock: true, Start: 5, End: 6}},
		"SeekReq":             {&SeekReq{Chunk: chunk, Off: 1 << 33, Data: true}},
		"SeekResp":            {&SeekResp{Off: 1<<33 + 5, Found: true}},
		"ListChunksReq":       {&ListChunksReq{Target: 3, From: 300, Max: 8192}},
		"ListChunksResp":      {&ListChunksResp{Inos: []uint64{5, 1 << 40}, Bytes: []uint64{7, 0}, Next: 301, Done: true}},
		"ScrubReq":            {&ScrubReq{Target: 3, From: 301, Max: 1024, Repair: true, RateBytes: 100 << 20, Group: 2}},
		"ScrubResp": {&ScrubResp{Chunks: 1, Bytes: 2, BadBlocks: 3, Repaired: 4, Unrepairable: 5, Mismatched: 6, PeerMissing: 7,
			Problems: []string{"chunk 5: block 3 bad on both copies"}, Next: 302, Done: true}},
		"ChunkSumsReq": {&ChunkSumsReq{Chunk: ChunkID{Target: GroupBit | 2, Epoch: 9, Ino: 1 << 40}, Off: 1 << 20, Len: 8 << 20, Data: true, Heal: true}},
		"ChunkSumsResp": {&ChunkSumsResp{Exists: true, Size: 1<<20 + 5, Sums: []uint32{0, 0xdeadbeef}, Bad: []uint32{1}, Healed: 2,
			Data: []byte("block bytes")}},
		"MirrorSuspectsReq": {&MirrorSuspectsReq{Group: 3, Epoch: 7, Target: 4, Inos: []uint64{5, 1 << 40}}},
		"ChunkID":           {&chunk, &ChunkID{Target: GroupBit | 4, Ino: 9, Epoch: 1 << 33}},
		"GroupInfo":         {&group},
		"ListGroupsResp": {&ListGroupsResp{Groups: []GroupInfo{group, {ID: 2, Epoch: 1, Primary: 5, Secondary: 6}}},
			&ListGroupsResp{Groups: []GroupInfo{{ID: 4, Epoch: 3, Primary: 6, Secondary: 5, State: GroupDegraded, FullResync: true}, group}, Version: 1 << 35}},
		"GroupResp": {&GroupResp{Group: group, Version: 9001}, &GroupResp{Group: group}},
		"MirrorCreateReq": {&MirrorCreateReq{Hdr: hdr, Auto: true, ByDomain: true},
			&MirrorCreateReq{Hdr: hdr, Pairs: []uint32{1, 4, 2, 3}}},
		"MirrorGroupReq":   {&MirrorGroupReq{Hdr: hdr, Group: 3}, &MirrorGroupReq{Hdr: hdr, Group: 3, Epoch: 8}},
		"MirrorReplaceReq": {&MirrorReplaceReq{Hdr: hdr, Group: 3, Target: 9}},
		"HALeaseReq":       {&HALeaseReq{Name: "nfs-ha/10.0.0.100", Holder: "gw-a/0a1b", TTLMs: 4000}, &HALeaseReq{Name: "x", Holder: "y", Release: true}},
		"HALeaseResp":      {&HALeaseResp{Granted: true, Holder: "gw-a/0a1b", RemainingMs: 3999, Epoch: 7}, &HALeaseResp{}},
		"DirLayoutResp":    {&DirLayoutResp{StripeSize: 4 << 20, StripeCount: 3, Mirror: true}, &DirLayoutResp{}},
		"MirrorReportReq":  {&MirrorReportReq{ServerID: 2, Group: 3, Epoch: 7, Target: 4, Event: MirrorResyncProgress, Done: 1 << 30, Total: 1 << 33, Detail: "chunk 4/99"}},
		"ServerHeartbeatResp": {&ServerHeartbeatResp{Groups: []GroupInfo{group}, LeaseMs: 2000, FailoverTimeoutMs: 3000},
			&ServerHeartbeatResp{Groups: []GroupInfo{{ID: 4, Epoch: 3, Primary: 6, Secondary: 5, State: GroupResyncing, FullResync: true}}, LeaseMs: 2000, Version: 1 << 34}},
		"WriteReq":      {&WriteReq{Chunk: chunk, Off: 3, Sync: true, Data: []byte("hi")}},
		"WriteResp":     {&WriteResp{Alloc: 8192, HasAlloc: true}},
		"ReadReq":       {&ReadReq{Chunk: chunk, Off: 3, Len: 4096}},
		"ReadResp":      {&ReadResp{Data: []byte("read")}},
		"TruncateReq":   {&TruncateReq{Chunk: chunk, Size: 5}},
		"PunchReq":      {&PunchReq{Chunk: chunk, Off: 5, Len: 6}},
		"ChunkReq":      {&ChunkReq{Chunk: chunk}},
		"ChunkStatResp": {&ChunkStatResp{Size: 5, Exists: true, Alloc: 4096, HasAlloc: true}},
		"ChunksReq":     {&ChunksReq{Chunks: []ChunkID{chunk, {Target: 1, Ino: 2}}}},
		"VoterInfo":     {&voter},
		"MetaInfoResp": {&MetaInfoResp{Addr: "10.0.0.1:7400", ID: "10.0.0.1:7400", RaftAddr: "10.0.0.1:7400", State: "follower", Term: 3,
			AppliedIndex: 40, CommitIndex: 41, LastIndex: 42, Leader: "10.0.0.2:7400", LeaderID: "10.0.0.2:7400",
			Voters: []VoterInfo{voter, {ID: "meta-1", RaftAddr: "127.0.0.1:4000"}}, LastContactMs: -1,
			LeaderChangeNs: 1763885000123456789, LeaderChangeCause: "leader lost: no contact for 1.2s", Health: []string{"raft log: sync failed"}, Serving: true}},
		"MembershipReq":  {&MembershipReq{Addr: "10.0.0.3:7400"}},
		"MembershipResp": {&MembershipResp{Done: "added", Leader: "10.0.0.2:7400", Voters: []VoterInfo{voter}, TookNs: 1234567}},
	}
}

// notOnWire are fields that a type's own encoding does not carry:
// caller-side options, and Attr's Blocks, which the answers holding an Attr
// append at their end (AttrResp, ChangeResp, ReadDirResp: their samples
// set it); GroupInfo's FullResync, which ListGroupsResp and
// ServerHeartbeatResp append at their end (their samples set it).
var notOnWire = map[string]bool{"ReadResp.Into": true, "ReadResp.Direct": true,
	"Attr.Blocks": true, "Attr.BlocksKnown": true, "Attr.Inline": true, "GroupInfo.FullResync": true,
	// encoded by CreateBatchReq, in its appended records (CreateBatchReq's sample sets them)
	"BatchCreate.Written": true, "BatchCreate.Size": true, "BatchCreate.Mtime": true, "BatchCreate.Alloc": true,
	"BatchCreate.Inline": true}

// decodedTypes lists the types of the message files that have a Decode
// method.
func decodedTypes(t *testing.T) []string {
	t.Helper()
	var out []string
	fset := token.NewFileSet()
	for _, name := range []string{"meta_msgs.go", "store_msgs.go", "member_msgs.go", "mirror_msgs.go", "deleg_msgs.go"} {
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv == nil || fn.Name.Name != "Decode" {
				continue
			}
			typ := fn.Recv.List[0].Type
			if s, ok := typ.(*ast.StarExpr); ok {
				typ = s.X
			}
			out = append(out, typ.(*ast.Ident).Name)
		}
	}
	sort.Strings(out)
	return out
}

// TestMessageSamplesExhaustive: every type with a Decode method in the
// message files has samples, so a new message type cannot go untested.
func TestMessageSamplesExhaustive(t *testing.T) {
	samples := messageSamples()
	withDecode := decodedTypes(t)
	if len(withDecode) < 50 {
		t.Fatalf("found only %d types with Decode methods: %v", len(withDecode), withDecode)
	}
	for _, name := range withDecode {
		if len(samples[name]) == 0 {
			t.Errorf("%s has a Decode method but no sample in messageSamples", name)
		}
	}
	for name, ms := range samples {
		for _, m := range ms {
			if got := reflect.TypeOf(m).Elem().Name(); got != name {
				t.Errorf("sample of %s is a %s", name, got)
			}
		}
	}
}

// TestMessageSamplesSetEveryField: for every message type, each field on
// the wire is non-zero in some sample, so that dropping it from Encode or
// Decode fails TestMessagesRoundTripEveryType.
func TestMessageSamplesSetEveryField(t *testing.T) {
	for name, ms := range messageSamples() {
		if len(ms) == 0 {
			continue
		}
		typ := reflect.TypeOf(ms[0]).Elem()
		for i := 0; i < typ.NumField(); i++ {
			f := typ.Field(i)
			if notOnWire[name+"."+f.Name] {
				continue
			}
			set := false
			for _, m := range ms {
				set = set || !reflect.ValueOf(m).Elem().Field(i).IsZero()
			}
			if !set {
				t.Errorf("%s.%s is zero in every sample", name, f.Name)
			}
		}
	}
}

// TestMessagesRoundTripEveryType decodes every sample into a fresh value
// and compares the structs; re-encoding gives the same bytes.
func TestMessagesRoundTripEveryType(t *testing.T) {
	for name, ms := range messageSamples() {
		for _, m := range ms {
			b := Marshal(m)
			fresh := reflect.New(reflect.TypeOf(m).Elem()).Interface().(Message)
			if err := Unmarshal(b, fresh); err != nil {
				t.Errorf("%s: decode: %v", name, err)
				continue
			}
			if !reflect.DeepEqual(fresh, m) {
				t.Errorf("%s: round trip gives\n%+v\nwant\n%+v", name, fresh, m)
			}
			if !bytes.Equal(Marshal(fresh), b) {
				t.Errorf("%s: re-encoding differs", name)
			}
		}
	}
}

// sampleTypes is the sorted names of messageSamples, for fuzz targets to
// pick a type by number.
func sampleTypes() ([]string, map[string][]Message) {
	samples := messageSamples()
	names := make([]string, 0, len(samples))
	for name := range samples {
		names = append(names, name)
	}
	sort.Strings(names)
	return names, samples
}

// FuzzDecode feeds every message decoder (which picks the type): none may
// panic, and what decodes re-encodes to bytes that decode to an equal
// value (non-canonical varints may decode, so the bytes may differ).
func FuzzDecode(f *testing.F) {
	names, samples := sampleTypes()
	for i, name := range names {
		for _, m := range samples[name] {
			f.Add(uint8(i), Marshal(m))
		}
	}
	f.Fuzz(func(t *testing.T, which uint8, b []byte) {
		name := names[int(which)%len(names)]
		m := newLike(samples[name][0])
		if Unmarshal(b, m) != nil {
			return
		}
		again := newLike(m)
		if err := Unmarshal(Marshal(m), again); err != nil || !reflect.DeepEqual(again, m) {
			t.Fatalf("%s: %+v re-decodes to %+v, %v", name, m, again, err)
		}
	})
}
