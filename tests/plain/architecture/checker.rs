//! The floor checker itself, over made-up trees: what keeps the rules,
//! imports up a floor, inline paths, loops, clap and unsafe out of place.

use super::*;

pub(super) fn tree(files: &[(&str, &str)]) -> BTreeMap<String, String> {
    files
        .iter()
        .map(|(p, s)| (p.to_string(), s.to_string()))
        .collect()
}

/// A small crate with the real layout's names, that keeps every rule.
fn good() -> Vec<(&'static str, &'static str)> {
    vec![
        (
            "src/lib.rs",
            "pub mod cli;\npub mod commands;\npub mod engine;\npub mod kinds;\npub mod cluster;\npub mod collective;\npub mod report;\npub mod test_hooks;\n",
        ),
        (
            "src/cli.rs",
            "use clap::Parser;\nuse crate::commands::run;\n",
        ),
        (
            "src/commands/mod.rs",
            "mod run;\npub use run::run;\nuse crate::engine;\n",
        ),
        (
            "src/commands/run.rs",
            "use crate::report::human;\nuse crate::collective::stage;\n#[derive(clap::Args)]\npub struct RunArgs;\n",
        ),
        (
            "src/engine.rs",
            "use crate::kinds::{self, Probe};\nuse preflight_result::Finding;\n",
        ),
        ("src/cluster/mod.rs", "pub mod store;\npub mod server;\n"),
        ("src/cluster/store.rs", "use super::server::Frame;\n"),
        ("src/cluster/server.rs", "use super::store::Store;\n"),
        (
            "src/collective/stage.rs",
            "use crate::cluster::store::Store;\n",
        ),
        (
            "src/report/human.rs",
            "use preflight_result::{CheckResult, Status};\n",
        ),
        (
            "src/kinds/mod.rs",
            "mod port;\nuse preflight_result::Finding;\n// use crate::engine; (a comment is no import)\nconst S: &str = \"crate::commands::run\";\n",
        ),
        (
            "src/kinds/port.rs",
            "#[cfg(test)]\nmod tests {\n    use super::*;\n    use super::super::Probe;\n}\n",
        ),
        ("src/test_hooks.rs", "use std::env;\n"),
    ]
}

fn with(
    base: Vec<(&'static str, &'static str)>,
    extra: &[(&'static str, &'static str)],
) -> BTreeMap<String, String> {
    let mut files = tree(&base);
    for (p, s) in extra {
        files.insert(p.to_string(), s.to_string());
    }
    files
}

#[test]
fn a_tree_that_keeps_the_rules_passes() {
    let _shared = crate::common::shared();
    let violations = check(&tree(&good()));
    assert!(violations.is_empty(), "{violations:#?}");
}

#[test]
fn an_import_up_a_floor_is_named_with_its_file_and_line() {
    let _shared = crate::common::shared();
    let files = with(
        good(),
        &[(
            "src/kinds/port.rs",
            "use preflight_result::Finding;\n\nuse crate::engine::{self, run};\n",
        )],
    );
    let v = check(&files);
    assert_eq!(v.len(), 1, "{v:#?}");
    assert_eq!(v[0].file, "src/kinds/port.rs");
    assert_eq!(v[0].line, 3);
    assert!(
        v[0].message.contains("use crate::engine::{self, run};"),
        "{}",
        v[0]
    );
    assert!(
        v[0].message
            .contains("kinds (floor 6) imports engine (floor 4)"),
        "{}",
        v[0]
    );
}

#[test]
fn inline_paths_and_super_count_as_imports() {
    let _shared = crate::common::shared();
    // `super::super` from kinds/port.rs is the crate root: a path up to
    // commands from there is an import too, as is an inline `crate::` path.
    let files = with(
        good(),
        &[
            (
                "src/kinds/port.rs",
                "fn f() { super::super::commands::run(); }\n",
            ),
            (
                "src/report/human.rs",
                "fn g() -> crate::commands::Stage { todo!() }\n",
            ),
        ],
    );
    let v = check(&files);
    let up: Vec<(&str, usize)> = v
        .iter()
        .filter(|v| v.message.contains("lower floor"))
        .map(|v| (v.file.as_str(), v.line))
        .collect();
    assert_eq!(
        up,
        vec![("src/kinds/port.rs", 1), ("src/report/human.rs", 1)],
        "{v:#?}"
    );
}

#[test]
fn the_ground_imports_nothing_above_it() {
    let _shared = crate::common::shared();
    let files = with(
        good(),
        &[("src/test_hooks.rs", "use crate::kinds::Probe;\n")],
    );
    let v = check(&files);
    assert!(
        v.iter().any(|v| v.file == "src/test_hooks.rs"
            && v.line == 1
            && v.message
                .contains("test_hooks (floor 8) imports kinds (floor 6)")),
        "{v:#?}"
    );
}

