//! The site configuration: `/etc/preflight/` (or `PREFLIGHT_CONFIG_DIR`),
//! read by the modes a scheduler starts with an almost empty environment
//! (`preflight slurm healthcheck|prolog|epilog`): `settings.yaml` says
//! what each mode runs and does, `checks.d/*.yaml` adds the site's checks.
//! Both are YAML in the checklists' dialect, and every error names the
//! file, line and column; `preflight validate` reads them too.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::Failure;
use super::selection::{all_checks, expand_paths, select};
use super::settings::ChecklistSettings;
use preflight_checklist::{ChecklistError, ChecklistErrors};
use preflight_ground::values::Span;
use preflight_ground::yaml;
use preflight_kinds::ports::PortRange;

pub const CONFIG_DIR_VAR: &str = "PREFLIGHT_CONFIG_DIR";
pub const DEFAULT_CONFIG_DIR: &str = "/etc/preflight";
pub const SETTINGS_FILE: &str = "settings.yaml";
pub const CHECKS_DIR: &str = "checks.d";
/// The site's node profile, over the shipped ones (`--profile`).
pub const PROFILE_FILE: &str = "profile.yaml";
/// A fleet of several kinds of node: the site's profiles, each node held
/// to the one its facts match.
pub const PROFILES_DIR: &str = "profiles.d";

/// What `incomplete` (a required check that could not be evaluated, or
/// a deadline) does to a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Incomplete {
    /// Not proof of a fault: logged and reported, the node left as it is.
    Ignore,
    /// Treated as a failure: the node is drained (LBNL NHC's watchdog does
    /// so for a check that hangs).
    Drain,
}

/// What the prolog does with a job whose rank 0 finds every port of the
/// rendezvous range held by other programs: a local user can bind them
/// all, so holding the job for it would let anyone hold any job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum OnSquat {
    /// The job runs, ungated, with the holders named in its comment and
    /// a warning in the report and the log.
    #[default]
    Run,
    /// The job is requeued and held, the holders named in its comment:
    /// a site that prefers no job unchecked, at the price that a local
    /// user can hold any job whose rank 0 lands on their node.
    Hold,
}

/// One mode's selection and deadline, and the prolog's own settings
/// (`PROLOG_ONLY`), which the other modes refuse where they are written.
/// One struct for every mode: the located deserializer and
/// `deny_unknown_fields` do not go with `serde(flatten)`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mode {
    /// Checks or tags to run (empty: all).
    #[serde(default)]
    pub only: Vec<String>,
    /// Checks or tags to leave out; wins over `only`.
    #[serde(default)]
    pub skip: Vec<String>,
    /// Opt-in checks or tags to run as well (`--with`).
    #[serde(default)]
    pub with: Vec<String>,
    /// The whole mode's deadline.
    pub timeout: Option<Span>,
    pub incomplete: Option<Incomplete>,
    /// Warnings drain too (`--strict`): the epilog's default, where a
    /// warning such as GPU memory still in use is left by the job.
    pub strict: Option<bool>,
    /// The prolog's: run the cluster stage across the job's allocation
    /// (`--cluster`).
    pub cluster: Option<bool>,
    /// The prolog's: where the allocation's rendezvous listens, one port
    /// per job, picked from the range by the job id, the same on every
    /// node.
    pub ports: Option<PortRange>,
    /// The prolog's: where each node's reachability probe listener may
    /// listen (else an ephemeral port): the range a site's firewall opens.
    pub probe_ports: Option<PortRange>,
    /// The prolog's: what a rendezvous range held whole by strangers does
    /// to the job.
    pub on_squat: Option<OnSquat>,
    /// The epilog's: where a watchdog in the job saved its diagnosis
    /// (`%j` job id, `%w` its working directory, `%n` the node), read
    /// when the job ran out of time; `off`.
    pub diagnosis: Option<String>,
}

/// The keys only the prolog takes: the other modes run on one node.
const PROLOG_ONLY: &[&str] = &["cluster", "ports", "probe_ports", "on_squat"];

/// The keys only the epilog takes: a job's end.
const EPILOG_ONLY: &[&str] = &["diagnosis"];

/// Where the sbatch example's watchdog saves the job's diagnosis.
pub const DIAGNOSIS_FILE: &str = "%w/preflight-diagnose-%j.json";

