//! `reconcile`: re-check stale payment intents against the chain, recover lost answers, read
//! batch-settlement channels (`audit::reconcile`).

use anyhow::Context;
use clap::Args;

use crate::config::{self, DatabaseArgs, DatabaseConfig, KeyArgs, SecretsArgs, UpstreamArgs};
use crate::telemetry::progress::Progress;

#[derive(Debug, Args)]
pub struct ReconcileArgs {
    #[command(flatten)]
    pub db: DatabaseArgs,
    /// Networks and their RPC URLs: `eip155:84532=http://…,…` (the routers' setting).
    #[arg(long, env = "X402_RPC_URLS", default_value = "")]
    pub x402_rpc_urls: String,
    /// Timeout of each chain RPC call, in ms.
    #[arg(long, env = "X402_RPC_TIMEOUT_MS", default_value = "5000")]
    pub x402_rpc_timeout_ms: String,
    /// Only intents last written longer ago than this, in seconds (the grace period).
    #[arg(long, env = "RECONCILE_OLDER_THAN_SECS", default_value = "120")]
    pub older_than_secs: String,
    /// An in-flight key whose heartbeat is older than this has no live owner, in ms
    /// (the routers' IDEMPOTENCY_ABANDON_AFTER_MS).
    #[arg(long, env = "IDEMPOTENCY_ABANDON_AFTER_MS", default_value = "60000")]
    pub abandon_after_ms: String,
    /// With the router's key (used only to sign the receipt of a recovered answer), also try
    /// to recover answers lost after a settled payment (byte-identical re-send to upstreams
    /// that advertised payment-identifier; never a new payment). Without it: no recovery.
    #[command(flatten)]
    pub key: KeyArgs,
    /// The keys that open what recovery re-sends (the routers' settings).
    #[command(flatten)]
    pub secrets: SecretsArgs,
    /// How upstreams are reached by recovery (the routers' settings).
    #[command(flatten)]
    pub upstream: UpstreamArgs,
    /// Most payments one run tries to recover.
    #[arg(long, env = "RECONCILE_MAX_RECOVERIES", default_value = "50")]
    pub max_recoveries: String,
    /// Longest time one run spends recovering, in seconds.
    #[arg(long, env = "RECONCILE_RECOVERY_SECS", default_value = "120")]
    pub recovery_secs: String,
}

/// `reconcile`: re-check stale payment intents on-chain; prints one JSON line of counts. The
/// check shows its progress on standard error, one step per batch of intents
/// (`telemetry::progress`).
///
/// # Errors
/// Configuration or database errors, or intents the chain could not answer for (after the
/// counts are printed), so that a scheduler notices.
pub async fn run(args: &ReconcileArgs) -> anyhow::Result<()> {
    use crate::audit::reconcile;
    let db = DatabaseConfig::from_args(&args.db)?;
    let networks = config::parse_rpc_urls(&args.x402_rpc_urls)?;
    let solana_urls = config::solana::rpc_urls(&args.x402_rpc_urls)?;
    anyhow::ensure!(
        !networks.is_empty() || !solana_urls.is_empty(),
        "invalid setting X402_RPC_URLS (--x402-rpc-urls): is required: reconcile reads the chain"
    );
    let timeout = config::parse_ms("X402_RPC_TIMEOUT_MS", &args.x402_rpc_timeout_ms)?;
    // Logs from here on: a Solana network with one RPC URL is warned about as it is built.
    crate::telemetry::init(false);
    let solana =
        crate::chains::solana::SolanaRpcs::new(&solana_urls, timeout).context("building the Solana RPC clients")?;
    let solana = (!solana.is_empty()).then(|| std::sync::Arc::new(solana));
    let older_than: u64 = config::parse_num("RECONCILE_OLDER_THAN_SECS", &args.older_than_secs)
        .map_err(|e| e.for_flag("older-than-secs"))?;
    let abandon_after = config::parse_ms("IDEMPOTENCY_ABANDON_AFTER_MS", &args.abandon_after_ms)
        .map_err(|e| e.for_flag("abandon-after-ms"))?;
    let mut settings = reconcile::Settings {
        older_than: std::time::Duration::from_secs(older_than),
        abandon_after,
        faults: None,
        only: None,
        solana,
        progress: None,
    };
    let receipt_signer = config::load_signer(&args.key)?;
    let upstream_config = config::UpstreamConfig::from_args(&args.upstream)?;
    let max_payments: u64 = config::parse_num("RECONCILE_MAX_RECOVERIES", &args.max_recoveries)
        .map_err(|e| e.for_flag("max-recoveries"))?;
    let budget: u64 =
        config::parse_num("RECONCILE_RECOVERY_SECS", &args.recovery_secs).map_err(|e| e.for_flag("recovery-secs"))?;
    let upstream = crate::upstream::UpstreamClient::new(&upstream_config).context("building the upstream client")?;
    let keyring = receipt_signer
        .as_ref()
        .map(|signer| config::secrets::keyring(args.secrets.secrets_key_file.as_ref(), signer))
        .transpose()?;
    let recovering = receipt_signer.as_ref().zip(keyring.as_ref()).map(|(signer, keyring)| reconcile::Recovering {
        upstream: &upstream,
        receipt_signer: signer,
        keyring,
        max_payments,
        budget: std::time::Duration::from_secs(budget),
    });
    let chain = crate::x402::Chain::new(networks, timeout);
    let pool = db.pool();
    let mut conn = pool.get().await.context("connecting to Postgres")?;
    let total = reconcile::count_candidates(&mut conn, &settings).await.context("counting payment intents")?;
    settings.progress = Some(std::sync::Arc::new(Progress::start("reconcile", "intents", Some(total))));
    let report = reconcile::run(&mut conn, &chain, &settings, recovering.as_ref())
        .await
        .context("reconciling payment intents")?;
    drop(settings); // the bar is cleared before the report is printed
    println!("{}", serde_json::to_string(&report)?);
    anyhow::ensure!(
        report.errors == 0,
        "{} payment intent(s) could not be checked on-chain (see the log); they were left as they were",
        report.errors
    );
    Ok(())
}
