//! What the pet store, the operator and the developer commands share as
//! processes: when to stop ([`signal`]) and how a flag reads a duration
//! ([`duration`]).

pub mod duration;
pub mod signal;

pub use duration::{DurationError, parse_duration, parse_positive_duration};
pub use signal::{ShutdownSignals, shutdown_requested, stop_flag};
