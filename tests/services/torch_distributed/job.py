"""A torch job for `preflight diagnose`'s tests, under torchrun (Gloo):
every rank loops all_reduce; JOB_MODE picks the fault.

  healthy    every rank loops; rank 0 writes JOB_MARKER after 20 rounds
  late_init  rank JOB_RANK writes JOB_MARKER and sleeps before
             init_process_group
  stop       rank JOB_RANK writes JOB_MARKER and sleeps before its 6th
             all_reduce
A held rank sleeps until the file JOB_RELEASE exists (where set) or
JOB_SECONDS pass; every rank ends after JOB_ROUNDS all_reduces (where
set), or when torchrun is killed."""
import os
import time

import torch
import torch.distributed as dist

mode = os.environ.get("JOB_MODE", "healthy")
rank = int(os.environ["RANK"])
held = int(os.environ.get("JOB_RANK", "-1"))
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


if mode == "late_init" and rank == held:
    hold()
dist.init_process_group("gloo")
t = torch.ones(1024)
i = 0
while time.monotonic() < end and (rounds is None or i < rounds):
    if mode == "stop" and rank == held and i == 5:
        hold()
    dist.all_reduce(t)
    i += 1
    if mode == "healthy" and rank == 0 and i == 20:
        mark()
assert t[0].item() > 0
dist.destroy_process_group()
