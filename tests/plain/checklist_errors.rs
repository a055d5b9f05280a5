//! Every invalid checklist is rejected with exit code 2 and a message naming
//! the file, line, column and key path, with the valid choices when few.

use crate::common::binary;

use binary::{preflight, run};

/// Runs `validate` and `check` on the fixture; both must name the spot.
fn rejects(name: &str, expected: &str) {
    let file = format!("fixtures/checklists/invalid/{name}");
    for args in [
        vec!["validate", file.as_str()],
        vec!["check", "--no-shipped", "--checks", file.as_str()],
    ] {
        let out = run(preflight().args(&args));
        assert_eq!(out.code, 2, "{args:?}: {}", out.stderr);
        let want = format!("error: {file}:{expected}");
        assert!(
            out.stderr.contains(&want),
            "{args:?}\nwant: {want}\ngot:  {}",
            out.stderr
        );
        assert!(
            out.stdout.is_empty(),
            "no report for an invalid checklist: {}",
            out.stdout
        );
    }
}

#[test]
fn unknown_key() {
    let _shared = crate::common::shared();
    rejects(
        "unknown-key.yaml",
        "5:5: checks[0].minimum: unknown key `minimum` for kind `kernel_param`; `kernel_param` takes: name, equals, one_of, min, max, matches, if_missing; every check takes: id, kind,",
    );
}

#[test]
fn unknown_kind() {
    let _shared = crate::common::shared();
    rejects(
        "unknown-kind.yaml",
        "3:11: checks[0].kind: unknown kind `comand` (did you mean `command`?); valid kinds: amd_smi, command,",
    );
}

#[test]
fn wrong_type() {
    let _shared = crate::common::shared();
    rejects(
        "wrong-type.yaml",
        "5:10: checks[0].min: invalid type: string \"lots\", expected an integer",
    );
}

#[test]
fn duplicate_id() {
    let _shared = crate::common::shared();
    rejects(
        "duplicate-id.yaml",
        "6:5: duplicate check id `shm`: already defined at fixtures/checklists/invalid/duplicate-id.yaml:2:5",
    );
}

#[test]
fn bad_duration() {
    let _shared = crate::common::shared();
    rejects(
        "bad-duration.yaml",
        "5:14: checks[0].timeout: invalid duration `5 sex`: unknown time unit \"sex\"",
    );
}

#[test]
fn bad_regex() {
    let _shared = crate::common::shared();
    rejects(
        "bad-regex.yaml",
        "5:15: checks[0].contains: invalid regex `^127\\.0\\.1\\.1[\\s`: unclosed character class",
    );
}

#[test]
fn bad_severity_lists_the_choices() {
    let _shared = crate::common::shared();
    rejects(
        "bad-severity.yaml",
        "5:15: checks[0].severity: unknown variant `fatal`, expected `fail` or `warn`",
    );
}

#[test]
fn bad_hint_placeholder() {
    let _shared = crate::common::shared();
    rejects(
        "bad-hint.yaml",
        "5:11: checks[0].hint: unknown placeholder `{paht}` in hint; valid: {measured}, {expected}, {id}, {host}, {path}, {env.NAME}",
    );
}

#[test]
fn bad_when_condition() {
    let _shared = crate::common::shared();
    rejects(
        "bad-when.yaml",
        "6:15: checks[0].when.vendor: unknown variant `nvidai`, expected one of `nvidia`, `amd`, `intel`, `habana`, `any`, `none`",
    );
}

#[test]
fn missing_kind() {
    let _shared = crate::common::shared();
    rejects(
        "missing-kind.yaml",
        "2:5: checks[0]: check `shm` is missing key `kind`; valid kinds:",
    );
}

#[test]
fn missing_required_parameter() {
    let _shared = crate::common::shared();
    rejects(
        "missing-param.yaml",
        "2:5: checks[0]: missing key `path`, required by kind `file`",
    );
}

#[test]
fn invalid_yaml_syntax() {
    let _shared = crate::common::shared();
    rejects(
        "not-yaml.yaml",
        "4:10: invalid YAML: mapping values are not allowed in this context",
    );
}

