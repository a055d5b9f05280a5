//! The job token and the handshake that proves it, both ways, without
//! sending it.
//!
//! Token: PREFLIGHT_TOKEN; else derived from SLURM_JOB_ID or
//! TORCHELASTIC_RUN_ID (every rank of one job sees the same id, another
//! job sees another); else none, with a warning in the report (any
//! preflight without a token is then accepted).
//!
//! Handshake: the client sends a nonce; the server answers with its nonce
//! and HMAC-SHA256(token, "server" | client nonce | server nonce); the
//! client checks that and answers HMAC-SHA256(token, "client" | ...). The
//! role prefix keeps one side's proof from being replayed as the other's;
//! fresh nonces keep a recorded proof from being replayed at all. A side
//! whose check fails says so to the other before closing, so both reports
//! can say "in use by another job".

use std::collections::BTreeMap;
use std::io::Read;
use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::Instant;

use super::protocol::{self, FrameError, Msg};
use crate::values::hex;

type HmacSha256 = Hmac<Sha256>;

/// What the rejecting side writes; the other side recognises it.
pub const OTHER_JOB: &str = "another job: the job tokens differ";

#[derive(Clone)]
pub struct Token {
    key: Vec<u8>,
    /// Where it came from, for the report; never the value.
    pub source: &'static str,
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Token({})", self.source)
    }
}

impl Token {
    pub fn resolve(env: &BTreeMap<String, String>) -> Token {
        let get = |n: &str| env.get(n).filter(|v| !v.is_empty());
        if let Some(t) = get("PREFLIGHT_TOKEN") {
            return Token::new(t.as_bytes(), "PREFLIGHT_TOKEN");
        }
        match super::identity::job_id(env) {
            Some((var @ "SLURM_JOB_ID", id)) => {
                Token::new(format!("slurm-job:{id}").as_bytes(), var)
            }
            Some((var, id)) => Token::new(format!("torchelastic:{id}").as_bytes(), var),
            None => Token::new(b"preflight: no job token", "none"),
        }
    }

    pub fn new(key: &[u8], source: &'static str) -> Token {
        Token {
            key: key.to_vec(),
            source,
        }
    }

    pub fn is_none(&self) -> bool {
        self.source == "none"
    }

    fn mac(&self, role: &str, client: &str, server: &str) -> HmacSha256 {
        // HMAC takes keys of any length; this cannot fail.
        let mut mac = <HmacSha256 as Mac>::new_from_slice(&self.key)
            .unwrap_or_else(|_| unreachable!("HMAC accepts any key length"));
        mac.update(role.as_bytes());
        mac.update(b"|");
        mac.update(client.as_bytes());
        mac.update(b"|");
        mac.update(server.as_bytes());
        mac
    }

    pub fn proof(&self, role: &str, client: &str, server: &str) -> String {
        hex(&self.mac(role, client, server).finalize().into_bytes())
    }

    /// Constant-time comparison of a peer's proof.
    pub fn verify(&self, role: &str, client: &str, server: &str, proof: &str) -> bool {
        let Some(bytes) = unhex(proof) else {
            return false;
        };
        self.mac(role, client, server).verify_slice(&bytes).is_ok()
    }

    /// A short fingerprint that is the same on every rank of one job, for
    /// the report; it reveals nothing usable about the token.
    pub fn fingerprint(&self) -> String {
        let digest = Sha256::digest([b"fingerprint|".as_slice(), &self.key].concat());
        hex(&digest[..4])
    }
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    // A proof is 32 bytes; anything much longer is not one.
    if text.len() > 128 {
        return None;
    }
    crate::values::unhex(text)
}

/// 16 random bytes from the kernel; where /dev/urandom cannot be read, a
/// hash of time, pid and address space, which is still unique per call.
pub fn nonce() -> String {
    let mut bytes = [0u8; 16];
    let ok = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .is_ok();
    if !ok {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        let local = 0u8;
        let seed = format!("{now}|{}|{:p}", std::process::id(), &local);
        bytes.copy_from_slice(&Sha256::digest(seed.as_bytes())[..16]);
    }
    hex(&bytes)
}

#[derive(Debug)]
pub enum AuthError {
    /// The peer proved another token: another job (or a wrong token).
    OtherJob,
    /// The peer said it rejects us, and why.
    RejectedByPeer(String),
    Frame(FrameError),
    /// The peer spoke out of turn.
    Protocol(String),
}

impl std::fmt::Display for AuthError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AuthError::OtherJob => write!(f, "{OTHER_JOB}"),
            AuthError::RejectedByPeer(r) => write!(f, "rejected: {r}"),
            AuthError::Frame(e) => write!(f, "{e}"),
            AuthError::Protocol(m) => write!(f, "{m}"),
        }
    }
}

impl From<FrameError> for AuthError {
    fn from(e: FrameError) -> AuthError {
        AuthError::Frame(e)
    }
}

