//! The manual pages the packages install: one per command, generated from
//! the command line's definition, and preflight-checklist(5) for the
//! checklist format, generated from the kinds' own parameter tables so it
//! names every kind and key the loader takes.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::Failure;
use preflight_ground::exit::{ExitCode, MEANINGS};
use preflight_kinds::KINDS;
use preflight_report::output::write_stdout;

const MANUAL: &str = "preflight manual";

/// What each key every check may have means; a key added to the loader
/// without a line here fails the tests (`checklist_page_documents_...`).
const COMMON_KEY_DOCS: &[(&str, &str)] = &[
    (
        "id",
        "Unique name: letters, digits and . _ : -. An added check with a shipped id replaces it.",
    ),
    (
        "kind",
        "The built-in probe that evaluates the check (see KINDS below).",
    ),
    (
        "severity",
        "fail (the default: a failure makes the node not ready) or warn.",
    ),
    (
        "scope",
        "node (the default) or cluster: cluster is evaluated by rank 0 across the job, and only the cluster_* kinds take it.",
    ),
    (
        "timeout",
        "A duration with a unit, more than zero and at most 24h (default 10s, or the kind's own). A check that overruns it fails with \"timed out after ...\" (warns under severity: warn).",
    ),
    (
        "tags",
        "A list of words that --only, --skip and --with select by.",
    ),
    (
        "area",
        "The group the check is shown under in the human report (default: the kind's).",
    ),
    (
        "when",
        "When the check applies (see WHEN below); a check whose condition does not hold is skipped with the reason.",
    ),
    ("description", "Why the check matters; explain shows it."),
    (
        "hint",
        "What to do when it fails; may use placeholders (see HINTS below). An unknown placeholder is an error when the file is loaded.",
    ),
    (
        "opt_in",
        "true: the check runs only when --only or --with names it (its id or a tag), for checks too slow for every health check.",
    ),
    (
        "cache",
        "A duration: a pass is kept in the state directory and reused that long while the node (boot, kernel, drivers, firmware, accelerators, hardware events) and the check are unchanged; --fresh reuses none.",
    ),
];

/// The conditions of `when:`, all of which must hold.
const WHEN_DOCS: &[(&str, &str)] = &[
    (
        "vendor",
        "nvidia, amd, intel, habana, any or none: an accelerator of that vendor is on the PCI bus (none: a CPU-only node).",
    ),
    (
        "multi_node",
        "true or false: the job spans more than one node, or exactly one.",
    ),
    (
        "master",
        "true or false: this process is, or is not, the job's rank 0.",
    ),
    (
        "backend",
        "tcp, nccl or oneccl: that collective backend is requested (--backends).",
    ),
    (
        "env",
        "A list of variable names that are all set and not empty.",
    ),
    ("exists", "A path that exists (under --root)."),
];

