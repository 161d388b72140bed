#!/usr/bin/env bash
# An emulated aarch64 board: a Debian bookworm arm64 root filesystem run under qemu user-mode
# emulation, with an sshd and a Python that has numpy, onnx, onnxruntime, onnxslim and the TVM
# runtime (the aarch64 wheels from PyPI). edgesplit profiles it and runs bundles on it over SSH
# as on a real Raspberry Pi; its timings are an emulator's, and profiles made there say so.
#
#   scripts/arm64-board.sh check               can this machine run the board? (exit 0 yes, 3 no)
#   scripts/arm64-board.sh build               build it once (a no-op when the cache is current)
#   scripts/arm64-board.sh start STATE [PORT]  its sshd on 127.0.0.1:PORT (default 2222), in the
#                                              foreground until stopped (Ctrl-C or SIGTERM)
#
# Environment:
#   EDGESPLIT_BOARD_DIR     the cached board (default ~/.cache/edgesplit/arm64-board)
#   EDGESPLIT_BOARD_MIRROR  the Debian mirror (default: this machine's apt source for bookworm)
#   PYTHON                  the host Python whose pip fetches the wheels, and whose installed
#                           versions of them are used (default: .venv/bin/python, else python3)
#
# Needs root (debootstrap, chroot, mounts), binfmt_misc (mounted here when it is not) and the
# Debian packages qemu-user-static, binfmt-support, debootstrap, openssh-client and
# gcc-aarch64-linux-gnu (the cross compiler of the board's TVM parts); `build` installs the ones
# that are missing. Cheap by design: --variant=minbase plus python3, openssh-server and procps,
# and the Python wheels installed from the host (pip --platform --target), never by a pip that
# runs under emulation. `start` keeps the cache read-only: the board runs in its own mount and pid
# namespaces, with /tmp, /run and /board (STATE: keys, sshd_config, log) mounted over it, so
# several boards can share one cache and nothing is left mounted when it stops.
set -euo pipefail
HERE=$(cd "$(dirname "$0")/.." && pwd)
BOARD=${EDGESPLIT_BOARD_DIR:-$HOME/.cache/edgesplit/arm64-board}
ROOT=$BOARD/root
APT_PACKAGES=(qemu-user-static binfmt-support debootstrap openssh-client gcc-aarch64-linux-gnu)
# What the board's Python gets; versions are those installed on the host (see constraints()).
WHEELS=(numpy onnx onnxruntime onnxslim apache-tvm apache-tvm-ffi pyyaml psutil)
PYVER=3.11

say() { echo "arm64-board: $*" >&2; }
die() { say "$*"; exit 2; }
# Exit 3: this machine cannot run the board (the tests skip on it); any other failure is 1 or 2.
cannot() { say "$*"; exit 3; }

host_python() {
  if [ -n "${PYTHON:-}" ]; then echo "$PYTHON"
  elif [ -x "$HERE/.venv/bin/python" ]; then echo "$HERE/.venv/bin/python"
  else echo python3; fi
}

# Why this machine cannot run the board, or nothing. Fixes what it can (mounts binfmt_misc,
# enables qemu-aarch64) when it is allowed to ($1 = fix).
problems() {
  [ "$(id -u)" = 0 ] || { echo "not root (debootstrap, chroot and mounts need root)"; return; }
  [ "$(uname -m)" = x86_64 ] || { echo "the host is $(uname -m), not x86_64"; return; }
  local bm=/proc/sys/fs/binfmt_misc
  if [ ! -e $bm/status ]; then
    if [ "${1:-}" = fix ]; then mount -t binfmt_misc none $bm 2>/dev/null || true; fi
    [ -e $bm/status ] || { echo "binfmt_misc is not mounted and cannot be (mount -t binfmt_misc none $bm)"; return; }
  fi
  if [ ! -e $bm/qemu-aarch64 ] && [ "${1:-}" = fix ] && command -v update-binfmts >/dev/null; then
    update-binfmts --enable qemu-aarch64 >/dev/null 2>&1 || true
  fi
  if [ "${1:-}" = fix ] && [ -e $bm/qemu-aarch64 ] && ! grep -q '^enabled' $bm/qemu-aarch64; then
    update-binfmts --enable qemu-aarch64 >/dev/null 2>&1 || true
  fi
  if [ ! -e $bm/qemu-aarch64 ]; then
    echo "qemu-aarch64 is not registered with binfmt_misc (apt-get install qemu-user-static binfmt-support)"
    return
  fi
  grep -q '^enabled' $bm/qemu-aarch64 || { echo "binfmt_misc has qemu-aarch64 disabled"; return; }
  # F: the kernel opens the interpreter once, so it works inside the chroot without a copy there.
  grep -q '^flags:.*F' $bm/qemu-aarch64 || echo "binfmt_misc's qemu-aarch64 lacks the F flag (qemu-user-static registers it with F)"
}

