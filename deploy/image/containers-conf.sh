#!/usr/bin/env bash
# Prints a containers.conf for Debian's podman on a host whose root may not raise resource limits
# (no CAP_SYS_RESOURCE, as in many CI sandboxes and nested containers): runc, and default ulimits that
# never exceed this shell's. podman's defaults for root (nofile 1048576, nproc 4194304) fail there
# with "error setting rlimit type 7: operation not permitted".
set -euo pipefail

# nofile: the shell's own soft:hard pair (a server holds a socket per stream and a file per cache
# entry). nproc: the shell's hard limit, but no more than kernel.pid_max (no more processes can exist;
# seen here: pid_max 32768, nproc 96551, and runc refused anything above 32768).
nofile_soft=$(ulimit -Sn) nofile_hard=$(ulimit -Hn)
nproc=$(ulimit -Hu)
pid_max=$(cat /proc/sys/kernel/pid_max 2>/dev/null || echo 32768)
if [ "$nproc" = unlimited ] || [ "$nproc" -gt "$pid_max" ]; then nproc=$pid_max; fi
[ "$nofile_hard" = unlimited ] && nofile_hard=1048576
[ "$nofile_soft" = unlimited ] && nofile_soft=$nofile_hard

cat <<CONF
# written by deploy/image/containers-conf.sh
[containers]
default_ulimits = ["nofile=${nofile_soft}:${nofile_hard}", "nproc=${nproc}:${nproc}"]

[engine]
runtime = "runc"
CONF