/// Text as roff reads it literally: a backslash is `\e`, a line cannot
/// start with a control character, and `-` is a minus where a reader
/// copies it as one.
fn roff(text: &str) -> String {
    let text = text.replace('\\', "\\e").replace('-', "\\-");
    text.lines()
        .map(|l| {
            if l.starts_with('.') || l.starts_with('\'') {
                format!("\\&{l}")
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A tagged paragraph: `tag` in bold, then its text.
fn item(out: &mut String, tag: &str, text: &str) {
    let _ = write!(out, ".TP\n\\fB{}\\fR\n{}\n", roff(tag), roff(text));
}

/// preflight-checklist(5).
pub fn checklist_page() -> String {
    let version = env!("CARGO_PKG_VERSION");
    let mut p = String::new();
    let _ = writeln!(
        p,
        ".TH PREFLIGHT-CHECKLIST 5 \"{}\" \"preflight {version}\" \"{MANUAL}\"",
        date()
    );
    p.push_str(".SH NAME\npreflight\\-checklist \\- the YAML checklists preflight runs\n");
    p.push_str(".SH SYNOPSIS\n.nf\nchecks:\n  \\- id: \\fIsite.name\\fR\n    kind: \\fIkind\\fR\n    \\fIparameter\\fR: \\fIvalue\\fR\n    ...\n.fi\n");
    p.push_str(".SH DESCRIPTION\n");
    p.push_str(&roff(
        "A checklist file holds one YAML mapping with a checks: list. The shipped checklists are built into the binary; preflight check and run add files with --checks FILE|DIR, and the Slurm modes and the periodic check add every *.yaml in /etc/preflight/checks.d. Check a file with preflight validate FILE: a mistake is reported with its file, line and column, and exit code 2.",
    ));
    p.push_str("\n.SH KEYS\nEvery check may have these keys; the rest belong to its kind.\n");
    for (key, doc) in COMMON_KEY_DOCS {
        item(&mut p, key, doc);
    }
    p.push_str(".SH WHEN\nAll the conditions given must hold, else the check is skipped with the reason.\n");
    for (key, doc) in WHEN_DOCS {
        item(&mut p, key, doc);
    }
    p.push_str(".SH HINTS\n");
    p.push_str(&roff(
        "A hint may use {measured}, {expected}, {id}, {host}, {env.NAME} and the placeholders of its kind (listed under KINDS). A value the probe could not tell (unset, empty, unknown, none) is never printed: the parenthesis holding it, else its sentence, is left out.",
    ));
    p.push_str("\n.SH KINDS\n");
    p.push_str(&roff(
        "Each kind's parameters: name, type, default (required when there is none), meaning. preflight explain KIND prints the same with examples.",
    ));
    p.push('\n');
    for kind in KINDS {
        let scope = match kind.scope {
            preflight_kinds::Scope::Node => {
                "Scope node: evaluated once per node (in a job, by local rank 0 for the node's ranks)."
            }
            preflight_kinds::Scope::Rank => {
                "Scope rank: every rank evaluates it (its own environment, devices, bindings)."
            }
            preflight_kinds::Scope::Cluster => {
                "Scope cluster: rank 0 compares every node's check-in, or every rank reads the collective stage's shared report."
            }
        };
        let _ = write!(
            p,
            ".SS {}\n{} {}\n",
            roff(kind.name),
            roff(kind.summary),
            roff(scope)
        );
        for param in kind.params {
            let default = match param.default {
                None => "required".to_string(),
                Some(d) => format!("default {d}"),
            };
            item(
                &mut p,
                param.name,
                &format!("({}; {default}) {}", param.ty, param.doc),
            );
        }
        if !kind.hint_vars.is_empty() {
            let vars: Vec<String> = kind.hint_vars.iter().map(|v| format!("{{{v}}}")).collect();
            let _ = writeln!(p, ".PP\nHint placeholders: {}.", roff(&vars.join(", ")));
        }
    }
    p.push_str(".SH EXAMPLE\n.nf\n");
    p.push_str(&roff(
        "checks:\n  - id: site.lustre_mounted\n    kind: file\n    path: /proc/mounts\n    contains: '^\\S+ /lustre lustre '\n    tags: [storage, site]\n    description: Checkpoints go to /lustre.\n    hint: \"Mount it (`mount /lustre`) or drain {host}.\"",
    ));
    p.push_str("\n.fi\n.SH FILES\n");
    item(
        &mut p,
        "/etc/preflight/checks.d/*.yaml",
        "The site's checks, added to the shipped ones by the Slurm modes and the periodic check.",
    );
    item(
        &mut p,
        "/etc/preflight/settings.yaml",
        "What each Slurm mode runs and does.",
    );
    p.push_str(".SH SEE ALSO\n\\fBpreflight\\fR(1), \\fBpreflight\\-validate\\fR(1), \\fBpreflight\\-explain\\fR(1), \\fBpreflight\\-list\\fR(1)\n");
    p
}

/// Every command's page and the checklist page, written into `dir`.
pub fn write_pages(command: clap::Command, dir: &Path) -> Result<Vec<PathBuf>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let mut command = command.disable_help_subcommand(true);
    command.build();
    let mut written = Vec::new();
    command_pages(&command, dir, &mut written)?;
    let path = dir.join("preflight-checklist.5");
    write(&path, &checklist_page())?;
    written.push(path);
    Ok(written)
}

fn command_pages(
    command: &clap::Command,
    dir: &Path,
    written: &mut Vec<PathBuf>,
) -> Result<(), String> {
    for sub in command.get_subcommands().filter(|s| !s.is_hide_set()) {
        command_pages(sub, dir, written)?;
    }
    // The exit codes get a section of their own (clap_mangen would print
    // the help's epilogue under "EXTRA").
    let plain = command.clone().after_help(None::<&str>);
    let man = clap_mangen::Man::new(plain)
        .date(date())
        .manual(MANUAL)
        .source(format!("preflight {}", env!("CARGO_PKG_VERSION")));
    let mut page = Vec::new();
    man.render(&mut page)
        .map_err(|e| format!("cannot render the page of {}: {e}", command.get_name()))?;
    let mut page = String::from_utf8_lossy(&page).into_owned();
    let name = command
        .get_display_name()
        .unwrap_or(command.get_name())
        .to_string();
    if let Some(codes) = exit_status(&name) {
        page.push_str(&codes);
    }
    let mut also = vec!["\\fBpreflight\\-checklist\\fR(5)".to_string()];
    if name != "preflight" {
        also.insert(0, "\\fBpreflight\\fR(1)".to_string());
    }
    let _ = write!(page, ".SH SEE ALSO\n{}\n", also.join(", "));
    let path = dir.join(man.get_filename());
    write(&path, &page)?;
    written.push(path);
    Ok(())
}

/// The EXIT STATUS section of the commands whose code is a verdict
/// (from the one table, `preflight_ground::exit::MEANINGS`), or the Slurm modes'.
fn exit_status(page: &str) -> Option<String> {
    const SLURM: &str = ".SH EXIT STATUS\n.TP\n\\fB0\\fR\nThe node is ready, or was left as it is.\n.TP\n\\fB1\\fR\nThe node was drained (the prolog: the job does not start here).\n.TP\n\\fB2\\fR\nBad settings, or a Slurm call that failed: a drain that did not happen never looks like one that did.\n.TP\n\\fB3\\fR\nThe health check: incomplete, with incomplete: ignore.\n";
    match page {
        "preflight" | "preflight-run" | "preflight-check" | "preflight-bench" => {
            let mut section = String::from(".SH EXIT STATUS\n");
            for m in MEANINGS {
                let _ = write!(
                    section,
                    ".TP\n\\fB{}\\fR\n{}\n",
                    roff(m.code),
                    roff(&m.sentence())
                );
            }
            Some(section)
        }
        p if p.starts_with("preflight-slurm-") => Some(SLURM.to_string()),
        _ => None,
    }
}

/// The pages' date: SOURCE_DATE_EPOCH's day where the build sets it (a
/// reproducible package), else today's.
fn date() -> String {
    let at = std::env::var("SOURCE_DATE_EPOCH")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .map(|secs| std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs))
        .unwrap_or_else(std::time::SystemTime::now);
    humantime::format_rfc3339_seconds(at).to_string()[..10].to_string()
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// `preflight man-pages DIR` (hidden: tools/release.sh's step).
pub fn man_pages(command: clap::Command, dir: &Path) -> Result<ExitCode, Failure> {
    let written = write_pages(command, dir).map_err(Failure::Usage)?;
    let mut text = String::new();
    for path in written {
        let _ = writeln!(text, "{}", path.display());
    }
    write_stdout(&text).map_err(|e| Failure::Usage(format!("cannot write: {e}")))?;
    Ok(ExitCode::Ready)
}

#[cfg(test)]
mod tests {
    use super::*;
    use preflight_checklist::COMMON_KEYS;

    #[test]
    fn checklist_page_documents_every_key_the_loader_takes() {
        let documented: Vec<&str> = COMMON_KEY_DOCS.iter().map(|(k, _)| *k).collect();
        assert_eq!(
            documented, COMMON_KEYS,
            "a key without its line in the page"
        );
    }

    #[test]
    fn every_when_condition_documented_is_one_the_loader_takes() {
        let values = [
            ("vendor", "nvidia"),
            ("multi_node", "true"),
            ("master", "false"),
            ("backend", "tcp"),
            ("env", "[A]"),
            ("exists", "/x"),
        ];
        let documented: Vec<&str> = WHEN_DOCS.iter().map(|(k, _)| *k).collect();
        assert_eq!(documented, values.map(|(k, _)| k));
        for (key, value) in values {
            let text = format!(
                "checks:\n  - id: a\n    kind: env\n    name: X\n    when: {{{key}: {value}}}\n"
            );
            preflight_checklist::load_text("t.yaml", &text)
                .unwrap_or_else(|e| panic!("{key}: {e}"));
        }
        // And the loader takes no other: its error lists what it takes.
        let text = "checks:\n  - id: a\n    kind: env\n    name: X\n    when: {bogus: 1}\n";
        let error = preflight_checklist::load_text("t.yaml", text)
            .err()
            .unwrap()
            .to_string();
        for key in documented {
            assert!(error.contains(key), "{error}");
        }
    }

    #[test]
    fn checklist_page_names_every_kind_and_parameter() {
        let page = checklist_page();
        for kind in KINDS {
            assert!(
                page.contains(&format!(".SS {}", roff(kind.name))),
                "{}",
                kind.name
            );
            for param in kind.params {
                assert!(
                    page.contains(&format!("\\fB{}\\fR", roff(param.name))),
                    "{}.{}",
                    kind.name,
                    param.name
                );
            }
        }
    }

    #[test]
    fn roff_text_cannot_start_a_request() {
        assert_eq!(roff(".x\nb\\c-d\n'e"), "\\&.x\nb\\ec\\-d\n\\&'e");
    }
}
