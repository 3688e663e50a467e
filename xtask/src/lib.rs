//! What other crates reuse of the developer commands: the plugin's release
//! step for krew, which the end-to-end story installs with the real krew,
//! and the SBOM, which the OCI story attests to the chart with cosign; and
//! the RBAC audit the test command ends with.

pub mod krew;
pub mod rbac_audit;
pub mod sbom;
