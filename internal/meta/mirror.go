package meta

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"syscall"

	"github.com/stratafs/strata/internal/kv"
	"github.com/stratafs/strata/internal/layout"
	"github.com/stratafs/strata/internal/meta/schema"
	"github.com/stratafs/strata/internal/rpc"
)

// Mirror groups in the replicated state (docs/design/0014): the apply
// functions of the opMirror* commands. Each checks everything before it
// writes, and every change of a group's primary or state bumps its epoch.
//
// States and transitions:
//
//	create              → in_sync (epoch 1; a new group holds no chunk yet)
//	planned fail-over   in_sync → in_sync, primary and secondary swapped
//	automatic fail-over in_sync → degraded, swapped (the old primary is dead)
//	secondary lost      in_sync | resyncing → degraded (the primary's report,
//	                    or the leader: the secondary's server is silent)
//	secondary back      degraded → resyncing (its server heartbeats again)
//	primary's disk      in_sync → degraded, swapped, FullResync set (the
//	failed              primary's report MirrorPrimaryFailed: its own copy
//	                    failed a write or sync with a disk error that the
//	                    secondary's did not; the failed copy, now the
//	                    secondary, is copied whole by the resync). Not in
//	                    sync: EIO, the only current copy failed
//	resync done         resyncing → in_sync (the primary's report; clears
//	                    FullResync)
//	replace             degraded | resyncing → degraded with the new target
//	                    as secondary; its server's next heartbeat starts a
//	                    full resync (the primary sees a secondary it never
//	                    copied to: the target id changed)

// opMirrorCreate flags.
const (
	mirrorAuto     = 1 << 0 // pair every unpaired target
	mirrorByDomain = 1 << 1 // … across failure domains
)

// opMirrorFailOver flags.
const mirrorAutomatic = 1 << 0 // the leader's switch: the primary's server is silent

// groupErr is the errno answer about group id.
func noGroup(id uint32) error {
	return rpc.Errorf(syscall.ENOENT, "no mirror group %d (strata mirror list shows them)", id)
}

// group reads group id (ENOENT if there is none).
func (x *opCtx) group(id uint32) (schema.Group, error) {
	v, err := x.b.Get(schema.GroupKey(id))
	if errors.Is(err, kv.ErrNotFound) {
		return schema.Group{}, noGroup(id)
	}
	if err != nil {
		return schema.Group{}, fmt.Errorf("read mirror group %d: %w", id, err)
	}
	g, err := schema.DecodeGroup(v)
	if err != nil {
		return schema.Group{}, rpc.Errorf(syscall.EIO, "mirror group %d: %v", id, err)
	}
	return g, nil
}

func (x *opCtx) putGroup(g *schema.Group) error {
	return x.b.Set(schema.GroupKey(g.ID), schema.AppendGroup(nil, g))
}

// readGroups lists every group of r in id order.
func readGroups(r kv.Reader) ([]schema.Group, error) {
	return readRecords(r, schema.GroupPrefix(), schema.DecodeGroup, "mirror group")
}

// readTargets lists every registered target of r in id order.
func readTargets(r kv.Reader) ([]schema.Target, error) {
	return readRecords(r, schema.TargetPrefix(), schema.DecodeTarget, "target")
}

// readServers lists every registered storage server of r in id order.
func readServers(r kv.Reader) ([]schema.Server, error) {
	return readRecords(r, schema.ServerPrefix(), schema.DecodeServer, "server")
}

// readRecords decodes every record of r under prefix p, in key order; a
// record that does not decode is EIO naming what and its key.
func readRecords[T any](r kv.Reader, p []byte, decode func([]byte) (T, error), what string) ([]T, error) {
	return scanPrefix(r, p, func(_, v []byte) (T, error) { return decode(v) }, what+" record")
}

// readRecordKeys decodes the keys under prefix p.
func readRecordKeys[T any](r kv.Reader, p []byte, decode func([]byte) (T, error), what string) ([]T, error) {
	return scanPrefix(r, p, func(k, _ []byte) (T, error) { return decode(k) }, what+" key")
}

// scanPrefix decodes every key and value under prefix p, in key order.
func scanPrefix[T any](r kv.Reader, p []byte, decode func(k, v []byte) (T, error), what string) ([]T, error) {
	it, err := r.NewIter(p, kv.PrefixEnd(p))
	if err != nil {
		return nil, err
	}
	defer it.Close()
	var out []T
	for ok := it.First(); ok; ok = it.Next() {
		v, err := decode(it.Key(), it.Value())
		if err != nil {
			return nil, rpc.Errorf(syscall.EIO, "%s %x: %v", what, it.Key(), err)
		}
		out = append(out, v)
	}
	return out, it.Error()
}

