//! `--post URL`: the JSON report sent to a collector after the run. The
//! upload never changes the verdict or the exit code: a failure is a
//! warning in the report and on stderr. Every attempt has a timeout, and
//! the attempts (at most `ATTEMPTS`) stay within what is left of the run's
//! deadline; the proxy is the job's, as the `http` kind finds it. A
//! password in the URL or the proxy's is never shown, and no redirect is
//! followed: a collector that answers 307 does not get to send the report
//! on to any host it names.

use std::time::{Duration, Instant};

use preflight_facts::Facts;
use preflight_facts::http::{causes, proxy_for, redact_credentials};

const ATTEMPTS: usize = 3;

/// The longest one attempt may take, deadline permitting.
const ATTEMPT: Duration = Duration::from_secs(10);

/// Checked before the run: a URL that cannot be posted to is the
/// operator's mistake, told at once (exit 2).
pub fn parse_url(text: &str) -> Result<reqwest::Url, String> {
    let shown = redact_credentials(text);
    let url =
        reqwest::Url::parse(text).map_err(|e| format!("--post `{shown}` is not a URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!(
            "--post `{shown}`: only http:// and https:// are supported"
        ));
    }
    Ok(url)
}

/// Posts `body` (the JSON report) to `url` within `budget`; the warning
/// to report when it could not be delivered.
pub fn post(
    url: &reqwest::Url,
    body: String,
    budget: Duration,
    facts: &Facts,
) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            format!(
                "--post {}: cannot start: {e}",
                redact_credentials(url.as_str())
            )
        })?;
    runtime.block_on(send(url, body, budget, facts))
}

async fn send(
    url: &reqwest::Url,
    body: String,
    budget: Duration,
    facts: &Facts,
) -> Result<(), String> {
    let proxy = proxy_for(facts, url);
    let shown = redact_credentials(url.as_str());
    let mut builder = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("preflight/", env!("CARGO_PKG_VERSION")))
        // The job's proxy, as the `http` kind reads it, not the process's.
        .no_proxy()
        .tls_built_in_root_certs(url.scheme() == "https");
    if let Some(p) = &proxy {
        let p = reqwest::Proxy::all(p).map_err(|e| {
            format!(
                "--post {shown}: invalid proxy `{}`: {}",
                redact_credentials(p),
                causes(&e.without_url())
            )
        })?;
        builder = builder.proxy(p);
    }
    let client = builder
        .build()
        .map_err(|e| format!("--post {shown}: {}", causes(&e.without_url())))?;
    let end = Instant::now() + budget;
    let via = proxy
        .map(|p| format!(" (via proxy {})", redact_credentials(&p)))
        .unwrap_or_default();
    let mut last = String::from("no time was left within --timeout");
    for attempt in 0..ATTEMPTS {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        let result = client
            .post(url.clone())
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .timeout(left.min(ATTEMPT))
            .body(body.clone())
            .send()
            .await;
        match result {
            Ok(r) if r.status().is_success() => return Ok(()),
            Ok(r) if r.status().is_redirection() => {
                let to = r
                    .headers()
                    .get(reqwest::header::LOCATION)
                    .and_then(|l| l.to_str().ok())
                    .map(|l| redact_credentials(l).chars().take(200).collect::<String>())
                    .unwrap_or_else(|| "nowhere".into());
                last = format!(
                    "the collector answered {} to {to}: redirects are not followed (post to the final URL)",
                    r.status()
                );
                break;
            }
            Ok(r) => {
                last = format!("the collector answered {}", r.status());
                // A client error will not change on retry.
                if r.status().is_client_error() {
                    break;
                }
            }
            Err(e) if e.is_timeout() => last = "no answer in time".into(),
            Err(e) => last = causes(&e.without_url()),
        }
        if attempt + 1 < ATTEMPTS {
            let pause = Duration::from_millis(250 << attempt);
            tokio::time::sleep(pause.min(end.saturating_duration_since(Instant::now()))).await;
        }
    }
    Err(format!(
        "--post {shown}{via}: the report was not delivered: {last}"
    ))
}
