//! What the commands say of themselves: --help and each command's flags,
//! list and explain over every check, kind and id a run prints.

use super::*;

#[test]
fn list_says_whether_each_check_applies_and_why_not() {
    let _shared = crate::common::shared();
    let out = run(preflight().args([
        "list",
        "--no-shipped",
        "--checks",
        MIXED,
        "--root",
        "fixtures/minimal-root",
    ]));
    assert_eq!(out.code, 0);
    let line = out
        .stdout
        .lines()
        .find(|l| l.starts_with("needs.master"))
        .unwrap();
    assert!(line.ends_with("no: this is the master rank"), "{line}");
    let header = out.stdout.lines().next().unwrap();
    for column in ["ID", "KIND", "SEVERITY", "TAGS", "APPLIES"] {
        assert!(header.contains(column), "{header}");
    }
    let listed = run(preflight()
        .args([
            "list",
            "--no-shipped",
            "--checks",
            MIXED,
            "--format",
            "json",
        ])
        .env("RANK", "2")
        .env("WORLD_SIZE", "4"));
    // `list`'s entries are no report: its JSON has no schema type.
    let entries = json(&listed);
    let master = entries
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["id"] == "needs.master")
        .unwrap();
    assert_eq!(master["applies"], true);
    assert_eq!(master["params"]["name"], "HOME");
}

#[test]
fn explain_covers_what_why_and_how_to_fix() {
    let _shared = crate::common::shared();
    let out = run(preflight().args(["explain", "kernel.somaxconn"]));
    assert_eq!(out.code, 0, "{}", out.stderr);
    for part in [
        "kind kernel_param, severity warn",
        "What it verifies",
        "name: net.core.somaxconn",
        "Why it matters",
        "How to fix a failure",
        "sysctl -w net.core.somaxconn=4096",
        "Applies when",
        "min         integer (optional)",
        "if_missing  error|fail|skip (default error)",
    ] {
        assert!(
            out.stdout.contains(part),
            "missing `{part}` in:\n{}",
            out.stdout
        );
    }
}

#[test]
fn explain_a_kind_or_an_unknown_name() {
    let _shared = crate::common::shared();
    let kind = run(preflight().args(["explain", "command"]));
    assert_eq!(kind.code, 0);
    assert!(kind.stdout.contains("argv"));
    let unknown = run(preflight().args(["explain", "kernel.somaxcon"]));
    assert_eq!(unknown.code, 2);
    assert!(
        unknown
            .stderr
            .contains("(did you mean `kernel.somaxconn`?)"),
        "{}",
        unknown.stderr
    );
}

#[test]
fn help_documents_the_commands_and_exit_codes() {
    let _shared = crate::common::shared();
    let out = run(preflight().arg("--help"));
    assert_eq!(out.code, 0);
    for word in ["run", "check", "list", "explain", "validate", "incomplete"] {
        assert!(out.stdout.contains(word), "{word}:\n{}", out.stdout);
    }
    let check = run(preflight().args(["check", "--help"]));
    for flag in [
        "--checks",
        "--only",
        "--skip",
        "--format",
        "--output",
        "--timeout",
        "--strict",
        "--root",
        "--quiet",
        "--verbose",
        "--color",
    ] {
        assert!(check.stdout.contains(flag), "{flag}");
    }
}

/// The rows of the Markdown table under `heading` in `path`, each cell
/// trimmed.
fn table(path: &str, heading: &str) -> Vec<Vec<String>> {
    let text = std::fs::read_to_string(path).unwrap();
    let at = text
        .find(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("{path}: no `{heading}`"));
    text[at..]
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .map(|row| {
            // `\|` inside a cell is a bar, not a border.
            let row = row.replace("\\|", "\u{0}");
            let row = row.trim().trim_matches('|');
            row.split('|')
                .map(|c| c.replace('\u{0}', "|").trim().to_string())
                .collect()
        })
        .collect()
}

/// `--help`'s exit codes, as (code, meaning) pairs.
fn help_exit_codes() -> Vec<(String, String)> {
    let out = run(preflight().arg("--help"));
    assert_eq!(out.code, 0, "{}", out.stderr);
    let mut codes: Vec<(String, String)> = Vec::new();
    // A code's line, then its meaning's wrapped lines, indented further.
    for l in out
        .stdout
        .lines()
        .skip_while(|l| *l != "Exit codes:")
        .skip(1)
        .take_while(|l| l.starts_with("  "))
    {
        match codes.last_mut() {
            Some((_, meaning)) if l.starts_with("   ") => {
                meaning.push(' ');
                meaning.push_str(l.trim());
            }
            _ => {
                let (code, meaning) = l.trim().split_once(' ').unwrap();
                codes.push((code.to_string(), meaning.trim().to_string()));
            }
        }
    }
    assert!(codes.len() >= 4, "{}", out.stdout);
    codes
}

