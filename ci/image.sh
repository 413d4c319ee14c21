#!/usr/bin/env bash
# CI: build the root Dockerfile, the very file users build, with Buildah, and run the image as the
# chart runs it: UID 65532, read-only root filesystem, no network, no capabilities.
#
#   ci/image.sh                  # as root on Debian 12 (apt-get installs what is missing)
#   ci/image.sh --fresh-bases    # make the two base images again even when the current ones match
#   ci/image.sh --clean          # remove its images and Buildah's cache mounts (all of root's)
#   ci/image.sh --bases-only     # the prerequisites and the two base images, no build (CI starts this
#                                # in the background at its beginning: downloads and unpacking overlap
#                                # the Rust builds)
#
# The Dockerfile's base images are build arguments whose defaults are public images (rust, distroless
# cc-debian12). CI reaches no container registry, so this script makes equivalents from Debian 12
# packages and passes their names (docs/image-build.md):
#   localhost/carma-ci/rust:<RUST_VERSION>-bookworm
#       mmdebstrap bookworm (minbase) + gcc, libc6-dev, ca-certificates, and this machine's Rust
#       toolchain (`rustc --print sysroot`, which must be the Dockerfile's RUST_VERSION) where the rust
#       image has it (RUSTUP_HOME=/usr/local/rustup, CARGO_HOME=/usr/local/cargo). It also trusts the
#       CA certificates this machine adds to Debian's (/usr/local/share/ca-certificates).
#   localhost/carma-ci/distroless-cc-debian12:nonroot
#       the named Debian packages alone, unpacked (no dependencies, no maintainer scripts, so no shell
#       and no package manager), as distroless does; the CA bundle, passwd with nonroot (65532),
#       /home/nonroot; user 65532:65532.
# Bases are reused while their recipe (this file, the toolchain, the mirrors, the machine's extra CA
# certificates) is unchanged. The Dockerfile's cache mounts (crate registry, target directory) stay in
# /var/tmp/buildah-cache between runs.
#
# Each step prints its duration; the last line is
#   image: <ref>  size: <MB>  version: <what `carma --version` printed in the container>
# Env: DEBIAN_MIRROR (http://deb.debian.org/debian), DEBIAN_SECURITY_MIRROR
# (http://deb.debian.org/debian-security), RUST_SYSROOT (default: `rustc --print sysroot`).
# Exits non-zero on any failure. Disk: ~2.6 GB (bases 0.95 GB, cache mounts 1.6 GB, image 84 MB).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
SELF="$ROOT/ci/image.sh"
die() { echo "ci/image.sh: FAIL: $*" >&2; exit 1; }

BASE_REPO=localhost/carma-ci
RUNTIME_BASE="$BASE_REPO/distroless-cc-debian12:nonroot"
RUST_VERSION="$(sed -n 's/^ARG RUST_VERSION=//p' Dockerfile | head -n1)"
[[ -n "$RUST_VERSION" ]] || die "no 'ARG RUST_VERSION=' in Dockerfile"
RUST_BASE="$BASE_REPO/rust:$RUST_VERSION-bookworm"
SUITE=bookworm
DEBIAN_MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
DEBIAN_SECURITY_MIRROR="${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}"
SOURCES=("deb $DEBIAN_MIRROR $SUITE main" "deb $DEBIAN_MIRROR $SUITE-updates main"
         "deb $DEBIAN_SECURITY_MIRROR $SUITE-security main")
# Debian packages of the runtime base: glibc, libgcc, CA certificates, and the files every image has
# (os-release, /etc/services and protocols, time zones). gcc-12-base only carries libgcc's copyright.
RUNTIME_PACKAGES=(base-files netbase tzdata ca-certificates libc6 libgcc-s1 gcc-12-base)
# Debian packages of the build stage on top of minbase: a C toolchain (ring's build script, the linker
# driver) and CA certificates for cargo's downloads.
BUILD_PACKAGES=(ca-certificates gcc libc6-dev)
# Where the workspace's cache mounts live (Buildah, root).
BUILDAH_CACHE=/var/tmp/buildah-cache

fresh=0; clean=0; bases_only=0
while (($#)); do
  case "$1" in
    --fresh-bases) fresh=1; shift ;;
    --clean) clean=1; shift ;;
    --bases-only) bases_only=1; shift ;;
    -h|--help) sed -n '2,32p' "$SELF" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done

