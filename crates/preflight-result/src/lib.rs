//! The result model: what a probe finds, what a check reports, and the
//! verdict with its exit code.

pub mod built_in;
pub mod cause;
pub mod cluster;
pub mod collective;
pub mod diagnosis;
pub mod gpu_copies;
pub mod merged;
pub mod report;

use std::time::Duration;

use serde::{Deserialize, Serialize};

use preflight_ground::exit::ExitCode;

/// How a failed check counts: `fail` makes the node not ready, `warn` only
/// reports (unless `--strict`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    #[default]
    Fail,
    Warn,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Pass,
    Warn,
    Fail,
    Skip,
    Error,
}

impl Status {
    pub fn name(self) -> &'static str {
        match self {
            Status::Pass => "pass",
            Status::Warn => "warn",
            Status::Fail => "fail",
            Status::Skip => "skip",
            Status::Error => "error",
        }
    }
}

/// What a probe reports before severity is applied.
#[derive(Debug, Clone)]
pub struct Finding {
    pub status: Status,
    pub measured: Option<String>,
    pub expected: Option<String>,
    pub message: String,
    /// Kind-specific values that hints may interpolate.
    /// (A boxed slice, as `blames`: a finding stays small enough to
    /// travel in a `Result`.)
    pub vars: Box<[(&'static str, String)]>,
    /// For checks across nodes: the nodes this finding holds responsible
    /// (empty where no node can be singled out).
    pub blames: Box<[String]>,
    /// What few findings carry (boxed: findings travel in `Result`s, and
    /// most have none of it).
    pub extra: Option<Box<Extra>>,
}

#[derive(Debug, Clone, Default)]
pub struct Extra {
    /// For a bandwidth threshold: what it compared, for reports to draw.
    pub threshold: Option<collective::Threshold>,
    /// For `gpu_bandwidth`: each GPU's copy rates.
    pub copies: Option<gpu_copies::GpuCopies>,
    /// A check that found several problems reports each as its own
    /// result, with its own status: (subject, finding), the subject
    /// naming it after the check's id (`env.lint:NCCL_DEBUG`).
    pub parts: Vec<(String, Finding)>,
    /// What it is about, for the cause rules.
    pub about: About,
}

/// What a finding is about, in the fields the cause rules (`cause`) read:
/// a message may be reworded freely, the grouping of one cause's findings
/// does not change.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct About {
    /// The job's variables it is about, by name (`GLOO_SOCKET_IFNAME`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub variables: Vec<String>,
    /// The processes it found holding a port, by pid.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub holders: Vec<u32>,
    /// The checks of nodes it restates, by id (`cluster.node_checks`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub restates: Vec<String>,
    /// Host names it found resolving to loopback addresses only.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub loopback_hostnames: Vec<String>,
}

/// Names one finding says it is about, at most: a check across 16,384
/// nodes would otherwise name each (and every rank's verdict carries the
/// cluster checks), and the cause rules need the first few.
pub const ABOUT_MOST: usize = 32;

impl About {
    pub fn is_empty(&self) -> bool {
        *self == About::default()
    }

    /// What one node's rank needs of it (every rank's verdict carries the
    /// cluster checks): the host names cut to the node's own and one
    /// other (enough to tell "only mine" from "not only mine"), the rest
    /// to a few names, and a restatement that does not fit said as none.
    pub fn for_node(&self, hostname: Option<&str>) -> About {
        const FEW: usize = 8;
        let mut names: Vec<String> = Vec::new();
        if let Some(own) = hostname.filter(|h| self.loopback_hostnames.iter().any(|n| n == h)) {
            names.push(own.to_string());
        }
        if let Some(other) = self
            .loopback_hostnames
            .iter()
            .find(|n| Some(n.as_str()) != hostname)
        {
            names.push(other.clone());
        }
        About {
            variables: self.variables.iter().take(FEW).cloned().collect(),
            holders: self.holders.iter().take(FEW).copied().collect(),
            restates: if self.restates.len() > FEW {
                Vec::new()
            } else {
                self.restates.clone()
            },
            loopback_hostnames: names,
        }
    }

    /// Everything `other` is about added to this, each name once.
    pub fn merge(&mut self, other: &About) {
        fn add<T: PartialEq + Clone>(to: &mut Vec<T>, from: &[T]) {
            for x in from {
                if to.len() < ABOUT_MOST && !to.contains(x) {
                    to.push(x.clone());
                }
            }
        }
        add(&mut self.variables, &other.variables);
        add(&mut self.holders, &other.holders);
        add(&mut self.restates, &other.restates);
        add(&mut self.loopback_hostnames, &other.loopback_hostnames);
    }
}

impl Finding {
    fn new(status: Status, message: impl Into<String>) -> Finding {
        Finding {
            status,
            measured: None,
            expected: None,
            message: message.into(),
            vars: Box::default(),
            blames: Box::default(),
            extra: None,
        }
    }

