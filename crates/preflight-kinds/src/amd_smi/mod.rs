//! `amd_smi`: AMD Instinct GPUs as AMD's `amd-smi` reports them (and
//! `rocm-smi` where amd-smi is missing, for XGMI), one subject per check:
//! ECC counts per RAS block, XGMI links between GPUs, throttling
//! (violation status), the PCIe link against its maximum, and the pages
//! waiting for a reset to be retired. A recording per output stands in
//! for the tool in tests and replays.

use std::path::PathBuf;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

mod judge;

use judge::{
    Names, judge_ecc, judge_pcie, judge_reset, judge_rocm_smi, judge_throttle, judge_xgmi,
    ras_states, with_ras_states, xgmi_errors,
};

use super::tool_output::{Output, Tool};
use super::{KindInfo, ParamDoc, Params, Probe, ProbeFuture, parse_params};
pub mod parse;
use parse::Gpu;
use preflight_facts::{Facts, Vendor};
use preflight_result::Finding;

pub const KIND: KindInfo = KindInfo {
    name: "amd_smi",
    scope: crate::Scope::Node,
    area: "accelerators",
    summary: "AMD Instinct GPUs through `amd-smi` (`rocm-smi` for XGMI where amd-smi is missing), one `subject` per check: `ecc` (uncorrectable and deferred errors per RAS block), `xgmi` (every GPU's XGMI links up, as many as its peers', no XGMI error), `throttle` (power, thermal and PROCHOT violations active now), `pcie` (link width and speed at their maximum) and `reset` (bad pages pending retirement, the bad-page threshold exceeded).",
    params: &[
        ParamDoc {
            name: "subject",
            ty: "ecc|xgmi|throttle|pcie|reset",
            default: None,
            doc: "What the check reads: `amd-smi metric` for ecc, throttle and pcie (with `static --bus`), `amd-smi xgmi` for xgmi, `amd-smi bad-pages` (with `static --ras`) for reset.",
        },
        ParamDoc {
            name: "max_uncorrectable",
            ty: "integer",
            default: Some("0"),
            doc: "ecc: the most uncorrectable plus deferred errors a GPU may have counted.",
        },
        ParamDoc {
            name: "max_correctable",
            ty: "integer",
            default: Some("unset"),
            doc: "ecc: the most correctable errors a GPU may have counted.",
        },
        ParamDoc {
            name: "links",
            ty: "integer",
            default: Some("(the node's profile, else what most GPUs on the node have)"),
            doc: "xgmi: XGMI links every GPU must have up (7 on an 8-GPU MI300X board).",
        },
        ParamDoc {
            name: "amd_smi_metric",
            ty: "path",
            default: Some("unset"),
            doc: "A recorded `amd-smi metric --json` (ecc, throttle, pcie; xgmi reads its `xgmi_err`).",
        },
        ParamDoc {
            name: "amd_smi_static",
            ty: "path",
            default: Some("unset"),
            doc: "A recorded `amd-smi static --json` (pcie reads `bus`, reset reads `ras`).",
        },
        ParamDoc {
            name: "amd_smi_xgmi",
            ty: "path",
            default: Some("unset"),
            doc: "A recorded `amd-smi xgmi --json` (ROCm 7) or `amd-smi xgmi -l --json` (6.4).",
        },
        ParamDoc {
            name: "amd_smi_bad_pages",
            ty: "path",
            default: Some("unset"),
            doc: "A recorded `amd-smi bad-pages --json`.",
        },
        ParamDoc {
            name: "rocm_smi_json",
            ty: "path",
            default: Some("unset"),
            doc: "xgmi on older ROCm: a recorded `rocm-smi --showxgmierr --showtopotype --json`.",
        },
        ParamDoc {
            name: "amd_smi",
            ty: "path",
            default: Some("amd-smi"),
            doc: "The amd-smi program (on PATH unless a path).",
        },
    ],
    hint_vars: &["gpus"],
    parse: parse_params::<AmdSmi>,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
enum Subject {
    Ecc,
    Xgmi,
    Throttle,
    Pcie,
    Reset,
}

fn default_program() -> PathBuf {
    PathBuf::from("amd-smi")
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AmdSmi {
    subject: Subject,
    #[serde(default)]
    max_uncorrectable: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_correctable: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    links: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    amd_smi_metric: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    amd_smi_static: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    amd_smi_xgmi: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    amd_smi_bad_pages: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    rocm_smi_json: Option<PathBuf>,
    #[serde(default = "default_program")]
    amd_smi: PathBuf,
}

impl Params for AmdSmi {
    fn validate(&self) -> Result<(), String> {
        use Subject::*;
        let only = super::only_for;
        let s = self.subject;
        only(
            self.max_correctable.is_some() && s != Ecc,
            "max_correctable",
            "ecc",
        )?;
        only(self.links.is_some() && s != Xgmi, "links", "xgmi")?;
        only(
            self.amd_smi_static.is_some() && !matches!(s, Ecc | Pcie | Reset),
            "amd_smi_static",
            "ecc, pcie or reset",
        )?;
        only(
            self.amd_smi_xgmi.is_some() && s != Xgmi,
            "amd_smi_xgmi",
            "xgmi",
        )?;
        only(
            self.rocm_smi_json.is_some() && s != Xgmi,
            "rocm_smi_json",
            "xgmi",
        )?;
        only(
            self.amd_smi_bad_pages.is_some() && s != Reset,
            "amd_smi_bad_pages",
            "reset",
        )?;
        only(
            self.amd_smi_metric.is_some() && s == Reset,
            "amd_smi_metric",
            "ecc, xgmi, throttle or pcie",
        )?;
        if self.amd_smi.as_os_str().is_empty() {
            return Err("`amd_smi` is empty".into());
        }
        Ok(())
    }
}

impl AmdSmi {
    fn tool(&self, args: &[&str], param: &'static str) -> Tool<'static> {
        let mut argv = vec![self.amd_smi.display().to_string()];
        argv.extend(args.iter().map(|a| a.to_string()));
        Tool {
            argv,
            param,
            package: "ROCm: amd-smi-lib",
        }
    }

    async fn gpus(
        &self,
        facts: &Facts,
        args: &[&str],
        param: &'static str,
        recorded: Option<&std::path::Path>,
    ) -> Result<Vec<Gpu>, Finding> {
        let (text, source) = self
            .tool(args, param)
            .output(recorded, facts)
            .await
            .text()?;
        parse::parse_gpus(&source, &text).map_err(Finding::error)
    }

    fn recorded(&self) -> bool {
        self.amd_smi_metric.is_some()
            || self.amd_smi_static.is_some()
            || self.amd_smi_xgmi.is_some()
            || self.amd_smi_bad_pages.is_some()
            || self.rocm_smi_json.is_some()
    }

    /// rocm-smi's XGMI view: the recording, or rocm-smi on the live node.
    async fn rocm_smi(
        &self,
        facts: &Facts,
        names: &Names,
        recorded: Option<&std::path::Path>,
    ) -> Result<Finding, Finding> {
        let tool = Tool {
            argv: ["rocm-smi", "--showxgmierr", "--showtopotype", "--json"]
                .map(String::from)
                .to_vec(),
            param: "rocm_smi_json",
            package: "ROCm: rocm-smi-lib",
        };
        let (t, source) = tool.output(recorded, facts).await.text()?;
        let r = parse::parse_rocm_smi(&source, &t).map_err(Finding::error)?;
        Ok(judge_rocm_smi(&r, names, &source))
    }

    async fn xgmi(&self, facts: &Facts, names: &Names) -> Result<Finding, Finding> {
        if let Some(path) = &self.rocm_smi_json {
            return self.rocm_smi(facts, names, Some(path)).await;
        }
        let live = !self.recorded();
        // ROCm 7 prints the link state with `xgmi`; 6.4 only with `-l`;
        // before 6.4 amd-smi has none, and rocm-smi says what there is.
        let mut read = None;
        for (n, args) in [&["xgmi", "--json"][..], &["xgmi", "-l", "--json"][..]]
            .into_iter()
            .enumerate()
        {
            let tool = self.tool(args, "amd_smi_xgmi");
            let (t, source) = match tool.output(self.amd_smi_xgmi.as_deref(), facts).await {
                Output::Skip(_) if live => return self.rocm_smi(facts, names, None).await,
                // An amd-smi before 6.4 refuses `-l`: rocm-smi says it.
                Output::Error(_) if live && n == 1 => break,
                other => other.text()?,
            };
            match parse::parse_xgmi(&source, &t) {
                Ok(Some(x)) => {
                    read = Some((x, source));
                    break;
                }
                Ok(None) => {}
                Err(_) if live && n == 1 => break,
                Err(e) => return Err(Finding::error(e)),
            }
            if !live {
                return Err(Finding::skip(format!(
                    "{source} holds no XGMI link state (amd-smi before ROCm 6.4 prints only link metrics): record `amd-smi xgmi -l --json`, or rocm-smi's view in rocm_smi_json"
                )));
            }
        }
        let Some((xgmi, source)) = read else {
            return self.rocm_smi(facts, names, None).await;
        };
        let errors = if self.amd_smi_metric.is_some() || live {
            let metric = self
                .gpus(
                    facts,
                    &["metric", "--xgmi-err", "--json"],
                    "amd_smi_metric",
                    self.amd_smi_metric.as_deref(),
                )
                .await?;
            xgmi_errors(&metric, names)
        } else {
            Vec::new()
        };
        let profile = facts
            .profile()
            .and_then(|p| Some((p.named(), p.expect.xgmi?.links)));
        Ok(judge_xgmi(
            self,
            &xgmi,
            &errors,
            names,
            &source,
            profile.as_ref().map(|(n, l)| (n.as_str(), *l)),
        ))
    }

    async fn judge(&self, facts: &Facts, names: &Names) -> Result<Finding, Finding> {
        let metric = |args: &'static [&'static str]| {
            self.gpus(
                facts,
                args,
                "amd_smi_metric",
                self.amd_smi_metric.as_deref(),
            )
        };
        let statics = |args: &'static [&'static str]| {
            self.gpus(
                facts,
                args,
                "amd_smi_static",
                self.amd_smi_static.as_deref(),
            )
        };
        Ok(match self.subject {
            Subject::Ecc => {
                let m = metric(&["metric", "--ecc", "--ecc-blocks", "--json"]).await?;
                let mut f = judge_ecc(self, &m, names);
                if self.amd_smi_static.is_some() || !self.recorded() {
                    // RAS states that cannot be read (not root, a VM)
                    // leave the counts' finding as it is, saying so.
                    match statics(&["static", "--ras", "--json"]).await {
                        Ok(s) => f = with_ras_states(f, ras_states(&s, names)),
                        Err(e) if f.status == preflight_result::Status::Pass => {
                            f = Finding::warn(format!(
                                "{}; RAS states per block not read: {}",
                                f.message, e.message
                            ))
                            .measured(f.measured.clone().unwrap_or_default());
                        }
                        Err(_) => {}
                    }
                }
                f
            }
            Subject::Throttle => {
                judge_throttle(&metric(&["metric", "--throttle", "--json"]).await?, names)
            }
            Subject::Pcie => {
                let m = metric(&["metric", "--pcie", "--json"]).await?;
                let s = if self.amd_smi_static.is_some() || !self.recorded() {
                    statics(&["static", "--bus", "--json"]).await?
                } else {
                    Vec::new()
                };
                judge_pcie(&m, &s, names)
            }
            Subject::Reset => {
                let pages = if self.amd_smi_bad_pages.is_some() || !self.recorded() {
                    self.gpus(
                        facts,
                        &["bad-pages", "--json"],
                        "amd_smi_bad_pages",
                        self.amd_smi_bad_pages.as_deref(),
                    )
                    .await?
                } else {
                    Vec::new()
                };
                let s = if self.amd_smi_static.is_some() || !self.recorded() {
                    statics(&["static", "--ras", "--json"]).await?
                } else {
                    Vec::new()
                };
                judge_reset(&pages, &s, names)
            }
            Subject::Xgmi => return self.xgmi(facts, names).await,
        })
    }
}

impl Probe for AmdSmi {
    fn evaluate(self: Arc<Self>, facts: Arc<Facts>) -> ProbeFuture {
        Box::pin(async move {
            let present = super::vendor_present(&facts, Vendor::Amd).await;
            if !self.recorded() && !present {
                return Finding::skip("no AMD GPU present");
            }
            let names = Names::of(&facts);
            match self.judge(&facts, &names).await {
                Ok(f) | Err(f) => f,
            }
        })
    }
}

/// The fuzz target's way in (`fuzz/`): one recording read as `subject`
/// reads it, judged with no node behind it. A GPU that counted an
/// uncorrectable error, or a link down, never makes a pass.
#[cfg(feature = "fuzzing")]
pub fn judge_for_fuzzing(which: u8, text: &str) {
    use preflight_result::Status;
    let names = Names(Vec::new());
    let check = |subject| AmdSmi {
        subject,
        max_uncorrectable: 0,
        max_correctable: None,
        links: None,
        amd_smi_metric: None,
        amd_smi_static: None,
        amd_smi_xgmi: None,
        amd_smi_bad_pages: None,
        rocm_smi_json: None,
        amd_smi: default_program(),
    };
    match which % 3 {
        0 => {
            let Ok(gpus) = parse::parse_gpus("f", text) else {
                return;
            };
            let ecc = judge_ecc(&check(Subject::Ecc), &gpus, &names);
            // Counted, or not said (N/A, no section): never a pass.
            let counted_or_unsaid = gpus.iter().any(|g| {
                g.section("ecc")
                    .and_then(|e| judge::count(e, "total_uncorrectable_count"))
                    .is_none_or(|n| n > 0)
            });
            if counted_or_unsaid {
                assert_ne!(ecc.status, Status::Pass, "{gpus:?}");
            }
            let _ = judge_throttle(&gpus, &names);
            let _ = judge_pcie(&gpus, &gpus, &names);
            let _ = judge_reset(&gpus, &gpus, &names);
        }
        1 => {
            let Ok(Some(xgmi)) = parse::parse_xgmi("f", text) else {
                return;
            };
            let f = judge_xgmi(&check(Subject::Xgmi), &xgmi, &[], &names, "f", None);
            if xgmi.iter().any(|g| {
                g.links.iter().any(|(_, s)| *s == parse::LinkState::Down)
                    || g.links.iter().all(|(_, s)| *s == parse::LinkState::Unknown)
            }) {
                assert_ne!(f.status, Status::Pass, "{xgmi:?}");
            }
        }
        _ => {
            if let Ok(r) = parse::parse_rocm_smi("f", text) {
                let _ = judge_rocm_smi(&r, &names, "f");
            }
        }
    }
}
