//! NCCL smoke test on the local GPUs: one process per GPU, the five
//! operations verified, a size sweep with busbw, and an abort at a deadline.
//!
//!   smoke [--nccl-lib PATH] [--gpus N] [--sizes 1M,16M,64M,256M] [--deadline-s 60] [--hold-s 0]
//!
//! 1. The probe runs first and the smoke test stops there (exit 2) when it
//!    says there is no usable device or no NCCL.
//! 2. Phase "ops": N ranks (this program re-executed, rank = GPU ordinal),
//!    unique id from rank 0 through a file, non-blocking init polled to the
//!    deadline; allreduce (sum), broadcast (from the last rank), allgather,
//!    send/recv around a ring in a group (N >= 2), and a barrier (allreduce
//!    of one element), each checked element by element; then the sweep:
//!    time per allreduce, algbw and busbw = algbw * 2(n-1)/n.
//! 3. Phase "abort": the N ranks init a communicator of N+1 ranks whose last
//!    rank never comes; init must still be in progress at a 5 s deadline,
//!    and ncclCommAbort must end it promptly.
//!
//! Output lines starting with "RANK", "SWEEP" and "ABORT" are the results.
//! "HOLD": with --hold-s, each rank keeps its communicator that long after
//! the operations (for a query of NCCL's RAS port meanwhile), and writes
//! NCCL_SMOKE_HOLD_FILE.RANK, where set, when it starts to.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nccl_sys::{Comm, Cuda, CudaSearch, Error, Nccl, NcclSearch, RedOp, Stream, UniqueId, probe};

const RANK: &str = "NCCL_SMOKE_RANK";
const NRANKS: &str = "NCCL_SMOKE_NRANKS";
const WORLD: &str = "NCCL_SMOKE_WORLD";
const ID_FILE: &str = "NCCL_SMOKE_ID_FILE";
const LIB: &str = "NCCL_SMOKE_LIB";
const PHASE: &str = "NCCL_SMOKE_PHASE";
const SIZES: &str = "NCCL_SMOKE_SIZES";
const DEADLINE: &str = "NCCL_SMOKE_DEADLINE_S";
/// Seconds each rank keeps its communicator after the operations, for a
/// query of NCCL's RAS port meanwhile (tests/gpu/nccl-ras.sh).
const HOLD: &str = "NCCL_SMOKE_HOLD_S";

fn main() {
    let child = std::env::var(RANK).is_ok();
    let result = if child { rank_main() } else { parent_main() };
    match result {
        Ok(()) => std::process::exit(0),
        Err((code, msg)) => {
            eprintln!("{}{msg}", if child { "rank failed: " } else { "smoke: " });
            std::process::exit(code);
        }
    }
}

type Failure = (i32, String);

fn fail(msg: impl ToString) -> Failure {
    (1, msg.to_string())
}

fn parse_size(s: &str) -> Result<usize, Failure> {
    let s = s.trim();
    let (num, mult) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1usize << 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 1 << 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    let n: usize = num.parse().map_err(|_| fail(format!("bad size {s:?}")))?;
    let b = n * mult;
    if b < 4 || b % 4 != 0 {
        return Err(fail(format!(
            "size {s} must be a positive multiple of 4 bytes"
        )));
    }
    Ok(b)
}

