#!/bin/sh
# Assembles the kproxy image's root filesystem in $1 from the `tools` stage of deploy/Containerfile
# (a Debian slim with iptables installed): only what kproxy runs, and the libraries those need.
#
# What kproxy runs besides itself: the iptables tools of both backends (iptables mode, its
# backend detection, and removing kube-proxy's iptables leftovers in any mode). Everything else
# (nf_tables, IPVS, conntrack, links, ip sets) it speaks over netlink. No shell, no package
# manager, no coreutils: the image has nothing to exec into.
set -eu
root=$1
lib=/usr/lib/x86_64-linux-gnu
mkdir -p "$root/usr/sbin" "$root/usr/local/bin" "$root$lib/xtables" "$root/usr/lib64" "$root/etc" "$root/run" "$root/tmp"
chmod 1777 "$root/tmp"
# Merged /usr, as Debian: the paths the loader and the binaries name resolve the same way.
ln -s usr/lib "$root/lib"
ln -s usr/lib64 "$root/lib64"

# The two multi-call binaries, and the names kproxy calls them by (it never uses the
# /etc/alternatives `iptables`: it picks a backend itself, as upstream's iptables-wrapper).
for multi in xtables-nft-multi xtables-legacy-multi; do
  cp -a "/usr/sbin/$multi" "$root/usr/sbin/"
done
for family in iptables ip6tables; do
  for tool in "" -save -restore; do
    ln -s xtables-nft-multi "$root/usr/sbin/$family-nft$tool"
    ln -s xtables-legacy-multi "$root/usr/sbin/$family-legacy$tool"
  done
done
# iptables' extensions are loaded at run time (-m comment, -j DNAT, ...).
cp -a "$lib/xtables/." "$root$lib/xtables/"
# xtables reads these for named protocols and ethertypes.
for f in /etc/protocols /etc/ethertypes; do
  if [ -e "$f" ]; then cp -aL "$f" "$root/etc/"; fi
done

# Every shared library the binaries and extensions link, with the loader; and kproxy's own
# (the C library, libm, libgcc_s), which the binary added later links.
libs=$(for f in /usr/sbin/xtables-nft-multi /usr/sbin/xtables-legacy-multi "$lib"/xtables/*.so; do ldd "$f"; done \
  | awk '/=> \//{print $3} /^[ \t]*\/lib64\//{print $1}' | sort -u)
for l in $libs "$lib/libgcc_s.so.1" "$lib/libm.so.6"; do
  real=$(readlink -f "$l")
  mkdir -p "$root$(dirname "$real")"
  cp -a "$real" "$root$real"
  # The name it was linked by, when that is another file than the real one (a soname link).
  named="$(readlink -f "$(dirname "$l")")/$(basename "$l")"
  if [ "$named" != "$real" ]; then
    ln -sf "$real" "$root$named"
  fi
done
echo "root:x:0:0:root:/root:/nonexistent" > "$root/etc/passwd"
echo "root:x:0:" > "$root/etc/group"
