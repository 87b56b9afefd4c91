#!/usr/bin/env python3
"""Writes a single-layer OCI image-layout archive that `ctr images import` takes, without a
container engine or a registry (neither exists on the test machines).

The layer is built reproducibly (sorted entries, fixed mtime, root ownership), so the same
inputs give the same image digest and containerd does not re-unpack an unchanged image.

Usage:
  oci-image.py OUT.tar --name REF [--entrypoint JSON] [--cmd JSON] [--user USER]
               [--file SRC:DST[:MODE]]... [--symlink DST:TARGET]... [--dir DST[:MODE]]...
"""
import argparse
import hashlib
import io
import json
import os
import sys
import tarfile

MTIME = 0


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--name", required=True, help="image reference, e.g. docker.io/library/x:tag")
    p.add_argument("--entrypoint", type=json.loads, default=None)
    p.add_argument("--cmd", type=json.loads, default=None)
    p.add_argument("--user", default=None)
    p.add_argument("--arch", default="amd64", help="the image config's architecture (amd64, arm64)")
    p.add_argument("--file", action="append", default=[])
    p.add_argument("--symlink", action="append", default=[])
    p.add_argument("--dir", action="append", default=[])
    return p.parse_args()


def fail(msg):
    print(f"oci-image: {msg}", file=sys.stderr)
    sys.exit(1)


def layer(files, symlinks, dirs):
    """The layer tar: every parent directory, then the entries, in path order."""
    entries = {}

    def add_dir(path, mode=0o755):
        parts = path.strip("/").split("/")
        for i in range(1, len(parts) + 1):
            d = "/".join(parts[:i])
            if d and d not in entries:
                entries[d] = ("dir", mode if i == len(parts) else 0o755, None)

    for spec in dirs:
        dst, _, mode = spec.partition(":")
        add_dir(dst, int(mode, 8) if mode else 0o755)
    for spec in files:
        pieces = spec.split(":")
        if len(pieces) not in (2, 3):
            fail(f"--file {spec!r}: expected SRC:DST[:MODE]")
        src, dst = pieces[0], pieces[1]
        if not os.path.isfile(src):
            fail(f"--file {spec!r}: {src} is not a regular file")
        mode = int(pieces[2], 8) if len(pieces) == 3 else os.stat(src).st_mode & 0o777
        parent = os.path.dirname(dst.strip("/"))
        if parent:
            add_dir(parent)
        entries[dst.strip("/")] = ("file", mode, src)
    for spec in symlinks:
        dst, _, target = spec.partition(":")
        if not target:
            fail(f"--symlink {spec!r}: expected DST:TARGET")
        parent = os.path.dirname(dst.strip("/"))
        if parent:
            add_dir(parent)
        entries[dst.strip("/")] = ("symlink", 0o777, target)

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(entries):
            kind, mode, data = entries[path]
            info = tarfile.TarInfo(path)
            info.mtime, info.uid, info.gid, info.uname, info.gname, info.mode = MTIME, 0, 0, "", "", mode
            if kind == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif kind == "symlink":
                info.type, info.linkname = tarfile.SYMTYPE, data
                tar.addfile(info)
            else:
                with open(data, "rb") as f:
                    content = f.read()
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
    return buf.getvalue()


def main():
    a = parse_args()
    blobs = {}

    def blob(data, media_type):
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        blobs[digest] = data
        return {"mediaType": media_type, "digest": digest, "size": len(data)}

    layer_tar = layer(a.file, a.symlink, a.dir)
    layer_desc = blob(layer_tar, "application/vnd.oci.image.layer.v1.tar")
    config = {
        "architecture": a.arch,
        "os": "linux",
        "config": {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]},
        "rootfs": {"type": "layers", "diff_ids": [layer_desc["digest"]]},
        "history": [{"created_by": "scripts/oci-image.py"}],
    }
    if a.entrypoint is not None:
        config["config"]["Entrypoint"] = a.entrypoint
    if a.cmd is not None:
        config["config"]["Cmd"] = a.cmd
    if a.user is not None:
        config["config"]["User"] = a.user
    config_desc = blob(json.dumps(config, sort_keys=True).encode(), "application/vnd.oci.image.config.v1+json")
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": config_desc,
        "layers": [layer_desc],
    }
    manifest_desc = blob(json.dumps(manifest, sort_keys=True).encode(), "application/vnd.oci.image.manifest.v1+json")
    tag = a.name.rsplit(":", 1)[1] if ":" in a.name.rsplit("/", 1)[-1] else "latest"
    manifest_desc["annotations"] = {"io.containerd.image.name": a.name, "org.opencontainers.image.ref.name": tag}
    index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [manifest_desc]}

    tmp = a.out + ".tmp"
    with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as out:
        def put(name, data):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), MTIME, 0o644
            out.addfile(info, io.BytesIO(data))

        put("oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode())
        put("index.json", json.dumps(index, sort_keys=True).encode())
        for digest in sorted(blobs):
            put("blobs/sha256/" + digest.split(":", 1)[1], blobs[digest])
    os.replace(tmp, a.out)
    print(f"{a.name} {manifest_desc['digest']} {len(layer_tar)} bytes")


if __name__ == "__main__":
    main()