fn parent_main() -> Result<(), Failure> {
    let mut lib: Option<PathBuf> = None;
    let mut gpus: Option<usize> = None;
    let mut sizes = "1M,16M,64M,256M".to_string();
    let mut deadline_s: u64 = 60;
    let mut hold_s: u64 = 0;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .ok_or_else(|| fail(format!("{flag} needs a value")))
        };
        match flag.as_str() {
            "--nccl-lib" => lib = Some(PathBuf::from(value()?)),
            "--gpus" => gpus = Some(value()?.parse().map_err(|e| fail(format!("--gpus: {e}")))?),
            "--sizes" => sizes = value()?,
            "--hold-s" => {
                hold_s = value()?
                    .parse()
                    .map_err(|e| fail(format!("--hold-s: {e}")))?
            }
            "--deadline-s" => {
                deadline_s = value()?
                    .parse()
                    .map_err(|e| fail(format!("--deadline-s: {e}")))?
            }
            other => return Err(fail(format!("unknown argument {other}"))),
        }
    }
    let sizes: Vec<usize> = sizes.split(',').map(parse_size).collect::<Result<_, _>>()?;

    let nccl_search = NcclSearch::from_env(lib.as_deref());
    let p = probe(&CudaSearch::from_env(None), &nccl_search);
    println!("PROBE {p}");
    let (count, nccl) = match (&p.cuda, &p.nccl) {
        (nccl_sys::CudaStatus::Devices { count, .. }, Ok(n)) => (*count, n.clone()),
        _ => return Err((2, format!("not runnable here: {p}"))),
    };
    let n = gpus.unwrap_or(count).min(count);
    if n == 0 {
        return Err((2, "--gpus 0".into()));
    }
    println!(
        "NCCL {} at {} (found via {})",
        nccl.version,
        nccl.path,
        source_of(&nccl.report)
    );

    let dir = std::env::temp_dir().join(format!("nccl-smoke-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(fail)?;
    let size_list = sizes
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let ops = run_phase(
        &dir,
        "ops",
        n,
        n,
        &nccl.path,
        &size_list,
        (deadline_s + hold_s, hold_s),
    )?;
    // The abort phase: a world of n+1 whose last rank never starts.
    let abort = run_phase(&dir, "abort", n, n + 1, &nccl.path, "", (deadline_s, 0))?;
    let _ = std::fs::remove_dir_all(&dir);

    let mut ok = true;
    for (phase, results) in [("ops", &ops), ("abort", &abort)] {
        for (r, (success, text)) in results.iter().enumerate() {
            for line in text.lines() {
                for tag in ["RANK ", "SWEEP ", "ABORT "] {
                    if let Some(i) = line.find(tag) {
                        println!("{}", &line[i..]);
                    }
                }
            }
            if !success {
                ok = false;
                eprintln!("--- {phase} rank {r} failed; its output ---\n{text}");
            }
        }
    }
    if ok {
        println!(
            "SMOKE OK: {n} GPU(s), five operations verified, sweep done, abort at the deadline worked"
        );
        Ok(())
    } else {
        Err(fail("some ranks failed (output above)"))
    }
}

fn source_of(report: &nccl_sys::LoadReport) -> String {
    report
        .loaded()
        .map_or_else(|| "?".into(), |a| a.source.to_string())
}

fn run_phase(
    dir: &Path,
    phase: &str,
    n: usize,
    world: usize,
    lib: &str,
    sizes: &str,
    (deadline_s, hold_s): (u64, u64),
) -> Result<Vec<(bool, String)>, Failure> {
    let id_file = dir.join(format!("{phase}-id"));
    let exe = std::env::current_exe().map_err(fail)?;
    let mut children = Vec::new();
    for r in 0..n {
        let mut cmd = Command::new(&exe);
        cmd.env(RANK, r.to_string())
            .env(NRANKS, n.to_string())
            .env(WORLD, world.to_string())
            .env(ID_FILE, &id_file)
            .env(LIB, lib)
            .env(PHASE, phase)
            .env(SIZES, sizes)
            .env(DEADLINE, deadline_s.to_string())
            .env(HOLD, hold_s.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        children.push(
            cmd.spawn()
                .map_err(|e| fail(format!("spawn rank {r}: {e}")))?,
        );
    }
    let mut readers = Vec::new();
    for c in &mut children {
        let (mut o, mut e) = (c.stdout.take(), c.stderr.take());
        readers.push(std::thread::spawn(move || {
            let mut s = String::new();
            if let Some(x) = o.as_mut() {
                let _ = x.read_to_string(&mut s);
            }
            if let Some(x) = e.as_mut() {
                let _ = x.read_to_string(&mut s);
            }
            s
        }));
    }
    // The ranks keep their own deadlines; this one only catches a rank
    // stuck where no deadline reaches (a driver call that never returns).
    let hard = Duration::from_secs(deadline_s * 3 + 30);
    let start = Instant::now();
    let mut oks = Vec::new();
    for c in &mut children {
        let ok = loop {
            match c.try_wait() {
                Ok(Some(st)) => break st.success(),
                Ok(None) if start.elapsed() < hard => std::thread::sleep(Duration::from_millis(20)),
                _ => {
                    let _ = c.kill();
                    let _ = c.wait();
                    break false;
                }
            }
        };
        oks.push(ok);
    }
    let texts = readers.into_iter().map(|h| h.join().unwrap_or_default());
    Ok(oks.into_iter().zip(texts).collect())
}

fn env_usize(k: &str) -> Result<usize, Failure> {
    std::env::var(k)
        .map_err(|_| fail(format!("{k} unset")))?
        .parse()
        .map_err(|e| fail(format!("{k}: {e}")))
}

fn exchange_id(
    nccl: &Nccl,
    rank: usize,
    file: &Path,
    deadline: Instant,
) -> Result<UniqueId, Failure> {
    if rank == 0 {
        let id = nccl.unique_id().map_err(fail)?;
        let tmp = file.with_extension("tmp");
        std::fs::write(&tmp, id.as_bytes()).map_err(fail)?;
        std::fs::rename(&tmp, file).map_err(fail)?;
        return Ok(id);
    }
    loop {
        if let Ok(b) = std::fs::read(file) {
            return UniqueId::from_bytes(&b).map_err(fail);
        }
        if Instant::now() > deadline {
            return Err(fail("rank 0 never wrote the unique id"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn rank_main() -> Result<(), Failure> {
    let rank = env_usize(RANK)?;
    let n = env_usize(NRANKS)?;
    let world = env_usize(WORLD)?;
    let deadline_s = env_usize(DEADLINE)? as u64;
    let phase = std::env::var(PHASE).map_err(|_| fail("no phase"))?;
    let id_file = PathBuf::from(std::env::var(ID_FILE).map_err(|_| fail("no id file"))?);
    let lib = PathBuf::from(std::env::var(LIB).map_err(|_| fail("no lib"))?);

    let cuda = Cuda::open(None).map_err(fail)?;
    cuda.init().map_err(fail)?;
    let dev = cuda.device(rank).map_err(fail)?;
    let nccl = Nccl::open_path(&lib).map_err(fail)?;
    let deadline = Instant::now() + Duration::from_secs(deadline_s);
    let id = exchange_id(&nccl, rank, &id_file, deadline)?;

    if phase == "abort" {
        let comm = nccl.init_rank_nonblocking(world, &id, rank).map_err(fail)?;
        let short = Instant::now() + Duration::from_secs(5);
        match comm.wait_ready(short) {
            Ok(()) => {
                return Err(fail(format!(
                    "init of {world} ranks finished with only {n} present"
                )));
            }
            Err(Error::Timeout { what }) => {
                let t = Instant::now();
                comm.abort().map_err(fail)?;
                println!(
                    "ABORT rank {rank}: {what} after 5 s (rank {} never joined); ncclCommAbort took {:.1} ms",
                    world - 1,
                    t.elapsed().as_secs_f64() * 1e3
                );
                return Ok(());
            }
            Err(e) => return Err(fail(format!("expected a timeout, got: {e}"))),
        }
    }

    let mut comm = nccl.init_rank_nonblocking(n, &id, rank).map_err(fail)?;
    // Connections are made lazily at the first operations, which may then
    // sit in ncclInProgress: the smoke deadline bounds that too.
    comm.set_enqueue_timeout(Duration::from_secs(deadline_s));
    let t = Instant::now();
    if let Err(e) = comm.wait_ready(deadline) {
        let _ = comm.abort();
        return Err(fail(format!("init: {e}")));
    }
    let init_ms = t.elapsed().as_secs_f64() * 1e3;
    let stream = dev.stream().map_err(fail)?;
    let (free, total) = dev.mem_info().map_err(fail)?;
    let name = dev.name().unwrap_or_default();
    let result = five_ops(&nccl, &comm, &dev, &stream, deadline)
        .and_then(|()| sweep(&comm, &dev, &stream, deadline));
    match result {
        Ok(()) => {
            println!(
                "RANK {rank}/{n} OK on GPU {rank} ({name}, {} of {} MiB free): init {init_ms:.0} ms; \
                 allreduce broadcast allgather sendrecv barrier verified",
                free >> 20,
                total >> 20
            );
            let hold = env_usize(HOLD).unwrap_or(0) as u64;
            if hold > 0 {
                println!("HOLD rank {rank}: communicator kept {hold} s");
                // Said at once to whoever waits for it (stdout reaches
                // the parent only when the rank ends).
                if let Ok(f) = std::env::var("NCCL_SMOKE_HOLD_FILE") {
                    let _ = std::fs::write(format!("{f}.{rank}"), "holding\n");
                }
                std::thread::sleep(Duration::from_secs(hold));
            }
            comm.destroy().map_err(fail)
        }
        Err(e) => {
            let _ = comm.abort();
            Err(e)
        }
    }
}

fn check<T: PartialEq + std::fmt::Debug>(
    what: &str,
    got: &[T],
    want: impl Fn(usize) -> T,
) -> Result<(), Failure> {
    for (i, g) in got.iter().enumerate() {
        let w = want(i);
        if *g != w {
            return Err(fail(format!("{what}[{i}] = {g:?}, want {w:?}")));
        }
    }
    Ok(())
}

fn five_ops(
    nccl: &Nccl,
    comm: &Comm<'_>,
    dev: &nccl_sys::Device<'_>,
    stream: &Stream<'_>,
    deadline: Instant,
) -> Result<(), Failure> {
    let (rank, n) = (comm.rank(), comm.nranks());
    let count = 1 << 16;

    let host: Vec<f32> = (0..count)
        .map(|i| (rank + 1) as f32 + (i % 1000) as f32)
        .collect();
    let mut send = dev.alloc::<f32>(count).map_err(fail)?;
    let mut recv = dev.alloc::<f32>(count).map_err(fail)?;
    send.copy_from_host(&host).map_err(fail)?;
    comm.all_reduce(&send, &mut recv, RedOp::Sum, stream)
        .map_err(fail)?;
    comm.wait(stream, deadline).map_err(fail)?;
    let mut out = vec![0f32; count];
    recv.copy_to_host(&mut out).map_err(fail)?;
    check("allreduce", &out, |i| {
        (n * (n + 1) / 2) as f32 + (n * (i % 1000)) as f32
    })?;

    let root = n - 1;
    let mut b = dev.alloc::<i32>(4099).map_err(fail)?;
    let src: Vec<i32> = (0..4099)
        .map(|i| if rank == root { i * 3 + 7 } else { -1 })
        .collect();
    b.copy_from_host(&src).map_err(fail)?;
    comm.broadcast(&mut b, root, stream).map_err(fail)?;
    comm.wait(stream, deadline).map_err(fail)?;
    let mut bo = vec![0i32; 4099];
    b.copy_to_host(&mut bo).map_err(fail)?;
    check("broadcast", &bo, |i| i as i32 * 3 + 7)?;

    let per = 1000;
    let mut mine = dev.alloc::<u32>(per).map_err(fail)?;
    mine.copy_from_host(
        &(0..per)
            .map(|j| (rank * 100_000 + j) as u32)
            .collect::<Vec<_>>(),
    )
    .map_err(fail)?;
    let mut all = dev.alloc::<u32>(per * n).map_err(fail)?;
    comm.all_gather(&mine, &mut all, stream).map_err(fail)?;
    comm.wait(stream, deadline).map_err(fail)?;
    let mut ao = vec![0u32; per * n];
    all.copy_to_host(&mut ao).map_err(fail)?;
    check("allgather", &ao, |i| ((i / per) * 100_000 + i % per) as u32)?;

    if n >= 2 {
        let (right, left) = ((rank + 1) % n, (rank + n - 1) % n);
        let mut s = dev.alloc::<f64>(777).map_err(fail)?;
        s.copy_from_host(
            &(0..777)
                .map(|j| (rank * 1000 + j) as f64)
                .collect::<Vec<_>>(),
        )
        .map_err(fail)?;
        let mut r = dev.alloc::<f64>(777).map_err(fail)?;
        nccl.group(|| {
            comm.send(&s, right, stream)?;
            comm.recv(&mut r, left, stream)
        })
        .map_err(fail)?;
        comm.wait(stream, deadline).map_err(fail)?;
        let mut ro = vec![0f64; 777];
        r.copy_to_host(&mut ro).map_err(fail)?;
        check("sendrecv", &ro, |j| (left * 1000 + j) as f64)?;
    }

    // Barrier: a one-element allreduce finishes nowhere before everyone
    // has entered it.
    let mut one = dev.alloc::<i32>(1).map_err(fail)?;
    one.copy_from_host(&[1]).map_err(fail)?;
    comm.all_reduce_in_place(&mut one, RedOp::Sum, stream)
        .map_err(fail)?;
    comm.wait(stream, deadline).map_err(fail)?;
    let mut oo = [0i32];
    one.copy_to_host(&mut oo).map_err(fail)?;
    check("barrier", &oo, |_| n as i32)
}

fn sweep(
    comm: &Comm<'_>,
    dev: &nccl_sys::Device<'_>,
    stream: &Stream<'_>,
    deadline: Instant,
) -> Result<(), Failure> {
    let n = comm.nranks();
    let sizes: Vec<usize> = std::env::var(SIZES)
        .unwrap_or_default()
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().map_err(|e| fail(format!("size {s}: {e}"))))
        .collect::<Result<_, _>>()?;
    for bytes in sizes {
        let count = bytes / 4;
        let mut send = dev.alloc::<f32>(count).map_err(fail)?;
        let mut recv = dev.alloc::<f32>(count).map_err(fail)?;
        send.copy_from_host(&vec![1.0f32; count]).map_err(fail)?;
        let iters = 20;
        for _ in 0..5 {
            comm.all_reduce(&send, &mut recv, RedOp::Sum, stream)
                .map_err(fail)?;
        }
        comm.wait(stream, deadline).map_err(fail)?;
        let t = Instant::now();
        for _ in 0..iters {
            comm.all_reduce(&send, &mut recv, RedOp::Sum, stream)
                .map_err(fail)?;
        }
        comm.wait(stream, deadline).map_err(fail)?;
        let per = t.elapsed().as_secs_f64() / iters as f64;
        let mut all = vec![0f32; count];
        recv.copy_to_host(&mut all).map_err(fail)?;
        if all[0] != n as f32 || all[count - 1] != n as f32 {
            return Err(fail(format!(
                "sweep {bytes} B: sum {} / {}, want {n}",
                all[0],
                all[count - 1]
            )));
        }
        let algbw = bytes as f64 / per / 1e9;
        let busbw = algbw * 2.0 * (n - 1) as f64 / n as f64;
        if comm.rank() == 0 {
            println!(
                "SWEEP {} MiB x {n} GPUs: {:.1} us/allreduce, algbw {algbw:.2} GB/s, busbw {busbw:.2} GB/s",
                bytes as f64 / (1 << 20) as f64,
                per * 1e6
            );
        }
    }
    Ok(())
}
