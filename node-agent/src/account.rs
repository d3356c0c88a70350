//! The unix account a runner runs as (DESIGN §6 "Native provider": one pool account per
//! concurrent runner). Only the numeric ids travel: names are resolved by whoever assigns the
//! account, so nothing here depends on the host's user database.

/// A runner account: the uid the listener runs as and its primary group (the pool group, which
/// is how caches are shared).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RunnerAccount {
    pub uid: u32,
    pub gid: u32,
}
