//! The application state shared by every handler: cheap to clone (everything inside is
//! reference-counted), built once by `startup`, never global.

use std::sync::Arc;

use alloy::signers::local::PrivateKeySigner;

use crate::config::Config;
use crate::db::PgPool;
use crate::idempotency::Idempotency;
use crate::metrics::Metrics;
use crate::upstream::UpstreamClient;
use crate::x402::{Chain, Supported};

#[derive(Clone)]
pub struct AppState {
    pub config: Arc<Config>,
    pub pool: PgPool,
    /// A small pool of its own for idempotency heartbeats: a main pool drained by slow
    /// requests (e.g. queued on an agent's lock) must not silence the heartbeats of live
    /// owners and get them taken over.
    pub heartbeat_pool: PgPool,
    pub idempotency: Idempotency,
    pub upstream: UpstreamClient,
    /// Signs receipts (EIP-191). Today the router's wallet key.
    pub receipt_signer: Arc<PrivateKeySigner>,
    pub metrics: Arc<Metrics>,
    /// RPC access to the networks the router pays on.
    pub chain: Chain,
    /// The networks and assets the router will pay with.
    pub supported: Supported,
    /// Key of the deterministic nonce and payment-identifier HMACs, derived from the wallet key.
    pub nonce_secret: Arc<[u8; 32]>,
    /// The payment terms upstreams asked last (paying ahead, `terms`).
    pub terms: Arc<crate::upstream::known_terms::Terms>,
    /// Paying on Solana networks (`None`: none configured).
    pub solana: Option<Arc<crate::chains::solana::Solana>>,
    /// What agents can discover: facilitators' catalogues and the 402s seen (`discovery`).
    pub discovery: Arc<crate::discovery::Discovery>,
    /// Failed operator authentications per client address (`auth_throttle`), per process.
    pub operator_auth: Arc<crate::auth_throttle::AuthThrottle>,
    /// The chain index of each network with a WebSocket URL (`chains::evm_index`).
    pub indexes: Arc<crate::chains::evm_index::Indexes>,
    /// Test-only fault points (`None` in production).
    pub faults: Option<crate::faults::Hook>,
}
