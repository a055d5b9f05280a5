#!/usr/bin/env python3
# Spread of busbw between runs at several --warmup/--iters settings (issue
# 14): 2 ranks on loopback, 7 runs each. Needs dist/preflight (tools/release.sh).
import json, socket, statistics, subprocess

BIN = "dist/preflight"
def free():
    s=socket.socket(); s.bind(("127.0.0.1",0)); p=s.getsockname()[1]; s.close(); return p
def run(w, n):
    port=str(free())
    procs=[]
    for r in (0,1):
        env={"PATH":"/usr/bin:/bin","RANK":str(r),"WORLD_SIZE":"2","MASTER_ADDR":"127.0.0.1","MASTER_PORT":port,"PREFLIGHT_TOKEN":"spread-test-secret-01"}
        procs.append(subprocess.Popen([BIN,"bench","--backends","tcp","--max-size","4MiB","--warmup",str(w),"--iters",str(n),"--format","json"],env=env,stdout=subprocess.PIPE,stderr=subprocess.DEVNULL))
    outs=[p.communicate()[0] for p in procs]
    d=json.loads(outs[0])
    b=d["collective"]["backends"][0]
    return {(r["op"],r["bytes"]): r["busbw"] for r in b["sweep"]}, d["duration_ms"]
for w,n in [(2,5),(5,20),(5,50)]:
    runs=[run(w,n) for _ in range(7)]
    keys=runs[0][0].keys()
    def cv(sel):
        vals=[]
        for k in keys:
            if not sel(k[1]): continue
            xs=[r[0][k] for r in runs if k in r[0]]
            if len(xs)>2 and statistics.mean(xs)>0: vals.append(statistics.stdev(xs)/statistics.mean(xs))
        return statistics.median(vals)*100
    print(f"warmup {w} iters {n}: median CV of busbw across 7 runs: <=4KiB {cv(lambda b:b<=4096):.0f}%, 8KiB-256KiB {cv(lambda b:8192<=b<=262144):.0f}%, >=512KiB {cv(lambda b:b>=524288):.0f}%; sweep time median {statistics.median([r[1] for r in runs])} ms")
