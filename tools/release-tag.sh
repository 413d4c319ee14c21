#!/usr/bin/env bash
# Whether a git tag may publish a release, and what it publishes: the release workflow
# (.github/workflows/release.yaml) runs this first, and ci/checks/workflows.sh runs it on a good and a bad
# tag. A tag v<version> may publish when <version> is both charts/carma/Chart.yaml's version and its
# appVersion, and the chart's default image (tools/build-image.sh --print: image.repository and
# image.tag from values.yaml, an empty tag meaning the appVersion) is <repository>:<version>, so the
# chart the release pushes pulls the image the release pushes.
#
#   tools/release-tag.sh v0.2.0     # prints version=, image=, repository=, registry=, chart_package= and
#                                   # chart_registry= lines (the workflow appends them to $GITHUB_OUTPUT);
#                                   # exit 1 on a mismatch
#
# The chart goes to the OCI repository beside the image: ghcr.io/carma-io/carma -> oci://ghcr.io/carma-io/charts.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CHART="$ROOT/charts/carma/Chart.yaml"
die() { echo "tools/release-tag.sh: $*" >&2; exit 1; }
[[ $# -eq 1 && -n "$1" ]] || die "usage: tools/release-tag.sh TAG (e.g. v0.2.0)"
tag="$1"
[[ "$tag" == v* ]] || die "the tag '$tag' does not start with v"
version="${tag#v}"
[[ "$version" =~ ^[0-9]+\.[0-9]+\.[0-9]+([-+][0-9A-Za-z.+-]+)?$ ]] || die "'$version' (from the tag '$tag') is not a semantic version"

# A top-level scalar of Chart.yaml, unquoted (as tools/build-image.sh reads it).
chart_field() {
  sed -n "s/^$1:[[:space:]]*//p" "$CHART" | head -n1 | sed -e 's/[[:space:]]*#.*$//' -e 's/^"\(.*\)"$/\1/' -e "s/^'\(.*\)'\$/\1/"
}
chart_version="$(chart_field version)"
app_version="$(chart_field appVersion)"
bad=0
if [[ "$chart_version" != "$version" ]]; then
  echo "tools/release-tag.sh: the tag '$tag' is not charts/carma/Chart.yaml's version ($chart_version)" >&2; bad=1
fi
if [[ "$app_version" != "$version" ]]; then
  echo "tools/release-tag.sh: the tag '$tag' is not charts/carma/Chart.yaml's appVersion ($app_version)" >&2; bad=1
fi
image="$("$ROOT/tools/build-image.sh" --print)"
repository="${image%:*}"
if [[ "$image" != "$repository:$version" ]]; then
  echo "tools/release-tag.sh: the chart's default image is $image, not $repository:$version (charts/carma/values.yaml image.tag must be empty or $version)" >&2; bad=1
fi
[[ "$repository" == */* ]] || { echo "tools/release-tag.sh: image.repository '$repository' names no registry path" >&2; bad=1; }
((bad == 0)) || exit 1
echo "version=$version"
echo "image=$image"
echo "repository=$repository"
echo "registry=${repository%%/*}"
echo "chart_package=carma-$version.tgz"
echo "chart_registry=oci://${repository%/*}/charts"
