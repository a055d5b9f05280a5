# One rank of a Gloo job: init_process_group over env:// and one allreduce.
# Started by bench/cluster-rendezvous.sh with MASTER_ADDR/PORT, RANK and
# WORLD_SIZE, the way torchrun would (Debian's torchrun needs flags on
# Python 3.11; see the project's test-hosts reference).
import datetime, os, sys, time
t0 = time.time()
import torch
import torch.distributed as dist
timeout = float(os.environ.get("BENCH_TIMEOUT_S", "1800"))
try:
    dist.init_process_group("gloo", init_method="env://",
                            timeout=datetime.timedelta(seconds=timeout))
    x = torch.ones(1)
    dist.all_reduce(x)
    dist.destroy_process_group()
    print(f"rank {os.environ['RANK']}: ok sum={x.item():.0f} {time.time()-t0:.2f}s", flush=True)
except Exception as e:  # the message is what an operator would see
    print(f"rank {os.environ['RANK']}: {type(e).__name__}: {str(e).splitlines()[0][:200]} {time.time()-t0:.2f}s", flush=True)
    sys.exit(1)
