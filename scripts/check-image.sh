#!/usr/bin/env bash
# What can be checked of the image without a container engine: the Dockerfile copies the
# release binary this script builds (same path, same locked build), the binary is stripped, it
# starts, the `full` variant's scripts exist, and the SBOM shipped in the image lists exactly the
# crates the binary links. Prints the figures; fails on a mismatch.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/toolchain.sh
source scripts/toolchain.sh
# As build-image.sh builds it (the commit's date), so its build below reuses this one.
SOURCE_DATE_EPOCH=$(lsp_source_date_epoch "$PWD")
export SOURCE_DATE_EPOCH
cargo build --release --locked -q
rel=target/release/local-static-provisioner  # where the image build puts it
bin=${CARGO_TARGET_DIR:-target}/release/local-static-provisioner  # where this build did
grep -q "cargo build --release --locked" Dockerfile || { echo "Dockerfile does not build with --locked" >&2; exit 1; }
grep -q "COPY --from=build /src/$rel " Dockerfile || { echo "Dockerfile does not copy $rel" >&2; exit 1; }
for s in quick_reset.sh shred.sh dd_zero.sh blkdiscard.sh; do
  [[ -x deploy/scripts/$s ]] || { echo "deploy/scripts/$s missing or not executable" >&2; exit 1; }
done
# The image copies the binary as built; the release profile strips it (no symbol table left).
if readelf -S "$bin" | grep -q '\.symtab'; then
  echo "$bin has a symbol table: [profile.release] in Cargo.toml should strip it" >&2; exit 1
fi
"$bin" version
"$bin" --help > /dev/null
echo "release binary (as in the image): $(du -k "$bin" | cut -f1) KiB"
echo "dynamic libraries: $(ldd "$bin" | awk '{print $1}' | tr '\n' ' ')"

# The agent image the real test node runs (tests/node/images/build.sh, no container engine) has
# the final stage's user, entrypoint, command and binary path: compared here with the Dockerfile.
images=$(mktemp -d -t lsp-check-image.XXXXXX)
registry_pid=''
trap '[[ -z $registry_pid ]] || kill "$registry_pid" 2> /dev/null; rm -rf "$images"' EXIT
bash tests/node/images/build.sh "$images" 2> "$images/build.log" || { cat "$images/build.log" >&2; exit 1; }
host=$(rustc -vV | sed -n 's/^host: //p')
cargo tree --locked -e normal --prefix none -f '{p}' --target "$host" | sed 's/ (\*)//; s/ (proc-macro)//' \
  | awk '{print $1" "$2}' | sort -u > "$images/linked"
python3 - "$images/agent.tar" Dockerfile "$images/linked" <<'PY'
import json, sys, tarfile
archive, dockerfile = sys.argv[1], sys.argv[2]
with tarfile.open(archive) as t:
    blob = lambda d: t.extractfile("blobs/sha256/" + d.split(":")[1]).read()
    manifest = json.loads(blob(json.loads(t.extractfile("index.json").read())["manifests"][0]["digest"]))
    config = json.loads(blob(manifest["config"]["digest"]))["config"]
    with tarfile.open(fileobj=__import__("io").BytesIO(blob(manifest["layers"][0]["digest"]))) as layer:
        files = set(layer.getnames())
        sbom_path = "usr/share/doc/local-static-provisioner/sbom.cdx.json"
        sbom = json.load(layer.extractfile(sbom_path)) if sbom_path in files else None
lines = open(dockerfile).read().splitlines()
final = max(i for i, l in enumerate(lines) if l.startswith("FROM "))
stage = {}
for l in lines[final + 1:]:
    if l and not l.startswith("#"):
        word, _, rest = l.partition(" ")
        stage.setdefault(word, []).append(rest)
want = {"Entrypoint": json.loads(stage["ENTRYPOINT"][-1]), "Cmd": json.loads(stage["CMD"][-1]), "User": stage["USER"][-1]}
got = {k: config.get(k) for k in want}
copied = [c.split()[-1].lstrip("/") for c in stage.get("COPY", [])]
problems = [f"{k}: image {got[k]!r}, Dockerfile {want[k]!r}" for k in want if got[k] != want[k]]
problems += [f"{c} missing from the image" for c in copied if c not in files]
# The SBOM the image ships names exactly the crates the binary links (cargo tree, normal edges).
if sbom is None:
    problems.append(f"{sbom_path} missing from the image")
