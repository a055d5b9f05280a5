"""A torch job for `preflight diagnose`'s tests, under torchrun (Gloo):
every rank loops all_reduce; JOB_MODE picks the fault.

  healthy    every rank loops, with a 50 ms sleep a round; rank 0 writes
             JOB_MARKER after 20 rounds
  late_init  rank JOB_RANK writes JOB_MARKER and sleeps before
             init_process_group
  stop       rank JOB_RANK writes JOB_MARKER and sleeps before its 6th
             all_reduce
  spin       rank JOB_RANK writes JOB_MARKER and spins in a busy loop
             before its 6th all_reduce
  jitter     every rank sleeps 0 to 0.8 s (at random) before each
             all_reduce; rank 0 writes JOB_MARKER after 5 rounds
  slow       every rank all_reduces 32 MB, then sleeps 0.3 s; rank 0
             writes JOB_MARKER after 3 rounds
  mismatch   rank JOB_RANK calls all_gather where the others call their
             6th all_reduce, and writes JOB_MARKER
  two        before the 6th all_reduce, rank JOB_RANK sleeps (and writes
             JOB_MARKER) and rank JOB_RANK2 blocks in queue.Queue().get()
A held rank sleeps until the file JOB_RELEASE exists (where set) or
JOB_SECONDS pass; every rank ends after JOB_ROUNDS all_reduces (where
set), or when torchrun is killed.

Where TORCH_WORKER_SERVER_SOCKET is set (a torch with a Flight Recorder),
each rank serves torch's worker server at that path followed by its rank
and `.sock`, as a job wrapped in worker_main() does. Each rank JOB_DUMP
lists (`0,1,2`) has torch write its Flight Recorder dump (to
TORCH_FR_DUMP_TEMP_FILE and its rank) once its loop has stood still for a
second, as a job's own hang watchdog would. Where
TORCH_NCCL_DEBUG_INFO_PIPE_FILE is set, each rank stands in for what
ProcessGroupNCCL's heartbeat thread does with it (which a Gloo job has
not): it makes the FIFO `<that path><rank>.pipe`, and whenever a line
comes through it, torch writes the rank's dump. Where JOB_DESYNC is set,
each rank writes what ProcessGroupNCCL writes under
TORCH_NCCL_DESYNC_DEBUG (which a Gloo job does not): before and after
each all_reduce, `NCCL_<rank>_trace_start` and `_end` (the collective's
number as 8 bytes little-endian, its name, a NUL) in the store torch
gives an NCCL backend (torch 2.x: `PrefixStore("cuda/", <the group's
store>)`; 1.13: the group's store itself)."""
import contextlib
import os
import struct
import queue
import random
import threading
import time

import torch
import torch.distributed as dist

mode = os.environ.get("JOB_MODE", "healthy")
rank = int(os.environ["RANK"])
held = int(os.environ.get("JOB_RANK", "-1"))
held2 = int(os.environ.get("JOB_RANK2", "-1"))
marker = os.environ.get("JOB_MARKER", "")
end = time.monotonic() + float(os.environ.get("JOB_SECONDS", "120"))
release = os.environ.get("JOB_RELEASE", "")
rounds = int(os.environ.get("JOB_ROUNDS", "0")) or None


def mark():
    if marker:
        with open(marker + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.rename(marker + ".tmp", marker)


def hold():
    mark()
    while time.monotonic() < end:
        if release and os.path.exists(release):
            return
        time.sleep(0.2)
    raise SystemExit(0)


def spin():
    mark()
    n = 0
    while time.monotonic() < end:
        n += 1
    raise SystemExit(0)


def block():
    # A lock in the job's own code: a queue nobody fills.
    try:
        queue.Queue().get(timeout=max(end - time.monotonic(), 0))
    except queue.Empty:
        pass
    raise SystemExit(0)


server = contextlib.ExitStack()
base = os.environ.get("TORCH_WORKER_SERVER_SOCKET")
if base:
    from torch.distributed.elastic.control_plane import worker_main

    os.environ["TORCH_WORKER_SERVER_SOCKET"] = f"{base}{rank}.sock"
    server.enter_context(worker_main())


step = [0]


def dumps():
    from torch._C._distributed_c10d import _dump_fr_trace_file

    seen, since, dumped = step[0], time.monotonic(), False
    while True:
        time.sleep(0.1)
        if step[0] != seen:
            seen, since, dumped = step[0], time.monotonic(), False
        elif not dumped and time.monotonic() - since > 1:
            _dump_fr_trace_file(rank)
            dumped = True


def pipe(path):
    from torch._C._distributed_c10d import _dump_fr_trace_file

    os.mkfifo(path)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    while True:
        time.sleep(0.1)
        try:
            asked = os.read(fd, 64)
        except BlockingIOError:
            continue
        if asked:
            _dump_fr_trace_file(rank)


if os.environ.get("TORCH_NCCL_DEBUG_INFO_PIPE_FILE"):
    path = os.environ["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] + f"{rank}.pipe"
    threading.Thread(target=pipe, args=(path,), daemon=True).start()

if str(rank) in os.environ.get("JOB_DUMP", "").split(","):
    threading.Thread(target=dumps, daemon=True).start()

if mode == "late_init" and rank == held:
    hold()
dist.init_process_group("gloo")
traces = None
if os.environ.get("JOB_DESYNC"):
    c10d = dist.distributed_c10d
    if hasattr(c10d, "_world"):
        # torch 2.x: the NCCL backend's store is `<device>/` under the
        # group's prefix store, which the group map keeps.
        _, group_store = c10d._world.pg_map[dist.group.WORLD]
        traces = dist.PrefixStore("cuda/", group_store)
    else:
        # torch 1.13: the backend takes the group's prefix store, its name
        # over the default store, which the group map keeps.
        _, default_store = c10d._pg_map[dist.group.WORLD]
        traces = dist.PrefixStore("0", default_store)


def trace(which, seq):
    if traces is not None:
        traces.set(f"NCCL_{rank}_trace_{which}", struct.pack("<Q", seq) + b"all_reduce\0")


t = torch.ones(8 << 20 if mode == "slow" else 1024)
i = 0
while time.monotonic() < end and (rounds is None or i < rounds):
    if mode == "stop" and rank == held and i == 5:
        hold()
    if mode == "spin" and rank == held and i == 5:
        spin()
    if mode == "two" and i == 5:
        if rank == held:
            hold()
        if rank == held2:
            block()
    if mode == "jitter":
        time.sleep(random.uniform(0, 0.8))
    if mode == "mismatch" and rank == held and i == 5:
        mark()
        dist.all_gather([torch.zeros_like(t) for _ in range(dist.get_world_size())], t)
    else:
        trace("start", i + 1)
        dist.all_reduce(t)
        trace("end", i + 1)
        t.fill_(1)
    i += 1
    step[0] = i
    if mode == "slow":
        time.sleep(0.3)
    if mode == "healthy":
        time.sleep(0.05)
    if rank == 0 and (
        (mode == "healthy" and i == 20)
        or (mode == "jitter" and i == 5)
        or (mode == "slow" and i == 3)
    ):
        mark()
assert t[0].item() > 0
dist.destroy_process_group()
server.close()
