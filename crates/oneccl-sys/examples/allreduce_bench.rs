//! oneCCL CPU allreduce bandwidth, N ranks as N processes on this machine.
//!
//!   allreduce_bench [--lib PATH] [--ranks 4] [--sizes 4K,64K,1M,16M,64M] [--deadline-s 300]
//!
//! The parent re-executes itself once per rank (rank and world size in the
//! environment), passes the unique id through a file, and prints one
//! markdown row per size from rank 0: time per allreduce (the slowest
//! rank's mean), algbw = bytes / time and busbw = algbw * 2(n-1)/n, the
//! nccl-tests convention. oneCCL's own log lines go to the ranks' stdout,
//! which the parent keeps out of the table (shown only on failure).
//!
//! When unset, the loopback environment is set for the ranks:
//! CCL_KVS_IFACE=lo FI_PROVIDER=tcp FI_TCP_IFACE=lo CCL_YIELD=sched_yield
//! CCL_ATL_SHM=1.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use oneccl_sys::{Library, RedOp, UniqueId};

const RANK: &str = "ONECCL_BENCH_RANK";
const NRANKS: &str = "ONECCL_BENCH_NRANKS";
const ID_FILE: &str = "ONECCL_BENCH_ID_FILE";
const SIZES: &str = "ONECCL_BENCH_SIZES";
const LIB: &str = "ONECCL_BENCH_LIB";

fn main() {
    let code = match std::env::var(RANK) {
        Ok(_) => match rank_main() {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("rank failed: {e}");
                2
            }
        },
        Err(_) => match parent_main() {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("allreduce_bench: {e}");
                1
            }
        },
    };
    std::process::exit(code);
}

struct Args {
    lib: Option<PathBuf>,
    ranks: usize,
    sizes: Vec<usize>,
    deadline: Duration,
}

