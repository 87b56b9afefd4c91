#!/usr/bin/env bash
# Packages the Helm chart as a chart repository: lints it (--strict), runs `helm package` (the
# version from Chart.yaml) and writes `index.yaml` (`helm repo index`) beside the archive, so the
# directory can be served as it is (any static web server, a GitHub Pages branch, an object
# store) or the archive pushed to an OCI registry (docs/helm.md, "Publishing the chart").
# Usage: package-chart.sh [OUT_DIR] [REPO_URL]   default OUT_DIR: dist/chart; REPO_URL: the URL
# the directory will be served from (index.yaml's links), default relative links.
# Helm is the pinned one tests/tools/build-helm.sh builds (cached), unless HELM names another.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${1:-$repo/dist/chart}
url=${2:-}
chart=$repo/deploy/helm/local-static-provisioner
helm=${HELM:-}
if [[ -z $helm ]]; then
  # shellcheck source=scripts/toolchain.sh
  source "$repo/scripts/toolchain.sh"
  lsp_find_toolchains go || exit 1
  helm=$(bash "$repo/tests/tools/build-helm.sh")
fi
mkdir -p "$out"
"$helm" lint --strict "$chart" >&2
"$helm" package "$chart" --destination "$out" >&2
if [[ -n $url ]]; then
  "$helm" repo index "$out" --url "$url"
else
  "$helm" repo index "$out"
fi
version=$(awk '$1 == "version:" {print $2; exit}' "$chart/Chart.yaml")
archive=$out/local-static-provisioner-$version.tgz
(cd "$out" && sha256sum "$(basename "$archive")" > "$(basename "$archive").sha256")
echo "$archive"