#[test]
fn every_error_in_a_file_is_reported_at_once() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("two.yaml");
    std::fs::write(
        &file,
        "checks:\n  - id: a\n    kind: env\n    name: X\n    timeout: 5\n  - id: b\n    kind: envv\n    name: Y\n",
    )
    .unwrap();
    let out = run(preflight().arg("validate").arg(&file));
    assert_eq!(out.code, 2);
    assert!(out.stderr.contains("two.yaml:5:14: checks[0].timeout: invalid duration `5`: a duration needs a unit, e.g. `5s`"), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("two.yaml:7:11: checks[1].kind: unknown kind `envv` (did you mean `env`?)"),
        "{}",
        out.stderr
    );
}

#[test]
fn a_missing_checklist_file_is_named() {
    let _shared = crate::common::shared();
    let out = run(preflight().args(["check", "--checks", "fixtures/checklists/nope.yaml"]));
    assert_eq!(out.code, 2);
    assert!(
        out.stderr
            .contains("checklist path fixtures/checklists/nope.yaml: No such file or directory"),
        "{}",
        out.stderr
    );
}

#[test]
fn the_top_level_must_be_a_checks_list() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("top.yaml");
    std::fs::write(&file, "check:\n  - id: a\n").unwrap();
    let out = run(preflight().arg("validate").arg(&file));
    assert_eq!(out.code, 2);
    assert!(
        out.stderr
            .contains("top.yaml:1:1: unknown key `check` at the top level (did you mean `checks`?); valid keys: checks"),
        "{}",
        out.stderr
    );
}

#[test]
fn a_zero_timeout_is_rejected() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("zero.yaml");
    std::fs::write(
        &file,
        "checks:\n  - id: a\n    kind: env\n    name: X\n    timeout: 0s\n",
    )
    .unwrap();
    let out = run(preflight().arg("validate").arg(&file));
    assert_eq!(out.code, 2);
    assert!(
        out.stderr.contains(
            "zero.yaml:5:14: checks[0].timeout: a check's timeout must be longer than zero"
        ),
        "{}",
        out.stderr
    );
}

#[test]
fn validation_errors_point_at_the_key() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("mode.yaml");
    std::fs::write(
        &file,
        "checks:\n  - id: a\n    kind: file\n    path: /x\n    mode: \"99\"\n",
    )
    .unwrap();
    let out = run(preflight().arg("validate").arg(&file));
    assert_eq!(out.code, 2);
    assert!(
        out.stderr
            .contains("mode.yaml:5:11: checks[0].mode: `mode` `99` is not octal permission bits"),
        "{}",
        out.stderr
    );
}

#[test]
fn yaml_merge_keys_are_refused_clearly() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("merge.yaml");
    std::fs::write(
        &file,
        "base: &b\n  kind: env\nchecks:\n  - id: a\n    <<: *b\n    name: X\n",
    )
    .unwrap();
    let out = run(preflight().arg("validate").arg(&file));
    assert_eq!(out.code, 2);
    assert!(
        out.stderr
            .contains("merge.yaml:1:1: unknown key `base` at the top level"),
        "{}",
        out.stderr
    );
    std::fs::write(
        &file,
        "checks:\n  - &b {id: a, kind: env, name: X}\n  - id: c\n    <<: *b\n",
    )
    .unwrap();
    let out = run(preflight().arg("validate").arg(&file));
    assert_eq!(out.code, 2);
    assert!(out.stderr.contains("merge.yaml:4:5: checks[1]: YAML merge keys (`<<`) are not supported: write the keys out"), "{}", out.stderr);
}

#[test]
fn every_error_of_a_check_is_reported_at_once() {
    let _shared = crate::common::shared();
    for expected in [
        "4:11: checks[0].kind: unknown kind `nosuch`",
        "5:15: checks[0].severity: unknown variant `huge`, expected `fail` or `warn`",
        "6:14: checks[0].timeout: a check's timeout must be longer than zero",
        "7:9: checks[1].id: invalid id `Bad Id`",
    ] {
        rejects("many-errors.yaml", expected);
    }
}

/// A tab is one character: the error points at the tab itself, not where
/// the scanner stopped after it.
#[test]
fn a_tab_is_located_at_its_own_column() {
    let _shared = crate::common::shared();
    rejects(
        "tab-indent.yaml",
        "2:1: invalid YAML: tabs disallowed within this context",
    );
    rejects(
        "tab-in-scalar.yaml",
        "3:5: invalid YAML: while scanning a plain scalar, found a tab",
    );
}