impl Mode {
    /// Forgets the settings of the other modes.
    fn only_its_own(self, mode: &str) -> Mode {
        let prolog = mode == "prolog";
        Mode {
            cluster: self.cluster.filter(|_| prolog),
            ports: self.ports.filter(|_| prolog),
            probe_ports: self.probe_ports.filter(|_| prolog),
            on_squat: self.on_squat.filter(|_| prolog),
            diagnosis: self.diagnosis.filter(|_| mode == "epilog"),
            ..self
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Secret {
    /// A root-only file every node holds: combined with the job id, the
    /// job's secret, which every prolog can compute and no user can.
    pub site_key_file: Option<PathBuf>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    drain_prefix: Option<String>,
    report_dir: Option<PathBuf>,
    state_dir: Option<PathBuf>,
    max_concurrent: Option<u16>,
    scontrol: Option<PathBuf>,
    incomplete: Option<Incomplete>,
    secret: Option<Secret>,
    healthcheck: Option<Mode>,
    prolog: Option<Mode>,
    epilog: Option<Mode>,
}

/// The settings with every default filled in.
#[derive(Debug, Clone)]
pub struct Settings {
    pub dir: PathBuf,
    /// Where the settings came from (`defaults` when the file is absent).
    pub source: String,
    /// Every reason preflight sets starts with it; only a node whose
    /// reason does is ever resumed by preflight.
    pub drain_prefix: String,
    /// Reports are written here, one file per mode (the prolog's and
    /// epilog's with the job id).
    pub report_dir: PathBuf,
    /// Where kept passes live (`cache:`): the periodic timer's and the
    /// Slurm modes' must be the same for the prolog to reuse the timer's.
    pub state_dir: PathBuf,
    /// Checks run at once in every mode (`--max-concurrent`).
    pub max_concurrent: Option<u16>,
    /// `scontrol`, when not found in the usual places.
    pub scontrol: Option<PathBuf>,
    pub site_key_file: PathBuf,
    pub healthcheck: Resolved,
    pub prolog: Resolved,
    pub prolog_cluster: bool,
    pub prolog_ports: PortRange,
    pub prolog_probe_ports: Option<PortRange>,
    pub prolog_on_squat: OnSquat,
    pub epilog: Resolved,
    /// The epilog's: where the job's saved diagnosis is read; `None`: off.
    pub epilog_diagnosis: Option<String>,
}

/// One mode with its defaults applied.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub only: Vec<String>,
    pub skip: Vec<String>,
    pub with: Vec<String>,
    pub timeout: Duration,
    pub incomplete: Incomplete,
    pub strict: bool,
}

/// The checks the epilog runs by default: what a job leaves behind.
pub const EPILOG_TAG: &str = "epilog";
/// Left out of every mode by default: checks that take seconds.
pub const SLOW_TAG: &str = "slow";
/// The opt-in check the health check runs besides the rest by default.
pub const DCGM_QUICK: &str = "nvidia.dcgm_quick";

impl Settings {
    /// The configuration directory this process uses.
    pub fn dir_from_env(flag: Option<&Path>) -> PathBuf {
        flag.map(Path::to_path_buf)
            .or_else(|| {
                std::env::var_os(CONFIG_DIR_VAR)
                    .filter(|v| !v.is_empty())
                    .map(PathBuf::from)
            })
            .unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG_DIR))
    }

    /// Reads `dir/settings.yaml` (absent: the defaults). A file that is
    /// there but wrong is an error naming where.
    pub fn load(dir: &Path) -> Result<Settings, Failure> {
        match Settings::load_all(dir) {
            (settings, errors) if errors.is_empty() => Ok(settings),
            (_, errors) => Err(Failure::Checklist(ChecklistErrors(errors))),
        }
    }

    /// The settings with the defaults standing in for every entry that is
    /// wrong, and every error: what `validate --site` reports in one run.
    pub fn load_all(dir: &Path) -> (Settings, Vec<ChecklistError>) {
        let file = dir.join(SETTINGS_FILE);
        let name = file.display().to_string();
        let (raw, source, errors) = match std::fs::read_to_string(&file) {
            Ok(text) => {
                let (raw, errors) = parse(&name, &text);
                (raw, name, errors)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                (Raw::default(), "defaults".to_string(), Vec::new())
            }
            Err(e) => (
                Raw::default(),
                name.clone(),
                vec![ChecklistError::unreadable(&name, e)],
            ),
        };
        (Settings::resolve(dir, raw, source), errors)
    }

