//! `file`: a path exists (or not), has a type and mode, and its contents
//! match (or do not match) a pattern.

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{KindInfo, ParamDoc, Params, Probe, ProbeFuture, blocking, parse_params};
use preflight_facts::Facts;
use preflight_ground::values::Pattern;
use preflight_result::Finding;

/// Contents past this are not searched: enough for any config file or
/// /proc table, and a bound on memory when a check names a huge file.
const MAX_READ: u64 = 16 * 1024 * 1024;

pub const KIND: KindInfo = KindInfo {
    name: "file",
    scope: crate::Scope::Node,
    area: "system",
    summary: "A file or directory exists (or does not), with the expected type and mode, and its contents match a pattern.",
    params: &[
        ParamDoc {
            name: "path",
            ty: "string",
            default: None,
            doc: "The path, read under --root.",
        },
        ParamDoc {
            name: "exists",
            ty: "bool",
            default: Some("true"),
            doc: "Whether the path must exist (true) or must not (false).",
        },
        ParamDoc {
            name: "type",
            ty: "file|directory|symlink",
            default: Some("(any)"),
            doc: "The kind of file the path must be (a symlink is checked without following it).",
        },
        ParamDoc {
            name: "mode",
            ty: "octal string",
            default: Some("(any)"),
            doc: "The permission bits, e.g. \"0644\" or \"1777\".",
        },
        ParamDoc {
            name: "contains",
            ty: "regex",
            default: Some("unset"),
            doc: "Some line of the contents must match (^ and $ match at line ends).",
        },
        ParamDoc {
            name: "not_contains",
            ty: "regex",
            default: Some("unset"),
            doc: "No line of the contents may match.",
        },
    ],
    hint_vars: &["path"],
    parse: parse_params::<FileCheck>,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
enum FileType {
    File,
    Directory,
    Symlink,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileCheck {
    path: String,
    #[serde(default = "yes")]
    exists: bool,
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    file_type: Option<FileType>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    mode: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    contains: Option<Pattern>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    not_contains: Option<Pattern>,
}

fn yes() -> bool {
    true
}

fn parse_mode(text: &str) -> Option<u32> {
    let digits = text.trim_start_matches("0o");
    (!digits.is_empty() && digits.len() <= 4)
        .then(|| u32::from_str_radix(digits, 8).ok())
        .flatten()
}

impl Params for FileCheck {
    fn validate(&self) -> Result<(), String> {
        if let Some(mode) = &self.mode
            && parse_mode(mode).is_none()
        {
            return Err(format!(
                "`mode` `{mode}` is not octal permission bits such as \"0644\""
            ));
        }
        let expects_content = self.file_type.is_some()
            || self.mode.is_some()
            || self.contains.is_some()
            || self.not_contains.is_some();
        if !self.exists && expects_content {
            return Err(
                "`exists: false` cannot be combined with type, mode, contains or not_contains"
                    .into(),
            );
        }
        Ok(())
    }
}

impl FileCheck {
    fn check(&self, facts: &Facts) -> Finding {
        let path = &self.path;
        let real = facts.host_path(path);
        let follow = self.file_type != Some(FileType::Symlink);
        let meta = if follow {
            std::fs::metadata(&real)
        } else {
            std::fs::symlink_metadata(&real)
        };
        let with_path = |f: Finding| f.var("path", path.clone());
        let meta = match (meta, self.exists) {
            (Err(e), true) if e.kind() == std::io::ErrorKind::NotFound => {
                return with_path(
                    Finding::fail(format!("{path} does not exist"))
                        .measured("missing")
                        .expected("exists"),
                );
            }
            (Err(e), false) if e.kind() == std::io::ErrorKind::NotFound => {
                return with_path(
                    Finding::pass(format!("{path} does not exist")).measured("missing"),
                );
            }
            (Err(e), _) if super::is_denied(&e) => {
                return with_path(super::needs_privilege(
                    &format!("inspecting {path}"),
                    "read access to its directory (root)",
                ));
            }
            (Err(e), _) => return with_path(Finding::error(format!("cannot inspect {path}: {e}"))),
            (Ok(_), false) => {
                return with_path(
                    Finding::fail(format!("{path} exists but must not"))
                        .measured("exists")
                        .expected("absent"),
                );
            }
            (Ok(meta), true) => meta,
        };
        let actual_type = if meta.file_type().is_symlink() {
            "symlink"
        } else if meta.is_dir() {
            "directory"
        } else {
            "file"
        };
        if let Some(want) = self.file_type {
            let want_name = match want {
                FileType::File => "file",
                FileType::Directory => "directory",
                FileType::Symlink => "symlink",
            };
            if want_name != actual_type {
                return with_path(
                    Finding::fail(format!("{path} is a {actual_type}, not a {want_name}"))
                        .measured(actual_type)
                        .expected(want_name),
                );
            }
        }
        let mode = meta.permissions().mode() & 0o7777;
        if let Some(want) = self.mode.as_deref().and_then(parse_mode)
            && mode != want
        {
            return with_path(
                Finding::fail(format!("{path} has mode {mode:04o}, expected {want:04o}"))
                    .measured(format!("{mode:04o}"))
                    .expected(format!("{want:04o}")),
            );
        }
        if self.contains.is_some() || self.not_contains.is_some() {
            let mut text = String::new();
            let read = std::fs::File::open(&real).and_then(|f| {
                let mut bytes = Vec::new();
                f.take(MAX_READ).read_to_end(&mut bytes)?;
                text = String::from_utf8_lossy(&bytes).into_owned();
                Ok(())
            });
            if let Err(e) = read {
                if super::is_denied(&e) {
                    return with_path(super::needs_privilege(
                        &format!("reading {path}"),
                        "read access to it (root)",
                    ));
                }
                return with_path(Finding::error(format!("cannot read {path}: {e}")));
            }
            if let Some(p) = &self.contains
                && p.find(&text).is_none()
            {
                return with_path(
                    Finding::fail(format!("{path} has no line matching /{}/", p.as_str()))
                        .measured("no match")
                        .expected(format!("a line matching /{}/", p.as_str())),
                );
            }
            if let Some(p) = &self.not_contains
                && let Some(line) = p.find_line(&text)
            {
                return with_path(
                    Finding::fail(format!(
                        "{path} contains `{line}`, matching /{}/",
                        p.as_str()
                    ))
                    .measured(line.to_string())
                    .expected(format!("no line matching /{}/", p.as_str())),
                );
            }
        }
        with_path(
            Finding::pass(format!("{path} is a {actual_type} with mode {mode:04o}"))
                .measured(actual_type),
        )
    }
}

impl Probe for FileCheck {
    fn evaluate(self: Arc<Self>, facts: Arc<Facts>) -> ProbeFuture {
        blocking(move || self.check(&facts))
    }
}
