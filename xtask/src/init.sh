#!/bin/sh
# PID 1 of the guest (busybox sh). It loads modules, mounts the host's root filesystem read-only
# over virtio-9p with a tmpfs overlay on top, runs /run/kproxy/run.sh chrooted into it with the
# output on ttyS1 (streamed to the host) and reports the exit status on the console (ttyS0).
# The overlay is moved onto / (as switch_root does) so that it is the mount namespace's root: a
# process joining a mount namespace starts at that root, so `runc exec` (kubectl exec) would
# otherwise land in this initramfs instead of its container. The chroot into the overlay happens
# in a child, never in PID 1: kernel threads share PID 1's root, which stays on the (now covered)
# initramfs, where the kernel's module autoloader must keep finding /sbin/modprobe.
export PATH=/sbin:/bin HOME=/
mount -t devtmpfs devtmpfs /dev
exec </dev/null >/dev/console 2>&1
mount -t proc proc /proc
mount -t sysfs sysfs /sys
echo "KPROXY-GUEST-BOOTED uptime=$(cut -d' ' -f1 /proc/uptime)"
grep -q kproxy.probe /proc/cmdline && poweroff -f
fail() { echo "KPROXY-GUEST-SETUP-FAILED: $*"; poweroff -f; }
stty -F /dev/ttyS1 raw -echo || fail "stty ttyS1"
hostname kproxy-guest
ip link set lo up
for module in @PRELOAD@; do
  modprobe "$module" || echo "kproxy-guest: modprobe $module failed"
done
mkdir -p /lower /upper /newroot /share
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144,cache=loose,ro hostroot /lower || fail "mount host root"
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 kproxyrun /share || fail "mount run share"
mount -t tmpfs -o mode=0755 tmpfs /upper || fail "mount overlay tmpfs"
mkdir -p /upper/data /upper/work
mount -t overlay overlay -o lowerdir=/lower,upperdir=/upper/data,workdir=/upper/work /newroot \
  || fail "mount overlay"
mount -t proc proc /newroot/proc
mount -t sysfs sysfs /newroot/sys
mount -t devtmpfs devtmpfs /newroot/dev
mkdir -p /newroot/dev/pts /newroot/dev/shm
mount -t devpts devpts /newroot/dev/pts
mount -t tmpfs tmpfs /newroot/dev/shm
mount -t tmpfs -o mode=0755 tmpfs /newroot/run
mkdir -p /newroot/run/kproxy /newroot/usr/lib/modules/@RELEASE@
mount --bind /share /newroot/run/kproxy
mount --bind /lib/modules/@RELEASE@ /newroot/usr/lib/modules/@RELEASE@
# After the move, `.` (this shell's working directory) is the only way into the overlay: absolute
# paths still resolve from PID 1's root, the initramfs.
cd /newroot && mount --move . / || fail "move the overlay onto /"
echo "KPROXY-GUEST-READY uptime=$(cut -d' ' -f1 /proc/uptime)"
if grep -q kproxy.notty /proc/cmdline; then
  # The host's stdout is no terminal: don't let the command see one (colours, pagers).
  set -o pipefail
  chroot . /bin/sh /run/kproxy/run.sh </dev/null 2>&1 | cat >/dev/ttyS1
  rc=$?
else
  chroot . /bin/sh /run/kproxy/run.sh </dev/null >/dev/ttyS1 2>&1
  rc=$?
fi
echo "KPROXY-GUEST-EXIT=$rc uptime=$(cut -d' ' -f1 /proc/uptime)"
poweroff -f