    fn resolve(dir: &Path, raw: Raw, source: String) -> Settings {
        let incomplete = raw.incomplete.unwrap_or(Incomplete::Ignore);
        let mode = |m: Option<Mode>, only: &[&str], with: &[&str], timeout: u64, strict: bool| {
            let m = m.unwrap_or(Mode {
                only: only.iter().map(|s| s.to_string()).collect(),
                skip: vec![SLOW_TAG.into()],
                with: with.iter().map(|s| s.to_string()).collect(),
                ..Mode::default()
            });
            Resolved {
                only: m.only,
                skip: m.skip,
                with: m.with,
                timeout: m.timeout.map_or(Duration::from_secs(timeout), |s| s.0),
                incomplete: m.incomplete.unwrap_or(incomplete),
                strict: m.strict.unwrap_or(strict),
            }
        };
        let prolog = raw.prolog.clone();
        Settings {
            dir: dir.to_path_buf(),
            source,
            drain_prefix: raw.drain_prefix.unwrap_or_else(|| "preflight:".into()),
            report_dir: raw
                .report_dir
                .unwrap_or_else(|| PathBuf::from("/var/lib/preflight")),
            state_dir: raw
                .state_dir
                .unwrap_or_else(|| PathBuf::from("/var/lib/preflight")),
            max_concurrent: raw.max_concurrent,
            scontrol: raw.scontrol,
            site_key_file: raw
                .secret
                .and_then(|s| s.site_key_file)
                .unwrap_or_else(|| dir.join("site.key")),
            // slurmd kills a HealthCheckProgram after 60 s.
            // DCGM's quick diagnostic (seconds) suits the periodic check;
            // its longer levels are for the epilog or an operator's hand.
            healthcheck: mode(raw.healthcheck, &[], &[DCGM_QUICK], 45, false),
            prolog: mode(prolog.clone(), &[], &[], 60, false),
            prolog_cluster: prolog.as_ref().and_then(|p| p.cluster).unwrap_or(false),
            prolog_probe_ports: prolog.as_ref().and_then(|p| p.probe_ports),
            prolog_on_squat: prolog.as_ref().and_then(|p| p.on_squat).unwrap_or_default(),
            prolog_ports: prolog.and_then(|p| p.ports).unwrap_or(PortRange {
                first: 29400,
                last: 29499,
            }),
            epilog_diagnosis: match raw.epilog.as_ref().and_then(|e| e.diagnosis.clone()) {
                Some(off) if off == "off" => None,
                Some(p) => Some(p),
                None => Some(DIAGNOSIS_FILE.to_string()),
            },
            epilog: mode(raw.epilog, &[EPILOG_TAG], &[], 45, true),
        }
    }

    /// The site's checks directory.
    pub fn checks_dir(&self) -> PathBuf {
        self.dir.join(CHECKS_DIR)
    }

    /// The site's node profile, where it has one: `profile.yaml`, held to
    /// outright, else `profiles.d/`, the one the node's facts match.
    pub fn profile_file(&self) -> Option<PathBuf> {
        Some(self.dir.join(PROFILE_FILE))
            .filter(|p| p.is_file())
            .or_else(|| Some(self.dir.join(PROFILES_DIR)).filter(|p| p.is_dir()))
    }
}

/// The settings file's reader on untrusted text (`fuzz/`): read, or why
/// not.
#[cfg(feature = "fuzzing")]
pub fn parse_settings(file: &str, text: &str) -> Result<(), String> {
    let (_, errors) = parse(file, text);
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ChecklistErrors(errors).to_string())
    }
}

