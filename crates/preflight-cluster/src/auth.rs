//! The job token and the handshake that proves it, both ways, without
//! sending it.
//!
//! Token: PREFLIGHT_TOKEN (at least `MIN_SECRET` characters); else the
//! contents of PREFLIGHT_TOKEN_FILE (a file only its owner can read); else
//! derived from SLURM_JOB_ID or TORCHELASTIC_RUN_ID; else none. A derived
//! token is public (job ids are in `squeue`, run ids in `ps`): it keeps
//! apart jobs that share a port by accident, not a stranger on purpose, so
//! the report warns about it as it does about none, and `--require-secret`
//! refuses both for a job across nodes.
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
use super::sealed::{Direction, Sealed};
use preflight_ground::values::hex;

type HmacSha256 = Hmac<Sha256>;

/// What the rejecting side writes; the other side recognises it.
pub const OTHER_JOB: &str = "another job: the job tokens differ";

#[derive(Clone)]
pub struct Token {
    key: Vec<u8>,
    /// Where it came from, for the report; never the value.
    pub source: &'static str,
    /// Which of the rendezvous ports (`identity::rendezvous_ports`) the
    /// handshake is for: every proof covers it, so that a stranger on
    /// MASTER_PORT who relays the ranks to the port rank 0 moved to
    /// cannot pass a handshake through (0: MASTER_PORT itself).
    place: usize,
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Token({})", self.source)
    }
}

/// The shortest secret accepted: 16 characters. `preflight token` prints
/// 32 hex digits (128 bits).
pub const MIN_SECRET: usize = 16;

/// The fewest bits of guessing a secret must cost: 2^64 HMACs are decades
/// of a GPU farm's time, for anyone who recorded a handshake (the proofs
/// travel in clear) and tests guesses offline. Estimated by zxcvbn, which
/// counts how an attacker would guess: dictionary words, names, dates,
/// keyboard walks, repeats and sequences, l33t; random characters count
/// 10 guesses each (log2 10 = 3.3 bits), so 20 random characters are the
/// least that passes, and a human phrase of any length rarely does.
///
/// zxcvbn counts at most 2^64 guesses (a u64): the bar is that count, less
/// a rounding margin.
pub const MIN_SECRET_BITS: f64 = 63.9;
pub const TOKEN_VAR: &str = "PREFLIGHT_TOKEN";
/// Where a one-node job's secret comes from when nobody set one: its node
/// agent makes a fresh one and hands it to its own ranks only (in their
/// environment, which no other user can read).
pub const AGENT_SECRET: &str = "a secret of the node agent's own";
pub const TOKEN_FILE_VAR: &str = "PREFLIGHT_TOKEN_FILE";

impl Token {
    /// The job's token from the environment, or why the secret given there
    /// cannot be used (too short, a file others can read): exit 2.
    pub fn resolve(env: &BTreeMap<String, String>) -> Result<Token, String> {
        let token = Token::resolve_unjudged(env)?;
        token.judge()?;
        Ok(token)
    }

    /// `resolve`, but PREFLIGHT_TOKEN's guessing cost is left to `judge`:
    /// estimating it builds zxcvbn's dictionaries, about 10 ms of CPU, and
    /// a node's other ranks need not pay it when their leader, which did,
    /// proves the same secret to them.
    pub fn resolve_unjudged(env: &BTreeMap<String, String>) -> Result<Token, String> {
        let get = |n: &str| env.get(n).filter(|v| !v.is_empty());
        if let Some(t) = get(TOKEN_VAR) {
            check_min_length(TOKEN_VAR, t)?;
            return Ok(Token::new(t.as_bytes(), TOKEN_VAR));
        }
        if let Some(path) = get(TOKEN_FILE_VAR) {
            let secret = read_secret_file(std::path::Path::new(path))?;
            return Ok(Token::new(secret.as_bytes(), TOKEN_FILE_VAR));
        }
        Ok(match super::identity::job_id(env) {
            Some((var @ "SLURM_JOB_ID", id)) => {
                Token::new(format!("slurm-job:{id}").as_bytes(), var)
            }
            Some((var @ "TORCHELASTIC_RUN_ID", id)) => {
                Token::new(format!("torchelastic:{id}").as_bytes(), var)
            }
            // A pod's job, by what every pod of it shares (its leader's
            // name): as readable as a Slurm job id, so as weak.
            Some((var, id)) => Token::new(format!("kubernetes:{id}").as_bytes(), var),
            None => Token::none(),
        })
    }

