#!/usr/bin/env bash
# Installs what building, running and testing Strata needs on a Debian machine:
# fuse3 (fusermount3, /etc/fuse.conf), fio (benchmarks), iproute2 (multi-host tests),
# nftables (the network fault tests' one-way partitions and packet loss),
# rpcbind (the NFS gateway registers with it; its test starts one),
# and a Go toolchain at least as new as go.mod asks for (from the Go module proxy,
# which serves toolchains as modules, when the machine has none or an old one).
# Idempotent: does nothing that is already done. Run as root.
set -euo pipefail
export PATH=/usr/local/bin:/usr/local/go/bin:$PATH
cd "$(dirname "$0")/.."

need_pkgs=()
command -v fusermount3 >/dev/null 2>&1 || need_pkgs+=(fuse3)
command -v fio >/dev/null 2>&1 || need_pkgs+=(fio)
command -v ip >/dev/null 2>&1 || need_pkgs+=(iproute2)
command -v nft >/dev/null 2>&1 || need_pkgs+=(nftables)
command -v curl >/dev/null 2>&1 || need_pkgs+=(curl ca-certificates)
command -v unzip >/dev/null 2>&1 || need_pkgs+=(unzip)
command -v rpcbind >/dev/null 2>&1 || [ -x /usr/sbin/rpcbind ] || need_pkgs+=(rpcbind)
if [ ${#need_pkgs[@]} -gt 0 ]; then
  echo "install-deps: apt-get install ${need_pkgs[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
fi
# Let the mount admit every user (allow_other) when not root-mounted by fusermount.
if [ -f /etc/fuse.conf ] && ! grep -q '^user_allow_other' /etc/fuse.conf; then
  echo user_allow_other >>/etc/fuse.conf
fi
[ -e /dev/fuse ] || modprobe fuse 2>/dev/null || true

want=$(awk '/^go [0-9]/{print $2; exit}' go.mod)
have=""
if command -v go >/dev/null 2>&1; then
  have=$(go env GOVERSION 2>/dev/null | sed 's/^go//')
fi
older() { # is $1 older than $2 (dotted versions)?
  [ "$1" != "$2" ] && [ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -n1)" = "$1" ]
}
if [ -z "$have" ] || older "$have" "$want"; then
  dir=/usr/local/go-$want
  if [ ! -x "$dir/bin/go" ]; then
    proxy=${GOPROXY:-https://proxy.golang.org}
    proxy=${proxy%%,*}
    url="$proxy/golang.org/toolchain/@v/v0.0.1-go$want.linux-amd64.zip"
    echo "install-deps: fetching Go $want toolchain from the module proxy" >&2
    tmp=$(mktemp -d)
    curl -fsSL "$url" -o "$tmp/go.zip"
    unzip -q "$tmp/go.zip" -d "$tmp"
    mkdir -p "$dir"
    cp -a "$tmp"/golang.org/toolchain@*/. "$dir/"
    chmod +x "$dir"/bin/* "$dir"/pkg/tool/*/* 2>/dev/null || true
    rm -rf "$tmp"
  fi
  ln -sf "$dir/bin/go" /usr/local/bin/go
  ln -sf "$dir/bin/gofmt" /usr/local/bin/gofmt
fi
