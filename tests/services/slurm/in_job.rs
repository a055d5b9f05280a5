//! Inside and after a job in real Slurm: srun gating each node and GPU on
//! preflight, the epilog finding a process the job's user left, and the
//! watchdog naming the stuck rank across the allocation.

use super::*;

/// `srun` of `preflight run` with this cluster's settings: every task's
/// report in DIR/TAG-TASK, srun's own exit code. Each task's stderr goes
/// to DIR/TAG-TASK.err: with `--kill-on-bad-exit`, slurmstepd writes
/// "STEP CANCELLED" there for a task still exiting when another failed,
/// which in the report's file would follow the report.
fn srun_preflight(s: &Slurm, d: &Path, tag: &str, shape: &[&str]) -> (i32, Vec<Report>) {
    let checks = concat!(env!("CARGO_MANIFEST_DIR"), "/checks/cluster.yaml");
    let out = d.join(format!("{tag}-%t"));
    let err = d.join(format!("{tag}-%t.err"));
    let mut args: Vec<String> = ["-N3", "--kill-on-bad-exit=1", "-o"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.push(out.display().to_string());
    args.push("-e".into());
    args.push(err.display().to_string());
    args.extend(shape.iter().map(|s| s.to_string()));
    args.extend(
        [
            BIN,
            "run",
            "--no-shipped",
            "--checks",
            checks,
            "--timeout",
            "20s",
            "--format",
            "json",
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = s
        .cmd("srun", &argv)
        .env("PREFLIGHT_PROBE_PORTS", "29450-29459")
        .env("PREFLIGHT_TOKEN", "ec26e9aef7eb8a3378e3accc3c82a2fb")
        .output()
        .unwrap();
    let mut reports = Vec::new();
    for t in 0.. {
        let Ok(text) = std::fs::read_to_string(d.join(format!("{tag}-{t}"))) else {
            break;
        };
        let said = std::fs::read_to_string(d.join(format!("{tag}-{t}.err"))).unwrap_or_default();
        reports.push(common::report(&text, &format!("task {t}: {said}")));
    }
    (o.status.code().unwrap_or(-1), reports)
}

#[test]
fn srun_gates_on_preflight_run_per_node_and_per_gpu_and_the_sbatch_example_stops_short() {
    let _s = serial();
    let Some(s) = Slurm::start(Options {
        nodes: 3,
        extra: &[],
        before_start: &|_| {},
    }) else {
        return;
    };
    let d = s.dir.path().to_path_buf();
    for (tag, shape, tasks) in [
        ("node", &[][..], 3),
        ("gpu", &["--ntasks-per-node=2"][..], 6),
    ] {
        let (code, reports) = srun_preflight(&s, &d, tag, shape);
        assert_eq!(reports.len(), tasks, "{tag}");
        for r in &reports {
            assert_eq!(r.verdict, Verdict::Ready, "{tag}: {r}");
            assert_eq!(r.cluster().world_size as usize, tasks, "{tag}: {r}");
        }
        assert_eq!(code, 0, "{tag}");
    }

    // The README's srun line as printed (`preflight` the binary), in a
    // batch job on the three nodes: every task READY, exit 0.
    let readme = std::process::Command::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tools/readme-commands.sh"
    ))
    .arg("Run it under torchrun, srun or mpirun")
    .output()
    .unwrap();
    let line = String::from_utf8_lossy(&readme.stdout)
        .lines()
        .find(|l| l.starts_with("srun "))
        .expect("the README's srun line")
        .split_whitespace()
        .map(|w| if w == "preflight" { BIN } else { w })
        .collect::<Vec<_>>()
        .join(" ");
    let out = d.join("readme-srun.out");
    let o = s
        .cmd(
            "sbatch",
            &[
                "--parsable",
                "-N3",
                "--chdir",
                &d.display().to_string(),
                "-o",
                &out.display().to_string(),
                "--wrap",
                &format!("{line}; echo srun-exit=$?"),
            ],
        )
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let job = String::from_utf8_lossy(&o.stdout).trim().to_string();
    let gone = |job: &str| s.run("squeue", &["-h", "-j", job]).stdout.is_empty();
    assert!(wait_until(LIMIT, || gone(&job)), "{}", job_state(&s, &job));
    let printed = std::fs::read_to_string(&out).unwrap_or_default();
    let verdicts: Vec<&str> = printed
        .lines()
        .filter(|l| {
            ["READY  ", "NOT READY  ", "INCOMPLETE  "]
                .iter()
                .any(|v| l.starts_with(v))
        })
        .collect();
    assert_eq!(verdicts.len(), 3, "{line}:\n{printed}");
    assert!(
        verdicts.iter().all(|v| v.starts_with("READY  ")),
        "{printed}"
    );
    assert!(printed.contains("srun-exit=0"), "{printed}");

    // h2 drops the probe ports: every task exits 1 naming h2.
    drop_tcp(&s, 1, "29450:29459");
    let (code, reports) = srun_preflight(&s, &d, "faulty", &[]);
    assert_eq!(code, 1);
    assert_eq!(reports.len(), 3);
    for r in &reports {
        assert_eq!(r.verdict, Verdict::NotReady, "{r}");
        let culprits: Vec<&str> = r
            .cluster()
            .culprits
            .iter()
            .map(|c| c.node.as_str())
            .collect();
        assert_eq!(culprits, ["h2"], "{r}");
    }

    // The sbatch example with h2 still firewalled: the training step
    // does not run; fixed, it does.
    let example = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/contrib/slurm/sbatch-example.sh"
    );
    let submit = |marker: &str| -> String {
        let o = s
            .cmd(
                "sbatch",
                &[
                    "--parsable",
                    "-N3",
                    "--chdir",
                    &d.display().to_string(),
                    "-o",
                    &d.join(format!("{marker}.out")).display().to_string(),
                    example,
                ],
            )
            .env("PREFLIGHT", BIN)
            .env(
                "PREFLIGHT_ARGS",
                format!(
                    "--no-shipped --checks {}/checks/cluster.yaml",
                    env!("CARGO_MANIFEST_DIR")
                ),
            )
            .env("PREFLIGHT_PROBE_PORTS", "29450-29459")
            .env("TRAIN", format!("touch {}", d.join(marker).display()))
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", text(&o));
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    let job = submit("trained-faulty");
    assert!(wait_until(LIMIT, || gone(&job)), "{}", job_state(&s, &job));
    let out = std::fs::read_to_string(d.join("trained-faulty.out")).unwrap_or_default();
    assert!(
        !d.join("trained-faulty").exists(),
        "the training ran: {out}"
    );
    assert!(out.contains("the allocation is not ready"), "{out}");
    s.net.iptables(1, &["-F", "INPUT"]);
    let job = submit("trained");
    assert!(wait_until(LIMIT, || gone(&job)), "{}", job_state(&s, &job));
    let out = std::fs::read_to_string(d.join("trained.out")).unwrap_or_default();
    assert!(
        d.join("trained").exists(),
        "the training did not run: {out}"
    );
}

#[test]
fn the_epilog_drains_a_node_where_the_jobs_user_left_a_process() {
    let _s = serial();
    let settings = "report_dir: {dir}/reports/%n\n\
                    epilog:\n  only: [epilog, slurm.leftover_processes]\n";
    let before = |d: &Path| {
        let etc = site(d, settings);
        wrapper(d, "preflight-epilog", &etc, "");
    };
    let extra = ["Epilog={dir}/preflight-epilog".to_string()];
    let Some(s) = Slurm::start(Options {
        nodes: 2,
        extra: &extra,
        before_start: &before,
    }) else {
        return;
    };
    let d = s.dir.path().to_path_buf();
    let run_as_nobody = |node: &str, script: &str| {
        let o = s.run(
            "sbatch",
            &[
                "--parsable",
                "--uid=nobody",
                "-w",
                node,
                "--chdir",
                "/",
                "-o",
                "/dev/null",
                "--wrap",
                script,
            ],
        );
        assert!(o.status.success(), "{}", text(&o));
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    // A clean job: the epilog passes and the node stays in service.
    let job = run_as_nobody("h1", "true");
    let report = d.join(format!("reports/h1/epilog-{job}.json"));
    assert!(
        wait_until(LIMIT, || report.exists()),
        "no epilog report: {}\n{}",
        s.sinfo(),
        s.log("h1")
    );
    assert!(!s.state("h1").starts_with("drain"), "{}", s.sinfo());

    // A job whose child escaped it (a new session, reparented to init).
    let job = run_as_nobody(
        "h2",
        "setsid sleep 300 < /dev/null > /dev/null 2>&1 & sleep 1",
    );
    assert!(
        wait_until(LIMIT, || s.state("h2") == "drain"),
        "h2 was not drained: {}\n{}",
        s.sinfo(),
        s.log("h2")
    );
    let reason = s.reason("h2");
    assert!(
        reason.starts_with(
            "preflight: slurm.leftover_processes: 1 process of uid 65534 left after the job:"
        ) && reason.ends_with(" sleep"),
        "{reason}"
    );
    assert!(d.join(format!("reports/h2/epilog-{job}.json")).exists());
    assert_eq!(processes_in(&s, 1, "sleep 300").len(), 1);
}

/// The sbatch example's watchdog (contrib/slurm/sbatch-example.sh), with
/// a minute's limit and no gate step: at the
/// warning signal before the time limit, the job's every node diagnosed
/// in steps of the job itself, saved where the epilog looks.
/// `--this-namespace`: here every node shares one process table.
const WATCHDOG_JOB: &str = r#"#!/bin/bash
#SBATCH --time=1
#SBATCH --signal=B:USR1@45
watchdog() {
    # A one-minute limit may warn before torch is up on a busy machine:
    # the test's watchdog looks once rank 1 holds (the hang it is about).
    while [ ! -e "$JOB_MARKER" ]; do sleep 0.2; done
    "$PREFLIGHT" diagnose --slurm --this-namespace --py-spy off \
        --remote-preflight "$PREFLIGHT" --format json \
        --output "$workdir/preflight-diagnose-$SLURM_JOB_ID.json"
    echo $? > "$workdir/watchdog-exit"
}
workdir=$PWD  # the job's working directory (--chdir): where the epilog looks
trap watchdog USR1
export MASTER_ADDR=h1 MASTER_PORT=29511 GLOO_SOCKET_IFNAME=eth0 OMP_NUM_THREADS=1
export JOB_MODE=stop JOB_RANK=1 JOB_SECONDS=300 HOME=/tmp
srun --ntasks-per-node=1 bash -c 'RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS exec /usr/bin/python3 "$0"' "$JOB" &
train=$!
while wait "$train"; status=$?; kill -0 "$train" 2>/dev/null; do :; done
exit "$status"
"#;

#[test]
fn a_watchdog_names_the_stuck_rank_across_the_allocation_and_the_timeouts_epilog_drains_no_node_for_the_jobs_own_fault()
 {
    let torch = std::process::Command::new("/usr/bin/python3")
        .args(["-c", "import torch.distributed"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !torch {
        common::skip_unless_required("python3-torch is not installed");
        return;
    }
    let alone = serial();
    let settings = "report_dir: {dir}/reports/%n\nepilog:\n  only: [epilog]\n";
    let before = |d: &Path| {
        let etc = site(d, settings);
        // What each epilog said, kept for the test's messages. The batch
        // host's epilog acts once h2's has ended (20 s at most): the job
        // is then completing on h1 alone, and scontrol's NodeList may
        // have dropped h2, as it did on a CI run; h2 is still the job's.
        let dir = d.display();
        common::executable(
            d,
            "preflight-epilog",
            &format!(
                "#!/bin/sh\nexport PREFLIGHT={BIN} PREFLIGHT_CONFIG_DIR={etc}\nif [ \"$SLURMD_NODENAME\" = h1 ]; then\n  i=0\n  while [ ! -e {dir}/epilog-h2.done ] && [ $i -lt 200 ]; do sleep 0.1; i=$((i + 1)); done\nfi\nsh {CONTRIB}/preflight-epilog >> {dir}/epilog-$SLURMD_NODENAME.log 2>&1\nrc=$?\ntouch {dir}/epilog-$SLURMD_NODENAME.done\nexit $rc\n",
                etc = etc.display()
            ),
        );
        std::fs::write(d.join("job.sh"), WATCHDOG_JOB).unwrap();
    };
    let extra = ["Epilog={dir}/preflight-epilog".to_string()];
    let Some(s) = Slurm::start(Options {
        nodes: 2,
        extra: &extra,
        before_start: &before,
    }) else {
        return;
    };
    let d = s.dir.path().to_path_buf();
    let job_py = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/services/torch_distributed/job.py"
    );
    let o = s
        .cmd("sbatch", &["--parsable", "-N2", "--chdir"])
        .arg(&d)
        .args(["-o", "job.out"])
        .arg(d.join("job.sh"))
        .env("PREFLIGHT", BIN)
        .env("JOB", job_py)
        .env("JOB_MARKER", d.join("held"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let job = String::from_utf8_lossy(&o.stdout).trim().to_string();
    // The limit is a minute; slurmctld looks every 30 s: the warning
    // within 60 s, the end within 90 s, the epilog at once.
    let saved = d.join(format!("preflight-diagnose-{job}.json"));
    assert!(
        wait_until(Duration::from_secs(120), || d
            .join("watchdog-exit")
            .exists()),
        "the watchdog did not run: {}\n{}",
        job_state(&s, &job),
        std::fs::read_to_string(d.join("job.out")).unwrap_or_default()
    );
    let out = std::fs::read_to_string(d.join("job.out")).unwrap_or_default();
    assert!(d.join("held").exists(), "rank 1 never held: {out}");
    let exit = std::fs::read_to_string(d.join("watchdog-exit")).unwrap();
    let text = std::fs::read_to_string(&saved).unwrap();
    let diagnosis: preflight::schema::ClusterDiagnosis = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("not a cluster diagnosis ({e}): {text}"));
    assert_eq!(exit.trim(), "1", "{diagnosis:#?}\n{out}");
    assert_eq!(diagnosis.verdict, "held", "{diagnosis:#?}");
    assert_eq!(
        diagnosis.nodes.len(),
        2,
        "both nodes asked, in steps of the job: {diagnosis:#?}"
    );
    let culprits = &diagnosis.culprits;
    assert!(
        culprits.len() == 1 && culprits[0].rank == 1 && culprits[0].node == "h2",
        "{diagnosis:#?}"
    );
    assert_eq!(culprits[0].evidence, "rank", "{diagnosis:#?}");
    // The job runs out of time; h1's epilog (the batch host's) reads the
    // saved evidence: a rank asleep in the job's own code, which no drain
    // would mend, so it drains nothing and says what to do. Until then
    // (a minute's limit, which slurmctld looks at every 30 s) the job only
    // waits on Slurm's clock: the other tests may run, and its epilog's
    // deadlines are far from its time.
    drop(alone);
    assert!(
        wait_until(Duration::from_secs(180), || d
            .join("epilog-h1.done")
            .exists()),
        "h1's epilog did not end: {}\n{}",
        s.sinfo(),
        job_state(&s, &job)
    );
    let log = std::fs::read_to_string(d.join("epilog-h1.log")).unwrap_or_default();
    assert!(
        log.contains(&format!("job {job} timed out held up by rank 1 pid "))
            && log.contains(
                "not a node fault, so no node drained; next: a fault in the job's own code"
            ),
        "{log}"
    );
    assert!(!s.state("h2").starts_with("drain"), "{}", s.sinfo());
    assert_eq!(s.reason("h2"), "none", "{}", s.sinfo());
    assert!(
        wait_until(LIMIT, || d
            .join(format!("reports/h1/epilog-{job}.json"))
            .exists()),
        "h1's epilog did not run"
    );
    assert!(!s.state("h1").starts_with("drain"), "{}", s.sinfo());
    assert_eq!(s.reason("h1"), "none", "{}", s.sinfo());
}