    /// Whether PREFLIGHT_TOKEN's secret is too easy to guess (a secret
    /// from a file was judged as it was read).
    pub fn judge(&self) -> Result<(), String> {
        if self.source != TOKEN_VAR {
            return Ok(());
        }
        check_guessing(TOKEN_VAR, &String::from_utf8_lossy(&self.key))
    }

    /// No token at all: what `check`, which never meets a peer, carries.
    pub fn none() -> Token {
        Token::new(b"preflight: no job token", "none")
    }

    /// A secret the operator chose, as opposed to a job id anyone can read.
    pub fn is_secret(&self) -> bool {
        self.source == TOKEN_VAR || self.source == TOKEN_FILE_VAR || self.source == AGENT_SECRET
    }

    pub fn new(key: &[u8], source: &'static str) -> Token {
        Token {
            key: key.to_vec(),
            source,
            place: 0,
        }
    }

    /// The same token, for a handshake on the rendezvous port at `place`.
    pub fn at(&self, place: usize) -> Token {
        Token {
            place,
            ..self.clone()
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
        if self.place > 0 {
            mac.update(format!(" at {}", self.place).as_bytes());
        }
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

    /// The token as a report shows it: where it came from, and for a
    /// public one (derived from a job id anyone can read) its fingerprint,
    /// which tells two jobs apart. A secret's fingerprint is never shown:
    /// a report is posted, merged and attached to tickets, and a hash of
    /// the secret there would let anyone test guesses offline.
    pub fn describe(&self) -> String {
        if self.is_secret() || self.is_none() {
            self.source.to_string()
        } else {
            format!("{} ({})", self.source, self.fingerprint())
        }
    }

    /// A short fingerprint that is the same on every rank of one job: for
    /// public tokens only (see `describe`).
    pub fn fingerprint(&self) -> String {
        let digest = Sha256::digest([b"fingerprint|".as_slice(), &self.key].concat());
        hex(&digest[..4])
    }
}

fn check_length(what: &str, secret: &str) -> Result<(), String> {
    check_min_length(what, secret)?;
    check_guessing(what, secret)
}

fn check_min_length(what: &str, secret: &str) -> Result<(), String> {
    let n = secret.chars().count();
    if n < MIN_SECRET {
        return Err(format!(
            "{what} is {n} characters: a job secret needs at least {MIN_SECRET} (`preflight token` prints a fresh 128-bit one)"
        ));
    }
    Ok(())
}

fn check_guessing(what: &str, secret: &str) -> Result<(), String> {
    let bits = guessing_bits(secret);
    if bits < MIN_SECRET_BITS {
        return Err(format!(
            "{what} is too easy to guess: about {bits:.0} bits by zxcvbn's estimate (words, names, dates, sequences, repeats), and a job secret needs 64: anyone who records a handshake can test guesses offline; use `preflight token`, which prints a fresh 128-bit one"
        ));
    }
    Ok(())
}

/// log2 of the guesses zxcvbn estimates for `secret` (its first 128
/// characters: the estimate grows with the square of the length, and 128
/// random characters are far past any need).
pub fn guessing_bits(secret: &str) -> f64 {
    let head: String = secret.chars().take(128).collect();
    zxcvbn::zxcvbn(&head, &[]).guesses_log10() * std::f64::consts::LOG2_10
}

/// The secret in a file that only its owner may read: a file others can
/// read is a secret no more.
fn read_secret_file(path: &std::path::Path) -> Result<String, String> {
    read_secret(path, &format!("{TOKEN_FILE_VAR}={}", path.display()))
}

/// A secret file's trimmed text, refused unless it is this user's own,
/// readable by no one else, and long enough; errors start with `named`.
fn read_secret(path: &std::path::Path, named: &str) -> Result<String, String> {
    use preflight_facts::guarded_file::{self, Refused};
    use std::os::unix::fs::MetadataExt;
    let shown = path.display();
    let me = nix::unistd::geteuid().as_raw();
    // A secret is a line; a huge file is not one.
    let judged = guarded_file::read(path, 4096, |meta| {
        if meta.uid() != me {
            return Err(format!(
                "{named} belongs to uid {}, not to this user (uid {me}): the secret must be its user's own",
                meta.uid()
            ));
        }
        let mode = meta.mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(format!(
                "{named} can be read by others (mode {mode:04o}): `chmod 600 {shown}`"
            ));
        }
        Ok(())
    });
    let bytes = match judged {
        Ok(Ok(b)) => b,
        Ok(Err(why)) => return Err(why),
        Err(Refused::Link) => {
            return Err(format!("{named} is a symbolic link: name the file itself"));
        }
        Err(Refused::NotPlain) => return Err(format!("{named}: not a regular file")),
        Err(Refused::TooLarge(_)) => {
            return Err(format!(
                "{named}: a secret is a line, not a file of kilobytes"
            ));
        }
        Err(e @ (Refused::Missing | Refused::Io(_))) => return Err(format!("{named}: {e}")),
    };
    let secret = String::from_utf8_lossy(&bytes).trim().to_string();
    check_length(&format!("the secret in {named}"), &secret)?;
    Ok(secret)
}

/// A Slurm job's secret: the site key's HMAC of the job id, as hex. Every
/// node's prolog (root, which can read the key) computes the same; no
/// user can, though every user can read the job id.
pub fn job_secret(site_key: &std::path::Path, job_id: &str) -> Result<String, String> {
    let named = format!("the site key {}", site_key.display());
    let key = read_secret(site_key, &named).map_err(|e| {
        format!(
            "{e} (make one on every node: `preflight token > {0}; chmod 600 {0}`)",
            site_key.display()
        )
    })?;
    let mut mac = <HmacSha256 as Mac>::new_from_slice(key.as_bytes())
        .unwrap_or_else(|_| unreachable!("HMAC accepts any key length"));
    mac.update(b"preflight slurm job:");
    mac.update(job_id.as_bytes());
    Ok(hex(&mac.finalize().into_bytes()))
}

/// A number that only holders of `secret` can compute, for `what`: a
/// choice (a port) that strangers cannot know in advance. A hash of the
/// secret under a label, so that it tells nothing of the secret itself.
pub fn secret_pick(secret: &str, what: &str) -> u64 {
    let digest = Sha256::digest(format!("preflight pick|{what}|{secret}").as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first)
}

/// A fresh 128-bit secret as 32 hex digits, from the kernel's random
/// source only: unlike a nonce, a secret has no fallback.
pub fn fresh_secret() -> Result<String, String> {
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| format!("cannot read /dev/urandom for a secret: {e}"))?;
    Ok(hex(&bytes))
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    // A proof is 32 bytes; anything much longer is not one.
    if text.len() > 128 {
        return None;
    }
    preflight_ground::values::unhex(text)
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
    /// The peer proved another token: another job (or a wrong token);
    /// where the server's token comes from (and a public one's
    /// fingerprint), when it said.
    OtherJob {
        theirs: Option<String>,
    },
    /// The peer said it rejects us, and why.
    RejectedByPeer(String),
    Frame(FrameError),
    /// The peer spoke out of turn.
    Protocol(String),
}

