//! The real [`Nft`]: one `nft -f -` per transaction, the text streamed into it as it is
//! rendered, optionally inside a named network namespace (`ip netns exec`).

use crate::exec::run_ok;
use crate::nft::Transaction;
use crate::nft_sync::Nft;
use crate::Error;

#[derive(Debug, Clone, Default)]
pub struct CommandNft {
    /// Named network namespace to run in; `None` is the agent's own.
    netns: Option<String>,
}

impl CommandNft {
    pub fn new() -> Self {
        CommandNft::default()
    }

    /// Runs `nft` inside the named network namespace.
    pub fn in_netns(name: impl Into<String>) -> Self {
        CommandNft {
            netns: Some(name.into()),
        }
    }

    pub fn netns(&self) -> Option<&str> {
        self.netns.as_deref()
    }
}

impl Nft for CommandNft {
    fn apply(&mut self, tx: &Transaction) -> Result<(), Error> {
        if tx.is_empty() {
            return Ok(());
        }
        let args = ["-f".to_string(), "-".to_string()];
        run_ok(self.netns.as_deref(), "nft", &args, Some(tx)).map(|_| ())
    }
}