// mirrorRegistry is what pairing and its checks need of the registry.
type mirrorRegistry struct {
	targets map[uint32]schema.Target
	servers map[uint32]schema.Server
	inGroup map[uint32]uint32 // target → its group
	groups  []schema.Group
}

func (x *opCtx) mirrorRegistry() (*mirrorRegistry, error) {
	reg := &mirrorRegistry{targets: map[uint32]schema.Target{}, servers: map[uint32]schema.Server{}, inGroup: map[uint32]uint32{}}
	ts, err := readTargets(x.b)
	if err != nil {
		return nil, err
	}
	for _, t := range ts {
		reg.targets[t.ID] = t
	}
	ss, err := x.servers()
	if err != nil {
		return nil, err
	}
	for _, s := range ss {
		reg.servers[s.ID] = s
	}
	if reg.groups, err = readGroups(x.b); err != nil {
		return nil, err
	}
	for _, g := range reg.groups {
		reg.inGroup[g.Primary] = g.ID
		reg.inGroup[g.Secondary] = g.ID
	}
	return reg, nil
}

func (r *mirrorRegistry) serverOf(target uint32) schema.Server {
	return r.servers[r.targets[target].ServerID]
}

// checkPair says why targets p and s cannot form a group ("" if they can).
func (r *mirrorRegistry) checkPair(p, s uint32, byDomain bool) error {
	for _, t := range []uint32{p, s} {
		if _, ok := r.targets[t]; !ok {
			return rpc.Errorf(syscall.EINVAL, "target %d is not registered (strata status lists the targets)", t)
		}
		if g, ok := r.inGroup[t]; ok {
			return rpc.Errorf(syscall.EINVAL, "target %d is in mirror group %d already", t, g)
		}
	}
	if p == s {
		return rpc.Errorf(syscall.EINVAL, "target %d cannot mirror itself", p)
	}
	sp, ss := r.serverOf(p), r.serverOf(s)
	if sp.ID == ss.ID {
		return rpc.Errorf(syscall.EINVAL, "targets %d and %d are both on storage server %d (%s): a group's copies must be on different servers", p, s, sp.ID, sp.Addr)
	}
	if sp.Domain != "" && sp.Domain == ss.Domain {
		return rpc.Errorf(syscall.EINVAL, "targets %d and %d are both in failure domain %q (servers %s and %s)", p, s, sp.Domain, sp.Addr, ss.Addr)
	}
	if byDomain && (sp.Domain == "" || ss.Domain == "") {
		return rpc.Errorf(syscall.EINVAL, "targets %d and %d: --domain pairs only servers started with strata store --domain (servers %s %q, %s %q)", p, s, sp.Addr, sp.Domain, ss.Addr, ss.Domain)
	}
	return nil
}

