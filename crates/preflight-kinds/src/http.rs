//! `http`: GET a URL the job depends on (model registry, object store,
//! license or metrics endpoint) and check the status and, optionally, the
//! body. rustls with the ring provider: pure Rust plus a small C/asm core,
//! no cmake, no OpenSSL on the node. Proxies come from the job's own
//! environment (HTTPS_PROXY, HTTP_PROXY, ALL_PROXY, NO_PROXY), as the job
//! would use them (`facts::http`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::{KindInfo, ParamDoc, Params, Probe, ProbeFuture, parse_params};
use preflight_facts::Facts;
use preflight_facts::http::{causes, proxy_for, redact_credentials};
use preflight_ground::values::{Pattern, Span, format_duration};
use preflight_result::Finding;

/// Body bytes kept for matching and quoting.
const KEEP_BODY: usize = 256 * 1024;

pub const KIND: KindInfo = KindInfo {
    name: "http",
    scope: crate::Scope::Node,
    area: "network",
    summary: "GETs a URL (through the environment's proxy) and checks the status code and, optionally, the body.",
    params: &[
        ParamDoc {
            name: "url",
            ty: "string",
            default: None,
            doc: "http:// or https:// URL.",
        },
        ParamDoc {
            name: "status",
            ty: "integer or list of integers",
            default: Some("200"),
            doc: "Status codes that pass.",
        },
        ParamDoc {
            name: "body_matches",
            ty: "regex",
            default: Some("unset"),
            doc: "The body (first 256 KiB) must match.",
        },
        ParamDoc {
            name: "request_timeout",
            ty: "duration",
            default: Some("5s"),
            doc: "Limit for the whole request, connection included.",
        },
        ParamDoc {
            name: "use_proxy",
            ty: "bool",
            default: Some("true"),
            doc: "Honour HTTPS_PROXY / HTTP_PROXY / ALL_PROXY / NO_PROXY from the environment.",
        },
    ],
    hint_vars: &["status", "url", "proxy"],
    parse: parse_params::<Http>,
};

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(untagged)]
enum Statuses {
    One(u16),
    Many(Vec<u16>),
}

impl Statuses {
    fn list(&self) -> Vec<u16> {
        match self {
            Statuses::One(s) => vec![*s],
            Statuses::Many(v) => v.clone(),
        }
    }
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Http {
    url: String,
    #[serde(default = "ok_status")]
    status: Statuses,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    body_matches: Option<Pattern>,
    #[serde(default = "default_timeout")]
    request_timeout: Span,
    #[serde(default = "yes")]
    use_proxy: bool,
}

fn ok_status() -> Statuses {
    Statuses::One(200)
}
fn default_timeout() -> Span {
    Span(Duration::from_secs(5))
}
fn yes() -> bool {
    true
}

impl Params for Http {
    fn validate(&self) -> Result<(), String> {
        let shown = redact_credentials(&self.url);
        let url = reqwest::Url::parse(&self.url)
            .map_err(|e| format!("`url` `{shown}` is not a URL: {e}"))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(format!(
                "`url` `{shown}`: only http:// and https:// are supported"
            ));
        }
        let statuses = self.status.list();
        if statuses.is_empty() || statuses.iter().any(|s| !(100..=599).contains(s)) {
            return Err("`status` must be one or more codes between 100 and 599".into());
        }
        if self.request_timeout.0.is_zero() {
            return Err("`request_timeout` must be longer than zero".into());
        }
        Ok(())
    }
}

impl Http {
    fn client(&self, proxy: Option<&str>) -> Result<reqwest::Client, String> {
        let mut builder = reqwest::Client::builder()
            .timeout(self.request_timeout.0)
            .connect_timeout(self.request_timeout.0)
            .user_agent(concat!("preflight/", env!("CARGO_PKG_VERSION")))
            // Never the process environment behind the job's back: the
            // proxy is configured below from the job's environment.
            .no_proxy()
            // Loading the system's CA store costs a few hundred ms; plain
            // HTTP does not need it.
            .tls_built_in_root_certs(self.url.starts_with("https:"));
        if let Some(p) = proxy {
            let proxy = reqwest::Proxy::all(p)
                .map_err(|e| format!("invalid proxy `{}`: {e}", redact_credentials(p)))?;
            builder = builder.proxy(proxy);
        }
        builder
            .build()
            .map_err(|e| format!("cannot set up the HTTP client: {}", causes(&e)))
    }