/// The settings, and every error in them: what could be read is kept
/// (the defaults stand for a bad entry), so `validate --site` can go on to
/// the modes' selections and show every mistake in one run.
fn parse(file: &str, text: &str) -> (Raw, Vec<ChecklistError>) {
    let located = |e| ChecklistError::from_yaml(file, e);
    let node = match yaml::parse_document(text) {
        Ok(node) => node,
        Err(e) => return (Raw::default(), vec![located(e)]),
    };
    if yaml::type_name(&node) == "null" {
        return (Raw::default(), Vec::new());
    }
    let (raw, errors) = yaml::from_node_all::<Raw>(&node);
    let mut errors: Vec<ChecklistError> = errors
        .into_iter()
        .map(|e| {
            let message = suggest_key(&e.message);
            located(e.with_message(message))
        })
        .collect();
    let mut raw = raw.unwrap_or_default();
    for (name, mode) in [
        ("healthcheck", &mut raw.healthcheck),
        ("prolog", &mut raw.prolog),
        ("epilog", &mut raw.epilog),
    ] {
        let Some(entries) = entry(&node, name).and_then(yaml::mapping_entries) else {
            continue;
        };
        for (key, _) in entries {
            let Some(key_text) = yaml::scalar_text(key) else {
                continue;
            };
            let why = if name != "prolog" && PROLOG_ONLY.contains(&key_text.as_str()) {
                "only the prolog takes `{key}` (it alone runs across the job's allocation); move it under `prolog:`"
            } else if name != "epilog" && EPILOG_ONLY.contains(&key_text.as_str()) {
                "only the epilog takes `{key}` (a job's saved diagnosis is read at its end); move it under `epilog:`"
            } else {
                continue;
            };
            errors.push(located(yaml::YamlError::at(
                format!("{name}.{key_text}: {}", why.replace("{key}", &key_text)),
                key,
            )));
        }
        *mode = mode.take().map(|m| m.only_its_own(name));
    }
    if let Some(p) = &raw.drain_prefix
        && (p.trim().is_empty() || p.len() > 32 || p.contains(['\n', '"', '\'']))
    {
        let at = entry(&node, "drain_prefix");
        errors.push(located(match at {
            Some(v) => yaml::YamlError::at(
                "drain_prefix must be 1 to 32 characters, no quotes or newlines: it starts every reason preflight sets, and only reasons that start with it are resumed",
                v,
            ),
            None => yaml::YamlError::new("drain_prefix is invalid", None),
        }));
        raw.drain_prefix = None;
    }
    errors.sort_by_key(|e| e.location.map(|l| (l.line, l.column)));
    (raw, errors)
}

/// The value of the top-level key `key`.
fn entry<'a>(node: &'a yaml::Node, key: &str) -> Option<&'a yaml::Node> {
    yaml::mapping_entries(node)?
        .into_iter()
        .find(|(k, _)| yaml::scalar_text(k).as_deref() == Some(key))
        .map(|(_, v)| v)
}

/// serde's "unknown field `timout`, expected one of `only`, ..." with the
/// likely key named first.
fn suggest_key(message: &str) -> String {
    let Some(rest) = message.strip_prefix("unknown field `") else {
        return message.to_string();
    };
    let Some((key, expected)) = rest.split_once('`') else {
        return message.to_string();
    };
    let valid: Vec<&str> = expected.split('`').skip(1).step_by(2).collect();
    match preflight_ground::suggest::did_you_mean(key, valid.iter().copied()) {
        Some(s) => format!(
            "unknown key `{key}` (did you mean `{s}`?); valid keys: {}",
            valid.join(", ")
        ),
        None if valid.is_empty() => message.to_string(),
        None => format!("unknown key `{key}`; valid keys: {}", valid.join(", ")),
    }
}

/// Fewer ports than this in a range a local user can bind whole in a
/// moment.
const FEW_PORTS: u32 = 16;

/// What a local user can do with the prolog's ranges.
fn range_warnings(settings: &Settings, ephemeral: Option<PortRange>) -> Vec<String> {
    let mut out = Vec::new();
    let ranges = [
        ("prolog.ports", Some(settings.prolog_ports)),
        ("prolog.probe_ports", settings.prolog_probe_ports),
    ];
    for (name, range) in ranges {
        let Some(r) = range else { continue };
        let count = u32::from(r.last - r.first) + 1;
        if count < FEW_PORTS {
            out.push(format!(
                "{name} {r} holds {count} ports: any local user can bind them all before a job; {}",
                if name == "prolog.ports" {
                    match settings.prolog_on_squat {
                        OnSquat::Run => "the job then runs unchecked (on_squat: run)",
                        OnSquat::Hold => "the job is then held (on_squat: hold): anyone can hold any job whose rank 0 lands on their node",
                    }
                } else {
                    "the probe listener then takes an ephemeral port, which a firewall may drop"
                }
            ));
        }
        if let Some(e) = ephemeral
            && r.first <= e.last
            && e.first <= r.last
        {
            out.push(format!(
                "{name} {r} is inside the kernel's ephemeral range {e} (net.ipv4.ip_local_port_range): any program's outgoing connection may take one of its ports"
            ));
        }
    }
    out
}