// autoPairs pairs every target in no group with one on another server,
// and in another failure domain where both servers have one (byDomain:
// servers without a domain label are left out). Greedy and deterministic: the bucket (server or domain)
// with the most unpaired targets gives one to the fullest other bucket,
// preferring buckets it was paired with least, so a server's partners
// spread over the others; of each pair the primary is the target whose
// server holds fewer primaries, so primaries spread too.
func (r *mirrorRegistry) autoPairs(byDomain bool) ([]uint32, error) {
	// A server's bucket is its failure domain when it has one (labelled
	// servers are never paired within a domain, checkPair), else the
	// server itself — or none with byDomain.
	bucketOf := func(t schema.Target) string {
		if d := r.servers[t.ServerID].Domain; d != "" {
			return "d:" + d
		}
		if byDomain {
			return ""
		}
		return "s" + strconv.FormatUint(uint64(t.ServerID), 10)
	}
	buckets := map[string][]uint32{}
	labelled := false
	for _, t := range r.targets {
		if _, in := r.inGroup[t.ID]; in {
			continue
		}
		k := bucketOf(t)
		if k == "" {
			continue // byDomain: no label
		}
		labelled = true
		buckets[k] = append(buckets[k], t.ID)
	}
	if byDomain && !labelled && len(r.targets) > 0 {
		return nil, rpc.Errorf(syscall.EINVAL, "no unpaired target is on a storage server with a failure domain: start the servers with strata store --domain LABEL, or pair across servers (without --domain)")
	}
	keys := make([]string, 0, len(buckets))
	for k, ts := range buckets {
		slices.Sort(ts)
		keys = append(keys, k)
	}
	slices.Sort(keys)
	together := map[[2]string]int{}
	primaries := map[uint32]int{} // server → primaries it holds
	for _, g := range r.groups {
		primaries[r.serverOf(g.Primary).ID]++
		a, b := bucketOf(r.targets[g.Primary]), bucketOf(r.targets[g.Secondary])
		together[[2]string{a, b}]++
		together[[2]string{b, a}]++
	}
	var pairs []uint32
	for {
		a := ""
		for _, k := range keys {
			if len(buckets[k]) > 0 && (a == "" || len(buckets[k]) > len(buckets[a])) {
				a = k
			}
		}
		b := ""
		for _, k := range keys {
			if k == a || len(buckets[k]) == 0 {
				continue
			}
			if b == "" || len(buckets[k]) > len(buckets[b]) ||
				(len(buckets[k]) == len(buckets[b]) && together[[2]string{a, k}] < together[[2]string{a, b}]) {
				b = k
			}
		}
		if a == "" || b == "" {
			r.balancePrimaries(pairs, primaries)
			return pairs, nil
		}
		p, s := buckets[a][0], buckets[b][0]
		buckets[a], buckets[b] = buckets[a][1:], buckets[b][1:]
		if sp, ss := r.serverOf(p).ID, r.serverOf(s).ID; primaries[ss] < primaries[sp] || (primaries[ss] == primaries[sp] && s < p) {
			p, s = s, p
		}
		primaries[r.serverOf(p).ID]++
		together[[2]string{a, b}]++
		together[[2]string{b, a}]++
		pairs = append(pairs, p, s)
	}
}

// balancePrimaries swaps primary and secondary along chains of the new
// pairs until no server holds two primaries more than another it could
// give one to: from the server with the most, a path of pairs (primary
// on u, secondary on v) leads to a server with at least two fewer, and
// every pair on it is flipped. primaries counts every server's primaries
// (existing groups' included, which are not flipped). Deterministic.
func (r *mirrorRegistry) balancePrimaries(pairs []uint32, primaries map[uint32]int) {
	servers := make([]uint32, 0, len(r.servers))
	for id := range r.servers {
		servers = append(servers, id)
	}
	slices.Sort(servers)
	for range len(pairs) {
		hi := servers[0]
		for _, id := range servers {
			if primaries[id] > primaries[hi] {
				hi = id
			}
		}
		prev := map[uint32]int{hi: -1}
		queue, found := []uint32{hi}, uint32(0)
		for len(queue) > 0 && found == 0 {
			u := queue[0]
			queue = queue[1:]
			if primaries[u] <= primaries[hi]-2 {
				found = u
				break
			}
			for i := 0; i < len(pairs); i += 2 {
				if r.serverOf(pairs[i]).ID != u {
					continue
				}
				if v := r.serverOf(pairs[i+1]).ID; !hasKey(prev, v) {
					prev[v] = i
					queue = append(queue, v)
				}
			}
		}
		if found == 0 {
			return
		}
		for v := found; v != hi; {
			i := prev[v]
			pairs[i], pairs[i+1] = pairs[i+1], pairs[i]
			v = r.serverOf(pairs[i+1]).ID
		}
		primaries[hi]--
		primaries[found]++
	}
}

func hasKey[K comparable, V any](m map[K]V, k K) bool {
	_, ok := m[k]
	return ok
}

