//! The periodic check as its systemd units run it: the timer and service
//! expanded and sandboxed as systemd would, as nobody, giving the verdict
//! the command gives.

use super::*;

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
    let _serial = crate::common::serial();
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
    common::install_executable(std::path::Path::new(common::BIN), &bin);
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

    let run_under = |sandbox: bool| -> (i32, BTreeMap<String, String>, String, common::Report) {
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
        let report = common::report(&std::fs::read_to_string(&json).unwrap(), &said);
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
    let message = |r: &common::Report| common::message(r, "site.port").to_string();
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
