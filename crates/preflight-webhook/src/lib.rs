//! Kubernetes admission: `preflight webhook`, a mutating admission webhook
//! that puts preflight's gate into the pods that ask for it
//! (`preflight.dev/gate=gang|node`). What it does to a pod is `mutate`;
//! the HTTPS server the API server calls is `serve`, over a certificate
//! taken up again when its files change (`certificate`); a gang's size
//! from its scheduler's PodGroup is read from the API server
//! (`podgroup`).

mod body;
mod certificate;
pub mod mutate;
pub mod podgroup;
pub mod serve;

pub use mutate::Config;