/// The floors below the stages are crates: the compiler keeps them from
/// reaching up, and the checker holds `src/` to them by name.
#[test]
fn a_crate_below_is_named_only_from_above_it() {
    let _shared = crate::common::shared();
    let files = with(
        good(),
        &[
            ("src/engine.rs", "use preflight_report::human::Human;\n"),
            (
                "src/test_hooks.rs",
                "use preflight_facts::Facts;\nfn f() { preflight_kinds::lookup(\"x\"); }\n",
            ),
        ],
    );
    let v = check(&files);
    let shown: Vec<String> = v.iter().map(ToString::to_string).collect();
    assert_eq!(v.len(), 2, "{shown:#?}");
    assert!(
        shown.iter().any(|s| s.starts_with("src/engine.rs:1:")
            && s.contains("the engine stage names the crate preflight_report")),
        "{shown:#?}"
    );
    assert!(
        shown.iter().any(|s| s.starts_with("src/test_hooks.rs:2:")
            && s.contains("test_hooks (floor 8) names the crate preflight_kinds (floor 6)")),
        "{shown:#?}"
    );
}

#[test]
fn stages_keep_apart_and_away_from_rendering() {
    let _shared = crate::common::shared();
    let files = with(
        good(),
        &[
            (
                "src/cluster/server.rs",
                "use super::store::Store;\nuse crate::collective::stage::RankResult;\n",
            ),
            (
                "src/collective/stage.rs",
                "use crate::cluster::store::Store;\nuse crate::cluster::server::serve;\n",
            ),
            ("src/engine.rs", "use crate::report::human::Human;\n"),
        ],
    );
    let v = check(&files);
    let shown: Vec<String> = v.iter().map(ToString::to_string).collect();
    assert_eq!(v.len(), 4, "{shown:#?}");
    assert!(
        shown
            .iter()
            .any(|s| s.starts_with("src/cluster/server.rs:2:")
                && s.contains("cluster imports collective::stage")),
        "{shown:#?}"
    );
    assert!(
        shown
            .iter()
            .any(|s| s.starts_with("src/collective/stage.rs:2:")
                && s.contains("collective imports cluster::server")),
        "{shown:#?}"
    );
    assert!(
        shown.iter().any(|s| s.starts_with("src/engine.rs:1:")
            && s.contains("the engine stage imports report::human")),
        "{shown:#?}"
    );
    // The two stages now import each other: a loop across two folders.
    assert!(
        shown
            .iter()
            .any(|s| s.contains("import loop across 2 folders")),
        "{shown:#?}"
    );
}

#[test]
fn a_loop_inside_one_folder_is_allowed_and_across_folders_is_not() {
    let _shared = crate::common::shared();
    // store ↔ server in cluster/ is in the good tree and passes; kinds and
    // report importing each other is a loop across folders (and an import
    // up a floor).
    let files = with(
        good(),
        &[
            ("src/kinds/mod.rs", "use crate::report::human;\n"),
            ("src/report/human.rs", "use crate::kinds::Probe;\n"),
        ],
    );
    let v = check(&files);
    assert!(
        v.iter().any(|v| v
            .message
            .contains("import loop across 2 folders (src/kinds, src/report)")),
        "{v:#?}"
    );
}

#[test]
fn clap_and_unsafe_stay_where_they_belong() {
    let _shared = crate::common::shared();
    let files = with(
        good(),
        &[(
            "src/report/human.rs",
            "#[derive(Clone, clap::ValueEnum)]\npub enum Format { Human }\nfn f() { unsafe { g() } }\n",
        )],
    );
    let v = check(&files);
    let shown: Vec<String> = v.iter().map(ToString::to_string).collect();
    assert_eq!(v.len(), 2, "{shown:#?}");
    assert!(
        shown[0].starts_with("src/report/human.rs:1:") && shown[0].contains("clap belongs to"),
        "{shown:#?}"
    );
    assert!(
        shown[1].starts_with("src/report/human.rs:3:") && shown[1].contains("`unsafe` lives only"),
        "{shown:#?}"
    );
}

#[test]
fn use_trees_expand() {
    let _shared = crate::common::shared();
    assert_eq!(
        expand("crate::a::{b, c::{d, e as f}, self}"),
        vec![
            "crate::a::b",
            "crate::a::c::d",
            "crate::a::c::e as f",
            "crate::a::self"
        ]
    );
}
