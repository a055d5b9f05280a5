# 64 MiB Gloo allreduce, the side-by-side peer of `preflight bench`: two
# warm-ups, then the mean of 5 timed calls after a barrier each; rank 0
# prints seconds per call. Started by bench/collective-*.sh with the
# launcher variables set.
import os, time, torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="env://")
x = torch.ones((64 << 20) // 4)
for _ in range(2):
    dist.all_reduce(x)
times = []
for _ in range(5):
    dist.barrier()
    t = time.perf_counter(); dist.all_reduce(x); times.append(time.perf_counter() - t)
if dist.get_rank() == 0:
    print(sum(times) / len(times))
dist.destroy_process_group()
