//! `preflight webhook`: the mutating admission webhook that gates pods
//! labelled `preflight.dev/gate` (see `preflight_webhook`).

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;

use super::Failure;
use preflight_ground::exit::ExitCode;

#[derive(Debug, Args)]
pub struct WebhookArgs {
    /// Where to listen (HTTPS): the Service's target port.
    #[arg(long, value_name = "ADDR:PORT", default_value = "0.0.0.0:8443")]
    pub listen: SocketAddr,
    /// The server's certificate chain (PEM), signed by the CA in the
    /// MutatingWebhookConfiguration's caBundle.
    #[arg(long, value_name = "FILE")]
    pub tls_cert: PathBuf,
    /// Its private key (PEM).
    #[arg(long, value_name = "FILE")]
    pub tls_key: PathBuf,
    /// The preflight image the init container runs.
    #[arg(long, value_name = "IMAGE")]
    pub image: String,
    /// `preflight run`'s deadline in a gang's init container: every pod
    /// of the job must start within it (image pulls, scheduling).
    #[arg(long, value_name = "DURATION", default_value = "600s", value_parser = parse_span)]
    pub gang_timeout: preflight_ground::values::Span,
    /// The API server, to read a gang's size from its scheduler's
    /// PodGroup (Volcano, KAI, coscheduling, Kubernetes' own): `off`, a
    /// URL, or by default the in-cluster one (KUBERNETES_SERVICE_HOST and
    /// _PORT), where the pod has its ServiceAccount's token.
    #[arg(long, value_name = "URL|off")]
    pub api_server: Option<String>,
    /// The CA the API server's certificate is checked against.
    #[arg(long, value_name = "FILE", default_value = SA_CA)]
    pub api_ca: PathBuf,
    /// The ServiceAccount token sent to it (read again for each call: the
    /// kubelet renews it).
    #[arg(long, value_name = "FILE", default_value = SA_TOKEN)]
    pub api_token: PathBuf,
}

const SA_CA: &str = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";
const SA_TOKEN: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";

/// Where PodGroups are read, and how that was decided, in words: an
/// explicit URL that cannot be used is an error; the in-cluster default
/// without its token (automountServiceAccountToken false) reads none.
fn podgroups(
    args: &WebhookArgs,
) -> Result<
    (
        Option<std::sync::Arc<preflight_webhook::podgroup::ApiServer>>,
        String,
    ),
    Failure,
> {
    let in_cluster = || {
        let host = std::env::var("KUBERNETES_SERVICE_HOST").ok()?;
        let port = std::env::var("KUBERNETES_SERVICE_PORT").unwrap_or_else(|_| "443".into());
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host
        };
        Some(format!("https://{host}:{port}"))
    };
    let (url, explicit) = match args.api_server.as_deref() {
        Some("off") => return Ok((None, "PodGroups not read (--api-server off)".into())),
        Some(url) => (url.to_string(), true),
        None => match in_cluster() {
            Some(url) => (url, false),
            None => return Ok((None, "PodGroups not read (not in a cluster)".into())),
        },
    };
    if !url.starts_with("https://") {
        return Err(Failure::Usage(format!(
            "--api-server {url}: the API server is reached over https://"
        )));
    }
    match preflight_webhook::podgroup::ApiServer::new(&url, &args.api_ca, &args.api_token) {
        Ok(api) => Ok((
            Some(std::sync::Arc::new(api)),
            format!("PodGroups read from {url}"),
        )),
        Err(e) if explicit => Err(Failure::Usage(format!("--api-server {url}: {e}"))),
        Err(e) => Ok((None, format!("PodGroups not read ({e})"))),
    }
}

fn parse_span(text: &str) -> Result<preflight_ground::values::Span, String> {
    preflight_ground::values::Span::parse(text)
}

/// Serves until SIGTERM; exit 2 when it cannot start (the files, the
/// address).
pub fn webhook(args: &WebhookArgs) -> Result<ExitCode, Failure> {
    let tls =
        preflight_webhook::serve::tls(&args.tls_cert, &args.tls_key).map_err(Failure::Usage)?;
    let listener = std::net::TcpListener::bind(args.listen)
        .map_err(|e| Failure::Usage(format!("--listen {}: {e}", args.listen)))?;
    let at = listener.local_addr().unwrap_or(args.listen);
    let (api, said) = podgroups(args)?;
    eprintln!(
        "preflight webhook: serving https://{at}/mutate (image {}; {said})",
        args.image
    );
    let cfg = preflight_webhook::Config {
        image: args.image.clone(),
        gang_timeout: args.gang_timeout.0,
        podgroups: api,
    };
    preflight_webhook::serve::serve(listener, tls, cfg).map_err(Failure::Usage)?;
    Ok(ExitCode::Ready)
}
