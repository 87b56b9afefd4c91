#!/usr/bin/env python3
"""A failing disk for tests: a FUSE filesystem, spoken over /dev/fuse with the standard library
only, that exposes one file, ``disk.img``, backed by a real (sparse) file, and that a test can
switch at runtime between healthy, failing (EIO on chosen byte ranges, for reads and/or
writes), wedged (every call blocks, unanswered, until released) and resized. A loop device over
``disk.img`` is then a block device that fails the way a real disk does (this kernel has no
device-mapper, so no dm-error / dm-flakey / dm-delay).

Usage (as root):

    fuse_disk.py --mountpoint DIR --backing FILE --size BYTES --control SOCKET

It mounts a FUSE filesystem at DIR (fstype ``fuse``, source ``fuse_disk``) whose only entry is
``DIR/disk.img``; the file's bytes are those of FILE (created or resized to BYTES, sparse).
``disk.img`` is opened with FOPEN_DIRECT_IO: no page cache on the FUSE side, so every read and
write of a loop device over it reaches this server (the loop device's and the filesystem's own
caches above it are the test's business: drop them with ``echo 3 > /proc/sys/vm/drop_caches``).

Control: one command per connection on the UNIX socket SOCKET, one line in, one line out
(``ok ...`` or ``error ...``):

    healthy                      no failures, answers everything (also releases a block)
    eio START END r|w|rw         add a failing range [START, END) in bytes (END ``-`` = the end)
    clear                        remove every failing range
    block                        stop answering: every request from now on waits, unanswered
    release                      answer the waiting requests (as the current state says) and
                                 answer again
    release-eio                  answer the waiting requests with EIO, and answer again
    resize BYTES                 the exposed size (and the backing file's) becomes BYTES
    status                       ``ok {json}``: state, size, ranges, pending, served counters

The socket is served by its own thread, so a wedged disk never blocks its control channel.

Stopping: SIGTERM or SIGINT answers every waiting request with EIO, detaches the mount
(umount2 MNT_DETACH) and closes /dev/fuse, then exits 0. Whatever happens, the kernel never
stays wedged on this server: closing /dev/fuse (the process ending, even by SIGKILL) aborts the
connection and fails every request still waiting (ENOTCONN) and every later one. So to release
a machine by hand: ``kill PID`` (or ``kill -9 PID``; ``kill -CONT PID`` first if it was
stopped), or ``echo 1 > /sys/fs/fuse/connections/N/abort``, then ``umount -l DIR``; a loop
device over ``disk.img`` then fails its I/O until ``losetup -d``.
"""

import argparse
import ctypes
import errno
import json
import os
import signal
import socket
import stat
import struct
import sys
import threading

# Opcodes (linux/fuse.h).
LOOKUP, FORGET, GETATTR, SETATTR = 1, 2, 3, 4
OPEN, READ, WRITE, STATFS, RELEASE, FSYNC = 14, 15, 16, 17, 18, 20
GETXATTR, LISTXATTR, FLUSH, INIT = 22, 23, 25, 26
OPENDIR, READDIR, RELEASEDIR, FSYNCDIR, ACCESS = 27, 28, 29, 30, 34
INTERRUPT, DESTROY, BATCH_FORGET, FALLOCATE, LSEEK = 36, 38, 42, 43, 46

# Requests the kernel expects no answer to.
NO_REPLY = {FORGET, BATCH_FORGET, INTERRUPT}

ROOT_ID, FILE_ID = 1, 2
FILE_NAME = b"disk.img"
FOPEN_DIRECT_IO = 1 << 0
FATTR_SIZE = 1 << 3
FUSE_BIG_WRITES = 1 << 5
MAX_WRITE = 1 << 17

IN_HEADER = struct.Struct("<IIQQIIIHH")  # len opcode unique nodeid uid gid pid total_extlen padding
OUT_HEADER = struct.Struct("<IiQ")  # len error unique
ATTR = struct.Struct("<QQQQQQIIIIIIIIII")  # fuse_attr (88 bytes)

MS_NOSUID, MS_NODEV = 2, 4
MNT_DETACH = 2

libc = ctypes.CDLL(None, use_errno=True)


class Stop(Exception):
    """Raised in the main thread by SIGTERM/SIGINT."""


