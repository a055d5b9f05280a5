//! `preflight token`: a fresh job secret for PREFLIGHT_TOKEN or
//! PREFLIGHT_TOKEN_FILE, made once per job and given to every node.

use super::Failure;
use preflight_ground::exit::ExitCode;
use preflight_report::output::write_stdout;

pub fn token() -> Result<ExitCode, Failure> {
    let secret = preflight_cluster::auth::fresh_secret().map_err(Failure::Usage)?;
    write_stdout(&format!("{secret}\n"))
        .map_err(|e| Failure::Usage(format!("cannot write the secret: {e}")))?;
    Ok(ExitCode::Ready)
}
