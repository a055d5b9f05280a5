//! How the server answers a request it will not serve, or serves: the one
//! refusal message, and the one deadline every reply is written within (a
//! peer that does not read its answer is let go, never waited for).

use std::time::Duration;

use tokio::io::AsyncWrite;
use tokio::time::Instant;

use super::Writer;
use crate::protocol::{self, Msg};

/// How long a reply may take to leave.
const REPLY_WITHIN: Duration = Duration::from_secs(1);

/// A refusal, as every refusal reads on the wire.
pub(super) fn rejected(reason: String) -> Msg {
    Msg::Rejected {
        reason,
        source: None,
        fingerprint: None,
    }
}

/// `msg` on a connection's shared writer, within the reply deadline and
/// never past `until` (the store's end); whether it went out.
pub(super) async fn send(writer: &Writer, msg: &Msg, until: Instant) -> bool {
    let by = (Instant::now() + REPLY_WITHIN).min(until);
    protocol::write(&mut *writer.lock().await, msg, by)
        .await
        .is_ok()
}

/// `msg` on a stream the connection still holds whole.
pub(super) async fn send_on<W: AsyncWrite + Unpin>(stream: &mut W, msg: &Msg) {
    let _ = protocol::write(stream, msg, Instant::now() + REPLY_WITHIN).await;
}