/// One run shows every mistake of every file, in line order: a bad
/// parameter no longer hides a misspelt key of the same check, and a
/// misspelt top-level key gets its suggestion.
#[test]
fn validate_shows_every_error_of_every_file_in_line_order() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.yaml");
    std::fs::write(
        &a,
        "checks:\n  - id: a\n    kind: env\n    nme: X\n  - id: b\n    kind: kernel_param\n    name: net.core.somaxconn\n    min: \"lots\"\n    timout: 5s\n",
    )
    .unwrap();
    let b = dir.path().join("b.yaml");
    std::fs::write(&b, "check:\n  - id: c\n").unwrap();
    let out = run(preflight().args(["validate", a.to_str().unwrap(), b.to_str().unwrap()]));
    assert_eq!(out.code, 2, "{}", out.stderr);
    let lines: Vec<&str> = out.stderr.lines().collect();
    let a = a.display().to_string();
    let b = b.display().to_string();
    let want = [
        format!(
            "error: {a}:4:5: checks[0].nme: unknown key `nme` for kind `env` (did you mean `name`?)"
        ),
        format!(
            "error: {a}:8:10: checks[1].min: invalid type: string \"lots\", expected an integer"
        ),
        format!(
            "error: {a}:9:5: checks[1].timout: unknown key `timout` for kind `kernel_param` (did you mean `timeout`?)"
        ),
        format!("error: {b}:1:1: unknown key `check` at the top level (did you mean `checks`?)"),
    ];
    assert_eq!(lines.len(), want.len(), "{}", out.stderr);
    for (line, want) in lines.iter().zip(&want) {
        assert!(
            line.starts_with(want.as_str()),
            "want: {want}\ngot:  {line}"
        );
    }
}

/// An empty file is valid, and said to be empty.
#[test]
fn validate_warns_of_an_empty_file() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.yaml");
    std::fs::write(&empty, "").unwrap();
    let out = run(preflight().args(["validate", empty.to_str().unwrap()]));
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stderr
            .contains(&format!("warning: {}: no checks", empty.display())),
        "{}",
        out.stderr
    );
}

/// `validate --site`: a bad value, a misspelt key and a selection that
/// matches nothing, in one run, not three edit-and-rerun cycles.
#[test]
fn validate_site_shows_every_error_at_once() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("settings.yaml"),
        "prolog:\n  cluster: flase\n  timout: 5s\nhealthcheck:\n  skip: [slowe]\n",
    )
    .unwrap();
    let out = run(preflight()
        .args(["validate", "--site", "--config-dir"])
        .arg(dir.path()));
    assert_eq!(out.code, 2, "{}", out.stderr);
    let file = dir.path().join("settings.yaml").display().to_string();
    let lines: Vec<&str> = out.stderr.lines().collect();
    assert_eq!(lines.len(), 3, "{}", out.stderr);
    assert!(
        lines[0].starts_with(&format!("error: {file}:2:12: prolog.cluster: invalid type")),
        "{}",
        lines[0]
    );
    assert!(
        lines[1].starts_with(&format!(
            "error: {file}:3:3: prolog.timout: unknown key `timout` (did you mean `timeout`?)"
        )),
        "{}",
        lines[1]
    );
    assert!(
        lines[2].starts_with(&format!("error: {file}: healthcheck: --skip `slowe` matches no check id or tag (did you mean `slow`?)")),
        "{}",
        lines[2]
    );
}

#[test]
fn a_rank_kind_cannot_be_left_to_the_nodes_leader() {
    let _shared = crate::common::shared();
    rejects(
        "rank-kind-as-node.yaml",
        "5:12: checks[0].scope: kind `env` examines each rank's own state (its environment, devices or bindings): its scope is rank",
    );
}

#[test]
fn a_node_kind_is_no_cluster_comparison() {
    let _shared = crate::common::shared();
    rejects(
        "node-kind-as-cluster.yaml",
        "5:12: checks[0].scope: `scope: cluster` needs a cluster kind (cluster_versions, cluster_env, ...); `file` is evaluated on each node",
    );
}

#[test]
fn a_check_every_rank_must_run_cannot_be_left_to_the_leader() {
    let _shared = crate::common::shared();
    rejects(
        "torch-job-as-node.yaml",
        "5:12: checks[0].scope: kind `torch_distributed` as configured runs on every rank at once (its parameters say so): its scope is rank",
    );
}