/// The site configuration as found valid: where its settings came from,
/// its checklist files and profile, and what it allows that it should
/// not (`warnings`: said, not refused; a site may have its reasons).
#[derive(Debug)]
pub struct Valid {
    pub source: String,
    pub files: usize,
    pub checks_dir: PathBuf,
    pub profile: Option<PathBuf>,
    pub warnings: Vec<String>,
}

/// The site configuration in `dir` as the `slurm` modes will read it.
/// Every error at once: the settings' (each bad entry replaced by its
/// default so the rest is still checked), the site checklists', and each
/// mode's selection against the checks there are.
pub fn validate(dir: &Path) -> Result<Valid, Failure> {
    let (settings, mut errors) = Settings::load_all(dir);
    let checks_dir = settings.checks_dir();
    let files = if checks_dir.is_dir() {
        expand_paths(std::slice::from_ref(&checks_dir))?
    } else {
        Vec::new()
    };
    let shipped = ChecklistSettings::shipped_with(files.clone());
    match all_checks(&shipped) {
        Ok(_) => {
            for (name, mode) in [
                ("healthcheck", &settings.healthcheck),
                ("prolog", &settings.prolog),
                ("epilog", &settings.epilog),
            ] {
                let selection = ChecklistSettings {
                    only: mode.only.clone(),
                    skip: mode.skip.clone(),
                    with: mode.with.clone(),
                    ..shipped.clone()
                };
                let problem = match select(all_checks(&shipped)?, &selection) {
                    Ok(c) if c.is_empty() => {
                        Some("`only` and `skip` leave no check to run".to_string())
                    }
                    Ok(_) => None,
                    Err(e) => Some(e.to_string().trim_start_matches("error: ").to_string()),
                };
                if let Some(message) = problem {
                    errors.push(ChecklistError {
                        file: settings.source.clone(),
                        location: None,
                        path: name.to_string(),
                        message,
                    });
                }
            }
        }
        Err(Failure::Checklist(ChecklistErrors(mut e))) => errors.append(&mut e),
        Err(other) => return Err(other),
    }
    // The site's profile, where it has one: its errors are located.
    let profile = settings.profile_file();
    if let Some(path) = &profile
        && let Err(e) = preflight_facts::profile::load_given(path)
    {
        errors.extend(e.into_iter().map(|e| ChecklistError {
            file: e.file,
            location: e.location,
            path: e.path,
            message: e.message,
        }));
    }
    if !errors.is_empty() {
        return Err(Failure::Checklist(ChecklistErrors(errors)));
    }
    // What a local user can do with the prolog's port ranges.
    let ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|t| {
            let mut it = t.split_whitespace().map(|n| n.parse::<u16>().ok());
            Some(PortRange {
                first: it.next()??,
                last: it.next()??,
            })
        });
    Ok(Valid {
        warnings: range_warnings(&settings, ephemeral),
        source: settings.source.clone(),
        files: files.len(),
        checks_dir,
        profile,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> Result<Settings, String> {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join(SETTINGS_FILE), text).unwrap();
        Settings::load(d.path()).map_err(|e| e.to_string())
    }

    #[test]
    fn no_file_is_the_defaults() {
        let d = tempfile::tempdir().unwrap();
        let s = Settings::load(d.path()).unwrap();
        assert_eq!(s.source, "defaults");
        assert_eq!(s.drain_prefix, "preflight:");
        assert_eq!(s.healthcheck.timeout, Duration::from_secs(45));
        assert_eq!(s.healthcheck.skip, vec!["slow"]);
        assert_eq!(s.healthcheck.incomplete, Incomplete::Ignore);
        assert_eq!(s.epilog.only, vec!["epilog"]);
        // DCGM's quick level runs in the health check only.
        assert_eq!(s.healthcheck.with, vec![DCGM_QUICK]);
        assert!(s.prolog.with.is_empty() && s.epilog.with.is_empty());
        assert!(s.epilog.strict && !s.healthcheck.strict && !s.prolog.strict);
        assert!(!s.prolog_cluster);
        assert_eq!(s.epilog_diagnosis.as_deref(), Some(DIAGNOSIS_FILE));
        let off = load("epilog: {only: [epilog], diagnosis: \"off\"}\n").unwrap();
        assert_eq!(off.epilog_diagnosis, None);
        assert_eq!(s.prolog_ports.to_string(), "29400-29499");
        assert_eq!(s.site_key_file, d.path().join("site.key"));
    }

    /// The settings file the packages install states every default: as
    /// shipped it changes nothing.
    #[test]
    fn the_shipped_settings_file_is_the_defaults() {
        let shipped = include_str!("../../../contrib/slurm/settings.yaml");
        let d = tempfile::tempdir().unwrap();
        let mut defaults = Settings::load(d.path()).unwrap();
        let mut from_file = load(shipped).unwrap();
        defaults.source.clear();
        from_file.source.clear();
        from_file.dir = defaults.dir.clone();
        from_file.site_key_file = defaults.site_key_file.clone();
        assert_eq!(format!("{defaults:?}"), format!("{from_file:?}"));
        assert!(shipped.contains("site_key_file: /etc/preflight/site.key"));
    }

    #[test]
    fn every_setting_is_read() {
        let s = load(
            "drain_prefix: 'pf:'\nreport_dir: /r\nincomplete: drain\nsecret: {site_key_file: /k}\n\
             healthcheck: {only: [quick], timeout: 20s, incomplete: ignore}\n\
             prolog: {cluster: true, ports: 30000-30009, timeout: 90s}\n\
             epilog: {skip: [], with: [nvidia.dcgm_medium]}\n",
        )
        .unwrap();
        assert_eq!(s.drain_prefix, "pf:");
        assert_eq!(s.report_dir, PathBuf::from("/r"));
        assert_eq!(s.site_key_file, PathBuf::from("/k"));
        assert_eq!(s.healthcheck.only, vec!["quick"]);
        assert_eq!(s.healthcheck.timeout, Duration::from_secs(20));
        assert_eq!(s.healthcheck.incomplete, Incomplete::Ignore);
        assert_eq!(s.prolog.incomplete, Incomplete::Drain);
        assert!(s.prolog_cluster);
        assert_eq!(s.prolog_ports.to_string(), "30000-30009");
        assert_eq!(s.prolog.timeout, Duration::from_secs(90));
        assert!(s.epilog.only.is_empty() && s.epilog.skip.is_empty());
        assert_eq!(s.epilog.with, vec!["nvidia.dcgm_medium"]);
        // A mode the site writes replaces the defaults, `with` too.
        assert!(s.healthcheck.with.is_empty());
    }

    #[test]
    fn errors_name_file_line_and_column() {
        let e = load("healthcheck:\n  timeout: 45\n").unwrap_err();
        assert!(e.contains("settings.yaml:2:"), "{e}");
        assert!(
            e.contains("healthcheck.timeout") && e.contains("needs a unit"),
            "{e}"
        );
        let e = load("prolog:\n  ports: 29500-29400\n").unwrap_err();
        assert!(e.contains(":2:") && e.contains("backwards"), "{e}");
        let e = load("healthchek: {}\n").unwrap_err();
        assert!(e.contains(":1:1") && e.contains("healthchek"), "{e}");
        let e = load("incomplete: maybe\n").unwrap_err();
        assert!(e.contains("maybe"), "{e}");
        let e = load("drain_prefix: \"\"\n").unwrap_err();
        assert!(e.contains(":1:15") && e.contains("drain_prefix"), "{e}");
        let e = load("epilog:\n  skip: []\n  cluster: true\n").unwrap_err();
        assert!(
            e.contains(":3:3") && e.contains("epilog.cluster: only the prolog takes `cluster`"),
            "{e}"
        );
        let e = load("healthcheck: {probe_ports: 1-2}\n").unwrap_err();
        assert!(
            e.contains(":1:15") && e.contains("healthcheck.probe_ports"),
            "{e}"
        );
        let e = load("prolog:\n  diagnosis: off\n").unwrap_err();
        assert!(
            e.contains(":2:3") && e.contains("prolog.diagnosis: only the epilog takes"),
            "{e}"
        );
        let e = load("a: [\n").unwrap_err();
        assert!(e.contains("invalid YAML"), "{e}");
    }
}
