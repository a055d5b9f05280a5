//! preflight bench on loopback: every size swept, rows as measured and a
//! table per operation, the defaults the README states, and bus bandwidth
//! as nccl-tests reports it.

use super::*;

#[test]
fn a_full_sweep_with_factor_four_reports_busbw_as_nccl_tests() {
    let _serial = serial();
    let out = ranks(
        3,
        &[
            "--collective",
            "full",
            "--max-size",
            "256KiB",
            "--step-factor",
            "4",
            "--iters",
            "2",
        ],
        &[],
    );
    all_exit(&out, 0);
    let report = out[0].report();
    let sweep = &tcp(&report).sweep;
    let sizes: Vec<usize> = sweep
        .iter()
        .filter(|r| r.op.name() == "allreduce")
        .map(|r| r.bytes)
        .collect();
    assert_eq!(sizes, vec![8, 32, 128, 512, 2048, 8192, 32768, 131072]);
    for r in sweep {
        let factor = match r.op.name() {
            "allreduce" => 2.0 * 2.0 / 3.0,
            "allgather" => 2.0 / 3.0,
            _ => 1.0,
        };
        assert!((r.busbw - r.algbw * factor).abs() < 1e-9, "{r:#?}");
    }
    // Three ranks: pairs over three rounds, every pair once.
    assert_eq!(report.collective().pairs.len(), 3);
}

/// `preflight bench`: the rendezvous and the full sweep, no checklist; the
/// sizes double from 8 B to `--max-size` and every row is verified, as an
/// nccl-tests run would report it.
#[test]
fn bench_sweeps_every_size_without_a_checklist() {
    let _serial = serial();
    let port = cluster::free_port().to_string();
    let args: Vec<String> = [
        "bench",
        "--backends",
        "tcp",
        "--max-size",
        "64KiB",
        "--timeout",
        "60s",
        "--format",
        "json",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let procs: Vec<Proc> = (0..2)
        .map(|r| local(&format!("rank{r}"), &args, &env(&r.to_string(), "2", &port)))
        .collect();
    let out: Vec<Outcome> = procs.into_iter().map(|p| p.finish(MARGIN)).collect();
    all_exit(&out, 0);
    let report = out[0].report();
    assert_eq!(report.command, "bench");
    // No node checklist: only the stages' own results.
    for c in &report.checks {
        let id = c.id.as_str();
        assert!(
            id.starts_with("cluster.") || id.starts_with("collective."),
            "a checklist check in bench: {id}"
        );
    }
    let b = tcp(&report);
    passed_and_verified(b, "bench");
    let sizes: Vec<usize> = b
        .sweep
        .iter()
        .filter(|row| row.op.name() == "allreduce")
        .map(|row| row.bytes)
        .collect();
    let expected: Vec<usize> = (3..=16).map(|p| 1usize << p).collect();
    assert_eq!(sizes, expected, "{b:#?}");
}

/// `bench` as nccl-tests users read it: on rank 0's terminal each row as
/// it is measured, then one table per operation closed by its average bus
/// bandwidth.
#[test]
fn bench_shows_rows_as_measured_and_a_table_per_operation() {
    let _serial = serial();
    let port = cluster::free_port().to_string();
    let flags = "bench --backends tcp --max-size 64KiB --timeout 60s";
    let peer_args: Vec<String> = flags.split(' ').map(String::from).collect();
    let peer = local("rank1", &peer_args, &env("1", "2", &port));
    let command = format!("{} {flags}", env!("CARGO_BIN_EXE_preflight"));
    let tty = std::process::Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("TERM", "xterm")
        .env("LANG", "C.UTF-8")
        .envs(env("0", "2", &port))
        .output()
        .expect("script");
    let text = String::from_utf8_lossy(&tty.stdout).into_owned();
    let out = peer.finish(MARGIN);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(tty.status.success(), "{text}");
    // Live: every row of the sweep passed through the progress line.
    assert!(
        text.contains("[tcp] allreduce 8 B:") && text.contains("[tcp] broadcast 65536 B:"),
        "{text:?}"
    );
    // Then a table per operation, each with its average.
    for op in ["allreduce", "allgather", "broadcast"] {
        let at = text
            .find(&format!("  {op:<10}      size(B)"))
            .unwrap_or_else(|| panic!("no {op} table: {text}"));
        let table = &text[at..];
        let avg = table.find("avg busbw ").expect("an average line");
        assert!(table[avg..].contains("GB/s over 14 sizes"), "{table}");
    }
}

/// The sweep's defaults, as the README states them, with no size or
/// iteration flag: `bench` sweeps to 64 MiB with 5 untimed and 20 timed
/// iterations, `run`'s short stage to 1 MiB with 2 and 5, both with a
/// 10 s step deadline; the report records what ran.
#[test]
fn the_sweeps_defaults_are_what_the_readme_says_and_are_recorded() {
    let _serial = serial();
    // (max_size, step_factor, warmup, iters, step_timeout_ms), and the
    // allreduce sizes.
    let settings = |command: &str| -> ((usize, usize, u32, u32, u64), Vec<usize>) {
        let port = cluster::free_port().to_string();
        let mut args: Vec<String> = match command {
            "bench" => ["bench", "--format", "json", "--timeout", "120s"]
                .iter()
                .map(|s| s.to_string())
                .collect(),
            _ => run_args("60s"),
        };
        args.extend(["--backends", "tcp"].map(String::from));
        let procs: Vec<Proc> = (0..2)
            .map(|r| {
                local(
                    &format!("{command}{r}"),
                    &args,
                    &env(&r.to_string(), "2", &port),
                )
            })
            .collect();
        let out: Vec<Outcome> = procs.into_iter().map(|p| p.finish(MARGIN)).collect();
        all_exit(&out, 0);
        let report = out[0].report();
        let largest: Vec<usize> = tcp(&report)
            .sweep
            .iter()
            .filter(|row| row.op.name() == "allreduce")
            .map(|row| row.bytes)
            .collect();
        let s = report
            .collective()
            .settings
            .clone()
            .unwrap_or_else(|| panic!("no sweep settings in {report}"));
        (
            (
                s.max_size,
                s.step_factor,
                s.warmup,
                s.iters,
                s.step_timeout_ms,
            ),
            largest,
        )
    };
    let (bench, sizes) = settings("bench");
    assert_eq!(bench, (67108864, 2, 5, 20, 10000));
    assert_eq!(sizes.last(), Some(&(64usize << 20)));
    let (run, sizes) = settings("run");
    assert_eq!(run, (1048576, 2, 2, 5, 10000));
    assert_eq!(sizes, [8, 64 << 10, 1 << 20]);
}
