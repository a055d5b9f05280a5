//! Installed the way clusters install software: tools/package.sh's .deb
//! installed, upgraded, removed and purged for real with dpkg on this
//! machine, and checked by lintian; the .rpm read back with `rpm -qp` and
//! held to the .deb's contents; the man pages rendered; the completion
//! scripts read by their shells; the periodic check run under the
//! restrictions its systemd unit sets.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

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

/// preflight-check.service as the test reads it: its environment, its
/// command line, and the restrictions it asks systemd for.
#[derive(Clone)]
struct Unit {
    env: BTreeMap<String, String>,
    exec: String,
    /// ReadWritePaths (a leading `-`: may be missing) and StateDirectory's
    /// /var/lib/NAME: where the unit may write.
    writable: Vec<String>,
    capabilities: Vec<String>,
    /// ProtectKernelTunables / ProtectControlGroups: /proc/sys and /sys
    /// read-only.
    kernel_read_only: bool,
}

fn unit() -> Unit {
    let text = std::fs::read_to_string(root("contrib/systemd/preflight-check.service")).unwrap();
    let mut unit = Unit {
        env: BTreeMap::new(),
        exec: String::new(),
        writable: Vec::new(),
        capabilities: Vec::new(),
        kernel_read_only: false,
    };
    let mut section = "";
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if line.starts_with('[') {
            section = line;
            continue;
        }
        let (key, value) = line.split_once('=').unwrap();
        if section != "[Service]" {
            continue;
        }
        match (key, value) {
            ("Environment", v) => {
                let (k, v) = v.split_once('=').unwrap();
                unit.env.insert(k.into(), v.into());
            }
            ("ExecStart", v) => unit.exec = v.into(),
            ("ReadWritePaths", v) => unit.writable.extend(
                v.split_whitespace()
                    .map(|p| p.trim_start_matches('-').to_string()),
            ),
            ("StateDirectory", v) => unit.writable.push(format!("/var/lib/{v}")),
            ("CapabilityBoundingSet", v) => {
                unit.capabilities = v
                    .split_whitespace()
                    .map(|c| c.trim_start_matches("CAP_").to_lowercase())
                    .collect()
            }
            ("ProtectKernelTunables", "yes") | ("ProtectControlGroups", "yes") => {
                unit.kernel_read_only = true
            }
            // What the sandbox below reproduces as systemd would.
            ("ProtectSystem", "strict")
            | ("ProtectHome", "read-only")
            | ("PrivateTmp", "yes")
            | ("NoNewPrivileges", "yes") => {}
            // Not restrictions: how systemd starts and judges the run.
            ("Type", "oneshot") | ("SuccessExitStatus", _) | ("TimeoutStartSec", _) => {}
            (k, v) => panic!(
                "preflight-check.service sets {k}={v}, which this test cannot reproduce: teach it, or the verdict under it is untested"
            ),
        }
    }
    unit
}

/// The unit's command line, with systemd's expansion: `${VAR}` one word,
/// `$VAR` split at white space.
fn expand(exec: &str, env: &BTreeMap<String, String>) -> Vec<String> {
    let mut argv = Vec::new();
    for word in exec.split_whitespace() {
        if let Some(name) = word.strip_prefix('$').filter(|n| !n.starts_with('{')) {
            argv.extend(env[name].split_whitespace().map(String::from));
            continue;
        }
        let mut word = word.to_string();
        for (k, v) in env {
            word = word.replace(&format!("${{{k}}}"), v);
        }
        assert!(!word.contains('$'), "unexpanded {word}");
        argv.push(word);
    }
    argv
}