    pub fn pass(message: impl Into<String>) -> Finding {
        Finding::new(Status::Pass, message)
    }

    pub fn fail(message: impl Into<String>) -> Finding {
        Finding::new(Status::Fail, message)
    }

    /// Valid but risky: the job will start, and may be slow or fragile.
    pub fn warn(message: impl Into<String>) -> Finding {
        Finding::new(Status::Warn, message)
    }

    pub fn skip(reason: impl Into<String>) -> Finding {
        Finding::new(Status::Skip, reason)
    }

    /// The check could not be evaluated: never a silent pass.
    pub fn error(reason: impl Into<String>) -> Finding {
        Finding::new(Status::Error, reason)
    }

    pub fn measured(mut self, value: impl Into<String>) -> Finding {
        self.measured = Some(value.into());
        self
    }

    pub fn expected(mut self, value: impl Into<String>) -> Finding {
        self.expected = Some(value.into());
        self
    }

    pub fn var(mut self, name: &'static str, value: impl Into<String>) -> Finding {
        let mut all = std::mem::take(&mut self.vars).into_vec();
        all.push((name, value.into()));
        self.vars = all.into_boxed_slice();
        self
    }

    /// Names the nodes at fault, by their cluster names.
    pub fn blame(mut self, nodes: impl IntoIterator<Item = String>) -> Finding {
        let mut all = std::mem::take(&mut self.blames).into_vec();
        all.extend(nodes);
        self.blames = all.into_boxed_slice();
        self
    }

    pub fn threshold(mut self, threshold: collective::Threshold) -> Finding {
        self.extra.get_or_insert_default().threshold = Some(threshold);
        self
    }

    pub fn copies(mut self, copies: gpu_copies::GpuCopies) -> Finding {
        self.extra.get_or_insert_default().copies = Some(copies);
        self
    }

    fn about_mut(&mut self) -> &mut About {
        &mut self.extra.get_or_insert_default().about
    }

    /// Says the finding is about these variables of the job.
    pub fn about_variables<S: Into<String>>(
        mut self,
        names: impl IntoIterator<Item = S>,
    ) -> Finding {
        let about = self.about_mut();
        for name in names {
            let name = name.into();
            if about.variables.len() < ABOUT_MOST && !about.variables.contains(&name) {
                about.variables.push(name);
            }
        }
        self
    }

    /// Says the finding found these processes holding a port.
    pub fn held_by(mut self, pids: impl IntoIterator<Item = u32>) -> Finding {
        let about = self.about_mut();
        for pid in pids {
            if about.holders.len() < ABOUT_MOST && !about.holders.contains(&pid) {
                about.holders.push(pid);
            }
        }
        self
    }

    /// Says the finding restates these checks of nodes.
    pub fn restating(mut self, ids: impl IntoIterator<Item = String>) -> Finding {
        let about = self.about_mut();
        for id in ids {
            if !about.restates.contains(&id) {
                about.restates.push(id);
            }
        }
        // Past the bound nothing is said: a restatement is a consequence
        // only when every check it restates failed here, which a cut list
        // cannot tell.
        if about.restates.len() > ABOUT_MOST {
            about.restates.clear();
        }
        self
    }

    /// Says the finding found this host name resolving to loopback only.
    pub fn loopback_hostname(mut self, name: impl Into<String>) -> Finding {
        let name = name.into();
        let about = self.about_mut();
        if about.loopback_hostnames.len() < ABOUT_MOST && !about.loopback_hostnames.contains(&name)
        {
            about.loopback_hostnames.push(name);
        }
        self
    }

    /// What the finding is about (empty when nobody said).
    pub fn about(&self) -> About {
        self.extra
            .as_ref()
            .map(|e| e.about.clone())
            .unwrap_or_default()
    }

    /// One problem among several this check found, reported on its own
    /// as `<check id>:<subject>` with its own status.
    pub fn part(mut self, subject: impl Into<String>, finding: Finding) -> Finding {
        self.extra
            .get_or_insert_default()
            .parts
            .push((subject.into(), finding));
        self
    }