    async fn run(&self, facts: &Facts) -> Finding {
        let url = match reqwest::Url::parse(&self.url) {
            Ok(u) => u,
            Err(e) => return Finding::error(format!("invalid url: {e}")),
        };
        let shown = redact_credentials(&self.url);
        let proxy = if self.use_proxy {
            proxy_for(facts, &url)
        } else {
            None
        };
        let via = proxy.as_deref().map_or(String::new(), |p| {
            format!(" via proxy {}", redact_credentials(p))
        });
        let client = match self.client(proxy.as_deref()) {
            Ok(c) => c,
            Err(e) => return Finding::error(e),
        };
        let vars = |f: Finding, status: String| {
            f.var("status", status).var("url", shown.clone()).var(
                "proxy",
                proxy
                    .as_deref()
                    .map_or_else(|| "none".into(), redact_credentials),
            )
        };
        let start = Instant::now();
        let response = match client.get(url).send().await {
            Ok(r) => r,
            Err(e) => {
                let what = if e.is_timeout() {
                    format!(
                        "no response within {} (dropped by a firewall, or the server hangs)",
                        format_duration(self.request_timeout.0)
                    )
                } else if e.is_connect() {
                    format!("cannot connect: {}", causes(&e.without_url()))
                } else {
                    causes(&e.without_url())
                };
                return vars(
                    Finding::fail(format!("GET {shown}{via}: {what}")).measured("no response"),
                    "none".into(),
                );
            }
        };
        let status = response.status().as_u16();
        let wanted = self.status.list();
        let expected = wanted
            .iter()
            .map(u16::to_string)
            .collect::<Vec<_>>()
            .join(" or ");
        if !wanted.contains(&status) {
            return vars(
                Finding::fail(format!(
                    "GET {shown}{via}: status {status}, expected {expected}"
                ))
                .measured(status.to_string())
                .expected(expected),
                status.to_string(),
            );
        }
        if let Some(pattern) = &self.body_matches {
            let body = match read_body(response, self.request_timeout.0).await {
                Ok(b) => b,
                Err(e) => {
                    return vars(
                        Finding::fail(format!("GET {shown}{via}: reading the body: {e}")),
                        status.to_string(),
                    );
                }
            };
            if !pattern.is_match(&body) {
                let excerpt: String = body.chars().take(200).collect();
                return vars(
                    Finding::fail(format!(
                        "GET {shown}{via}: body does not match /{}/: {}",
                        pattern.as_str(),
                        excerpt.trim()
                    ))
                    .measured(status.to_string())
                    .expected(format!("body matching /{}/", pattern.as_str())),
                    status.to_string(),
                );
            }
        }
        vars(
            Finding::pass(format!(
                "GET {shown}{via}: {status} in {}",
                format_duration(start.elapsed())
            ))
            .measured(status.to_string()),
            status.to_string(),
        )
    }
}

async fn read_body(mut response: reqwest::Response, limit: Duration) -> Result<String, String> {
    let mut kept = Vec::new();
    let read = async {
        while let Some(chunk) = response.chunk().await.map_err(|e| causes(&e))? {
            let room = KEEP_BODY.saturating_sub(kept.len());
            kept.extend_from_slice(&chunk[..chunk.len().min(room)]);
            if room == 0 {
                break;
            }
        }
        Ok::<(), String>(())
    };
    tokio::time::timeout(limit, read)
        .await
        .map_err(|_| "timed out".to_string())??;
    Ok(String::from_utf8_lossy(&kept).into_owned())
}

impl Probe for Http {
    fn evaluate(self: Arc<Self>, facts: Arc<Facts>) -> ProbeFuture {
        Box::pin(async move { self.run(&facts).await })
    }
}