class Disk:
    def __init__(self, fd, backing, mountpoint):
        self.fd = fd
        self.backing = os.open(backing, os.O_RDWR | os.O_CREAT, 0o600)
        self.mountpoint = mountpoint
        self.lock = threading.Lock()
        self.size = 0
        self.ranges = []  # (start, end, reads, writes)
        self.blocked = False
        self.pending = []  # raw requests received while blocked
        self.counts = {"reads": 0, "writes": 0, "eio_reads": 0, "eio_writes": 0, "requests": 0}

    # --- answers -------------------------------------------------------------------------

    def reply(self, unique, error=0, body=b""):
        data = OUT_HEADER.pack(OUT_HEADER.size + len(body), -error if error else 0, unique) + body
        try:
            os.write(self.fd, data)
        except OSError as e:
            # ENOENT: the request was interrupted meanwhile; anything else: the connection is gone.
            if e.errno != errno.ENOENT:
                raise

    def attr(self, node):
        if node == ROOT_ID:
            mode, size, nlink = stat.S_IFDIR | 0o755, 0, 2
        else:
            mode, size, nlink = stat.S_IFREG | 0o600, self.size, 1
        blocks = (size + 511) // 512
        return ATTR.pack(node, size, blocks, 0, 0, 0, 0, 0, 0, mode, nlink, 0, 0, 0, 4096, 0)

    def attr_out(self, node):
        # attr_valid 0: the kernel asks again every time, so a resize shows at once.
        return struct.pack("<QII", 0, 0, 0) + self.attr(node)

    def failing(self, offset, length, write):
        end = offset + length
        for start, stop, reads, writes in self.ranges:
            if (writes if write else reads) and offset < stop and start < end:
                return True
        return False

    # --- dispatch ------------------------------------------------------------------------

    def handle(self, raw, force_error=0):
        """Answers one request (called with the lock held)."""
        length, opcode, unique, nodeid, _uid, _gid, _pid, _extlen, _pad = IN_HEADER.unpack_from(raw)
        body = raw[IN_HEADER.size:length]
        self.counts["requests"] += 1
        if opcode in NO_REPLY:
            return
        if force_error:
            return self.reply(unique, force_error)
        if opcode == INIT:
            major, minor, max_readahead, _flags = struct.unpack_from("<IIII", body)
            out = struct.pack(
                "<IIIIHHIIHHI7I",
                7,
                min(minor, 31),
                max_readahead,
                FUSE_BIG_WRITES,
                16,  # max_background
                12,  # congestion_threshold
                MAX_WRITE,
                1,  # time_gran
                0,
                0,
                0,
                *([0] * 7),
            )
            return self.reply(unique, 0, out)
        if opcode == LOOKUP:
            name = body.split(b"\0", 1)[0]
            if nodeid != ROOT_ID or name != FILE_NAME:
                return self.reply(unique, errno.ENOENT)
            entry = struct.pack("<QQQQII", FILE_ID, 0, 0, 0, 0, 0) + self.attr(FILE_ID)
            return self.reply(unique, 0, entry)
        if opcode == GETATTR:
            return self.reply(unique, 0, self.attr_out(nodeid))
        if opcode == SETATTR:
            valid = struct.unpack_from("<I", body)[0]
            if valid & FATTR_SIZE and nodeid == FILE_ID:
                size = struct.unpack_from("<Q", body, 16)[0]
                self.set_size(size)
            return self.reply(unique, 0, self.attr_out(nodeid))
        if opcode in (OPEN, OPENDIR):
            flags = FOPEN_DIRECT_IO if opcode == OPEN else 0
            return self.reply(unique, 0, struct.pack("<QII", 0, flags, 0))
        if opcode == READ:
            _fh, offset, size = struct.unpack_from("<QQI", body)
            if nodeid != FILE_ID:
                return self.reply(unique, errno.EISDIR)
            self.counts["reads"] += 1
            if self.failing(offset, size, write=False):
                self.counts["eio_reads"] += 1
                return self.reply(unique, errno.EIO)
            size = max(0, min(size, self.size - offset))
            data = os.pread(self.backing, size, offset) if size else b""
            return self.reply(unique, 0, data)
        if opcode == WRITE:
            _fh, offset, size = struct.unpack_from("<QQI", body)
            # fuse_write_in is 40 bytes from 7.9 on; the data follows it.
            data = body[40:40 + size]
            self.counts["writes"] += 1
            if self.failing(offset, size, write=True):
                self.counts["eio_writes"] += 1
                return self.reply(unique, errno.EIO)
            if offset >= self.size:
                return self.reply(unique, errno.ENOSPC)
            data = data[: self.size - offset]
            os.pwrite(self.backing, data, offset)
            return self.reply(unique, 0, struct.pack("<II", len(data), 0))
        if opcode == READDIR:
            _fh, offset, size = struct.unpack_from("<QQI", body)
            entries = [(ROOT_ID, b".", 4), (ROOT_ID, b"..", 4), (FILE_ID, FILE_NAME, 8)]
            out = b""
            for i, (ino, name, kind) in enumerate(entries):
                if i < offset:
                    continue
                dirent = struct.pack("<QQII", ino, i + 1, len(name), kind) + name
                dirent += b"\0" * ((8 - len(dirent) % 8) % 8)
                if len(out) + len(dirent) > size:
                    break
                out += dirent
            return self.reply(unique, 0, out)
        if opcode == STATFS:
            blocks = self.size // 4096
            st = struct.pack("<QQQQQIIII6I", blocks, 0, 0, 2, 0, 4096, 255, 4096, 0, *([0] * 6))
            return self.reply(unique, 0, st)
        if opcode in (RELEASE, RELEASEDIR, FLUSH, FSYNC, FSYNCDIR):
            return self.reply(unique, 0)
        if opcode == DESTROY:
            return self.reply(unique, 0)
        # GETXATTR, LISTXATTR, ACCESS, FALLOCATE, LSEEK and the rest: not implemented, which
        # the kernel remembers and stops asking (or falls back).
        return self.reply(unique, errno.ENOSYS)

    def set_size(self, size):
        self.size = size
        os.ftruncate(self.backing, size)

    # --- the request loop (main thread) --------------------------------------------------

    def serve(self):
        bufsize = MAX_WRITE + 64 * 1024
        while True:
            try:
                raw = os.read(self.fd, bufsize)
            except OSError as e:
                if e.errno in (errno.ENOENT, errno.EINTR, errno.EAGAIN):
                    continue  # an interrupted request vanished: read again
                if e.errno == errno.ENODEV:
                    return  # unmounted
                raise
            with self.lock:
                opcode = IN_HEADER.unpack_from(raw)[1]
                if self.blocked and opcode not in (INIT, DESTROY) and opcode not in NO_REPLY:
                    self.pending.append(raw)
                else:
                    self.handle(raw)

    def answer_pending(self, error=0):
        pending, self.pending = self.pending, []
        for raw in pending:
            self.handle(raw, force_error=error)
        return len(pending)

    # --- the control channel (its own thread) --------------------------------------------

    def command(self, line):
        words = line.split()
        if not words:
            return "error empty command"
        cmd, args = words[0], words[1:]
        with self.lock:
            if cmd == "healthy":
                self.ranges = []
                self.blocked = False
                n = self.answer_pending()
                return f"ok healthy (answered {n} waiting)"
            if cmd == "eio":
                if len(args) != 3 or args[2] not in ("r", "w", "rw"):
                    return "error usage: eio START END r|w|rw"
                start = int(args[0])
                end = (1 << 63) if args[1] == "-" else int(args[1])
                self.ranges.append((start, end, "r" in args[2], "w" in args[2]))
                return f"ok eio [{start}, {end}) {args[2]}"
            if cmd == "clear":
                self.ranges = []
                return "ok clear"
            if cmd == "block":
                self.blocked = True
                return "ok block"
            if cmd in ("release", "release-eio"):
                self.blocked = False
                n = self.answer_pending(errno.EIO if cmd == "release-eio" else 0)
                return f"ok {cmd} (answered {n} waiting)"
            if cmd == "resize":
                if len(args) != 1:
                    return "error usage: resize BYTES"
                self.set_size(int(args[0]))
                return f"ok resize {self.size}"
            if cmd == "status":
                state = {
                    "blocked": self.blocked,
                    "size": self.size,
                    "ranges": [[s, e, "r" * r + "w" * w] for s, e, r, w in self.ranges],
                    "pending": len(self.pending),
                    **self.counts,
                }
                return "ok " + json.dumps(state, separators=(",", ":"))
        return f"error unknown command {cmd!r}"

    def control(self, path):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        srv.bind(path)
        srv.listen(8)
        while True:
            conn, _ = srv.accept()
            with conn:
                try:
                    data = b""
                    while not data.endswith(b"\n"):
                        chunk = conn.recv(4096)
                        if not chunk:
                            break
                        data += chunk
                    answer = self.command(data.decode().strip())
                except Exception as e:  # a bad command never ends the server
                    answer = f"error {e}"
                try:
                    conn.sendall(answer.encode() + b"\n")
                except OSError:
                    pass

    def stop(self):
        """Fails what waits, detaches the mount and closes /dev/fuse (which aborts the
        connection: nothing can wait on this server after that)."""
        with self.lock:
            self.blocked = False
            try:
                self.answer_pending(errno.EIO)
            except OSError:
                pass
        libc.umount2(self.mountpoint.encode(), MNT_DETACH)
        os.close(self.fd)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mountpoint", required=True)
    p.add_argument("--backing", required=True)
    p.add_argument("--size", required=True, type=int)
    p.add_argument("--control", required=True)
    a = p.parse_args()

    fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
    os.makedirs(a.mountpoint, exist_ok=True)
    opts = f"fd={fd},rootmode=40000,user_id=0,group_id=0,allow_other".encode()
    if libc.mount(b"fuse_disk", a.mountpoint.encode(), b"fuse", MS_NOSUID | MS_NODEV, opts) != 0:
        e = ctypes.get_errno()
        sys.exit(f"fuse_disk: mount {a.mountpoint}: {os.strerror(e)}")
    disk = Disk(fd, a.backing, a.mountpoint)
    disk.set_size(a.size)

    def on_signal(_sig, _frame):
        raise Stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    threading.Thread(target=disk.control, args=(a.control,), daemon=True).start()
    print(f"fuse_disk: serving {a.mountpoint}/disk.img ({a.size} bytes), control {a.control}", flush=True)
    try:
        disk.serve()
    except Stop:
        pass
    finally:
        disk.stop()


if __name__ == "__main__":
    main()
