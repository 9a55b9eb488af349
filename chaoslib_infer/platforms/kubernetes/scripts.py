"""The small programs the exec-based faults run inside the model-server container.

Each program exists twice, with the same arguments and the same output lines: a ``python3 -c``
version and a POSIX ``sh -c`` version (shell builtins only, plus ``head``/``tail``/``sleep`` where
noted), so that an image without Python still works (see
:func:`chaoslib_infer.platforms.kubernetes.exec.run_script`). Processes are always named by
``pid`` *and* start time (field 22 of ``/proc/PID/stat``, in clock ticks since boot): a process is
only signalled when both match, so a pid reused after a restart is never touched.

- :data:`PROBE` (no arguments): ``self <pid>`` then one ``proc <pid> <ppid> <start> <state>
  <same_cgroup 0|1> <comm>`` line per process the container can see.
- :data:`SIGNAL` (``SIG TTL_S PID:START...``): sends ``SIG`` (STOP or CONT) to each process, one
  ``sent <pid> <state after>`` / ``gone <pid>`` / ``failed <pid>`` line each. With ``TTL_S`` > 0 it
  first starts a detached dead-man timer that sends CONT to the same processes after ``TTL_S``
  seconds (``timer <pid> <start>``; the sh version needs ``sleep``).
- :data:`HOG` (``MB TTL_S``): a detached memory hog that allocates and touches ``MB`` MiB (in
  16 MiB steps) and holds it until ``TTL_S`` seconds have passed (the sh version, ``head -c ...
  /dev/zero | tail``, ends by itself once ``tail`` has read everything). Before it starts it sets
  its own ``oom_score_adj`` to -1000 (needs CAP_SYS_RESOURCE), else raises every other process of
  its cgroup to +1000 (always allowed), so the kernel picks the model server, not the hog.
  Prints ``hog <pid> <start> <mode> <cgroup memory limit or ->``.
- :data:`KILL_TREE` (``PID START``): SIGKILL that process and its children (``killed <pid>``
  lines), or ``gone <pid>`` when it no longer exists.
"""

from __future__ import annotations

__all__ = ["HOG", "KILL_TREE", "PROBE", "SIGNAL"]

_PY_COMMON = r"""
import os, signal, sys, time
def stat(p):
    with open("/proc/%s/stat" % p) as f:
        s = f.read()
    return s[s.rindex(")") + 2:].split()
def cgroup(p):
    try:
        with open("/proc/%s/cgroup" % p) as f:
            return f.read()
    except OSError:
        return None
def pids():
    return sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
def detach():
    os.setsid()
    fd = os.open("/dev/null", os.O_RDWR)
    for i in (0, 1, 2):
        os.dup2(fd, i)
"""

_PY_PROBE = (
    _PY_COMMON
    + r"""
mine = cgroup("self")
print("self", os.getpid())
for p in pids():
    try:
        st = stat(p)
        with open("/proc/%d/comm" % p) as f:
            comm = f.read().strip()
    except (OSError, ValueError, IndexError):
        continue
    print("proc", p, st[1], st[19], st[0], 1 if cgroup(p) == mine else 0, comm)
"""
)

_SH_PROBE = r"""
read -r mine < /proc/self/cgroup
echo "self $$"
for d in /proc/[0-9]*; do
  p=${d#/proc/}
  read -r st 2>/dev/null < "$d/stat" || continue
  comm=${st#*"("}
  comm=${comm%")"*}
  set -- ${st##*") "}
  cg=
  read -r cg 2>/dev/null < "$d/cgroup"
  same=0
  [ "$cg" = "$mine" ] && same=1
  echo "proc $p $2 ${20} $1 $same $comm"
done
"""

_PY_SIGNAL = (
    _PY_COMMON
    + r"""
sig = getattr(signal, "SIG" + sys.argv[1])
ttl = float(sys.argv[2])
pairs = [a.split(":") for a in sys.argv[3:]]
def matching():
    out = []
    for p, start in pairs:
        try:
            if stat(p)[19] == start:
                out.append(int(p))
        except (OSError, ValueError, IndexError):
            pass
    return out
if ttl > 0:
    child = os.fork()
    if child == 0:
        detach()
        time.sleep(ttl)
        for p in matching():
            try:
                os.kill(p, signal.SIGCONT)
            except OSError:
                pass
        os._exit(0)
    print("timer", child, stat(child)[19])
alive = matching()
for p, _ in pairs:
    if int(p) not in alive:
        print("gone", p)
        continue
    try:
        os.kill(int(p), sig)
    except OSError as exc:
        print("failed", p, exc.errno)
        continue
    print("sent", p, stat(p)[0])
"""
)

