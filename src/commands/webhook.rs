//! `preflight webhook`: the mutating admission webhook that gates pods
//! labelled `preflight.dev/gate` (see `crate::admission`).

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;

use super::Failure;
use crate::exit::ExitCode;

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
    pub gang_timeout: crate::values::Span,
}

fn parse_span(text: &str) -> Result<crate::values::Span, String> {
    crate::values::Span::parse(text)
}

/// Serves until SIGTERM; exit 2 when it cannot start (the files, the
/// address).
pub fn webhook(args: &WebhookArgs) -> Result<ExitCode, Failure> {
    let tls =
        crate::admission::serve::tls(&args.tls_cert, &args.tls_key).map_err(Failure::Usage)?;
    let listener = std::net::TcpListener::bind(args.listen)
        .map_err(|e| Failure::Usage(format!("--listen {}: {e}", args.listen)))?;
    let at = listener.local_addr().unwrap_or(args.listen);
    eprintln!(
        "preflight webhook: serving https://{at}/mutate (image {})",
        args.image
    );
    let cfg = crate::admission::Config {
        image: args.image.clone(),
        gang_timeout: format!("{}s", args.gang_timeout.0.as_secs().max(1)),
    };
    crate::admission::serve::serve(listener, tls, cfg).map_err(Failure::Usage)?;
    Ok(ExitCode::Ready)
}