/// systemd's default PATH for a system service.
const SYSTEMD_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Runs `argv` as systemd would run the unit, with util-linux's tools
/// (this machine runs no systemd: PID 1 is no systemd, so systemd-run
/// cannot start a unit): a clean environment (systemd's PATH and the
/// unit's variables) from `/`, in a mount namespace where every mount but
/// /dev, /proc, /sys and `writable` is read-only (ProtectSystem=strict,
/// ProtectHome=read-only), /proc/sys and /sys read-only too
/// (ProtectKernelTunables, ProtectControlGroups), /tmp and /var/tmp fresh
/// directories of the host's /tmp file system (PrivateTmp), then setpriv
/// for NoNewPrivileges and the capability bounding set.
fn sandboxed(unit: &Unit, writable: &[String], private: (&Path, &Path), argv: &[String]) -> Output {
    let caps: Vec<String> = unit.capabilities.iter().map(|c| format!("+{c}")).collect();
    let script = r#"
set -eu
for p in $READ_WRITE; do mount --bind "$p" "$p"; done
awk '{print $5}' /proc/self/mountinfo | sort -u | while read -r m; do
    m=$(printf '%b' "$m")
    case "$m" in /dev|/dev/*|/proc|/proc/*|/sys|/sys/*) continue ;; esac
    keep=
    for p in $READ_WRITE; do case "$m" in "$p"|"$p"/*) keep=1 ;; esac; done
    [ -n "$keep" ] || mount -o remount,bind,ro "$m"
done
if [ "$KERNEL_RO" = 1 ]; then
    mount --bind /proc/sys /proc/sys
    mount -o remount,bind,ro /proc/sys
    awk '{print $5}' /proc/self/mountinfo | sort -u | while read -r m; do
        case "$m" in /sys|/sys/*) mount -o remount,bind,ro "$m" ;; esac
    done
fi
mount --bind "$PRIVATE_VAR_TMP" /var/tmp
mount --bind "$PRIVATE_TMP" /tmp
exec setpriv --no-new-privs --inh-caps=-all --bounding-set="-all,$CAPS" -- "$@"
"#;
    Command::new("unshare")
        .args([
            "--mount",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            script,
            "sandbox",
        ])
        .args(argv)
        .env_clear()
        .env("PATH", SYSTEMD_PATH)
        .envs(&unit.env)
        .env("READ_WRITE", writable.join(" "))
        .env("KERNEL_RO", if unit.kernel_read_only { "1" } else { "0" })
        .env("PRIVATE_TMP", private.0)
        .env("PRIVATE_VAR_TMP", private.1)
        .env("CAPS", caps.join(","))
        .current_dir("/")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// `status` of each check in a Prometheus file, and the verdict.
fn statuses(prom: &Path) -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(prom).unwrap();
    let mut out = BTreeMap::new();
    for line in text.lines().filter(|l| l.ends_with("} 1")) {
        let label = |name: &str| {
            line.split(&format!("{name}=\""))
                .nth(1)
                .and_then(|r| r.split('"').next())
                .map(String::from)
        };
        if line.starts_with("preflight_check_status{") {
            out.insert(label("check").unwrap(), label("status").unwrap());
        } else if line.starts_with("preflight_verdict{") {
            out.insert("(verdict)".into(), label("verdict").unwrap());
        }
    }
    out
}

/// A port held by `nobody`, until dropped.
struct Held(std::process::Child);

impl Drop for Held {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn hold_as_nobody(port: u16) -> Held {
    let child = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--", "/usr/bin/python3", "-c"])
        .current_dir("/")
        .arg(format!(
            "import socket,sys,time\ns=socket.socket()\ns.bind(('127.0.0.1',{port}))\ns.listen()\nprint('up',flush=True)\ntime.sleep(120)"
        ))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut held = Held(child);
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(held.0.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "up");
    held
}

#[test]
fn the_periodic_check_gives_the_same_verdict_under_its_units_restrictions() {
    if !nix::unistd::geteuid().is_root()
        || !have("unshare")
        || !have("setpriv")
        || !Path::new("/usr/bin/python3").exists()
    {
        common::skip_unless_required("the unit's sandbox needs root, unshare, setpriv and python3");
        return;
    }
    let unit = unit();
    // Everything the run reads or writes lives outside /tmp, which the
    // unit hides (a checkout under /tmp included): under /var/lib, in a
    // directory of the test's own.
    let base = tempfile::Builder::new()
        .prefix("preflight-unit-test.")
        .tempdir_in("/var/lib")
        .unwrap();
    std::fs::set_permissions(
        base.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let bin = base.path().join("preflight");
    std::fs::copy(common::BIN, &bin).unwrap();
    // The unit's writable places, each mapped to one of the test's.
    let mut writable = Vec::new();
    let mut map: Vec<(String, String)> = Vec::new();
    for (i, path) in unit.writable.iter().enumerate() {
        let mine = base.path().join(format!("rw{i}"));
        std::fs::create_dir(&mine).unwrap();
        map.push((path.clone(), mine.display().to_string()));
        writable.push(mine.display().to_string());
    }
    let textfile_of_unit = unit.env["PREFLIGHT_TEXTFILE_DIR"].clone();
    assert!(
        unit.writable.contains(&textfile_of_unit),
        "the textfile directory is not writable under the unit: {:?}",
        unit.writable
    );
    // The site's checks: a file in another user's private directory (as
    // munge's is), and a port another user holds.
    let checks = base.path().join("checks.d");
    std::fs::create_dir(&checks).unwrap();
    let private = base.path().join("private");
    std::fs::create_dir(&private).unwrap();
    std::fs::write(private.join("key"), "x").unwrap();
    nix::unistd::chown(&private.join("key"), Some(65534.into()), Some(65534.into())).unwrap();
    nix::unistd::chown(&private, Some(65534.into()), Some(65534.into())).unwrap();
    std::fs::set_permissions(
        &private,
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    let port = common::unused_port("127.0.0.1");
    let _held = hold_as_nobody(port);
    std::fs::write(
        checks.join("site.yaml"),
        format!(
            "checks:\n  - id: site.private_file\n    kind: file\n    path: {}\n  - id: site.port\n    kind: port\n    ports: [{port}]\n    address: 127.0.0.1\n",
            private.join("key").display()
        ),
    )
    .unwrap();
    let tmp_private = tempfile::Builder::new()
        .prefix("preflight-private-tmp.")
        .tempdir_in("/tmp")
        .unwrap();
    let var_tmp_private = tempfile::Builder::new()
        .prefix("preflight-private-var-tmp.")
        .tempdir_in("/tmp")
        .unwrap();

    let run_under = |sandbox: bool| -> (i32, BTreeMap<String, String>, String, serde_json::Value) {
        let mut env = unit.env.clone();
        // The JSON report too, where the unit's comment says to keep it.
        let args = env.get_mut("PREFLIGHT_CHECK_ARGS").unwrap();
        args.push_str(" --json-report /var/lib/preflight/periodic.json");
        // Whole paths only, each once: a mapped path may start with
        // another unit path's text.
        for v in env.values_mut() {
            *v = v
                .split(' ')
                .map(|word| {
                    map.iter()
                        .find_map(|(from, to)| {
                            (word == from || word.starts_with(&format!("{from}/")))
                                .then(|| format!("{to}{}", &word[from.len()..]))
                        })
                        .unwrap_or_else(|| word.to_string())
                })
                .collect::<Vec<_>>()
                .join(" ");
        }
        let textfile = PathBuf::from(&env["PREFLIGHT_TEXTFILE_DIR"]);
        let _ = std::fs::remove_file(textfile.join("preflight.prom"));
        let exec = unit
            .exec
            .replace("/usr/bin/preflight", bin.to_str().unwrap())
            .replace("/etc/preflight/checks.d", checks.to_str().unwrap());
        let argv = expand(&exec, &env);
        let json = PathBuf::from(
            argv.iter()
                .skip_while(|a| *a != "--json-report")
                .nth(1)
                .unwrap(),
        );
        let _ = std::fs::remove_file(&json);
        let out = if sandbox {
            let unit = Unit {
                env: env.clone(),
                ..unit.clone()
            };
            sandboxed(
                &unit,
                &writable,
                (tmp_private.path(), var_tmp_private.path()),
                &argv,
            )
        } else {
            Command::new(&argv[0])
                .args(&argv[1..])
                .env_clear()
                .env("PATH", SYSTEMD_PATH)
                .envs(&env)
                .current_dir("/")
                .stdin(Stdio::null())
                .output()
                .unwrap()
        };
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let prom = textfile.join("preflight.prom");
        assert!(
            prom.is_file(),
            "no metrics written (sandbox: {sandbox}): {said}"
        );
        let report: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        (
            out.status.code().unwrap_or(-1),
            statuses(&prom),
            said,
            report,
        )
    };
    // The sandbox is what the unit says, or this test proves nothing.
    let probe = sandboxed(
        &unit,
        &writable,
        (tmp_private.path(), var_tmp_private.path()),
        &[
            "sh".into(),
            "-c".into(),
            format!(
                "! touch /usr/.preflight-probe 2>/dev/null && ! touch /root/.preflight-probe 2>/dev/null && ! touch {base}/.probe 2>/dev/null && touch {rw}/w && rm {rw}/w && [ -z \"$(ls -A /tmp)\" ] && ! sh -c 'echo 1 > /proc/sys/kernel/sysrq' 2>/dev/null && grep -E '^(CapBnd|NoNewPrivs)' /proc/self/status",
                base = base.path().display(),
                rw = writable[0]
            ),
        ],
    );
    let said = String::from_utf8_lossy(&probe.stdout);
    assert!(
        probe.status.success(),
        "the sandbox is not what the unit asks: {said}{}",
        String::from_utf8_lossy(&probe.stderr)
    );
    let mask: u64 = unit
        .capabilities
        .iter()
        .map(|c| match c.as_str() {
            "dac_read_search" => 1u64 << 2,
            "net_admin" => 1 << 12,
            "net_raw" => 1 << 13,
            "sys_ptrace" => 1 << 19,
            "syslog" => 1 << 34,
            other => panic!("add capability {other}'s number"),
        })
        .sum();
    assert!(said.contains(&format!("CapBnd:\t{mask:016x}")), "{said}");
    assert!(said.contains("NoNewPrivs:\t1"), "{said}");

    let (free_code, free, _, free_report) = run_under(false);
    let (code, restricted, said, report) = run_under(true);
    assert!(free.len() > 10, "{free:?}");
    assert_eq!(restricted, free, "{said}");
    assert_eq!(code, free_code, "{said}");
    // The file in another user's directory is read, and the port's holder
    // is named, under the unit as root names them without it.
    assert_eq!(restricted["site.private_file"], "pass", "{said}");
    assert_eq!(restricted["site.port"], "fail", "{said}");
    let message = |r: &serde_json::Value| {
        r["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["id"] == "site.port")
            .unwrap()["message"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert!(
        message(&report).contains("held by pid"),
        "{}",
        message(&report)
    );
    assert!(message(&report).contains("python3"), "{}", message(&report));
    assert_eq!(message(&report), message(&free_report));
    // And the unit would count it as run, whatever the verdict.
    assert!([0, 1, 3].contains(&code), "{said}");
}