/// The exit codes are one table (crates/preflight-ground/src/exit.rs): `--help` prints it, the
/// man pages of the commands that end in a verdict carry it, and the
/// README's and docs/reference.md's tables say exactly the same.
#[test]
fn the_exit_codes_are_written_once() {
    let _shared = crate::common::shared();
    let help = help_exit_codes();
    for path in ["README.md", "docs/reference.md"] {
        let rows: Vec<(String, String)> = table(path, "## Exit codes")
            .into_iter()
            .map(|cells| {
                let verdict = cells[1].trim_matches('`');
                let when = cells[2].replace('`', "");
                let meaning = if verdict.is_empty() {
                    when
                } else {
                    format!("{verdict}: {when}")
                };
                (cells[0].clone(), meaning)
            })
            .collect();
        assert_eq!(rows, help, "{path}'s exit codes are not --help's");
    }
    let dir = tempfile::tempdir().unwrap();
    let out = run(preflight().arg("man-pages").arg(dir.path()));
    assert_eq!(out.code, 0, "{}", out.stderr);
    for page in [
        "preflight.1",
        "preflight-run.1",
        "preflight-check.1",
        "preflight-bench.1",
    ] {
        let text = std::fs::read_to_string(dir.path().join(page)).unwrap();
        let section: Vec<&str> = text
            .lines()
            .skip_while(|l| *l != ".SH EXIT STATUS")
            .skip(1)
            .take_while(|l| !l.starts_with(".SH"))
            .filter(|l| *l != ".TP")
            .collect();
        let unroff = |l: &str| l.replace("\\-", "-").replace("\\&", "");
        let codes: Vec<(String, String)> = section
            .chunks(2)
            .map(|pair| {
                let code = pair[0].trim_start_matches("\\fB").trim_end_matches("\\fR");
                (unroff(code), unroff(pair[1]))
            })
            .collect();
        assert_eq!(codes, help, "{page}'s EXIT STATUS is not --help's");
    }
}

