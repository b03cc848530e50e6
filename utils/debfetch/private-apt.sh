# Sourced by the fetch scripts (utils/pyfetch, utils/jdkfetch): apt under a
# private configuration, so that packages of other Debian suites can be
# downloaded without touching /etc/apt or dpkg's state.

# install_missing PKG...: installs with the system's own apt configuration (call it before
# private_apt replaces APT_CONFIG) those of the Debian packages that are not installed; needs root
# only when one is missing.
install_missing() {
  local p missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  ((${#missing[@]})) || return 0
  [ "$(id -u)" = 0 ] || { echo "missing packages (install as root): ${missing[*]}" >&2; return 1; }
  echo "Installing ${missing[*]}" >&2
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
}

# debian_mirror prints the system's Debian mirror (no trailing slash).
debian_mirror() {
  local m
  m=$(apt-get indextargets --format '$(REPO_URI) $(RELEASE)' | awk '$2 !~ /-/ && $1 ~ /debian\/?$/ {print $1; exit}')
  [ -n "$m" ] || { echo "no Debian mirror found in the system's apt sources" >&2; return 1; }
  echo "${m%/}"
}

# private_apt DIR ARCH SUITE [SECURITY_MIRROR]: an apt configuration in DIR
# for ARCH with SUITE (one, or several separated by spaces, e.g. "sid
# experimental") from the system's mirror (and SUITE-security from
# SECURITY_MIRROR, if given), exported as APT_CONFIG, its lists updated.
# PRIVATE_APT_TYPES (default "deb") picks the index types: "deb-src" for
# source packages only (apt-get source), "deb deb-src" for both.
private_apt() {
  local dir=$1 arch=$2 suite=$3 security=${4:-} mirror t opts
  local key=/usr/share/keyrings/debian-archive-keyring.gpg
  mirror=$(debian_mirror) || return 1
  mkdir -p "$dir/lists/partial" "$dir/cache/archives/partial"
  {
    for t in ${PRIVATE_APT_TYPES:-deb}; do
      opts="signed-by=$key"
      [ "$t" = deb-src ] || opts="arch=$arch $opts"
      for s in $suite; do
        echo "$t [$opts] $mirror $s main"
        [ -z "$security" ] || echo "$t [$opts] $security $s-security main"
      done
    done
  } >"$dir/sources.list"
  cat >"$dir/apt.conf" <<EOF
Dir::Etc::sourcelist "$dir/sources.list"; Dir::Etc::sourceparts "-";
Dir::State::Lists "$dir/lists"; Dir::Cache "$dir/cache"; Dir::State::status "/dev/null";
APT::Architecture "$arch"; APT::Architectures { "$arch"; }; APT::Sandbox::User "root";
Acquire::Languages "none"; Acquire::IndexTargets::deb::DEP-11::DefaultEnabled "false";
EOF
  export APT_CONFIG=$dir/apt.conf
  apt-get -q update >&2 || { echo "apt-get update for $suite failed" >&2; return 1; }
}
