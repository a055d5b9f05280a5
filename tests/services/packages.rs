//! Installed the way clusters install software: tools/package.sh's .deb
//! installed, upgraded, removed and purged for real with dpkg on this
//! machine, and checked by lintian; the .rpm read back with `rpm -qp` and
//! held to the .deb's contents; the man pages rendered; the completion
//! scripts read by their shells; the periodic check run under the
//! restrictions its systemd unit sets.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

mod timer;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn root(path: &str) -> PathBuf {
    Path::new(ROOT).join(path)
}

fn have(program: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn run(program: &str, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"))
}

fn ok(program: &str, args: &[&str]) -> String {
    let out = run(program, args);
    assert!(
        out.status.success(),
        "{program} {args:?}: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The packages of the release binary (dist/preflight) at `version`, built
/// by tools/package.sh into a directory of their own; `None` (after the
/// skip rule) where the binary or the packaging tools are missing.
fn packages(version: &str) -> Option<(PathBuf, PathBuf)> {
    packages_with(version, None)
}

/// `packages`, shipping `settings` instead of contrib/slurm/settings.yaml.
fn packages_with(version: &str, settings: Option<&Path>) -> Option<(PathBuf, PathBuf)> {
    let bin = root("dist/preflight");
    if !bin.exists() {
        common::skip_unless_required(
            "dist/preflight is not built: run tools/release.sh (.ci/run does)",
        );
        return None;
    }
    for tool in ["dpkg-deb", "rpmbuild", "rpm"] {
        if !have(tool) {
            common::skip_unless_required(&format!("{tool} is not installed (.ci/install)"));
            return None;
        }
    }
    let out = std::env::temp_dir().join(format!(
        "preflight-packages-{}-{version}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).unwrap();
    let mut package = Command::new("bash");
    package
        .arg(root("tools/package.sh"))
        .env("BIN", &bin)
        .env("OUT", &out)
        .env("VERSION", version);
    if let Some(settings) = settings {
        package.env("SETTINGS", settings);
    }
    let built = package.output().unwrap();
    assert!(
        built.status.success(),
        "tools/package.sh: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    let names: Vec<PathBuf> = String::from_utf8_lossy(&built.stdout)
        .lines()
        .map(PathBuf::from)
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
    Some((names[0].clone(), names[1].clone()))
}

/// The packages at Cargo.toml's version, built once for the tests that
/// only read them.
fn current() -> Option<&'static (PathBuf, PathBuf)> {
    static BUILT: OnceLock<Option<(PathBuf, PathBuf)>> = OnceLock::new();
    BUILT
        .get_or_init(|| packages(env!("CARGO_PKG_VERSION")))
        .as_ref()
}

/// The subcommands a user may type (not the hidden ones), and every long
/// flag of each, from the command line's own definition.
fn command_tree() -> Vec<(String, Vec<String>)> {
    fn walk(prefix: &str, cmd: &clap::Command, out: &mut Vec<(String, Vec<String>)>) {
        // clap's own `help` subcommands have no page (the pages are
        // built without them) and take no flag.
        for sub in cmd
            .get_subcommands()
            .filter(|s| !s.is_hide_set() && s.get_name() != "help")
        {
            let name = format!("{prefix}-{}", sub.get_name());
            let flags = sub
                .get_arguments()
                .filter(|a| !a.is_hide_set())
                .filter_map(|a| a.get_long().map(str::to_string))
                .collect();
            out.push((name.clone(), flags));
            walk(&name, sub, out);
        }
    }
    let mut cmd = preflight::cli::command();
    cmd.build();
    let mut out = Vec::new();
    walk("preflight", &cmd, &mut out);
    out
}

/// Purges the package when the test ends, passed or not.
struct Purge;

impl Drop for Purge {
    fn drop(&mut self) {
        let _ = run("dpkg", &["--purge", "preflight"]);
    }
}

fn status() -> String {
    let out = run("dpkg-query", &["-W", "-f=${Status}", "preflight"]);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_deb_installs_upgrades_keeps_the_edited_settings_and_purges() {
    let _shared = crate::common::shared();
    if !nix::unistd::geteuid().is_root() || !have("dpkg") {
        common::skip_unless_required("dpkg -i needs root on a Debian machine");
        return;
    }
    if status().starts_with("install") || Path::new("/etc/preflight").exists() {
        common::skip_unless_required(
            "preflight is already installed here (or /etc/preflight exists): the test would replace an operator's installation",
        );
        return;
    }
    let Some((deb, _)) = current() else { return };
    // The newer build ships changed settings: the operator's edit must
    // still win, the new file set beside it.
    let changed = tempfile::NamedTempFile::new().unwrap();
    let contrib = std::fs::read_to_string(root("contrib/slurm/settings.yaml")).unwrap();
    std::fs::write(changed.path(), format!("{contrib}# a newer default\n")).unwrap();
    let Some((newer, _)) = packages_with(
        &format!("{}.1", env!("CARGO_PKG_VERSION")),
        Some(changed.path()),
    ) else {
        return;
    };
    let _purge = Purge;

    ok("dpkg", &["--install", deb.to_str().unwrap()]);
    assert_eq!(status(), "install ok installed");
    let version = ok("/usr/bin/preflight", &["--version"]);
    assert_eq!(
        version.trim(),
        format!("preflight {}", env!("CARGO_PKG_VERSION"))
    );
    // What lands where.
    // Every setting at its default, commented out: the file pins nothing.
    let settings = std::fs::read_to_string("/etc/preflight/settings.yaml").unwrap();
    for line in settings.lines() {
        assert!(
            line.trim().is_empty() || line.trim_start().starts_with('#'),
            "{line}"
        );
    }
    for line in contrib
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
    {
        assert!(
            settings.contains(&format!("# {line}")),
            "{line} is not in the installed settings"
        );
    }
    assert_eq!(
        std::fs::read_dir("/etc/preflight/checks.d")
            .unwrap()
            .count(),
        0
    );
    let conffiles = ok("dpkg-query", &["-W", "-f=${Conffiles}", "preflight"]);
    assert!(
        conffiles.contains("/etc/preflight/settings.yaml"),
        "{conffiles}"
    );
    for path in [
        "/usr/share/preflight/slurm/preflight-healthcheck",
        "/usr/share/preflight/slurm/preflight-prolog",
        "/usr/share/preflight/slurm/preflight-epilog",
        "/usr/share/preflight/slurm/slurm.conf.fragment",
        "/usr/share/preflight/ansible/validate.yml",
        "/usr/share/preflight/ansible/library/preflight.py",
        "/usr/share/preflight/kubernetes/daemonset.yaml",
        "/usr/share/preflight/prometheus/preflight-alerts.yml",
        "/usr/share/bash-completion/completions/preflight",
        "/usr/share/zsh/vendor-completions/_preflight",
        "/usr/share/fish/vendor_completions.d/preflight.fish",
        "/usr/lib/systemd/system/preflight-check.service",
        "/usr/lib/systemd/system/preflight-check.timer",
        "/usr/share/doc/preflight/copyright",
        "/usr/share/doc/preflight/changelog.gz",
        "/usr/share/doc/preflight/README.md.gz",
        "/usr/share/man/man5/preflight-checklist.5.gz",
    ] {
        assert!(Path::new(path).is_file(), "{path} is not installed");
    }
    for (name, _) in command_tree() {
        let page = format!("/usr/share/man/man1/{name}.1.gz");
        assert!(Path::new(&page).is_file(), "{page} is not installed");
    }
    // man finds the pages where it looks, with no MANPATH of ours.
    let found = ok("man", &["-w", "5", "preflight-checklist"]);
    assert_eq!(found.trim(), "/usr/share/man/man5/preflight-checklist.5.gz");
    // The packaged Slurm wrappers run the packaged binary.
    let wrapper =
        std::fs::read_to_string("/usr/share/preflight/slurm/preflight-healthcheck").unwrap();
    assert!(
        wrapper.contains("PREFLIGHT:-/usr/bin/preflight}"),
        "{wrapper}"
    );
    // The shipped settings and the empty checks.d are a valid site.
    ok("/usr/bin/preflight", &["validate", "--site"]);
    // The units as systemd reads them, and the timer left disabled.
    if !have("systemd-analyze") || !have("systemctl") {
        common::skip_unless_required(
            "systemd-analyze and systemctl (apt: systemd) are not installed",
        );
    } else {
        let verify = run(
            "systemd-analyze",
            &[
                "verify",
                "/usr/lib/systemd/system/preflight-check.service",
                "/usr/lib/systemd/system/preflight-check.timer",
            ],
        );
        let said = String::from_utf8_lossy(&verify.stderr);
        assert!(verify.status.success(), "{said}");
        assert!(!said.contains("preflight-check"), "{said}");
    }
    let wants = Path::new("/etc/systemd/system/timers.target.wants/preflight-check.timer");
    assert!(!wants.exists(), "the package enabled the timer");

    // The operator edits the settings and enables the timer (the README's
    // one command; without a running systemd, systemctl only links it).
    let edited = settings.replacen("# incomplete: ignore ", "incomplete: drain ", 1);
    assert_ne!(edited, settings);
    std::fs::write("/etc/preflight/settings.yaml", &edited).unwrap();
    let enabled = have("systemctl");
    if enabled {
        ok("systemctl", &["enable", "preflight-check.timer"]);
        assert!(
            wants.symlink_metadata().is_ok(),
            "systemctl enable linked nothing"
        );
    }

    // An upgrade to a newer build keeps the edit; the new file lands
    // beside it (what `apt` does with --force-confold, without asking).
    ok(
        "dpkg",
        &[
            "--force-confdef",
            "--force-confold",
            "--install",
            newer.to_str().unwrap(),
        ],
    );
    let dist = std::fs::read_to_string("/etc/preflight/settings.yaml.dpkg-dist").unwrap();
    assert!(dist.ends_with("# a newer default\n"), "{dist}");
    assert_eq!(
        ok("dpkg-query", &["-W", "-f=${Version}", "preflight"]),
        format!("{}.1", env!("CARGO_PKG_VERSION"))
    );
    assert_eq!(
        std::fs::read_to_string("/etc/preflight/settings.yaml").unwrap(),
        edited
    );

    // Remove: the program goes, the configuration stays.
    ok("dpkg", &["--remove", "preflight"]);
    assert_eq!(status(), "deinstall ok config-files");
    assert!(!Path::new("/usr/bin/preflight").exists());
    assert!(!Path::new("/usr/share/man/man5/preflight-checklist.5.gz").exists());
    assert!(!Path::new("/usr/share/preflight").exists());
    assert_eq!(
        std::fs::read_to_string("/etc/preflight/settings.yaml").unwrap(),
        edited
    );
    if enabled {
        assert!(
            wants.symlink_metadata().is_ok(),
            "remove forgot the enablement"
        );
    }

    // Purge: nothing is left, the timer's enablement included.
    ok("dpkg", &["--purge", "preflight"]);
    assert!(!status().starts_with("deinstall"), "{}", status());
    assert!(!Path::new("/etc/preflight").exists());
    if enabled {
        assert!(
            wants.symlink_metadata().is_err(),
            "purge left the timer enabled"
        );
    }
}

#[test]
fn lintian_finds_no_error_or_warning_in_the_deb() {
    let _shared = crate::common::shared();
    if !have("lintian") {
        common::skip_unless_required("lintian is not installed (.ci/install)");
        return;
    }
    let Some((deb, _)) = current() else { return };
    let out = run(
        "lintian",
        &[
            "--pedantic",
            "-I",
            "--show-overrides",
            "--allow-root",
            deb.to_str().unwrap(),
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let problems: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("E:") || l.starts_with("W:"))
        .collect();
    assert!(problems.is_empty(), "{text}");
    // Every override still matches something: none hides nothing.
    assert!(!text.contains("unused-override"), "{text}");
    assert!(!text.contains("mismatched-override"), "{text}");
}

/// The files (not directories) a package holds.
fn deb_files(deb: &Path) -> BTreeSet<String> {
    let listing = ok("dpkg-deb", &["--contents", deb.to_str().unwrap()]);
    listing
        .lines()
        .filter(|l| !l.starts_with('d'))
        .filter_map(|l| l.split_whitespace().last())
        .map(|p| p.trim_start_matches('.').to_string())
        .collect()
}

#[test]
fn the_rpm_holds_what_the_deb_holds_at_red_hats_paths() {
    let _shared = crate::common::shared();
    let Some((deb, rpm)) = current() else { return };
    let rpm = rpm.to_str().unwrap();
    let query = |format: &str| ok("rpm", &["-qp", "--qf", format, rpm]);
    let modes: BTreeMap<String, String> = query("[%{FILEMODES:perms} %{FILENAMES}\n]")
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(m, p)| (p.to_string(), m.to_string()))
        .collect();
    let rpm_files: BTreeSet<String> = modes
        .iter()
        .filter(|(_, m)| !m.starts_with('d'))
        .map(|(p, _)| p.clone())
        .collect();
    // The .deb's files at the .rpm's paths: Debian's own documentation
    // files aside, zsh's directory and the licence where each family keeps them.
    let expected: BTreeSet<String> = deb_files(deb)
        .into_iter()
        .filter(|p| {
            ![
                "/usr/share/doc/preflight/copyright",
                "/usr/share/doc/preflight/changelog.gz",
                "/usr/share/lintian/overrides/preflight",
            ]
            .contains(&p.as_str())
        })
        .map(|p| match p.as_str() {
            "/usr/share/zsh/vendor-completions/_preflight" => {
                "/usr/share/zsh/site-functions/_preflight".to_string()
            }
            "/usr/share/doc/preflight/README.md.gz" => {
                "/usr/share/doc/preflight/README.md".to_string()
            }
            _ => p,
        })
        .chain(["/usr/share/licenses/preflight/LICENSE".to_string()])
        .collect();
    assert_eq!(rpm_files, expected);
    // The configuration: settings.yaml never replaced by an upgrade, and
    // checks.d a directory the package owns.
    assert_eq!(
        ok("rpm", &["-qpc", rpm]).trim(),
        "/etc/preflight/settings.yaml"
    );
    let flags = query("[%{FILEFLAGS:fflags} %{FILENAMES}\n]");
    assert!(
        flags
            .lines()
            .any(|l| l == "cn /etc/preflight/settings.yaml"),
        "{flags}"
    );
    assert!(
        modes["/etc/preflight/checks.d"].starts_with('d'),
        "{modes:?}"
    );
    assert!(modes["/usr/bin/preflight"].starts_with("-rwxr-xr-x"));
    // The description whole, as the .deb has it (an rpm macro would end
    // it at its first line).
    let long = ok("dpkg-deb", &["-f", deb.to_str().unwrap(), "Description"]);
    let deb_text: Vec<String> = long
        .lines()
        .skip(1)
        .map(|l| l.trim().trim_start_matches('.').to_string())
        .collect();
    let rpm_text: Vec<String> = query("%{DESCRIPTION}")
        .lines()
        .map(|l| l.trim().to_string())
        .collect();
    assert_eq!(rpm_text, deb_text);
    // The directories the package brings are its own: an erase removes them.
    for dir in [
        "/usr/share/doc/preflight",
        "/usr/share/licenses/preflight",
        "/usr/share/preflight",
    ] {
        assert!(
            modes.get(dir).is_some_and(|m| m.starts_with('d')),
            "{dir} not owned: {modes:?}"
        );
    }
    // Metadata: Cargo.toml's version and licence.
    assert_eq!(
        query("%{NAME} %{VERSION} %{ARCH} %{LICENSE}"),
        format!("preflight {} x86_64 Apache-2.0", env!("CARGO_PKG_VERSION"))
    );
    // Nothing needed beyond the C library (glibc 2.17) and a shell for
    // the scripts: not the Ansible modules' Python, not libgcc.
    let requires = ok("rpm", &["-qp", "--requires", rpm]);
    for need in requires.lines() {
        let fine = need.starts_with("libc.so.6")
            || need.starts_with("libm.so.6")
            || need.starts_with("libpthread.so.0")
            || need.starts_with("libdl.so.2")
            || need.starts_with("ld-linux-x86-64.so.2")
            || need.starts_with("rpmlib(")
            || need.starts_with("rtld(")
            || need.starts_with("config(preflight)")
            || need == "/bin/sh"
            || need == "/bin/bash";
        assert!(fine, "unexpected requirement {need}:\n{requires}");
        if let Some(v) = need.split("(GLIBC_").nth(1) {
            let v: Vec<u32> = v
                .trim_end_matches(")(64bit)")
                .split('.')
                .map(|n| n.parse().unwrap())
                .collect();
            assert!(v.as_slice() <= [2, 17].as_slice(), "{need}");
        }
    }
    // The scriptlets: systemd told of changed units; an erase leaves no
    // timer running.
    let scripts = ok("rpm", &["-qp", "--scripts", rpm]);
    assert!(scripts.contains("daemon-reload"), "{scripts}");
    assert!(
        scripts.contains("disable --now preflight-check.timer"),
        "{scripts}"
    );
}

#[test]
fn every_command_has_a_man_page_that_renders_without_warnings() {
    let _shared = crate::common::shared();
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(common::BIN)
        .arg("man-pages")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut pages: Vec<(PathBuf, &str)> = vec![(dir.path().join("preflight.1"), "preflight")];
    let tree = command_tree();
    for (name, _) in &tree {
        pages.push((dir.path().join(format!("{name}.1")), name));
    }
    pages.push((
        dir.path().join("preflight-checklist.5"),
        "preflight-checklist",
    ));
    let written = std::fs::read_dir(dir.path()).unwrap().count();
    assert_eq!(
        written,
        pages.len(),
        "a page for no command, or a hidden one"
    );
    for (page, name) in &pages {
        let page = page.to_str().unwrap();
        assert!(Path::new(page).is_file(), "{name} has no page");
        if have("groff") {
            let lint = run("groff", &["-man", "-ww", "-z", "-Tutf8", page]);
            assert!(
                lint.status.success() && lint.stderr.is_empty(),
                "{page}: {}",
                String::from_utf8_lossy(&lint.stderr)
            );
        }
        if have("man") {
            let shown = Command::new("man")
                .args(["--warnings", "-l", page])
                .env("MANWIDTH", "80")
                .env("MAN_KEEP_FORMATTING", "0")
                .env("LANG", "C.UTF-8")
                .stdin(Stdio::null())
                .output()
                .unwrap();
            let said = String::from_utf8_lossy(&shown.stderr);
            assert!(shown.status.success() && said.is_empty(), "{page}: {said}");
            let text = String::from_utf8_lossy(&shown.stdout);
            assert!(text.contains(name), "{page}:\n{text}");
        }
    }
    if !have("man") || !have("groff") {
        common::skip_unless_required("man and groff are not installed (.ci/install)");
    }
    // The commands whose exit code is a verdict say what each code means.
    for name in [
        "preflight",
        "preflight-run",
        "preflight-check",
        "preflight-bench",
        "preflight-slurm-healthcheck",
    ] {
        let page = std::fs::read_to_string(dir.path().join(format!("{name}.1"))).unwrap();
        assert!(
            page.contains(".SH EXIT STATUS\n.TP\n\\fB0\\fR"),
            "{name}.1 has no EXIT STATUS"
        );
        assert!(!page.contains(".SH EXTRA"), "{name}.1");
    }
    // And no flag the command refuses: `check` meets no other rank.
    let check = std::fs::read_to_string(dir.path().join("preflight-check.1")).unwrap();
    for refused in ["nnodes", "master\\-addr", "collective", "nccl\\-lib"] {
        assert!(
            !check.contains(&format!("\\-\\-{refused}")),
            "preflight-check.1 lists --{refused}"
        );
    }
    // Each command's page lists its flags.
    for (name, flags) in &tree {
        let page = std::fs::read_to_string(dir.path().join(format!("{name}.1"))).unwrap();
        for flag in flags {
            assert!(
                page.contains(&format!("\\-\\-{}", flag.replace('-', "\\-"))),
                "{name}.1 does not mention --{flag}"
            );
        }
    }
}

fn completion(shell: &str) -> String {
    let out = Command::new(common::BIN)
        .args(["completions", shell])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn the_completions_name_every_command_and_flag_and_their_shells_read_them() {
    let _shared = crate::common::shared();
    let tree = command_tree();
    for shell in ["bash", "zsh", "fish"] {
        let script = completion(shell);
        for (name, flags) in &tree {
            let word = name.rsplit('-').next().unwrap();
            assert!(script.contains(word), "{shell}: no {name}");
            for flag in flags {
                assert!(
                    script.contains(&format!("--{flag}")) || script.contains(&format!("-l {flag}")),
                    "{shell}: no --{flag} of {name}"
                );
            }
        }
        assert!(!script.contains("man-pages"), "{shell}: a hidden command");
        assert!(
            !script.contains("collective-worker"),
            "{shell}: a hidden command"
        );
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), &script).unwrap();
        let syntax: &[&str] = match shell {
            "bash" => &["-n"],
            "zsh" => &["-n"],
            _ => &["--no-execute"],
        };
        if !have(shell) {
            common::skip_unless_required(&format!("{shell} is not installed (.ci/install)"));
            continue;
        }
        let mut args: Vec<&str> = syntax.to_vec();
        args.push(file.path().to_str().unwrap());
        let out = run(shell, &args);
        assert!(
            out.status.success(),
            "{shell} cannot read its script: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // Bash completes for real: the function the script registers, asked
    // as bash would ask it.
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), completion("bash")).unwrap();
    let ask = |words: &str| {
        let script = format!(
            "source {}; COMP_WORDS=({words}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); \
             COMP_LINE=\"{words}\"; COMP_POINT=${{#COMP_LINE}}; \
             _preflight preflight \"${{COMP_WORDS[COMP_CWORD]}}\" \"${{COMP_WORDS[COMP_CWORD-1]}}\"; \
             printf '%s\\n' \"${{COMPREPLY[@]}}\"",
            file.path().display()
        );
        ok("bash", &["-c", &script])
    };
    let subcommands = ask("preflight ch");
    assert!(subcommands.lines().any(|w| w == "check"), "{subcommands}");
    let flags = ask("preflight check --json");
    assert!(flags.lines().any(|w| w == "--json-report"), "{flags}");
    // Only what the command takes: `check` refuses the cluster flags.
    let every = ask("preflight check --");
    for refused in ["--nnodes", "--master-addr", "--collective", "--nccl-lib"] {
        assert!(
            !every.lines().any(|w| w == refused),
            "{refused} offered: {every}"
        );
    }
    let bench = ask("preflight bench --");
    assert!(bench.lines().any(|w| w == "--nnodes"), "{bench}");
    assert!(!bench.lines().any(|w| w == "--checks"), "{bench}");
    let shells = ask("preflight completions f");
    assert!(shells.lines().any(|w| w == "fish"), "{shells}");
}