/// The commands are listed once, in the command tree: the README's and
/// docs/reference.md's tables name exactly the commands `--help` lists.
#[test]
fn the_docs_name_exactly_the_commands_help_lists() {
    let _shared = crate::common::shared();
    let out = run(preflight().arg("--help"));
    let mut listed: Vec<String> = out
        .stdout
        .lines()
        .skip_while(|l| *l != "Commands:")
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter(|l| !l.starts_with("   "))
        .map(|l| l.split_whitespace().next().unwrap().to_string())
        .filter(|c| c != "help")
        .collect();
    listed.sort();
    assert!(listed.len() >= 10, "{}", out.stdout);
    for path in ["README.md", "docs/reference.md"] {
        let mut named: Vec<String> = table(path, "## Commands")
            .iter()
            .flat_map(|cells| {
                // Each code span of the first cell names one command:
                // `preflight list`, `explain ID|KIND`.
                cells[0]
                    .split('`')
                    .skip(1)
                    .step_by(2)
                    .map(|span| {
                        let span = span.strip_prefix("preflight ").unwrap_or(span);
                        span.split_whitespace().next().unwrap().to_string()
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        named.sort();
        assert_eq!(named, listed, "{path}'s commands are not --help's");
    }
}

/// The long flags a command's `--help` lists.
fn help_flags(command: &str) -> Vec<String> {
    let help = run(preflight().args([command, "--help"]));
    assert_eq!(help.code, 0, "{}", help.stderr);
    help.stdout
        .lines()
        .filter_map(|l| {
            let l = l.trim_start();
            let l = l
                .strip_prefix("-q, ")
                .or(l.strip_prefix("-v, "))
                .or(l.strip_prefix("-h, "))
                .unwrap_or(l);
            l.strip_prefix("--")
                .map(|f| f.split([' ', '<', '=']).next().unwrap().to_string())
        })
        .filter(|f| f != "help")
        .collect()
}

/// Each of run, check and bench lists in its help exactly the flags it
/// takes: every flag of the three that a command's help leaves out is
/// refused there (exit 2, named), and the command runs with every flag
/// its help lists, given all at once.
#[test]
fn each_command_help_lists_exactly_the_flags_it_takes() {
    let _shared = crate::common::shared();
    let port = common::unused_port("127.0.0.1").to_string();
    let empty = tempfile::tempdir().unwrap();
    let root = empty.path().to_str().unwrap();
    let output = empty.path().join("out").display().to_string();
    let json = empty.path().join("report.json").display().to_string();
    let termination = empty.path().join("termination-log").display().to_string();
    let profile = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("profiles/hgx-h100-8.yaml")
        .display()
        .to_string();
    // A value for every flag; a flag added without one fails here.
    let sample = |flag: &str| -> Option<&str> {
        Some(match flag {
            "checks" => MIXED,
            "no-shipped" | "strict" | "quiet" | "verbose" | "require-secret" | "fresh"
            | "no-slow-now" => return None,
            "state-dir" => root,
            "max-concurrent" => "4",
            "only" | "with" => "kernel",
            "skip" => "env",
            "root" => root,
            "backends" => "tcp",
            "init-method" => "env://",
            "profile" => &profile,
            "color" => "never",
            "format" => "json",
            "output" => &output,
            "json-report" => &json,
            "termination-log" => &termination,
            "post" => "http://127.0.0.1:9/",
            "timeout" => "30s",
            "nnodes" => "1",
            "node-rank" => "0",
            "nproc-per-node" => "1",
            "master-addr" => "127.0.0.1",
            "master-port" => &port,
            "probe-ports" => "29700-29710",
            "collective" => "short",
            "max-size" => "8",
            "step-factor" => "4",
            "warmup" => "0",
            "iters" => "1",
            "step-timeout" => "5s",
            "nccl-lib" | "oneccl-lib" => "/nonexistent/lib.so",
            other => panic!("no sample value for --{other}: add one"),
        })
    };
    let args = |flags: &[String]| -> Vec<String> {
        let mut out = Vec::new();
        for f in flags {
            if f == "verbose" && flags.iter().any(|q| q == "quiet") {
                continue;
            }
            out.push(format!("--{f}"));
            if let Some(v) = sample(f) {
                out.push(v.to_string());
            }
        }
        out
    };
    let every = help_flags("run");
    for command in ["run", "check", "bench"] {
        let listed = help_flags(command);
        for flag in every.iter().filter(|f| !listed.contains(f)) {
            let mut given = vec![command.to_string()];
            given.extend(args(std::slice::from_ref(flag)));
            let out = run(preflight().args(&given));
            assert_eq!(out.code, 2, "{given:?}: {}", out.stderr);
            assert!(
                out.stderr.contains(&format!("--{flag} does nothing here")),
                "{given:?}: {}",
                out.stderr
            );
        }
        let mut given = vec![command.to_string()];
        given.extend(args(&listed));
        let out = run(preflight().args(&given));
        assert!(
            matches!(out.code, 0 | 1 | 3),
            "{given:?}: exit {}: {}",
            out.code,
            out.stderr
        );
    }
    // And what each leaves out, as the issue found them.
    let check = help_flags("check");
    for gone in [
        "nnodes",
        "master-addr",
        "collective",
        "max-size",
        "nccl-lib",
    ] {
        assert!(
            !check.iter().any(|f| f == gone),
            "check --help lists --{gone}"
        );
    }
    let bench = help_flags("bench");
    for gone in [
        "checks",
        "only",
        "skip",
        "strict",
        "no-shipped",
        "init-method",
        "with",
    ] {
        assert!(
            !bench.iter().any(|f| f == gone),
            "bench --help lists --{gone}"
        );
    }
}

/// Every id a command prints is one `list` lists and `explain` explains
/// (the stages' own results included), `explain` says of each what `list`
/// says of it on this node, and `list`'s counts are `check`'s and `run`'s.
#[test]
fn list_and_explain_know_every_id_a_run_prints() {
    let _shared = crate::common::shared();
    // `list`'s entries are no report: untyped.
    let listed = json(&run(preflight().args(["list", "--format", "json"])));
    let entries = listed.as_array().unwrap();
    let ids: Vec<&str> = entries.iter().map(|e| e["id"].as_str().unwrap()).collect();
    let port = common::unused_port("127.0.0.1").to_string();
    let report = report(&run(preflight().args([
        "run",
        "--nnodes",
        "1",
        "--nproc-per-node",
        "2",
        "--master-port",
        &port,
        "--format",
        "json",
    ])));
    let mut printed: Vec<String> = report.checks.iter().map(|c| c.id.clone()).collect();
    for must in ["cluster.barrier", "collective.tcp", "cluster.reachability"] {
        assert!(
            printed.iter().any(|p| p == must),
            "{must} not in the run's report"
        );
    }
    // And the ones a failed rendezvous prints.
    printed.extend([
        "cluster.rendezvous".to_string(),
        "collective.stragglers".to_string(),
        "collective.slow_links".to_string(),
    ]);
    for id in &printed {
        assert!(ids.contains(&id.as_str()), "`list` does not list {id}");
    }
    for entry in entries {
        let id = entry["id"].as_str().unwrap();
        let out = run(preflight().args(["explain", id]));
        assert_eq!(out.code, 0, "explain {id}: {}", out.stderr);
        if entry["source"] == "built-in" {
            assert!(
                out.stdout.contains("built into preflight run and bench"),
                "{}",
                out.stdout
            );
            continue;
        }
        let said = if entry["applies"] == true {
            "yes".to_string()
        } else {
            format!("no ({})", entry["reason"].as_str().unwrap())
        };
        assert!(
            out.stdout
                .contains(&format!("on this node (`check`): {said}\n")),
            "explain {id} disagrees with list ({said}):\n{}",
            out.stdout
        );
    }
    // The counts, each said with what it counts.
    let human = run(preflight().arg("list")).stdout;
    let by_check = entries
        .iter()
        .filter(|e| e["source"] != "built-in")
        .filter(|e| {
            let r = e["reason"].as_str().unwrap_or("");
            !r.starts_with("opt-in") && !r.starts_with("preflight run only")
        })
        .count();
    assert!(
        human.contains(&format!("({by_check} of them by `check`")),
        "{human}"
    );
    let check = run(preflight().arg("check")).stdout;
    assert!(
        check
            .lines()
            .next()
            .unwrap()
            .ends_with(&format!(" · {by_check} checks")),
        "{check}"
    );
}