impl std::fmt::Display for AuthError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AuthError::OtherJob { .. } => write!(f, "{OTHER_JOB}"),
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

/// What both ends hold after the handshake: the two nonces, from which
/// each derives the keys that seal the connection (`sealed`).
pub struct Session {
    client: String,
    server: String,
}

impl Session {
    /// This end's sending and receiving directions.
    fn directions(&self, token: &Token, client_side: bool) -> (Direction, Direction) {
        let key = |dir: &str| -> [u8; 32] {
            let mut k = [0u8; 32];
            k.copy_from_slice(
                &token
                    .mac(&format!("session {dir}"), &self.client, &self.server)
                    .finalize()
                    .into_bytes(),
            );
            k
        };
        let (c2s, s2c) = (key("c2s"), key("s2c"));
        if client_side {
            (Direction::new(c2s), Direction::new(s2c))
        } else {
            (Direction::new(s2c), Direction::new(c2s))
        }
    }

    /// The stream, sealed for the rest of its life.
    pub fn seal<S>(self, stream: S, token: &Token, client_side: bool) -> Sealed<S> {
        let (send, recv) = self.directions(token, client_side);
        Sealed::new(stream, send, recv)
    }
}

/// The client's side: it proves the token first (over both nonces), then
/// checks the server's proof. A stranger posing as the server learns a
/// proof to guess against only if ranks connect to it; with a secret of
/// 64 bits or more (`preflight token` makes 128) guessing is hopeless.
pub async fn client<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    token: &Token,
    deadline: Instant,
) -> Result<Session, AuthError> {
    let mine = nonce();
    protocol::write(
        stream,
        &Msg::Hello {
            nonce: mine.clone(),
            version: preflight_result::report::TOOL.version.to_string(),
        },
        deadline,
    )
    .await?;
    let theirs =
        match protocol::read_limited(stream, deadline, protocol::MAX_HANDSHAKE_FRAME).await? {
            Msg::Challenge { nonce } if nonce.len() <= 128 => nonce,
            Msg::Rejected { reason, .. } => return Err(AuthError::RejectedByPeer(reason)),
            other => return Err(unexpected("a challenge", &other)),
        };
    let proof = token.proof("client", &mine, &theirs);
    protocol::write(stream, &Msg::Proof { proof }, deadline).await?;
    match protocol::read_limited(stream, deadline, protocol::MAX_HANDSHAKE_FRAME).await? {
        Msg::Welcome { proof } if token.verify("server", &mine, &theirs, &proof) => Ok(Session {
            client: mine,
            server: theirs,
        }),
        // A server that accepted a proof it could not check, or forged
        // its own: not this job's.
        Msg::Welcome { .. } => Err(AuthError::OtherJob { theirs: None }),
        Msg::Rejected {
            reason,
            source,
            fingerprint,
        } if reason == OTHER_JOB => Err(AuthError::OtherJob {
            theirs: their_token(source, fingerprint),
        }),
        Msg::Rejected { reason, .. } => Err(AuthError::RejectedByPeer(reason)),
        other => Err(unexpected("a welcome", &other)),
    }
}

