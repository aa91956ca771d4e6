package nfs

import (
	"bytes"
	"context"
	"path"
	"slices"
	"strings"
	"syscall"

	"github.com/stratafs/strata/internal/nfs/oncrpc"
	"github.com/stratafs/strata/internal/nfs/xdr"
	"github.com/stratafs/strata/internal/rpc"
)

// mountProgram is MOUNT v3 (RFC 1813 appendix I).
func (s *Server) mountProgram() *oncrpc.Program {
	return &oncrpc.Program{Prog: mountProgram, Vers: mountVersion, Name: "mount", Procs: []oncrpc.Proc{
		0: nullProc,
		1: serve(xdr.XDR_Dirpath, xdr.XDR_Mountres3, s.mnt),
		2: s.dump,
		3: serveVoid(xdr.XDR_Dirpath, s.umnt),
		4: s.umntall,
		5: s.export,
	}}
}

// exportOf finds the export a MNT path is in: the export of that path, or
// of its nearest ancestor (a client may mount a directory inside an
// export, as with knfsd). The path must be absolute: libnfs sends "" for
// nfs://HOST/FILE, and treating it as "/" makes libnfs take "/" for an
// export nested in "" (MNT3ERR_NOENT, as knfsd answers; nfs://HOST//FILE
// works).
func (s *Server) exportOf(p string) (*Export, string) {
	if !strings.HasPrefix(p, "/") {
		return nil, ""
	}
	p = path.Clean(p)
	for dir := p; ; dir = path.Dir(dir) {
		if e := s.byPath[dir]; e != nil {
			return e, p
		}
		if dir == "/" {
			return nil, ""
		}
	}
}

// mnt checks the caller against the export's allow-list and answers the
// handle of the directory asked for. A caller not on the list gets
// MNT3ERR_ACCES and nothing else.
func (s *Server) mnt(ctx context.Context, call *oncrpc.Call, p *xdr.Dirpath) *xdr.Mountres3 {
	res := &xdr.Mountres3{}
	e, dir := s.exportOf(*p)
	if e == nil {
		res.Fhs_status = xdr.MNT3ERR_NOENT
		return res
	}
	if !e.allows(call.Remote) {
		s.log.Warn("nfs: mount refused: client not allowed", "client", call.Remote, "export", e.Path)
		res.Fhs_status = xdr.MNT3ERR_ACCES
		return res
	}
	a, err := s.c.ResolvePath(ctx, dir)
	if err != nil {
		res.Fhs_status = mountStatus(err)
		s.log.Warn("nfs: mount: resolving the path", "path", dir, "export", e.Path, "err", err)
		return res
	}
	if a.Mode&syscall.S_IFMT != syscall.S_IFDIR {
		res.Fhs_status = xdr.MNT3ERR_NOTDIR
		return res
	}
	s.mu.Lock()
	s.mu.mounts[mountKey{host: call.Remote.Addr().String(), path: dir}] = struct{}{}
	if dir == e.Path {
		s.mu.roots[e.id()] = a.Ino
	}
	s.mu.Unlock()
	res.Fhs_status = xdr.MNT3_OK
	ok := res.Mountinfo()
	ok.Fhandle = s.handleOf(e, a.Ino)
	ok.Auth_flavors = []int32{int32(xdr.AUTH_SYS)}
	s.log.Info("nfs: mounted", "client", call.Remote, "path", dir, "export", e.Path)
	return res
}

func mountStatus(err error) xdr.Mountstat3 {
	switch rpc.ErrnoOf(err) {
	case syscall.ENOENT:
		return xdr.MNT3ERR_NOENT
	case syscall.ENOTDIR:
		return xdr.MNT3ERR_NOTDIR
	case syscall.EACCES:
		return xdr.MNT3ERR_ACCES
	case syscall.ENAMETOOLONG:
		return xdr.MNT3ERR_NAMETOOLONG
	default:
		return xdr.MNT3ERR_IO
	}
}

// umnt forgets a mount (DUMP stops listing it).
func (s *Server) umnt(ctx context.Context, call *oncrpc.Call, p *xdr.Dirpath) {
	s.mu.Lock()
	delete(s.mu.mounts, mountKey{host: call.Remote.Addr().String(), path: path.Clean(*p)})
	s.mu.Unlock()
}

func (s *Server) umntall(ctx context.Context, call *oncrpc.Call, args []byte, res *bytes.Buffer) error {
	host := call.Remote.Addr().String()
	s.mu.Lock()
	for k := range s.mu.mounts {
		if k.host == host {
			delete(s.mu.mounts, k)
		}
	}
	s.mu.Unlock()
	return nil
}

// dump lists the mounts MNT recorded (and UMNT has not removed) since this
// gateway started.
func (s *Server) dump(ctx context.Context, call *oncrpc.Call, args []byte, res *bytes.Buffer) error {
	s.mu.Lock()
	keys := make([]mountKey, 0, len(s.mu.mounts))
	for k := range s.mu.mounts {
		keys = append(keys, k)
	}
	s.mu.Unlock()
	slices.SortFunc(keys, func(a, b mountKey) int { return strings.Compare(a.host+" "+a.path, b.host+" "+b.path) })
	var list xdr.Mountlist
	for i := len(keys) - 1; i >= 0; i-- {
		list = &xdr.Mountbody{Ml_hostname: keys[i].host, Ml_directory: keys[i].path, Ml_next: list}
	}
	return xdr.Encode(res, xdr.XDR_Mountlist(&list))
}

// export lists the exports the caller may mount, with their clients. An
// export whose directory does not exist (yet) is left out: libnfs mounts
// the exports nested in the one it mounts, and fails on one it cannot.
func (s *Server) export(ctx context.Context, call *oncrpc.Call, args []byte, res *bytes.Buffer) error {
	var list xdr.Exports
	for i := len(s.cfg.Exports) - 1; i >= 0; i-- {
		e := &s.cfg.Exports[i]
		if !e.allows(call.Remote) {
			continue
		}
		if a, err := s.c.ResolvePath(ctx, e.Path); err != nil || a.Mode&syscall.S_IFMT != syscall.S_IFDIR {
			s.log.Debug("nfs: EXPORT leaves out an export without its directory", "export", e.Path, "err", err)
			continue
		}
		var groups xdr.Groups
		for j := len(e.ClientsText) - 1; j >= 0; j-- {
			groups = &xdr.Groupnode{Gr_name: e.ClientsText[j], Gr_next: groups}
		}
		list = &xdr.Exportnode{Ex_dir: e.Path, Ex_groups: groups, Ex_next: list}
	}
	return xdr.Encode(res, xdr.XDR_Exports(&list))
}
