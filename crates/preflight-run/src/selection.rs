//! The checks of a run: the shipped checklist and the added files, chosen
//! by `only`, `skip` and `with`, and this node's facts to judge them by.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::Failure;
use super::settings::ChecklistSettings;
use preflight_checklist::{self as checklist, Check, ChecklistError, ChecklistErrors};
use preflight_facts::Facts;

/// The YAML files a `--checks` path stands for: the file itself, or a
/// directory's *.yaml and *.yml files in name order.
pub fn expand_paths(paths: &[PathBuf]) -> Result<Vec<PathBuf>, Failure> {
    let mut files = Vec::new();
    for path in paths {
        let meta = std::fs::metadata(path)
            .map_err(|e| Failure::Usage(format!("checklist path {}: {e}", path.display())))?;
        if meta.is_dir() {
            let mut found: Vec<PathBuf> = std::fs::read_dir(path)
                .map_err(|e| {
                    Failure::Usage(format!("checklist directory {}: {e}", path.display()))
                })?
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| is_yaml(p))
                .collect();
            found.sort();
            files.extend(found);
        } else {
            files.push(path.clone());
        }
    }
    Ok(files)
}

fn is_yaml(path: &Path) -> bool {
    matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("yaml" | "yml")
    )
}

/// Loads every file, collecting all errors before giving up.
pub fn load_added(files: &[PathBuf]) -> Result<Vec<Check>, ChecklistErrors> {
    let mut checks = Vec::new();
    let mut errors: Vec<ChecklistError> = Vec::new();
    for file in files {
        match checklist::load_file(file) {
            Ok(mut loaded) => checks.append(&mut loaded),
            Err(ChecklistErrors(mut e)) => errors.append(&mut e),
        }
    }
    if errors.is_empty() {
        Ok(checks)
    } else {
        Err(ChecklistErrors(errors))
    }
}

/// The results `run` and `bench` print that no checklist defines.
pub fn built_in_results() -> Vec<preflight_result::built_in::BuiltIn> {
    let mut out = preflight_cluster::built_in_results();
    out.extend(preflight_collective::checks::built_in_results());
    out
}

/// Why `check` on this node would not run `check`, or `None` when it
/// would: `list` and `explain` say the same.
pub fn not_here(c: &Check, args: &ChecklistSettings, facts: &Facts) -> Option<String> {
    if c.opt_in && !args.named(c) {
        Some(format!(
            "opt-in: runs only with --only or --with {}",
            c.tags.first().unwrap_or(&c.id)
        ))
    } else if c.evaluator() != preflight_checklist::Evaluator::Node {
        // `check` never runs it; `run` does, across the nodes.
        Some("preflight run only: it compares nodes (check meets none)".to_string())
    } else {
        c.when.unmet(facts)
    }
}

/// Every check this invocation knows, before `--only`/`--skip`.
pub fn all_checks(args: &ChecklistSettings) -> Result<Vec<Check>, Failure> {
    let files = expand_paths(&args.checks)?;
    let shipped = if args.no_shipped {
        Vec::new()
    } else {
        let mut checks = Vec::new();
        for source in checklist::shipped() {
            checks.append(&mut checklist::load_text(&source.name, &source.text)?);
        }
        checks
    };
    let added = load_added(&files)?;
    Ok(checklist::assemble(shipped, added)?)
}

/// The checks selected by `--only` and `--skip`. A selector that names no
/// check is an error: a typo must not silently run nothing.
pub fn select(checks: Vec<Check>, args: &ChecklistSettings) -> Result<Vec<Arc<Check>>, Failure> {
    let named = |c: &Check| args.named(c);
    Ok(select_all(checks, args)?
        .into_iter()
        .filter(|c| !c.opt_in || named(c))
        .collect())
}

/// As `select`, keeping opt-in checks that `--only` does not name (`list`
/// shows them, saying how to run them).
pub fn select_all(
    checks: Vec<Check>,
    args: &ChecklistSettings,
) -> Result<Vec<Arc<Check>>, Failure> {
    for selector in args.only.iter().chain(&args.skip).chain(&args.with) {
        if !checks.iter().any(|c| c.selected_by(selector)) {
            let flag = if args.only.contains(selector) {
                "--only"
            } else if args.skip.contains(selector) {
                "--skip"
            } else {
                "--with"
            };
            let mut message = format!("{flag} `{selector}` matches no check id or tag");
            let names: Vec<&str> = checks
                .iter()
                .flat_map(|c| {
                    std::iter::once(c.id.as_str()).chain(c.tags.iter().map(String::as_str))
                })
                .collect();
            if let Some(s) = preflight_ground::suggest::did_you_mean(selector, names) {
                message.push_str(&format!(" (did you mean `{s}`?)"));
            }
            return Err(Failure::Usage(message));
        }
    }
    Ok(checks
        .into_iter()
        .filter(|c| args.only.is_empty() || args.only.iter().any(|s| c.selected_by(s)))
        .filter(|c| !args.skip.iter().any(|s| c.selected_by(s)))
        .map(Arc::new)
        .collect())
}

/// This node's facts, with the job's environment: `env` where a command
/// makes one (a Slurm prolog gives the stages their identity so), else
/// this process's.
pub fn facts(
    args: &ChecklistSettings,
    env: Option<std::collections::BTreeMap<String, String>>,
) -> Result<Facts, Failure> {
    if !args.root.is_dir() {
        return Err(Failure::Usage(format!(
            "--root {}: not a directory",
            args.root.display()
        )));
    }
    let backends = args.backends.0.clone();
    let facts = match env {
        Some(env) => Facts::new(args.root.clone(), env, backends),
        None => Facts::from_process(args.root.clone(), backends),
    };
    Ok(facts.with_init_method(args.init_method.clone()))
}