t_all=$SECONDS; t_step=$SECONDS; cur=""
step() { # step <name>: ends the current step (prints its duration), starts the next
  [[ -z "$cur" ]] || printf -- '-- %s: %ss\n' "$cur" "$((SECONDS - t_step))"
  cur="$1"; t_step=$SECONDS
  [[ -z "$cur" ]] || printf '\n== %s\n' "$cur"
}

[[ "$(id -u)" == 0 ]] || die "needs root (mmdebstrap's root mode, Buildah's and Podman's root storage)"

# One at a time: a second run (CI's build after its background --bases-only) waits here, then finds
# the bases made.
exec 8>/var/lock/carma-ci-image.lock
if ! flock -n 8; then
  echo "waiting for another ci/image.sh (making the bases in the background?)"
  waited=$SECONDS; flock 8; echo "waited $((SECONDS - waited)) s"
fi

image="$(tools/build-image.sh --print)"

if ((clean)); then
  for ref in "$image" "$RUST_BASE" "$RUNTIME_BASE"; do buildah rmi "$ref" 2>/dev/null || true; done
  rm -rf "$BUILDAH_CACHE"
  echo "removed $image, $RUST_BASE, $RUNTIME_BASE and $BUILDAH_CACHE"
  exit 0
fi

step "prerequisites: buildah, podman, runc, mmdebstrap (apt-get)"
need=()
for p in buildah podman runc mmdebstrap; do command -v "$p" >/dev/null 2>&1 || need+=("$p"); done
if ((${#need[@]})); then
  command -v apt-get >/dev/null || die "${need[*]} missing, and no apt-get to install them (Debian 12)"
  export DEBIAN_FRONTEND=noninteractive
  # Waits for another apt-get (CI's other steps install packages too) instead of failing.
  install=(apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends "${need[@]}")
  "${install[@]}" >/dev/null 2>&1 || { apt-get -o DPkg::Lock::Timeout=600 update -q >/dev/null && "${install[@]}" >/dev/null; } \
    || die "apt-get install ${need[*]} failed"
fi
echo "$(buildah --version); $(podman --version)"
echo "runc $(runc --version | sed -n 's/^runc version //p'); mmdebstrap $(mmdebstrap --version | awk '{print $2}')"
df -h /var/lib/containers /var/tmp 2>/dev/null | awk 'NR == 1 || !seen[$1]++' || true

# The toolchain of the build stage: this machine's, when it is the Dockerfile's RUST_VERSION.
sysroot="${RUST_SYSROOT:-$(rustc --print sysroot 2>/dev/null || true)}"
[[ -x "$sysroot/bin/rustc" && -x "$sysroot/bin/cargo" ]] \
  || die "no Rust toolchain with rustc and cargo (rustc --print sysroot gives '$sysroot'; set RUST_SYSROOT)"
rustc_vv="$("$sysroot/bin/rustc" -vV)"
rust_full="$(sed -n 's/^release: //p' <<<"$rustc_vv")"
host="$(sed -n 's/^host: //p' <<<"$rustc_vv")"
[[ "$rust_full" == "$RUST_VERSION" || "$rust_full" == "$RUST_VERSION".* ]] \
  || die "the Dockerfile builds with Rust $RUST_VERSION, the toolchain at $sysroot is $rust_full (set RUST_SYSROOT)"

# A base is made again when its recipe changes: this script, the toolchain, the mirrors, the local CAs.
recipe="$( { cat "$SELF"; echo "$rustc_vv"; printf '%s\n' "${SOURCES[@]}"
             cat /usr/local/share/ca-certificates/*.crt 2>/dev/null || true; } | sha256sum | cut -c1-16)"
have_base() { # have_base <ref>: the image exists and was made by this recipe
  ((fresh)) && return 1
  [[ "$(podman image inspect --format '{{index .Labels "io.carma.ci.recipe"}}' "$1" 2>/dev/null)" == "$recipe" ]]
}
# On exit, success or not: the working containers and scratch files go, and so do images a new tag left
# without a name (earlier bases, the previous build).
ctr=""; work=""; replaced=()
cleanup() {
  [[ -z "$ctr" ]] || buildah rm "$ctr" >/dev/null 2>&1 || true
  [[ -z "$work" ]] || rm -rf "$work"
  local id
  for id in ${replaced[@]+"${replaced[@]}"}; do
    if [[ "$(podman image inspect --format '{{len .RepoTags}}' "$id" 2>/dev/null)" == 0 ]]; then
      buildah rmi "$id" >/dev/null 2>&1 || true
    fi
  done
}
trap cleanup EXIT
image_id() { podman image inspect --format '{{.Id}}' "$1" 2>/dev/null; }
remember_old() { local id; if id="$(image_id "$1")"; then replaced+=("$id"); fi; }
commit() { # commit <container> <ref>
  remember_old "$2"
  buildah commit -q --rm "$1" "$2" >/dev/null; ctr=""
}

step "base image $RUST_BASE (mmdebstrap $SUITE minbase + ${BUILD_PACKAGES[*]}, Rust $rust_full from $sysroot)"
if have_base "$RUST_BASE"; then
  echo "reused (recipe $recipe); --fresh-bases makes it again"
else
  ctr="$(buildah from scratch)"
  mnt="$(buildah mount "$ctr")"
  pkgs="$(IFS=,; echo "${BUILD_PACKAGES[*]}")"
  mmdebstrap --quiet --variant=minbase --include="$pkgs" \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    "$SUITE" "$mnt" "${SOURCES[@]}"
  # The CA certificates this machine adds to Debian's (/usr/local/share/ca-certificates, e.g. a TLS
  # proxy's in front of crates.io), so cargo in the build stage trusts what the machine trusts. The
  # build stage only: the runtime base has Debian's certificates alone.
  if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    cp -a /usr/local/share/ca-certificates/. "$mnt/usr/local/share/ca-certificates/"
    chroot "$mnt" update-ca-certificates >/dev/null 2>&1 || die "update-ca-certificates failed in the build base"
    echo "added this machine's CA certificates: $(cd /usr/local/share/ca-certificates && echo *.crt)"
  fi
  # The toolchain where rustup puts it in the rust image, without docs, sources and unused tools; cargo
  # and rustc on PATH in /usr/local/cargo/bin (CARGO_HOME), as rustup's proxies are there.
  tc="/usr/local/rustup/toolchains/$rust_full-$host"
  mkdir -p "$mnt$tc" "$mnt/usr/local/cargo/bin"
  tar -C "$sysroot" --exclude=lib/rustlib/src --exclude=lib/rustlib/rustc-src -cf - bin/cargo bin/rustc bin/rustdoc lib \
    | tar -C "$mnt$tc" -xf -
  for b in cargo rustc rustdoc; do ln -s "../../rustup/toolchains/$rust_full-$host/bin/$b" "$mnt/usr/local/cargo/bin/$b"; done
  du -sh "$mnt" | awk '{print "rootfs: " $1}'
  buildah umount "$ctr" >/dev/null
  buildah config --env RUSTUP_HOME=/usr/local/rustup --env CARGO_HOME=/usr/local/cargo \
    --env PATH=/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env RUST_VERSION="$rust_full" --cmd bash \
    --label io.carma.ci.recipe="$recipe" \
    --label org.opencontainers.image.description="CI stand-in for docker.io/library/rust:$RUST_VERSION-bookworm, made by ci/image.sh" \
    "$ctr"
  commit "$ctr" "$RUST_BASE"
fi

step "base image $RUNTIME_BASE (${RUNTIME_PACKAGES[*]}, unpacked)"
if have_base "$RUNTIME_BASE"; then
  echo "reused (recipe $recipe); --fresh-bases makes it again"
else
  # mmdebstrap downloads (and verifies) the packages for $SUITE; only the named ones are unpacked.
  work="$(mktemp -d /var/tmp/carma-ci-image.XXXXXX)"
  pkgs="$(IFS=,; echo "${RUNTIME_PACKAGES[*]}")"
  mmdebstrap --quiet --variant=extract --include="$pkgs" --skip=cleanup/apt/cache \
    "$SUITE" "$work/debs" "${SOURCES[@]}"
  ctr="$(buildah from scratch)"
  mnt="$(buildah mount "$ctr")"
  for p in "${RUNTIME_PACKAGES[@]}"; do
    debs=("$work/debs/var/cache/apt/archives/${p}_"*.deb)
    [[ ${#debs[@]} == 1 && -f "${debs[0]}" ]] || die "expected one .deb of $p, found: ${debs[*]}"
    dpkg-deb --extract "${debs[0]}" "$mnt"
    echo "  $(basename "${debs[0]}")"
  done
  rm -rf "$work"; work=""
  # What maintainer scripts and distroless add: the CA bundle (update-ca-certificates), users, groups,
  # home and temporary directories, name service switch.
  find "$mnt/usr/share/doc" -type f ! -name copyright -delete
  rm -rf "$mnt/usr/share/man" "$mnt/usr/share/lintian"
  mkdir -p "$mnt/etc/ssl/certs"
  # shellcheck disable=SC1003 # sed's "append a newline when the last line lacks one"
  find "$mnt/usr/share/ca-certificates" -name '*.crt' | LC_ALL=C sort \
    | while read -r crt; do sed -e '$a\' "$crt"; done >"$mnt/etc/ssl/certs/ca-certificates.crt"
  printf '%s\n' 'root:x:0:0:root:/root:/sbin/nologin' 'nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin' \
    'nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin' >"$mnt/etc/passwd"
  printf '%s\n' 'root:x:0:' 'nobody:x:65534:' 'tty:x:5:' 'staff:x:50:' 'nonroot:x:65532:' >"$mnt/etc/group"
  printf '%s\n' 'passwd: files' 'group: files' 'shadow: files' 'hosts: files dns' 'networks: files' \
    'protocols: files' 'services: files' 'ethers: files' 'rpc: files' >"$mnt/etc/nsswitch.conf"
  install -d -m 0700 "$mnt/root"; install -d -m 0700 -o 65532 -g 65532 "$mnt/home/nonroot"
  install -d -m 1777 "$mnt/tmp"
  echo "rootfs: $(du -sh "$mnt" | cut -f1), $(grep -c 'BEGIN CERTIFICATE' "$mnt/etc/ssl/certs/ca-certificates.crt") CA certificates"
  ! ls "$mnt"/bin/sh "$mnt"/usr/bin/sh "$mnt"/usr/bin/dpkg "$mnt"/usr/bin/apt 2>/dev/null || die "runtime base has a shell or package manager"
  buildah umount "$ctr" >/dev/null
  buildah config --user 65532:65532 --workingdir /home/nonroot \
    --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    --label io.carma.ci.recipe="$recipe" \
    --label org.opencontainers.image.description="CI stand-in for gcr.io/distroless/cc-debian12:nonroot, made by ci/image.sh" \
    "$ctr"
  commit "$ctr" "$RUNTIME_BASE"
fi

if ((bases_only)); then step ""; echo "bases made in $((SECONDS - t_all)) s"; exit 0; fi

step "build the root Dockerfile (buildah, bases $RUST_BASE and $RUNTIME_BASE)"
remember_old "$image"
# --isolation chroot: RUN steps need no OCI runtime (crun, the default one, refuses hosts that mix
# cgroup v1 and v2 controllers) and share the host's network, over which cargo fetches crates.io.
# --pull=never: the bases are the local ones; nothing is pulled.
CONTAINER_ENGINE=buildah tools/build-image.sh -- --isolation chroot --pull=never \
  --build-arg RUST_IMAGE="$RUST_BASE" --build-arg RUNTIME_IMAGE="$RUNTIME_BASE"
du -sh "$BUILDAH_CACHE" 2>/dev/null | awk '{print "cache mounts (" $2 "): " $1}'

step "run: carma --version as UID 65532 on a read-only root filesystem"
# runc, not crun (see above). Small fixed limits: Podman's defaults (a million open files and so on)
# are more than a host without CAP_SYS_RESOURCE can grant, and --version needs neither.
# --read-only-tmpfs=false: no writable /tmp or /run either, as readOnlyRootFilesystem in Kubernetes.
run=(podman run --rm --runtime runc --network none --read-only --read-only-tmpfs=false
     --user 65532:65532 --cap-drop all --security-opt no-new-privileges
     --ulimit nofile=1024:1024 --ulimit nproc=1024:1024)
version="$("${run[@]}" "$image" --version)" || die "carma --version failed in $image"
echo "carma --version: $version"
[[ "$version" =~ ^carma\ [0-9] ]] || die "unexpected version output: $version"
user="$(podman image inspect --format '{{.Config.User}}' "$image")"
[[ "$user" == 65532:65532 ]] || die "image user is '$user', not 65532:65532"
echo "image user: $user"
if out="$("${run[@]}" --entrypoint /bin/sh "$image" -c true 2>&1)"; then die "$image has a shell"; fi
grep -qi '/bin/sh.*no such file' <<<"$out" || die "/bin/sh failed, but not for want of a shell: $out"
echo "no shell: /bin/sh does not exist"
label="$(podman image inspect --format '{{index .Labels "org.opencontainers.image.version"}}' "$image")"
[[ "$label" == "${image##*:}" ]] || die "label org.opencontainers.image.version is '$label', the tag ${image##*:}"

size="$(podman image inspect --format '{{.Size}}' "$image")"
step ""
echo "total: $((SECONDS - t_all))s"
printf 'image: %s  size: %s MB  version: %s\n' "$image" "$(awk -v b="$size" 'BEGIN {printf "%.1f", b / 1e6}')" "$version"