// mirrorCreate makes groups of the pairs asked for (or found): every
// pair is checked before any group is written; EINVAL names the first
// bad one. The answer lists the new groups (none: nothing to pair).
func (x *opCtx) mirrorCreate(c *command) (*answer, error) {
	reg, err := x.mirrorRegistry()
	if err != nil {
		return nil, err
	}
	byDomain := c.Flags&mirrorByDomain != 0
	pairs := c.Pairs
	if c.Flags&mirrorAuto != 0 {
		if len(pairs) > 0 {
			return nil, rpc.Errorf(syscall.EINVAL, "automatic pairing takes no pairs")
		}
		if pairs, err = reg.autoPairs(byDomain); err != nil {
			return nil, err
		}
	} else if len(pairs) == 0 || len(pairs)%2 != 0 {
		return nil, rpc.Errorf(syscall.EINVAL, "%d target ids: give pairs of (primary, secondary)", len(pairs))
	}
	next := uint32(1)
	if n := len(reg.groups); n > 0 {
		next = reg.groups[n-1].ID + 1
	}
	made := make([]schema.Group, 0, len(pairs)/2)
	for i := 0; i < len(pairs); i += 2 {
		p, s := pairs[i], pairs[i+1]
		if err := reg.checkPair(p, s, byDomain); err != nil {
			return nil, err
		}
		g := schema.Group{ID: next, Epoch: 1, Primary: p, Secondary: s, State: schema.GroupInSync, Since: x.now}
		if g.ID&layout.GroupBit != 0 {
			return nil, rpc.Errorf(syscall.ENOSPC, "mirror group numbers are exhausted")
		}
		next++
		reg.inGroup[p], reg.inGroup[s] = g.ID, g.ID
		made = append(made, g)
	}
	resp := &rpc.ListGroupsResp{} // the new groups alone, no map: Version 0
	for i := range made {
		if err := x.putGroup(&made[i]); err != nil {
			return nil, err
		}
		resp.Groups = append(resp.Groups, groupInfoOf(&made[i]))
	}
	x.f.groups.Add(int64(len(made)))
	return &answer{msg: resp}, nil
}

// groupInfoOf is a group on the wire without its servers' addresses and
// liveness (the handlers add those: Service.groupInfos).
func groupInfoOf(g *schema.Group) rpc.GroupInfo {
	return rpc.GroupInfo{ID: g.ID, Epoch: g.Epoch, Primary: g.Primary, Secondary: g.Secondary, State: g.State,
		SinceMs: g.Since / 1e6, ResyncDone: g.ResyncDone, ResyncTotal: g.ResyncTotal, FullResync: g.FullResync}
}

// groupAnswer answers a change of one group with it, versioned by this
// command's raft index (rpc.MapVersion: the group as of that index).
func (x *opCtx) groupAnswer(g *schema.Group) (*answer, error) {
	if err := x.putGroup(g); err != nil {
		return nil, err
	}
	return &answer{msg: &rpc.ListGroupsResp{Groups: []rpc.GroupInfo{groupInfoOf(g)}, Version: x.index}}, nil
}

// enter moves g to state st under a new epoch.
func (x *opCtx) enter(g *schema.Group, st uint8) {
	g.Epoch++
	if g.State != st {
		g.Since = x.now
	}
	g.State = st
	g.ResyncDone, g.ResyncTotal = 0, 0
}

func staleEpoch(g *schema.Group, epoch uint64) error {
	return rpc.Errorf(syscall.ESTALE, "mirror group %d is at epoch %d (%s), not %d: it changed meanwhile; read the group map again",
		g.ID, g.Epoch, rpc.GroupStateName(g.State), epoch)
}

// mirrorFailOver makes the secondary the primary. Only an in-sync
// secondary holds every acknowledged write, so only an in-sync group
// switches. A planned switch keeps it in sync (the old primary is alive
// and has everything); the leader's switch (mirrorAutomatic: the primary's
// server went silent) leaves it degraded, the old primary as the
// secondary to be resynced when it returns.
func (x *opCtx) mirrorFailOver(c *command) (*answer, error) {
	g, err := x.group(c.Group)
	if err != nil {
		return nil, err
	}
	if c.Epoch != 0 && c.Epoch != g.Epoch {
		return nil, staleEpoch(&g, c.Epoch)
	}
	if g.State != schema.GroupInSync {
		return nil, rpc.Errorf(syscall.EBUSY, "mirror group %d is %s: its secondary (target %d) lacks writes and cannot take over",
			g.ID, rpc.GroupStateName(g.State), g.Secondary)
	}
	g.Primary, g.Secondary = g.Secondary, g.Primary
	if c.Flags&mirrorAutomatic != 0 {
		x.enter(&g, schema.GroupDegraded)
	} else {
		g.Epoch++
	}
	return x.groupAnswer(&g)
}

