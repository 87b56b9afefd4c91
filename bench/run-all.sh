#!/usr/bin/env bash
# Every benchmark figure, one after the other (each sets up and tears down its own control
# plane, volumes and agents). Prints each figure's JSON line and table. Never fails on timing.
# Needs root; takes about 10 minutes on 2 cores, and about 15 more for the issue-29 side-by-side
# figures at the end (they build upstream v2.9.0 once, see bench/upstream/build.sh).
set -uo pipefail
here=$(dirname "${BASH_SOURCE[0]}")
bash "$here/discovery-latency.sh" 100        # figures 1 and 6 (idle cost with 100 volumes)
bash "$here/bulk-publish.sh" 1000            # figure 2
bash "$here/recycle.sh" 10000                # figure 3
bash "$here/wipe-fs.sh" 200000               # figure 4
bash "$here/scale-foreign.sh" 10 20000       # figure 5
bash "$here/many-agents.sh" 50 20            # figure 7
bash "$here/node-cleanup.sh" 500 100          # issue 8: release of a deleted node
bash "$here/node-cleanup-nodes.sh"            # node-cleanup idle with 10 and 2000 Nodes
bash "$here/ledger-lookup.sh" 1000            # figure 9: used-disk ledger lookups of one pass
bash "$here/config-scale.sh"                  # issue 14: validate-config with 1000..8000 classes
bash "$here/device-claims.sh" 20                # issue 17: raw devices claimed: attach -> PV, disks, idle
bash "$here/device-probe.sh" 3                  # figure 14: proving blank: probe 100 GiB / 1 TiB, claim 100 GiB, full read
bash "$here/wedged-volume.sh" 50                 # issue 27: 50 mounts, then again beside a frozen ext4 volume; its thaw
bash "$here/wedged-disks.sh" 20 100               # issue 41: 20 and 100 wedged volumes: publish, recycle, threads, RSS
bash "$here/idle-side-by-side.sh" 100            # issue 29: idle, one agent with 100 volumes, ours vs upstream v2.9.0
bash "$here/busy-node.sh" 100                  # issue 42: idle with 100 volumes while a tmpfs elsewhere is mounted and unmounted twice a second
bash "$here/fleet.sh" 50 10                      # issue 29: fleet of 50 agents x 10 volumes, ours vs upstream v2.9.0
bash "$here/encryption.sh" 20                    # issue 45: 20 ext4 volumes plain and 20 encrypted: publish, recycle
