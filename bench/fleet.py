#!/usr/bin/env python3
"""Helpers of bench/fleet.sh that shell does badly: reading the API server's audit log, the
PV watch log and the Events, for either implementation (ours or upstream's v2.9.0).

The audit log (tests/control-plane/start.sh) holds the requests of the agents' ServiceAccount,
one JSON object per stage; a request is counted once (by auditID), at the time the API server
received it, under "verb resource" ("create persistentvolumes", "patch nodes", ...).
The watch log is `kubectl get pv --watch --output-watch-events` with the columns EVENT NAME UID
PHASE AFFINITY_HOST, each line prefixed with the time it was read.

Subcommands (each prints one JSON object):
  requests AUDIT USER T0 T1         requests of USER received in [T0, T1), by verb+resource,
                                    how many were answered 409 (Conflict), and the
                                    answers >= 300 by "verb resource code"
  pvs WATCH                         PVs that exist now: name -> [uid, phase, node]
  published WATCH TOTAL             time of the first sighting of the TOTAL-th distinct PV
  pick WATCH K SKIP                 K existing Available PVs, round-robin over nodes, after
                                    skipping the first SKIP of that order
  renewed WATCH NAMES_JSON          how many of NAMES (name -> old uid) exist again with another
                                    uid and phase Available, and the time the last one did
  refusals EVENTS_JSON              Warning events saying a volume is already published
  mount-events SECONDS              mount table changes on this host over SECONDS (the
                                    kernel's POLLPRI on /proc/self/mountinfo, which also wakes
                                    every agent of ours: other work on the host counts too)
"""
import json
import select
import sys
import time
from datetime import datetime


def ts(s):
    return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def requests(audit, user, t0, t1):
    seen, by, conflicts, failed = set(), {}, 0, {}
    with open(audit) as f:
        for line in f:
            try:
                e = json.loads(line)
            except ValueError:
                continue
            if e.get("user", {}).get("username") != user:
                continue
            aid = e.get("auditID")
            if aid in seen:
                # The ResponseComplete of a request already counted at ResponseStarted (a watch).
                continue
            t = ts(e["requestReceivedTimestamp"])
            if not t0 <= t < t1:
                continue
            seen.add(aid)
            ref = e.get("objectRef", {})
            res = ref.get("resource", e.get("requestURI", "?"))
            if ref.get("subresource"):
                res += "/" + ref["subresource"]
            key = f'{e.get("verb")} {res}'
            by[key] = by.get(key, 0) + 1
            code = e.get("responseStatus", {}).get("code", 0)
            if code == 409:
                conflicts += 1
            if code >= 300:
                failed[f"{key} {code}"] = failed.get(f"{key} {code}", 0) + 1
    return {"total": sum(by.values()), "conflicts": conflicts, "by": dict(sorted(by.items())),
            "failed": dict(sorted(failed.items()))}


def watch_lines(path):
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) < 5:
                continue
            yield float(parts[0]), parts[1], parts[2], parts[3], parts[4], (parts[5] if len(parts) > 5 else "<none>")


def pvs(path):
    now = {}
    for _, ev, name, uid, phase, node in watch_lines(path):
        if ev == "DELETED":
            if now.get(name, [None])[0] == uid:
                del now[name]
        else:
            now[name] = [uid, phase, node]
    return now


def published(path, total):
    seen = set()
    for t, ev, name, *_ in watch_lines(path):
        if ev != "DELETED" and name not in seen:
            seen.add(name)
            if len(seen) >= total:
                return {"count": len(seen), "time": t}
    return {"count": len(seen), "time": None}


def pick(path, k, skip):
    per_node = {}
    for name, (uid, phase, node) in sorted(pvs(path).items()):
        if phase == "Available":
            per_node.setdefault(node, []).append((name, uid))
    order, i = [], 0
    while any(i < len(v) for v in per_node.values()):
        for node in sorted(per_node):
            if i < len(per_node[node]):
                order.append(per_node[node][i])
        i += 1
    return dict(order[skip:skip + k])


def renewed(path, names):
    last, done = None, set()
    for t, ev, name, uid, phase, _ in watch_lines(path):
        if name in names and ev != "DELETED" and uid != names[name] and phase == "Available" and name not in done:
            done.add(name)
            last = t
    return {"done": len(done), "of": len(names), "time": last}


def refusals(events):
    n, volumes = 0, set()
    for e in json.load(open(events)).get("items", []):
        text = (e.get("message") or e.get("note") or "")
        if e.get("type") == "Warning" and "already published" in text:
            n += 1
            related = (e.get("related") or {}).get("name")
            volumes.add(related or text)
    return {"already_published_warnings": n, "volumes_refused": len(volumes)}


def mount_events(seconds):
    with open("/proc/self/mountinfo") as f:
        f.read()
        p = select.poll()
        p.register(f, select.POLLPRI | select.POLLERR)
        n, end = 0, time.time() + seconds
        while (left := end - time.time()) > 0:
            if p.poll(left * 1000):
                n += 1
                f.seek(0)
                f.read()
    return {"mount_events": n}


def main(argv):
    cmd = argv[1]
    if cmd == "requests":
        out = requests(argv[2], argv[3], float(argv[4]), float(argv[5]))
    elif cmd == "pvs":
        out = pvs(argv[2])
    elif cmd == "published":
        out = published(argv[2], int(argv[3]))
    elif cmd == "pick":
        out = pick(argv[2], int(argv[3]), int(argv[4]))
    elif cmd == "renewed":
        out = renewed(argv[2], json.loads(argv[3]))
    elif cmd == "mount-events":
        out = mount_events(float(argv[2]))
    elif cmd == "refusals":
        out = refusals(argv[2])
    else:
        sys.exit(f"unknown subcommand {cmd}")
    print(json.dumps(out, separators=(",", ":")))


if __name__ == "__main__":
    main(sys.argv)
