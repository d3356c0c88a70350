//! The broker's scale-set variant (docs/demand-modes.md): an attempt of a `ScaleSet` policy is
//! minted with its scale set's `generatejitconfig`, through the same one-shot journal rules as
//! the REST mint (`protocol::issue`: only `Prepared` without a runner id, a leftover registration
//! of the name deleted and minted once more, the runner id CAS-journalled before the JIT leaves,
//! a registration that lost its CAS deleted). Only the mint differs; the leftover is deleted
//! through the REST runner list, where GitHub lists scale-set runners too.

use std::sync::Arc;

use super::protocol::Registrar;
use crate::github::GitHubError;
use crate::github::client::GitHubClient;
use crate::github::client::MintDemand;
use crate::github::endpoint::Endpoint;
use crate::github::errors::Terminal;
use crate::github::scaleset::{ScaleSetClient, ScaleSetError};
use crate::github::types::{JitConfig, Runner};

/// Mints through scale set `id`; discards through the REST client.
#[derive(Debug)]
pub struct ScaleSetRegistrar {
    pub rest: Arc<GitHubClient>,
    pub set: Arc<ScaleSetClient>,
    pub id: i64,
}

/// A scale-set failure as the broker's GitHub error: an existing runner of the name is
/// `NameTaken` (the broker deletes the leftover and mints again), a 5xx or transport failure is
/// retryable, anything else terminal.
pub fn as_github_error(e: ScaleSetError) -> GitHubError {
    let endpoint = Endpoint::GenerateJitConfig;
    match e {
        ScaleSetError::GitHub(e) => e,
        ScaleSetError::Service { status: 409, .. } => GitHubError::Terminal {
            endpoint,
            status: 409,
            reason: Terminal::NameTaken,
        },
        e @ (ScaleSetError::SessionConflict
        | ScaleSetError::Expired
        | ScaleSetError::Transport
        | ScaleSetError::Service { .. })
            if e.is_retryable() =>
        {
            let status = match e {
                ScaleSetError::Service { status, .. } => status,
                _ => 503,
            };
            GitHubError::Retryable {
                endpoint,
                status,
                retry_after: None,
            }
        }
        ScaleSetError::Service { status, .. } => GitHubError::Terminal {
            endpoint,
            status,
            reason: Terminal::Refused,
        },
        ScaleSetError::HostNotAllowed(_) => GitHubError::Terminal {
            endpoint,
            status: 0,
            reason: Terminal::Refused,
        },
        _ => GitHubError::Malformed { endpoint },
    }
}

impl Registrar for ScaleSetRegistrar {
    async fn discard(&self, name: &str) -> Result<Option<i64>, GitHubError> {
        self.rest.discard_registration(name).await
    }

    async fn mint(
        &self,
        name: &str,
        _runner_group_id: i64,
        _labels: &[String],
        // The scale set's mint is one call, never retried here: nothing to ask between tries.
        _demand: &impl MintDemand,
    ) -> Result<JitConfig, GitHubError> {
        // The set's labels and group were fixed when it was created from the policy.
        let jit = self
            .set
            .generate_jit(self.id, name, "_work")
            .await
            .map_err(as_github_error)?;
        Ok(JitConfig {
            runner: Runner {
                id: jit.runner_id,
                name: jit.runner_name,
                status: "offline".into(),
                busy: false,
                labels: vec![],
            },
            encoded_jit_config: jit.encoded_jit_config,
        })
    }
}
