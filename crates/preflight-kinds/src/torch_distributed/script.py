# preflight's torch_distributed probe (embedded in the binary, run with
# `python -c`). It does what a distributed job does at start-up, in the
# job's own environment: pick the backend torch would use for this node's
# device, init_process_group (with a device_id where frameworks pass one),
# a Gloo CPU group, an allreduce on each and a barrier. Every step is
# announced on stdout as one marked JSON line, so that preflight can say
# which step failed or hung; the parent kills the whole process group at
# its deadline.
import json
import os
import sys

MARK = "PREFLIGHT-TORCH "


def say(**fields):
    sys.stdout.write(MARK + json.dumps(fields) + "\n")
    sys.stdout.flush()


BACKEND_FOR_DEVICE = {"cuda": "nccl", "xpu": "xccl", "hpu": "hccl", "cpu": "gloo"}
DEVICE_FOR_BACKEND = {
    "nccl": "cuda",
    "xccl": "xpu",
    "ccl": "xpu",
    "hccl": "hpu",
    "gloo": "cpu",
    "mpi": "cpu",
    "ucc": "cpu",
}


def installed(module):
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def accelerator(torch):
    """The device type a framework would run on here, as torch sees it."""
    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        return "cuda"
    if not hasattr(torch, "xpu") and installed("intel_extension_for_pytorch"):
        # Before torch 2.4, torch.xpu exists only once IPEX is imported.
        import intel_extension_for_pytorch  # noqa: F401
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        return "xpu"
    if installed("habana_frameworks"):
        import habana_frameworks.torch  # noqa: F401
        hpu = getattr(torch, "hpu", None)
        if hpu is not None and hpu.is_available():
            return "hpu"
    return "cpu"


def xccl_available(dist):
    check = getattr(dist, "is_xccl_available", None)
    return bool(check and check())


def backend_available(backend, dist):
    """Whether this torch can create `backend`, where it can tell."""
    check = getattr(dist, "is_%s_available" % backend, None)
    if check is not None:
        return bool(check())
    generic = getattr(dist, "is_backend_available", None)
    if generic is not None:
        return bool(generic(backend))
    # Older torch without a way to ask: init_process_group will say.
    return True


def register(backend, dist):
    """Imports the plugin that registers an out-of-tree backend, as jobs do."""
    if backend == "ccl" or (backend == "xccl" and not xccl_available(dist)):
        if installed("oneccl_bindings_for_pytorch"):
            import oneccl_bindings_for_pytorch  # noqa: F401
            return "ccl"
    if backend == "hccl" and installed("habana_frameworks"):
        import habana_frameworks.torch.distributed.hccl  # noqa: F401
    return backend


def main(cfg):
    import datetime
    import inspect
    import platform

    say(step="start", python=sys.executable, python_version=platform.python_version())
    step = "import"
    try:
        import torch
    except ModuleNotFoundError as e:
        if e.name == "torch":
            say(missing="torch", text=str(e))
            return 3
        say(error=str(e), type=type(e).__name__, step=step)
        return 1
    except Exception as e:  # a broken install: a missing shared library, an ABI clash
        say(error=str(e), type=type(e).__name__, step=step)
        return 1
    import torch.distributed as dist

    say(step=step, torch=torch.__version__)
    if not dist.is_available():
        say(error="torch.distributed is not available in this build of torch", type="RuntimeError", step=step)
        return 1
    try:
        step = "device"
        wanted = cfg["backend"]
        if wanted == "auto":
            device = accelerator(torch)
            backend = BACKEND_FOR_DEVICE[device]
        else:
            backend = wanted
            device = DEVICE_FOR_BACKEND.get(backend, "cpu")
        backend = register(backend, dist)
        local_rank = int(os.environ.get("LOCAL_RANK", "0") or 0)
        takes_id = "device_id" in inspect.signature(dist.init_process_group).parameters
        pass_id = device != "cpu" and takes_id and cfg["device_id"] in ("auto", "true")
        kwargs = {"timeout": datetime.timedelta(seconds=cfg["timeout_s"])}
        if pass_id:
            kwargs["device_id"] = torch.device(device, local_rank)
        if cfg["rendezvous"] == "local":
            kwargs.update(init_method="tcp://127.0.0.1:%d" % cfg["port"], rank=0, world_size=1)
        else:
            kwargs.update(init_method="env://")
        say(
            step=step,
            backend=backend,
            device=device,
            local_rank=local_rank,
            device_id=str(kwargs["device_id"]) if pass_id else None,
            takes_device_id=takes_id,
            init_method=kwargs["init_method"],
        )
        if not backend_available(backend, dist):
            raise RuntimeError("this torch has no %s backend (torch.distributed says it is not available)" % backend)
        if device != "cpu":
            module = getattr(torch, device, None)
            if module is None or not module.is_available():
                raise RuntimeError("no %s device: torch.%s.is_available() is False" % (device, device))
            module.set_device(local_rank)

        step = "init_process_group"
        say(step=step)
        dist.init_process_group(backend, **kwargs)
        world = dist.get_world_size()
        rank = dist.get_rank()

        step = "new_group"
        say(step=step)
        cpu_group = dist.new_group(backend="gloo", timeout=kwargs["timeout"])

        step = "allreduce"
        say(step=step)
        where = "cpu" if device == "cpu" else "%s:%d" % (device, local_rank)
        t = torch.ones(4, device=where)
        dist.all_reduce(t)
        c = torch.ones(4)
        dist.all_reduce(c, group=cpu_group)
        if device != "cpu":
            getattr(torch, device).synchronize()
        got = (t.cpu().tolist(), c.tolist())
        if any(v != float(world) for v in got[0] + got[1]):
            say(error="allreduce of ones gave %r, expected %d everywhere" % (got, world), type="WrongResult", step=step)
            return 1

        step = "barrier"
        say(step=step)
        dist.barrier()
        dist.barrier(group=cpu_group)

        step = "destroy_process_group"
        dist.destroy_process_group()
        say(step="done", ok=True, world_size=world, rank=rank)
        return 0
    except BaseException as e:  # noqa: B902 - every failure is the report
        import traceback

        traceback.print_exc()
        say(error=str(e)[-4000:], type=type(e).__name__, step=step)
        return 1


if __name__ == "__main__":
    sys.exit(main(json.loads(sys.argv[1])))