# Builds replace the cache; running boards use it. A build takes the lock alone, each running
# board shares it (its fd 9 stays open in the board's processes until they end).
lock() {
  mkdir -p "$(dirname "$BOARD")"
  exec 9>>"$BOARD.lock"
  if [ "$1" = exclusive ]; then
    flock -w 3600 9 || die "$BOARD is in use by running boards or another build (waited an hour)"
  else
    flock -s -w 3600 9 || die "$BOARD is being rebuilt (waited an hour)"
  fi
}

install_packages() {
  local need=() p
  for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || need+=("$p")
  done
  [ ${#need[@]} -eq 0 ] && return
  command -v apt-get >/dev/null || die "missing ${need[*]} and there is no apt-get"
  say "apt-get install ${need[*]}"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}") >/dev/null \
    || die "could not apt-get install ${need[*]}"
}

# The first Debian URI this machine's apt uses for bookworm (deb822 or one-line form).
mirror() {
  if [ -n "${EDGESPLIT_BOARD_MIRROR:-}" ]; then echo "$EDGESPLIT_BOARD_MIRROR"; return; fi
  local uri
  uri=$(awk '/^URIs:/{u=$2} /^Suites:.*\<bookworm\>/{if(u){print u; exit}}' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
  [ -n "$uri" ] || uri=$(awk '$1=="deb" && $3=="bookworm"{print $2; exit}' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null || true)
  echo "${uri:-http://deb.debian.org/debian}"
}

# Pins for the board's wheels: the versions installed in the host's Python, so the board runs
# what the host compiled and profiled with.
constraints() {
  "$(host_python)" -m pip freeze --exclude-editable 2>/dev/null | grep -E '^[A-Za-z0-9_.-]+==' || true
}

# What the cached board was built from: the build's code (without comments, as bash prints
# it), the wheel list and their pinned versions. Editing `start` or a comment rebuilds nothing.
stamp() {
  { declare -f build slim; echo "${WHEELS[*]} $PYVER"; constraints; } | sha256sum | cut -c1-16
}

build() {
  [ "$(id -u)" = 0 ] || cannot "this machine cannot run the board: not root (debootstrap, chroot and mounts need root)"
  install_packages
  local why; why=$(problems fix)
  [ -z "$why" ] || cannot "this machine cannot run the board: $why"
  lock exclusive
  local want; want=$(stamp)
  if [ "$(cat "$BOARD/stamp" 2>/dev/null)" = "$want" ] && [ -x "$ROOT/usr/bin/python3" ]; then
    say "up to date: $BOARD"
    return
  fi
  local t0=$SECONDS tmp="$BOARD.build.$$"
  rm -rf "$tmp"; mkdir -p "$tmp"
  trap 'rm -rf "$tmp"' EXIT
  # One stage: debootstrap's own work (resolving, parsing the package lists with perl) runs
  # natively and only dpkg runs under qemu (its second stage alone, all under qemu, took over
  # 15 minutes here). dpkg is told not to fsync every file, from a config placed before it is
  # unpacked; it is removed afterwards.
  say "debootstrap arm64 bookworm (minbase) from $(mirror) into $tmp"
  mkdir -p "$tmp/root/etc/dpkg/dpkg.cfg.d"
  echo force-unsafe-io >"$tmp/root/etc/dpkg/dpkg.cfg.d/edgesplit-unsafe-io"
  if ! debootstrap --arch=arm64 --variant=minbase --include=python3,openssh-server,procps \
      bookworm "$tmp/root" "$(mirror)" >"$tmp/debootstrap.log" 2>&1; then
    tail -20 "$tmp/debootstrap.log" >&2
    die "debootstrap failed (log above)"
  fi
  rm -f "$tmp/root/etc/dpkg/dpkg.cfg.d/edgesplit-unsafe-io"
  say "debootstrap took $((SECONDS - t0)) s; installing wheels from the host's pip"
  local t1=$SECONDS cons="$tmp/constraints.txt" py; py=$(host_python)
  constraints >"$cons"
  local plat=() p
  for p in manylinux_2_36 manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 manylinux_2_26 \
           manylinux_2_24 manylinux_2_17 manylinux2014; do plat+=(--platform "${p}_aarch64"); done
  # pip byte-compiles with the host's Python: the same 3.11 bytecode the board would make, made
  # natively instead of on the board's first import under emulation.
  if ! "$py" -m pip install -q --disable-pip-version-check "${plat[@]}" \
      --only-binary=:all: --implementation cp --python-version "$PYVER" --abi "cp${PYVER/./}" \
      --target "$tmp/root/usr/local/lib/python$PYVER/dist-packages" -c "$cons" "${WHEELS[@]}" \
      >"$tmp/pip.log" 2>&1; then
    grep -v '^WARNING: Location' "$tmp/pip.log" | tail -20 >&2
    die "pip could not install the aarch64 wheels (log above)"
  fi
  say "wheels took $((SECONDS - t1)) s"
  slim "$tmp/root"
  mkdir -p "$tmp/root/board"
  say "checking the board's Python (under qemu)"
  # (onnxruntime warns that its cpuinfo cannot read /sys: the chroot has none; see start)
  if ! chroot "$tmp/root" /usr/bin/python3 -c "import platform, numpy, onnxruntime, tvm
from tvm.runtime.vm import VirtualMachine
assert platform.machine() == 'aarch64', platform.machine()
print('board: python', platform.python_version(), 'numpy', numpy.__version__, 'onnxruntime', onnxruntime.__version__, 'tvm', tvm.__version__)" \
      >"$tmp/check.log" 2>&1; then
    grep -v cpuinfo "$tmp/check.log" | tail -20 >&2
    die "the board's Python cannot import its modules (above)"
  fi
  grep '^board:' "$tmp/check.log" >&2
  rm -rf "$BOARD/root" "$BOARD/stamp"
  mkdir -p "$BOARD"
  mv "$tmp/root" "$ROOT"
  echo "$want" >"$BOARD/stamp"
  rm -rf "$tmp"; trap - EXIT
  say "built $BOARD in $((SECONDS - t0)) s, $(du -sh "$ROOT" | cut -f1)"
}

# What the board never uses: TVM's compiler (240 MB; the board runs compiled parts, and
# without it `import tvm` loads the runtime only: 4x faster under qemu), apt's caches and lists,
# docs, manuals, locales, and the host keys the package made (each start makes its own).
slim() {
  local r=$1
  rm -f "$r"/usr/local/lib/python$PYVER/dist-packages/tvm/lib/libtvm_compiler.so
  rm -rf "$r"/var/cache/apt/archives/*.deb "$r"/var/cache/apt/*.bin "$r"/var/lib/apt/lists/* \
    "$r"/usr/share/doc/* "$r"/usr/share/man/* "$r"/usr/share/info/* "$r"/usr/share/locale/* \
    "$r"/etc/ssh/ssh_host_*
}

start() {
  local state=${1:?usage: arm64-board.sh start STATE_DIR [PORT]} port=${2:-2222}
  local why; why=$(problems fix)
  [ -z "$why" ] || cannot "this machine cannot run the board: $why"
  lock shared
  [ -x "$ROOT/usr/sbin/sshd" ] || die "no board at $BOARD: run scripts/arm64-board.sh build first"
  mkdir -p "$state/tmp"
  state=$(cd "$state" && pwd)
  chmod 700 "$state"; chmod 1777 "$state/tmp"
  [ -f "$state/host_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C arm64-board-host -f "$state/host_ed25519"
  [ -f "$state/client_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C arm64-board-client -f "$state/client_ed25519"
  cp "$state/client_ed25519.pub" "$state/authorized_keys"
  echo "[127.0.0.1]:$port $(cut -d' ' -f1,2 "$state/host_ed25519.pub")" >"$state/known_hosts"
  cat >"$state/sshd_config" <<EOF
Port $port
ListenAddress 127.0.0.1
HostKey /board/host_ed25519
PidFile /run/sshd.pid
AuthorizedKeysFile /board/authorized_keys
StrictModes no
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
MaxStartups 20
Subsystem sftp internal-sftp
LogLevel VERBOSE
EOF
  say "sshd on 127.0.0.1:$port; connect with:"
  say "  ssh -i $state/client_ed25519 -o UserKnownHostsFile=$state/known_hosts -p $port root@127.0.0.1"
  say "  edgesplit profile MODEL --remote root@127.0.0.1:$port --identity $state/client_ed25519 --known-hosts $state/known_hosts --device raspberry-pi5"
  # No /sys: with it, onnxruntime's cpuinfo reads the host's x86 /proc/cpuinfo as an Arm one and
  # segfaults while importing (onnxruntime 1.32, qemu 7.2); without it, it warns and runs.
  # A private mount namespace (its mounts vanish with it), its own host name, and a pid
  # namespace whose init is the board's sshd: when it dies, every process of the board dies
  # with it. unshare itself ignores
  # SIGINT and SIGTERM while it waits, and sshd as a namespace's init ignores SIGINT, so this
  # shell stays in front and turns Ctrl-C, SIGTERM and SIGHUP into a SIGTERM for sshd.
  unshare --mount --propagation private --pid --uts --fork --kill-child -- /bin/sh -euc '
    root=$1 state=$2
    hostname arm64-board
    mount -t proc proc "$root/proc"
    mount --rbind /dev "$root/dev"
    mount -t tmpfs -o mode=755 tmpfs "$root/run"
    mkdir -p "$root/run/sshd"
    mount --bind "$state" "$root/board"
    mount --bind "$state/tmp" "$root/tmp"
    exec chroot "$root" /usr/sbin/sshd -D -f /board/sshd_config -E /board/sshd.log
  ' board "$ROOT" "$state" &
  local upid=$!
  trap 'kill -TERM $(cat /proc/'"$upid"'/task/'"$upid"'/children 2>/dev/null) 2>/dev/null || true' INT TERM HUP
  local rc=0
  wait "$upid" || rc=$?
  if [ "$rc" -gt 128 ] && kill -0 "$upid" 2>/dev/null; then  # a signal stopped the wait: stopping
    wait "$upid" || true
    rc=0
  fi
  if [ "$rc" != 0 ]; then tail -3 "$state/sshd.log" >&2 2>/dev/null || true; say "sshd ended (exit $rc)"; fi
  return "$rc"
}

main() {
  case "${1:-}" in
    check)
      local why; why=$(problems fix)
      [ -z "$why" ] || cannot "this machine cannot run the board: $why"
      say "this machine can run the board ($BOARD $([ -f "$BOARD/stamp" ] && echo built || echo 'not built'))"
      ;;
    build) build ;;
    start) shift; start "$@" ;;
    *) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
  esac
}

# One line, read whole before it runs: editing this file while a build runs cannot derail it.
main "$@"; exit $?