else:
    linked = {tuple(l.split()) for l in open(sys.argv[3])}
    agent = sbom["metadata"]["component"]
    listed = {(c["name"], "v" + c["version"]) for c in sbom["components"]}
    want_agent = next(x for x in linked if x[0] == "local-static-provisioner")
    linked.discard(want_agent)
    if sbom["bomFormat"] != "CycloneDX" or (agent["name"], "v" + agent["version"]) != want_agent:
        problems.append(f"SBOM describes {agent['name']} {agent['version']}, not {want_agent}")
    if listed != linked:
        problems.append(f"SBOM crates differ from the binary's: only in SBOM {sorted(listed - linked)}, "
                        f"missing {sorted(linked - listed)}")
    else:
        print(f"image SBOM lists the {len(listed)} crates the binary links")
if problems:
    sys.exit("test node's agent image differs from the Dockerfile's final stage: " + "; ".join(problems))
print(f"test node's agent image matches the Dockerfile's final stage: {want}, {copied}")
PY

# The release image as users get it (scripts/build-image.sh): the archive under the tag asked
# for, its SBOM beside it (the one the image ships), and checksums that verify.
dist=$images/dist
IMAGE=registry.example.com/storage/local-static-provisioner:9.9.9 bash scripts/build-image.sh "$dist" \
  > "$images/dist.out" 2> "$images/dist.log" || { cat "$images/dist.log" >&2; exit 1; }
arch=$(case $(uname -m) in x86_64) echo amd64 ;; aarch64) echo arm64 ;; *) uname -m ;; esac)
archive=$dist/local-static-provisioner-9.9.9-$arch.oci.tar
[[ $(tail -1 "$images/dist.out") == "$archive" ]] || { echo "build-image.sh printed $(tail -1 "$images/dist.out"), not $archive" >&2; exit 1; }
(cd "$dist" && sha256sum --quiet -c SHA256SUMS) || { echo "build-image.sh: SHA256SUMS does not verify" >&2; exit 1; }
python3 - "$archive" "$dist/local-static-provisioner-9.9.9-$arch.sbom.cdx.json" <<'PY'
import json, sys, tarfile
archive, sbom_file = sys.argv[1], sys.argv[2]
with tarfile.open(archive) as t:
    index = json.loads(t.extractfile("index.json").read())
    blob = lambda d: t.extractfile("blobs/sha256/" + d.split(":")[1]).read()
    manifest = json.loads(blob(index["manifests"][0]["digest"]))
    with tarfile.open(fileobj=__import__("io").BytesIO(blob(manifest["layers"][0]["digest"]))) as layer:
        shipped = layer.extractfile("usr/share/doc/local-static-provisioner/sbom.cdx.json").read()
ref = index["manifests"][0].get("annotations", {})
names = " ".join(ref.values())
if "registry.example.com/storage/local-static-provisioner:9.9.9" not in names:
    sys.exit(f"build-image.sh: the archive does not name the image asked for: {ref}")
if open(sbom_file, "rb").read() != shipped:
    sys.exit("build-image.sh: the SBOM beside the archive is not the one the image ships")
print(f"release image archive: {archive.rsplit('/', 1)[-1]}, {ref}, SBOM and checksums verified")
PY

# The arm64 image, cross-built on this amd64 machine (ARCH=arm64): its config says arm64, its
# binary is an AArch64 executable, and that binary starts on the image's own loader and
# libraries, under qemu-user (-L: the image's root for every absolute path it opens).
if [[ $arch == amd64 ]]; then
  # Into the amd64 image's directory, as docs/install.md shows: SHA256SUMS then lists both.
  adist=$dist
  ARCH=arm64 IMAGE=registry.example.com/storage/local-static-provisioner:9.9.9 bash scripts/build-image.sh "$adist" \
    > "$images/arm64.out" 2> "$images/arm64.log" || { cat "$images/arm64.log" >&2; exit 1; }
  (cd "$adist" && sha256sum --quiet -c SHA256SUMS) || { echo "ARCH=arm64: SHA256SUMS does not verify" >&2; exit 1; }
  summed=$(awk '{print $2}' "$adist/SHA256SUMS" | tr '\n' ' ')
  [[ $summed == "local-static-provisioner-9.9.9-amd64.oci.tar local-static-provisioner-9.9.9-amd64.sbom.cdx.json local-static-provisioner-9.9.9-arm64.oci.tar local-static-provisioner-9.9.9-arm64.sbom.cdx.json " ]] \
    || { echo "amd64 then arm64 into one directory: SHA256SUMS lists $summed" >&2; exit 1; }
  root=$images/arm64-root
  mkdir "$root"
  python3 - "$adist/local-static-provisioner-9.9.9-arm64.oci.tar" "$root" <<'PY'
