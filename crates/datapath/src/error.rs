//! The crate's one error type.

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot parse iptables line {line:?}: {reason}")]
    Parse { line: String, reason: String },
    /// A payload the in-memory fakes ([`crate::fake`]) refuse, as the real tool would; the
    /// real tools' refusals are [`Error::Command`].
    #[cfg(any(test, feature = "fake"))]
    #[error("iptables-restore rejected the payload: {reason}")]
    Restore { reason: String },
    #[error("running {command} failed")]
    Spawn {
        command: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{command} exited with {status}: {stderr}")]
    Command {
        command: String,
        status: String,
        stderr: String,
    },
    /// The kernel refused a message of an nftables batch (the whole batch is then not applied),
    /// or the netlink socket failed; `object` names what the message did, in `nft` words.
    #[error("nftables over netlink: {object}: {message} (errno {errno})")]
    Netlink {
        object: String,
        errno: i32,
        message: String,
    },
    /// berth's nftables table as the kernel holds it holds something berth never writes (a
    /// table another program changed): `object` names where, `reason` what.
    #[error("berth's nftables table, {object}: {reason}")]
    Decode { object: String, reason: String },
    #[error("packet trace failed: {reason}")]
    Trace { reason: String },
    #[error("invalid {field} in {object}: {value:?}")]
    InvalidInput {
        object: String,
        field: String,
        value: String,
    },
}

impl Error {
    /// A bounded label for logs and metrics.
    pub fn category(&self) -> &'static str {
        match self {
            Error::Parse { .. } => "parse",
            #[cfg(any(test, feature = "fake"))]
            Error::Restore { .. } => "restore",
            Error::Spawn { .. } => "spawn",
            Error::Command { .. } => "command",
            Error::Netlink { .. } => "netlink",
            Error::Decode { .. } => "decode",
            Error::Trace { .. } => "trace",
            Error::InvalidInput { .. } => "invalid",
        }
    }

    /// Whether the same step can succeed when tried again unchanged: a tool that failed to
    /// run or was refused (the xtables lock, a chain changed under it) can, a full resync
    /// rewriting every chain; input berth cannot express cannot.
    pub fn is_retryable(&self) -> bool {
        match self {
            #[cfg(any(test, feature = "fake"))]
            Error::Restore { .. } => true,
            Error::Spawn { .. } | Error::Command { .. } | Error::Netlink { .. } => true,
            Error::Parse { .. }
            | Error::Decode { .. }
            | Error::Trace { .. }
            | Error::InvalidInput { .. } => false,
        }
    }
}