_SH_SIGNAL = r"""
sig=$1
ttl=$2
shift 2
pairs="$*"
if [ "$ttl" != 0 ]; then
  (
    sleep "$ttl" || exit 0
    for pair in $pairs; do
      pid=${pair%%:*}
      read -r st 2>/dev/null < "/proc/$pid/stat" || continue
      set -- ${st##*") "}
      [ "${20}" = "${pair#*:}" ] && kill -s CONT "$pid" 2>/dev/null
    done
  ) < /dev/null > /dev/null 2>&1 &
  read -r st < "/proc/$!/stat"
  set -- ${st##*") "}
  echo "timer $! ${20}"
fi
for pair in $pairs; do
  pid=${pair%%:*}
  if ! read -r st 2>/dev/null < "/proc/$pid/stat"; then echo "gone $pid"; continue; fi
  set -- ${st##*") "}
  if [ "${20}" != "${pair#*:}" ]; then echo "gone $pid"; continue; fi
  if ! kill -s "$sig" "$pid" 2>/dev/null; then echo "failed $pid"; continue; fi
  read -r st 2>/dev/null < "/proc/$pid/stat"
  set -- ${st##*") "}
  echo "sent $pid $1"
done
"""

_PY_HOG = (
    _PY_COMMON
    + r"""
mb, ttl = int(sys.argv[1]), float(sys.argv[2])
me = os.getpid()
try:
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write("-1000")
    mode = "self-1000"
except OSError:
    mine, n = cgroup("self"), 0
    for p in pids():
        if p != me and cgroup(p) == mine:
            try:
                with open("/proc/%d/oom_score_adj" % p, "w") as f:
                    f.write("1000")
                n += 1
            except OSError:
                pass
    mode = "others+1000:%d" % n
limit = "-"
for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
    try:
        with open(path) as f:
            limit = f.read().strip()
        break
    except OSError:
        pass
child = os.fork()
if child:
    print("hog", child, stat(child)[19], mode, limit, flush=True)
    os._exit(0)
detach()
end = time.monotonic() + ttl
held, got, total = [], 0, mb << 20
while got < total and time.monotonic() < end:
    n = min(16 << 20, total - got)
    held.append(b"\x01" * n)
    got += n
    time.sleep(0.005)
while time.monotonic() < end:
    time.sleep(0.2)
os._exit(0)
"""
)

_SH_HOG = r"""
mb=$1
if echo -1000 2>/dev/null > /proc/self/oom_score_adj; then
  mode=self-1000
else
  read -r mine < /proc/self/cgroup
  n=0
  for d in /proc/[0-9]*; do
    [ "${d#/proc/}" = "$$" ] && continue
    cg=
    read -r cg 2>/dev/null < "$d/cgroup"
    [ "$cg" = "$mine" ] || continue
    echo 1000 2>/dev/null > "$d/oom_score_adj" && n=$((n + 1))
  done
  mode=others+1000:$n
fi
limit=-
for f in /sys/fs/cgroup/memory.max /sys/fs/cgroup/memory/memory.limit_in_bytes; do
  if [ -r "$f" ]; then read -r limit < "$f"; break; fi
done
( head -c $((mb * 1048576)) /dev/zero | tail > /dev/null ) < /dev/null > /dev/null 2>&1 &
read -r st < "/proc/$!/stat"
set -- ${st##*") "}
echo "hog $! ${20} $mode $limit"
"""

_PY_KILL_TREE = (
    _PY_COMMON
    + r"""
pid, start = int(sys.argv[1]), sys.argv[2]
try:
    ok = stat(pid)[19] == start
except (OSError, ValueError, IndexError):
    ok = False
if not ok:
    print("gone", pid)
    sys.exit(0)
kids = []
for p in pids():
    try:
        if int(stat(p)[1]) == pid:
            kids.append(p)
    except (OSError, ValueError, IndexError):
        pass
for p in [pid] + kids:
    try:
        os.kill(p, signal.SIGKILL)
        print("killed", p)
    except OSError:
        pass
"""
)

_SH_KILL_TREE = r"""
pid=$1
start=$2
if ! read -r st 2>/dev/null < "/proc/$pid/stat"; then echo "gone $pid"; exit 0; fi
set -- ${st##*") "}
if [ "${20}" != "$start" ]; then echo "gone $pid"; exit 0; fi
kids=
for d in /proc/[0-9]*; do
  read -r st 2>/dev/null < "$d/stat" || continue
  set -- ${st##*") "}
  [ "$2" = "$pid" ] && kids="$kids ${d#/proc/}"
done
for p in $pid $kids; do
  kill -s KILL "$p" 2>/dev/null && echo "killed $p"
done
"""

#: ``{"python3": source, "sh": source}`` of each program (see the module docstring).
PROBE = {"python3": _PY_PROBE, "sh": _SH_PROBE}
SIGNAL = {"python3": _PY_SIGNAL, "sh": _SH_SIGNAL}
HOG = {"python3": _PY_HOG, "sh": _SH_HOG}
KILL_TREE = {"python3": _PY_KILL_TREE, "sh": _SH_KILL_TREE}