/// What a rejecting server said of its token, in words, when what it said
/// is well formed: a variable's name (or `none`), and a public token's
/// fingerprint. A peer's word, bounded.
fn their_token(source: Option<String>, fingerprint: Option<String>) -> Option<String> {
    let source = source.filter(|s| {
        (1..=40).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_uppercase() || b == b'_')
            || s == "none"
    })?;
    let fingerprint =
        fingerprint.filter(|f| f.len() == 8 && f.bytes().all(|b| b.is_ascii_hexdigit()));
    Some(match fingerprint {
        Some(f) => format!("{source}, fingerprint {f}"),
        None => source,
    })
}

/// The server's side: a nonce, the client's proof checked, then its own.
pub async fn server<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    token: &Token,
    deadline: Instant,
) -> Result<Session, AuthError> {
    // A rank sends its hello as soon as it connects: a connection silent
    // for a second is not one, and holds a slot no longer.
    let first = deadline.min(Instant::now() + FIRST_FRAME_LIMIT);
    let theirs = match protocol::read_limited(stream, first, protocol::MAX_HANDSHAKE_FRAME).await? {
        Msg::Hello { nonce, .. } if nonce.len() <= 128 => nonce,
        other => return Err(unexpected("a hello", &other)),
    };
    let mine = nonce();
    protocol::write(
        stream,
        &Msg::Challenge {
            nonce: mine.clone(),
        },
        deadline,
    )
    .await?;
    match protocol::read_limited(stream, deadline, protocol::MAX_HANDSHAKE_FRAME).await? {
        Msg::Proof { proof } if token.verify("client", &theirs, &mine, &proof) => {
            let proof = token.proof("server", &theirs, &mine);
            protocol::write(stream, &Msg::Welcome { proof }, deadline).await?;
            Ok(Session {
                client: theirs,
                server: mine,
            })
        }
        Msg::Proof { .. } => {
            let _ = protocol::write(
                stream,
                &Msg::Rejected {
                    reason: OTHER_JOB.into(),
                    source: Some(token.source.to_string()),
                    // A secret's fingerprint would be an offline oracle for
                    // guesses; a public token's gives nothing away.
                    fingerprint: (!token.is_secret()).then(|| token.fingerprint()),
                },
                deadline,
            )
            .await;
            Err(AuthError::OtherJob { theirs: None })
        }
        Msg::Rejected { reason, .. } if reason == OTHER_JOB => {
            Err(AuthError::OtherJob { theirs: None })
        }
        Msg::Rejected { reason, .. } => Err(AuthError::RejectedByPeer(reason)),
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
/// How long a new connection may stay silent before its hello.
pub const FIRST_FRAME_LIMIT: Duration = Duration::from_secs(1);

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
            let (c, s) = tokio::join!(client(&mut c, &a, deadline), server(&mut s, &b, deadline));
            (c.map(|_| ()), s.map(|_| ()))
        })
    }

    /// After the handshake both ends seal the connection with keys of
    /// their own making: frames go through; a frame that a third party
    /// writes into the stream, unsealed, is caught.
    #[test]
    fn the_connection_is_sealed_after_the_handshake() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let t = Token::new(b"0123456789abcdef", "t");
            let (mut c, mut s) = tokio::io::duplex(1 << 16);
            let deadline = protocol::after(Duration::from_secs(2));
            let (cs, ss) = tokio::join!(client(&mut c, &t, deadline), server(&mut s, &t, deadline));
            let mut c = cs.unwrap().seal(c, &t, true);
            let mut s = ss.unwrap().seal(s, &t, false);
            let msg = Msg::StoreSet {
                key: "coll/report".into(),
                value: "ready".into(),
            };
            protocol::write(&mut c, &msg, deadline).await.unwrap();
            assert!(matches!(
                protocol::read(&mut s, deadline).await.unwrap(),
                Msg::StoreSet { .. }
            ));
            // An on-path host's frame, plain, in the server-bound stream.
            use tokio::io::AsyncWriteExt;
            let raw = protocol::encode(&msg);
            let mut record = (raw.len() as u32).to_be_bytes().to_vec();
            record.extend_from_slice(&raw);
            record.extend_from_slice(&[0u8; 32]);
            c.get_mut().write_all(&record).await.unwrap();
            let e = protocol::read(&mut s, deadline).await.unwrap_err();
            assert!(e.to_string().contains("integrity"), "{e}");
        });
    }

    #[test]
    fn token_sources_in_order() {
        let resolve = |vars: &[(&str, &str)]| Token::resolve(&env(vars)).unwrap();
        let t = resolve(&[
            ("PREFLIGHT_TOKEN", "d5fb75e87add5c93730f"),
            ("SLURM_JOB_ID", "1"),
            ("TORCHELASTIC_RUN_ID", "r"),
        ]);
        assert_eq!(t.source, "PREFLIGHT_TOKEN");
        assert!(t.is_secret());
        let t = resolve(&[("SLURM_JOB_ID", "1"), ("TORCHELASTIC_RUN_ID", "r")]);
        assert_eq!(t.source, "SLURM_JOB_ID");
        assert!(!t.is_secret(), "a job id anyone can read is no secret");
        assert_eq!(
            resolve(&[("TORCHELASTIC_RUN_ID", "r")]).source,
            "TORCHELASTIC_RUN_ID"
        );
        assert!(resolve(&[]).is_none());
        // torchrun's default run id is shared by every job: not a token.
        assert!(resolve(&[("TORCHELASTIC_RUN_ID", "none")]).is_none());
    }

    #[test]
    fn a_short_secret_or_a_file_others_can_read_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let e = Token::resolve(&env(&[("PREFLIGHT_TOKEN", "job-a")])).unwrap_err();
        assert!(
            e.starts_with("PREFLIGHT_TOKEN is 5 characters: a job secret needs at least 16"),
            "{e}"
        );
        let dir = std::env::temp_dir().join(format!("pf-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("secret");
        std::fs::write(&file, "855c0625cb2b1c6f1fd0\n").unwrap();
        let var = [("PREFLIGHT_TOKEN_FILE", file.to_str().unwrap())];
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = Token::resolve(&env(&var)).unwrap_err();
        assert!(
            e.contains("can be read by others (mode 0644): `chmod 600"),
            "{e}"
        );
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let t = Token::resolve(&env(&var)).unwrap();
        assert_eq!(t.source, "PREFLIGHT_TOKEN_FILE");
        // The file's secret, newline trimmed, is the same key as the variable's.
        let same = Token::resolve(&env(&[("PREFLIGHT_TOKEN", "855c0625cb2b1c6f1fd0")])).unwrap();
        assert_eq!(t.fingerprint(), same.fingerprint());
        std::fs::write(&file, "short\n").unwrap();
        assert!(
            Token::resolve(&env(&var))
                .unwrap_err()
                .contains("is 5 characters")
        );
        // A link to a good secret file is refused (opened once, never
        // followed), and a FIFO neither blocks nor counts as a file.
        std::fs::write(&file, "855c0625cb2b1c6f1fd0\n").unwrap();
        let link = dir.join("link");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&file, &link).unwrap();
        let e =
            Token::resolve(&env(&[("PREFLIGHT_TOKEN_FILE", link.to_str().unwrap())])).unwrap_err();
        assert!(
            e.ends_with("is a symbolic link: name the file itself"),
            "{e}"
        );
        // A Kubernetes Secret volume: `token` is a link into `..data`, a
        // link to the current timestamped directory; the webhook names
        // `..data/token`, whose last part is the file itself.
        let volume = dir.join("volume");
        let stamped = volume.join("..2026_11_28_08_00_00.123");
        std::fs::create_dir_all(&stamped).unwrap();
        std::fs::write(stamped.join("token"), "855c0625cb2b1c6f1fd0\n").unwrap();
        std::fs::set_permissions(
            stamped.join("token"),
            std::fs::Permissions::from_mode(0o400),
        )
        .unwrap();
        std::os::unix::fs::symlink("..2026_11_28_08_00_00.123", volume.join("..data")).unwrap();
        std::os::unix::fs::symlink("..data/token", volume.join("token")).unwrap();
        let through = volume.join("..data/token");
        let t =
            Token::resolve(&env(&[("PREFLIGHT_TOKEN_FILE", through.to_str().unwrap())])).unwrap();
        assert_eq!(t.fingerprint(), same.fingerprint());
        assert!(
            Token::resolve(&env(&[(
                "PREFLIGHT_TOKEN_FILE",
                volume.join("token").to_str().unwrap()
            )]))
            .is_err()
        );
        let fifo = dir.join("fifo");
        let _ = std::fs::remove_file(&fifo);
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let e =
            Token::resolve(&env(&[("PREFLIGHT_TOKEN_FILE", fifo.to_str().unwrap())])).unwrap_err();
        assert!(e.ends_with("not a regular file"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
        let s = fresh_secret().unwrap();
        assert_eq!(s.len(), 32);
        assert_ne!(s, fresh_secret().unwrap());
    }

    #[test]
    fn same_token_is_accepted_both_ways() {
        let (c, s) = handshake(Token::new(b"k", "t"), Token::new(b"k", "t"));
        assert!(c.is_ok() && s.is_ok(), "{c:?} {s:?}");
    }

    #[test]
    fn other_token_is_rejected_and_both_sides_know() {
        let (c, s) = handshake(Token::new(b"job-a", "t"), Token::new(b"job-b", "t"));
        assert!(matches!(c, Err(AuthError::OtherJob { .. })), "{c:?}");
        assert!(matches!(s, Err(AuthError::OtherJob { .. })), "{s:?}");
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

#[cfg(test)]
mod guessing {
    use super::*;

    #[test]
    fn human_tokens_are_refused_and_random_ones_pass() {
        for weak in [
            "cluster-prod-token-21",
            "my-cluster-secret-2024",
            "0123456789abcdef0123456789abcdef",
            "aaaaaaaaaaaaaaaaaaaaaaaa",
            "job-b-secret-0002",
            "3f2a9c41d07be855",
        ] {
            let bits = guessing_bits(weak);
            assert!(bits < MIN_SECRET_BITS, "{weak}: {bits}");
            let e = check_length("T", weak).unwrap_err();
            assert!(e.starts_with("T is too easy to guess: about "), "{e}");
        }
        for _ in 0..20 {
            let fresh = fresh_secret().unwrap();
            assert!(guessing_bits(&fresh) >= MIN_SECRET_BITS, "{fresh}");
            check_length("T", &fresh).unwrap();
        }
    }
}
