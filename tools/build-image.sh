#!/usr/bin/env bash
# Build the carma image from the root Dockerfile and tag it exactly as charts/carma references it by
# default: <image.repository>:<image.tag> from charts/carma/values.yaml, where an empty image.tag means
# the chart's appVersion (charts/carma/Chart.yaml). Both are read from the chart, so the chart and the
# image cannot disagree.
#
#   tools/build-image.sh                          # build ghcr.io/carma-io/carma:<appVersion>
#   tools/build-image.sh --repository REPO        # build REPO:<appVersion> (then install the chart with
#                                                 #   --set image.repository=REPO)
#   tools/build-image.sh --push                   # build, then push
#   tools/build-image.sh --print                  # print the image reference and exit (no engine needed)
#   tools/build-image.sh -- --platform linux/arm64   # further arguments go to `build`
#
# Engine: docker, else podman (CONTAINER_ENGINE=podman picks one; CONTAINER_ENGINE=buildah builds with
# `buildah build`, as ci/image.sh does). Exits 1 with a message naming what is missing when neither is
# installed, or when none can reach its engine (e.g. no Docker daemon).
#
# Base images: the Dockerfile's defaults are public (docker.io/library/rust, gcr.io/distroless); to
# build on others, pass build arguments: -- --build-arg RUST_IMAGE=... --build-arg RUNTIME_IMAGE=...
# (docs/image-build.md).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VALUES="$ROOT/charts/carma/values.yaml"
CHART="$ROOT/charts/carma/Chart.yaml"
die() { echo "tools/build-image.sh: $*" >&2; exit 1; }

# A top-level scalar of Chart.yaml, unquoted.
chart_field() {
  sed -n "s/^$1:[[:space:]]*//p" "$CHART" | head -n1 | sed -e 's/[[:space:]]*#.*$//' -e 's/^"\(.*\)"$/\1/' -e "s/^'\(.*\)'\$/\1/"
}
# A scalar directly under the top-level `image:` block of values.yaml, unquoted.
image_field() {
  awk -v key="$1" '
    /^[^[:space:]#]/ { in_image = ($0 ~ /^image:[[:space:]]*$/) ; next }
    in_image && $0 ~ "^  " key ":" {
      sub("^  " key ":[[:space:]]*", ""); sub(/[[:space:]]+#.*$/, "")
      gsub(/^"|"$/, ""); gsub(/^'\''|'\''$/, ""); print; exit
    }' "$VALUES"
}

repository="$(image_field repository)"
tag="$(image_field tag)"
app_version="$(chart_field appVersion)"
[[ -n "$repository" ]] || die "cannot read image.repository from $VALUES"
[[ -n "$tag" ]] || tag="$app_version"
[[ -n "$tag" ]] || die "image.tag is empty and $CHART has no appVersion"

push=0; print=0; extra=()
while (($#)); do
  case "$1" in
    --repository) [[ $# -ge 2 ]] || die "--repository needs a value"; repository="$2"; shift 2 ;;
    --repository=*) repository="${1#*=}"; shift ;;
    --push) push=1; shift ;;
    --print) print=1; shift ;;
    -h|--help) sed -n '2,20p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done
image="$repository:$tag"
if ((print)); then echo "$image"; exit 0; fi

# The engine: the first of docker / podman that is installed and answers.
candidates=()
if [[ -n "${CONTAINER_ENGINE:-}" ]]; then candidates=("$CONTAINER_ENGINE"); else candidates=(docker podman); fi
engine=""; found=()
for e in "${candidates[@]}"; do
  command -v "$e" >/dev/null 2>&1 || continue
  found+=("$e")
  if "$e" info >/dev/null 2>&1; then engine="$e"; break; fi
done
if [[ -z "$engine" ]]; then
  if ((${#found[@]} == 0)) && [[ -n "${CONTAINER_ENGINE:-}" ]]; then
    die "$CONTAINER_ENGINE (CONTAINER_ENGINE) is not installed; $image was not built."
  fi
  if ((${#found[@]} == 0)); then
    die "neither docker nor podman is installed (looked for: ${candidates[*]}). Install one of them to build $image, or build the Dockerfile with any OCI image builder and tag it $image."
  fi
  die "${found[*]} installed but cannot reach a container engine (\`${found[0]} info\` fails: is the Docker daemon running, or podman's machine started?); $image was not built."
fi

echo "tools/build-image.sh: building $image with $engine (chart appVersion $app_version)"
DOCKER_BUILDKIT=1 "$engine" build -f "$ROOT/Dockerfile" --build-arg "VERSION=$tag" -t "$image" \
  ${extra[@]+"${extra[@]}"} "$ROOT"
if ((push)); then
  "$engine" push "$image"
fi
echo "$image"
