# Sourced by the runtime fetch scripts (utils/rubyfetch, utils/phpfetch,
# utils/perlfetch):
# a runtime's Debian packages from another suite, unpacked with their
# libraries beside the system's, without touching /etc/apt or dpkg's state.
. "$(dirname "${BASH_SOURCE[0]}")/private-apt.sh"

# unpack_runtime OUT SUITE SECURITY NEW_LIBC PACKAGE...: downloads PACKAGE...
# from SUITE (one, or several separated by spaces, e.g. "sid experimental":
# the packages then come from the last), with its -security suite if
# SECURITY is 1, plus two levels of their lib* runtime dependencies (libc6
# too if NEW_LIBC is 1: the newer suites' builds need glibc >= 2.38, Debian
# 12 has 2.36; none if RUNTIME_LIBDEPS is 0) and the packages
# RUNTIME_EXTRA_LIBS names (from the suite's default release), into OUT/debs, and unpacks them all into OUT/root. apt's
# lists are kept in OUT's parent, per suite and architecture. RUNTIME_ARCH
# (default amd64) picks the Debian architecture: a foreign one (arm64 for
# the kernel matrix's VMs) is unpacked, never run here.
RUNTIME_ARCH=${RUNTIME_ARCH:-amd64}
unpack_runtime() {
  local out=$1 suite=$2 security_on=$3 new_libc=$4 mirror security="" rel="" p
  shift 4
  local core="$*"
  mkdir -p "$out/debs"
  mirror=$(debian_mirror) || return 1
  [ "$security_on" = 1 ] && security="${mirror%/debian}/debian-security"
  private_apt "$(dirname "$out")/apt-${suite// /-}-$RUNTIME_ARCH" "$RUNTIME_ARCH" "$suite" $security || {
    echo "no apt lists for $suite" >&2
    return 1
  }
  case $suite in *" "*) rel=/${suite##* } ;; esac
  local l1 libs
  if [ "${RUNTIME_LIBDEPS:-1}" = 0 ]; then
    libs=$(printf '%s\n' ${RUNTIME_EXTRA_LIBS:-} | sort -u)
  else
    l1=$(runtime_libdeps $core)
    libs=$(printf '%s\n' $l1 $(runtime_libdeps $l1) ${RUNTIME_EXTRA_LIBS:-} | sort -u)
  fi
  [ "$new_libc" = 1 ] || libs=$(printf '%s\n' $libs | grep -v '^libc6$' || true)
  (cd "$out/debs" && apt-get -q download $(for p in $core; do echo "$p$rel"; done) $libs >&2) || {
    echo "downloading $core $(echo $libs) failed" >&2
    return 1
  }
  rm -rf "$out/root.new" && mkdir "$out/root.new"
  for p in $core $libs; do dpkg-deb -x "$(ls "$out"/debs/"${p}"_*.deb | sort -V | tail -1)" "$out/root.new"; done
  rm -rf "$out/root" && mv "$out/root.new" "$out/root"
}

# runtime_libdeps PACKAGE...: their lib* dependencies, development
# packages, gconv modules and the runtimes' own libraries left out.
runtime_libdeps() {
  apt-cache depends --no-recommends --no-suggests --no-conflicts --no-breaks --no-replaces --no-enhances "$@" |
    awk '/Depends:/ && $2 ~ /^lib/ && $2 !~ /-dev$|gconv|^libruby|^libphp|^libperl/ {print $2}' | tr -d '<>' | sort -u
}

# point_at_root EXECUTABLE ROOT NEW_LIBC: makes EXECUTABLE load its
# libraries from ROOT's (DT_RPATH, after the directories its own RUNPATH or
# RPATH names) and, if NEW_LIBC is 1, start through
# ROOT's dynamic loader (PT_INTERP), so the process is the genuine
# executable mapping the genuine libraries. Suites before trixie keep the C
# library in /lib, not /usr/lib: both are searched.
point_at_root() {
  local exe=$1 triplet loader dir rpath
  triplet=$(runtime_triplet) loader=$(runtime_loader)
  command -v patchelf >/dev/null || { echo "patchelf missing (install-test-deps.sh installs it)" >&2; return 1; }
  rpath=$(patchelf --print-rpath "$exe")
  for dir in "$2/usr/lib/$triplet" "$2/lib/$triplet"; do
    [ -d "$dir" ] && rpath=${rpath:+$rpath:}$dir
  done
  if [ "$3" = 1 ]; then
    for dir in "$2/usr/lib/$triplet" "$2/lib/$triplet" ""; do
      [ -n "$dir" ] || { echo "no dynamic loader in the unpacked libc6" >&2; return 1; }
      [ -x "$dir/$loader" ] && break
    done
    patchelf --set-interpreter "$dir/$loader" "$exe"
  fi
  patchelf --force-rpath --set-rpath "$rpath" "$exe"
}

# runtime_triplet and runtime_loader: RUNTIME_ARCH's multiarch directory
# name and dynamic loader.
runtime_triplet() {
  case $RUNTIME_ARCH in
    amd64) echo x86_64-linux-gnu ;;
    arm64) echo aarch64-linux-gnu ;;
    *) echo "unknown architecture $RUNTIME_ARCH" >&2; return 1 ;;
  esac
}
runtime_loader() {
  case $RUNTIME_ARCH in
    amd64) echo ld-linux-x86-64.so.2 ;;
    arm64) echo ld-linux-aarch64.so.1 ;;
    *) echo "unknown architecture $RUNTIME_ARCH" >&2; return 1 ;;
  esac
}
