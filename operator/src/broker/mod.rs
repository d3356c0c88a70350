//! The JIT broker (DESIGN §5): HTTPS, caller proven by a bound service-account token to run on
//! the attempt's node, the runner id journalled before the JIT leaves, one JIT per attempt.

pub mod authn;
pub mod pods;
pub mod protocol;
pub mod scaleset;
pub mod server;
pub mod tls;