    /// A failure of a `severity: warn` check is reported as a warning.
    pub fn with_severity(mut self, severity: Severity) -> Finding {
        if self.status == Status::Fail && severity == Severity::Warn {
            self.status = Status::Warn;
        }
        self
    }
}

/// One check's line in the report. Deserializable because rank 0 sends
/// the cluster checks' results to every rank.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckResult {
    pub id: String,
    pub kind: String,
    pub area: String,
    pub severity: Severity,
    pub tags: Vec<String>,
    pub status: Status,
    pub measured: Option<String>,
    pub expected: Option<String>,
    pub message: String,
    pub hint: Option<String>,
    #[serde(
        serialize_with = "serialize_millis",
        deserialize_with = "deserialize_millis",
        rename = "duration_ms"
    )]
    pub duration: Duration,
    /// Where the check is defined, `file:line`.
    pub source: String,
    /// The failing check this one is a consequence of (see `cause`): it
    /// is reported as such, not as a second problem to fix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caused_by: Option<String>,
    /// What it is about, for the cause rules (and for a merged report's,
    /// which reads it back).
    #[serde(default, skip_serializing_if = "About::is_empty")]
    pub about: About,
    /// A bandwidth threshold's row and minimum (`collective_busbw`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threshold: Option<collective::Threshold>,
    /// Each GPU's copy rates (`gpu_bandwidth`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub copies: Option<gpu_copies::GpuCopies>,
    /// A kept pass reused instead of a run (`cache:`), with when it was
    /// measured and until when it is reused (RFC 3339).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cached: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reused_until: Option<String>,
    /// The node's finding, evaluated once by its leader (local rank 0) and
    /// shared with this rank (`checklist::shared`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shared: bool,
}

impl CheckResult {
    /// A result that no checklist entry produced (the rendezvous, the
    /// barrier, a collective backend): always `severity: fail`, tagged
    /// with its area.
    pub fn built_in(
        id: &str,
        kind: &str,
        area: &str,
        status: Status,
        message: String,
        hint: Option<String>,
    ) -> CheckResult {
        CheckResult {
            id: id.into(),
            kind: kind.into(),
            area: area.into(),
            severity: Severity::Fail,
            tags: vec![area.into()],
            status,
            measured: None,
            expected: None,
            message,
            hint,
            duration: Duration::ZERO,
            source: "built-in".into(),
            caused_by: None,
            about: About::default(),
            threshold: None,
            copies: None,
            cached: false,
            measured_at: None,
            reused_until: None,
            shared: false,
        }
    }

    /// The same result, said to be about `about`.
    pub fn about(mut self, about: About) -> CheckResult {
        self.about = about;
        self
    }
}

fn deserialize_millis<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let ms = <f64 as Deserialize>::deserialize(d)?;
    Ok(Duration::from_secs_f64((ms / 1e3).clamp(0.0, 1e9)))
}

fn serialize_millis<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64((d.as_secs_f64() * 1e6).round() / 1e3)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Ready,
    NotReady,
    Incomplete,
}

impl Verdict {
    /// `not_ready` when a check failed (or warned, under `--strict`);
    /// otherwise `incomplete` when a severity-fail check could not be
    /// evaluated (any check, under `--strict`); otherwise `ready`.
    pub fn of(results: &[CheckResult], strict: bool) -> Verdict {
        let not_ready = results
            .iter()
            .any(|r| r.status == Status::Fail || (strict && r.status == Status::Warn));
        if not_ready {
            return Verdict::NotReady;
        }
        let incomplete = results
            .iter()
            .any(|r| r.status == Status::Error && (strict || r.severity == Severity::Fail));
        if incomplete {
            Verdict::Incomplete
        } else {
            Verdict::Ready
        }
    }

    /// The worse of two verdicts: not_ready, then incomplete, then ready.
    pub fn worst(self, other: Verdict) -> Verdict {
        let rank = |v: Verdict| match v {
            Verdict::NotReady => 2,
            Verdict::Incomplete => 1,
            Verdict::Ready => 0,
        };
        if rank(other) > rank(self) {
            other
        } else {
            self
        }
    }

    /// The verdict a peer reported by name; anything unknown is not ready.
    pub fn from_name(name: &str) -> Verdict {
        match name {
            "ready" => Verdict::Ready,
            "incomplete" => Verdict::Incomplete,
            _ => Verdict::NotReady,
        }
    }

    pub fn exit_code(self) -> ExitCode {
        match self {
            Verdict::Ready => ExitCode::Ready,
            Verdict::NotReady => ExitCode::NotReady,
            Verdict::Incomplete => ExitCode::Incomplete,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Verdict::Ready => "ready",
            Verdict::NotReady => "not_ready",
            Verdict::Incomplete => "incomplete",
        }
    }
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct Summary {
    pub pass: usize,
    pub warn: usize,
    pub fail: usize,
    pub skip: usize,
    pub error: usize,
}

impl Summary {
    pub fn of(results: &[CheckResult]) -> Summary {
        let mut s = Summary::default();
        for r in results {
            *match r.status {
                Status::Pass => &mut s.pass,
                Status::Warn => &mut s.warn,
                Status::Fail => &mut s.fail,
                Status::Skip => &mut s.skip,
                Status::Error => &mut s.error,
            } += 1;
        }
        s
    }
}