import io, json, sys, tarfile
archive, root = sys.argv[1], sys.argv[2]
with tarfile.open(archive) as t:
    blob = lambda d: t.extractfile("blobs/sha256/" + d.split(":")[1]).read()
    manifest = json.loads(blob(json.loads(t.extractfile("index.json").read())["manifests"][0]["digest"]))
    config = json.loads(blob(manifest["config"]["digest"]))
    if (config["architecture"], config["os"]) != ("arm64", "linux"):
        sys.exit(f"ARCH=arm64: the image config says {config['os']}/{config['architecture']}")
    with tarfile.open(fileobj=io.BytesIO(blob(manifest["layers"][0]["digest"]))) as layer:
        layer.extractall(root, filter="tar")
PY
  abin=$root/usr/local/bin/local-static-provisioner
  readelf -h "$abin" | grep -q 'Machine:.*AArch64' || { echo "ARCH=arm64: $abin is not an AArch64 executable" >&2; exit 1; }
  qemu-aarch64 -L "$root" "$abin" version > "$images/arm64.version" 2>&1 \
    || { cat "$images/arm64.version" >&2; echo "ARCH=arm64: the image's binary does not start on its own libraries" >&2; exit 1; }
  echo "arm64 image (cross-built): $(head -1 "$images/arm64.out"); under qemu-aarch64: $(head -1 "$images/arm64.version")"
else
  echo "arm64 image: not cross-checked on a $arch machine (this check cross-builds arm64 on amd64)"
fi

# Pushed to a registry as docs/install.md says (crane, the archive unpacked as an OCI layout): a
# real registry (CNCF distribution, built from its module) on loopback, started and stopped here
# by its PID. What the registry serves under the tag must be the archive's manifest, byte for
# byte (its digest), and pulled back it must be the same image.
crane=$(bash tests/tools/build-crane.sh)
registry=$(bash tests/tools/build-registry.sh)
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
printf 'version: 0.1\nlog: {level: warn}\nstorage: {filesystem: {rootdirectory: %s}}\nhttp: {addr: "127.0.0.1:%s"}\n' \
  "$images/registry" "$port" > "$images/registry.yml"
"$registry" serve "$images/registry.yml" > "$images/registry.log" 2>&1 &
registry_pid=$!
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$port/v2/" > /dev/null && break
  kill -0 "$registry_pid" 2> /dev/null || { cat "$images/registry.log" >&2; echo "the registry did not start" >&2; exit 1; }
  sleep 0.1
done
ref=127.0.0.1:$port/storage/local-static-provisioner:9.9.9
mkdir "$images/layout"
tar -xf "$archive" -C "$images/layout"
"$crane" push --insecure "$images/layout" "$ref" > "$images/push.out" 2> "$images/push.log" \
  || { cat "$images/push.log" >&2; exit 1; }
# The digest of the (one) image an OCI layout directory holds.
manifest_digest() { python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["manifests"][0]["digest"])' "$1/index.json"; }
want=$(manifest_digest "$images/layout")
got=$("$crane" digest --insecure "$ref")
[[ $got == "$want" ]] || { echo "the registry serves $ref as $got, the archive's manifest is $want" >&2; exit 1; }
"$crane" pull --insecure --format oci "$ref" "$images/pulled" 2> "$images/pull.log" || { cat "$images/pull.log" >&2; exit 1; }
pulled=$(manifest_digest "$images/pulled")
[[ $pulled == "$want" ]] || { echo "pulled back from the registry: $pulled, not $want" >&2; exit 1; }
echo "pushed to a registry with crane and pulled back: $ref $want"
# Both architectures under one tag, as docs/install.md shows: the index names each platform.
if [[ -d ${root:-} ]]; then
  mkdir "$images/arm64-layout"
  tar -xf "$adist/local-static-provisioner-9.9.9-arm64.oci.tar" -C "$images/arm64-layout"
  "$crane" push --insecure "$images/arm64-layout" "$ref-arm64" > /dev/null 2> "$images/push.log" \
    || { cat "$images/push.log" >&2; exit 1; }
  "$crane" index append --insecure -m "$ref" -m "$ref-arm64" -t "${ref%:*}:multi" > /dev/null 2> "$images/index.log" \
    || { cat "$images/index.log" >&2; exit 1; }
  platforms=$("$crane" manifest --insecure "${ref%:*}:multi" \
    | python3 -c 'import json, sys; print(" ".join(sorted(m["platform"]["os"] + "/" + m["platform"]["architecture"] for m in json.load(sys.stdin)["manifests"])))')
  [[ $platforms == "linux/amd64 linux/arm64" ]] || { echo "the multi-arch index names $platforms" >&2; exit 1; }
  echo "one tag for both architectures (crane index append): ${ref%:*}:multi -> $platforms"
fi
kill "$registry_pid"
wait "$registry_pid" 2> /dev/null || true
registry_pid=''