pub async fn client<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    token: &Token,
    deadline: Instant,
) -> Result<(), AuthError> {
    let mine = nonce();
    protocol::write(
        stream,
        &Msg::Hello {
            nonce: mine.clone(),
            version: crate::result::report::TOOL.version.to_string(),
        },
        deadline,
    )
    .await?;
    let (theirs, proof) =
        match protocol::read_limited(stream, deadline, protocol::MAX_HANDSHAKE_FRAME).await? {
            Msg::Challenge { nonce, proof } => (nonce, proof),
            Msg::Rejected { reason } => return Err(AuthError::RejectedByPeer(reason)),
            other => return Err(unexpected("a challenge", &other)),
        };
    if !token.verify("server", &mine, &theirs, &proof) {
        let _ = protocol::write(
            stream,
            &Msg::Rejected {
                reason: OTHER_JOB.into(),
            },
            deadline,
        )
        .await;
        return Err(AuthError::OtherJob);
    }
    let proof = token.proof("client", &mine, &theirs);
    protocol::write(stream, &Msg::Proof { proof }, deadline).await?;
    match protocol::read_limited(stream, deadline, protocol::MAX_HANDSHAKE_FRAME).await? {
        Msg::Welcome => Ok(()),
        Msg::Rejected { reason } => Err(AuthError::RejectedByPeer(reason)),
        other => Err(unexpected("a welcome", &other)),
    }
}

pub async fn server<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    token: &Token,
    deadline: Instant,
) -> Result<(), AuthError> {
    let theirs =
        match protocol::read_limited(stream, deadline, protocol::MAX_HANDSHAKE_FRAME).await? {
            Msg::Hello { nonce, .. } if nonce.len() <= 128 => nonce,
            other => return Err(unexpected("a hello", &other)),
        };
    let mine = nonce();
    let proof = token.proof("server", &theirs, &mine);
    protocol::write(
        stream,
        &Msg::Challenge {
            nonce: mine.clone(),
            proof,
        },
        deadline,
    )
    .await?;
    match protocol::read_limited(stream, deadline, protocol::MAX_HANDSHAKE_FRAME).await? {
        Msg::Proof { proof } if token.verify("client", &theirs, &mine, &proof) => {
            protocol::write(stream, &Msg::Welcome, deadline).await?;
            Ok(())
        }
        Msg::Proof { .. } => {
            let _ = protocol::write(
                stream,
                &Msg::Rejected {
                    reason: OTHER_JOB.into(),
                },
                deadline,
            )
            .await;
            Err(AuthError::OtherJob)
        }
        Msg::Rejected { reason } if reason == OTHER_JOB => Err(AuthError::OtherJob),
        Msg::Rejected { reason } => Err(AuthError::RejectedByPeer(reason)),
        other => Err(unexpected("a proof", &other)),
    }
}

fn unexpected(wanted: &str, got: &Msg) -> AuthError {
    let name = serde_json::to_value(got)
        .ok()
        .and_then(|v| v.get("type").and_then(|t| t.as_str()).map(String::from))
        .unwrap_or_default();
    AuthError::Protocol(format!("expected {wanted}, got `{name}`"))
}

/// A client that has not authenticated by then is dropped: slowloris and
/// half-open connections cost one task for this long at most.
pub const HANDSHAKE_LIMIT: Duration = Duration::from_secs(5);

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn handshake(a: Token, b: Token) -> (Result<(), AuthError>, Result<(), AuthError>) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let (mut c, mut s) = tokio::io::duplex(4096);
            let deadline = protocol::after(Duration::from_secs(2));
            tokio::join!(client(&mut c, &a, deadline), server(&mut s, &b, deadline))
        })
    }

    #[test]
    fn token_sources_in_order() {
        let t = Token::resolve(&env(&[
            ("PREFLIGHT_TOKEN", "x"),
            ("SLURM_JOB_ID", "1"),
            ("TORCHELASTIC_RUN_ID", "r"),
        ]));
        assert_eq!(t.source, "PREFLIGHT_TOKEN");
        let t = Token::resolve(&env(&[("SLURM_JOB_ID", "1"), ("TORCHELASTIC_RUN_ID", "r")]));
        assert_eq!(t.source, "SLURM_JOB_ID");
        assert_eq!(
            Token::resolve(&env(&[("TORCHELASTIC_RUN_ID", "r")])).source,
            "TORCHELASTIC_RUN_ID"
        );
        assert!(Token::resolve(&env(&[])).is_none());
        // torchrun's default run id is shared by every job: not a token.
        assert!(Token::resolve(&env(&[("TORCHELASTIC_RUN_ID", "none")])).is_none());
    }

    #[test]
    fn same_token_is_accepted_both_ways() {
        let (c, s) = handshake(Token::new(b"k", "t"), Token::new(b"k", "t"));
        assert!(c.is_ok() && s.is_ok(), "{c:?} {s:?}");
    }

    #[test]
    fn other_token_is_rejected_and_both_sides_know() {
        let (c, s) = handshake(Token::new(b"job-a", "t"), Token::new(b"job-b", "t"));
        assert!(matches!(c, Err(AuthError::OtherJob)), "{c:?}");
        assert!(matches!(s, Err(AuthError::OtherJob)), "{s:?}");
    }

    #[test]
    fn proofs_are_bound_to_role_and_nonces() {
        let t = Token::new(b"k", "t");
        let p = t.proof("server", "a", "b");
        assert!(t.verify("server", "a", "b", &p));
        assert!(!t.verify("client", "a", "b", &p));
        assert!(!t.verify("server", "a", "c", &p));
        assert!(!t.verify("server", "a", "b", "zz"));
        assert!(!Token::new(b"other", "t").verify("server", "a", "b", &p));
        // The token itself never appears in what is sent.
        assert!(!p.contains(&hex(b"k")));
    }
}
