//! What other crates reuse of the developer commands: the plugin's release
//! step for krew, which the end-to-end story installs with the real krew.

pub mod krew;
