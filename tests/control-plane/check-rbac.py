#!/usr/bin/env python3
"""Checks a component's roles against what it really did during the test suite, from the API
server's audit log: sufficient (it was never refused a request its roles are meant to allow)
and minimal (every granted verb was used). Prints a table; exits 1 on failure.

usage: check-rbac.py AUDIT_LOG SERVICEACCOUNT ROLE_JSON...
  SERVICEACCOUNT is namespace:name; each ROLE_JSON is a ClusterRole or Role (kubectl -o json).
Resources are compared with their subresource, as RBAC grants them: `localstoragenodes/status`
is its own resource (the audit log's objectRef names it in `subresource`), so a patch of the
status is not counted as a use of `localstoragenodes` patch, nor the other way round.
"""
import json
import sys

# Verbs granted on purpose although a test run may not exercise them: kube-rs patches an
# Event (its series count) only when the same event repeats within minutes.
MAY_BE_UNUSED = {("events.k8s.io", "events", "patch")}
# The lists of what the watches stream (src/api/watch.rs): each watch starts with a streaming
# list, which is a watch; an API server without streaming lists (before Kubernetes 1.32, or the
# WatchList gate off) is answered with a list and then a watch, so list stays granted. The
# suite's control plane serves streaming lists; tests/cluster/idle_cost.rs runs the other kind on
# its own.
MAY_BE_UNUSED |= {("", "nodes", "list"), ("", "persistentvolumes", "list"),
                  ("storage.k8s.io", "storageclasses", "list"), ("coordination.k8s.io", "leases", "list")}
# Requests the suite makes with the agent's identity on purpose to prove RBAC is enforced.
EXPECTED_DENIALS = {("", "nodes", "delete"), ("", "secrets", "get"), ("", "secrets", "list"),
                    ("", "pods", "create"), ("storage.k8s.io", "storageclasses", "delete"),
                    ("", "namespaces", "create")}

log_path, account, role_paths = sys.argv[1], sys.argv[2], sys.argv[3:]
user = "system:serviceaccount:" + account
granted = set()
for role_path in role_paths:
    role = json.load(open(role_path))
    granted |= {(g, r, v) for rule in role["rules"] for g in rule.get("apiGroups", [""])
                for r in rule.get("resources", []) for v in rule.get("verbs", [])}
used, denied = set(), set()
def resource(ref):
    """resource/subresource of an audit objectRef, as RBAC names it."""
    name = ref.get("resource", "")
    return name + "/" + ref["subresource"] if ref.get("subresource") else name


for line in open(log_path):
    ev = json.loads(line)
    if ev.get("user", {}).get("username") != user:
        continue
    ref = ev.get("objectRef") or {}
    key = (ref.get("apiGroup", ""), resource(ref), ev["verb"])
    code = (ev.get("responseStatus") or {}).get("code", 0)
    (denied if code == 403 else used).add(key)

unused = sorted(granted - used - MAY_BE_UNUSED)
unexpected = sorted(d for d in denied - EXPECTED_DENIALS if d in granted or d[1] in {r for _, r, _ in granted})
print(f"{'group':<28} {'resource':<26} {'verb':<8} used")
for g, r, v in sorted(granted):
    print(f"{g or 'core':<28} {r:<26} {v:<8} {'yes' if (g, r, v) in used else 'NO'}")
ok = True
if unused:
    print(f"not minimal: granted but never used: {unused}")
    ok = False
if unexpected:
    print(f"not sufficient: {account} was refused: {unexpected}")
    ok = False
print(f"rbac check of {account}: " + ("ok" if ok else "FAILED"))
sys.exit(0 if ok else 1)