fn parse_size(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let (num, mult) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1 << 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 1 << 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    let n: usize = num.parse().map_err(|_| format!("bad size {s:?}"))?;
    let bytes = n * mult;
    if bytes < 4 || bytes % 4 != 0 {
        return Err(format!(
            "size {s} must be a positive multiple of 4 bytes (f32)"
        ));
    }
    Ok(bytes)
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        lib: None,
        ranks: 4,
        sizes: ["4K", "64K", "1M", "16M", "64M"]
            .iter()
            .map(|s| parse_size(s))
            .collect::<Result<_, _>>()?,
        deadline: Duration::from_secs(300),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--lib" => a.lib = Some(PathBuf::from(value()?)),
            "--ranks" => a.ranks = value()?.parse().map_err(|e| format!("--ranks: {e}"))?,
            "--sizes" => {
                a.sizes = value()?
                    .split(',')
                    .map(parse_size)
                    .collect::<Result<_, _>>()?
            }
            "--deadline-s" => {
                a.deadline =
                    Duration::from_secs(value()?.parse().map_err(|e| format!("--deadline-s: {e}"))?)
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if a.ranks < 2 {
        return Err("--ranks must be at least 2".into());
    }
    Ok(a)
}

fn parent_main() -> Result<(), String> {
    let args = parse_args()?;
    // Resolve the library once here, so a missing one is one clear line.
    let lib = Library::open(args.lib.as_deref()).map_err(|e| e.to_string())?;
    let lib_path = PathBuf::from(lib.path());
    let version = lib.version();
    drop(lib);

    let dir = std::env::temp_dir().join(format!("oneccl-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let id_file = dir.join("id");
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let sizes = args
        .sizes
        .iter()
        .map(|s| s.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let mut children = Vec::new();
    for r in 0..args.ranks {
        let mut cmd = Command::new(&exe);
        cmd.env(RANK, r.to_string())
            .env(NRANKS, args.ranks.to_string())
            .env(ID_FILE, &id_file)
            .env(SIZES, &sizes)
            .env(LIB, &lib_path)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in [
            ("CCL_KVS_IFACE", "lo"),
            ("FI_PROVIDER", "tcp"),
            ("FI_TCP_IFACE", "lo"),
            ("CCL_YIELD", "sched_yield"),
            ("CCL_ATL_SHM", "1"),
        ] {
            if std::env::var_os(k).is_none() {
                cmd.env(k, v);
            }
        }
        children.push(cmd.spawn().map_err(|e| format!("spawn rank {r}: {e}"))?);
    }
    // Read pipes on threads: a rank blocked on a full stdout pipe would
    // look like a hang.
    let mut readers = Vec::new();
    for c in &mut children {
        let mut out = c.stdout.take();
        let mut err = c.stderr.take();
        readers.push(std::thread::spawn(move || {
            let mut s = String::new();
            if let Some(o) = out.as_mut() {
                let _ = o.read_to_string(&mut s);
            }
            if let Some(e) = err.as_mut() {
                let _ = e.read_to_string(&mut s);
            }
            s
        }));
    }
    let start = Instant::now();
    let mut failed = Vec::new();
    for (r, c) in children.iter_mut().enumerate() {
        loop {
            match c.try_wait() {
                Ok(Some(st)) => {
                    if !st.success() {
                        failed.push(format!("rank {r} exited with {st}"));
                    }
                    break;
                }
                Ok(None) if start.elapsed() < args.deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => {
                    let _ = c.kill();
                    let _ = c.wait();
                    failed.push(format!(
                        "rank {r} killed at the {:?} deadline",
                        args.deadline
                    ));
                    break;
                }
            }
        }
    }
    let outputs: Vec<String> = readers
        .into_iter()
        .map(|h| h.join().unwrap_or_default())
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    if !failed.is_empty() {
        for (r, o) in outputs.iter().enumerate() {
            eprintln!("--- rank {r} output ---\n{o}");
        }
        return Err(failed.join("; "));
    }
    println!(
        "oneCCL {version} ({}), {} ranks, CPU host buffers, loopback",
        lib_path.display(),
        args.ranks
    );
    println!();
    println!("| size | iters | time/op | algbw | busbw |");
    println!("|---:|---:|---:|---:|---:|");
    for line in outputs[0].lines() {
        if let Some(row) = line.split("BENCHROW ").nth(1) {
            println!("{row}");
        }
    }
    Ok(())
}

fn env_usize(k: &str) -> Result<usize, String> {
    std::env::var(k)
        .map_err(|_| format!("{k} unset"))?
        .parse()
        .map_err(|e| format!("{k}: {e}"))
}

fn exchange_id(lib: &Library, rank: usize, file: &Path) -> Result<UniqueId, String> {
    if rank == 0 {
        let id = lib.unique_id().map_err(|e| e.to_string())?;
        let tmp = file.with_extension("tmp");
        std::fs::write(&tmp, id.as_bytes()).map_err(|e| e.to_string())?;
        std::fs::rename(&tmp, file).map_err(|e| e.to_string())?;
        return Ok(id);
    }
    let start = Instant::now();
    loop {
        if let Ok(b) = std::fs::read(file) {
            return UniqueId::from_bytes(&b).map_err(|e| e.to_string());
        }
        if start.elapsed() > Duration::from_secs(60) {
            return Err("rank 0 never wrote the unique id".into());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn human(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

fn rank_main() -> Result<(), String> {
    let rank = env_usize(RANK)?;
    let n = env_usize(NRANKS)?;
    let id_file = PathBuf::from(std::env::var(ID_FILE).map_err(|_| "no id file")?);
    let sizes: Vec<usize> = std::env::var(SIZES)
        .map_err(|_| "no sizes")?
        .split(',')
        .map(|s| s.parse().map_err(|e| format!("size {s}: {e}")))
        .collect::<Result<_, String>>()?;
    let lib = Library::open_path(Path::new(&std::env::var(LIB).map_err(|_| "no lib")?))
        .map_err(|e| e.to_string())?;
    let id = exchange_id(&lib, rank, &id_file)?;
    let comm = lib.init_rank(n, &id, rank).map_err(|e| e.to_string())?;
    let e = |e: oneccl_sys::Error| e.to_string();

    for bytes in sizes {
        let count = bytes / 4;
        let send = vec![(rank + 1) as f32; count];
        let mut recv = vec![0f32; count];
        // About 256 MiB moved per size, between 5 and 200 iterations.
        let iters = (256usize << 20).div_ceil(bytes).clamp(5, 200);
        for _ in 0..2 {
            comm.all_reduce(&send, &mut recv, RedOp::Sum).map_err(e)?;
        }
        comm.barrier().map_err(e)?;
        let t = Instant::now();
        for _ in 0..iters {
            comm.all_reduce(&send, &mut recv, RedOp::Sum).map_err(e)?;
        }
        let mut per_op = [t.elapsed().as_secs_f64() / iters as f64];
        let want = (n * (n + 1) / 2) as f32;
        if recv[0] != want || recv[count - 1] != want {
            return Err(format!(
                "wrong sum at {bytes} bytes: {} / {}, want {want}",
                recv[0],
                recv[count - 1]
            ));
        }
        // The slowest rank's time is the collective's time.
        comm.all_reduce_in_place(&mut per_op, RedOp::Max)
            .map_err(e)?;
        if rank == 0 {
            let t = per_op[0];
            let algbw = bytes as f64 / t / 1e9;
            let busbw = algbw * 2.0 * (n - 1) as f64 / n as f64;
            let time = if t < 1e-3 {
                format!("{:.1} us", t * 1e6)
            } else {
                format!("{:.2} ms", t * 1e3)
            };
            println!(
                "BENCHROW | {} | {iters} | {time} | {algbw:.3} GB/s | {busbw:.3} GB/s |",
                human(bytes)
            );
        }
    }
    Ok(())
}