// mirrorReport applies a store's report (rpc.MirrorReportReq) made in
// epoch c.Epoch by the server of target c.Target: only the current
// primary reports on its group, in the current epoch (an older one:
// ESTALE, the group moved on). MirrorCopyBad never comes here (the
// leader counts and logs it).
func (x *opCtx) mirrorReport(c *command) (*answer, error) {
	g, err := x.group(c.Group)
	if err != nil {
		return nil, err
	}
	switch {
	case c.Epoch < g.Epoch:
		return nil, staleEpoch(&g, c.Epoch)
	case c.Epoch > g.Epoch:
		return nil, rpc.Errorf(syscall.EINVAL, "mirror group %d is at epoch %d; a report of epoch %d is from no epoch it had", g.ID, g.Epoch, c.Epoch)
	case c.Target != g.Primary:
		return nil, rpc.Errorf(syscall.EINVAL, "target %d is not the primary of mirror group %d in epoch %d (target %d is)", c.Target, g.ID, g.Epoch, g.Primary)
	}
	switch uint8(c.Flags) {
	case rpc.MirrorSecondaryLost:
		if g.State == schema.GroupDegraded {
			return x.groupAnswer(&g) // it is already
		}
		x.enter(&g, schema.GroupDegraded)
	case rpc.MirrorPrimaryFailed:
		if g.State != schema.GroupInSync {
			return nil, rpc.Errorf(syscall.EIO, "mirror group %d is %s: the primary's copy (target %d) failed and the secondary (target %d) lacks writes; nothing to switch to",
				g.ID, rpc.GroupStateName(g.State), g.Primary, g.Secondary)
		}
		g.Primary, g.Secondary = g.Secondary, g.Primary
		x.enter(&g, schema.GroupDegraded)
		g.FullResync = true
	case rpc.MirrorResyncProgress:
		if g.State != schema.GroupResyncing {
			return nil, rpc.Errorf(syscall.EINVAL, "mirror group %d is %s, not resyncing", g.ID, rpc.GroupStateName(g.State))
		}
		g.ResyncDone, g.ResyncTotal = c.Done, c.Total
	case rpc.MirrorResyncDone:
		if g.State != schema.GroupResyncing {
			return nil, rpc.Errorf(syscall.EINVAL, "mirror group %d is %s, not resyncing", g.ID, rpc.GroupStateName(g.State))
		}
		x.enter(&g, schema.GroupInSync)
		g.FullResync = false
	default:
		return nil, rpc.Errorf(syscall.EINVAL, "unknown mirror report event %d", c.Flags)
	}
	return x.groupAnswer(&g)
}

// mirrorResync starts the resync of a degraded group whose secondary is
// back (its server heartbeats): the primary forwards new writes to it
// and copies what changed meanwhile.
func (x *opCtx) mirrorResync(c *command) (*answer, error) {
	g, err := x.group(c.Group)
	if err != nil {
		return nil, err
	}
	if c.Epoch != g.Epoch {
		return nil, staleEpoch(&g, c.Epoch)
	}
	if g.State != schema.GroupDegraded {
		return nil, rpc.Errorf(syscall.EINVAL, "mirror group %d is %s, not degraded", g.ID, rpc.GroupStateName(g.State))
	}
	x.enter(&g, schema.GroupResyncing)
	return x.groupAnswer(&g)
}

// mirrorReplace gives a group the target c.Target in place of its
// out-of-sync copy (the secondary of a degraded or resyncing group). The
// group stays degraded under a new epoch until the new target's server
// heartbeats, which starts the resync; the primary fills the new target
// completely (it never copied to it). A group in sync has no copy to
// replace: fail it over first, or let it degrade.
func (x *opCtx) mirrorReplace(c *command) (*answer, error) {
	g, err := x.group(c.Group)
	if err != nil {
		return nil, err
	}
	if g.State == schema.GroupInSync {
		return nil, rpc.Errorf(syscall.EBUSY, "mirror group %d is in sync: both copies are current, none to replace (a dead copy's group degrades within the failover timeout)", g.ID)
	}
	reg, err := x.mirrorRegistry()
	if err != nil {
		return nil, err
	}
	delete(reg.inGroup, g.Secondary) // leaving
	delete(reg.inGroup, g.Primary)   // staying: checked as the pair's other half
	if err := reg.checkPair(g.Primary, c.Target, false); err != nil {
		return nil, err
	}
	g.Secondary = c.Target
	x.enter(&g, schema.GroupDegraded)
	g.Since = x.now
	return x.groupAnswer(&g)
}

// isGroupCands reports whether a create's candidates are mirror groups.
func isGroupCands(cands []layout.Candidate) bool {
	return len(cands) > 0 && layout.IsGroup(cands[0].ID)
}
